"""Isolation: generated kernels run in a worker process, one job at a time, under a time limit.

A job is picklable data: a top-level `load` function (pickled by reference) and its
arguments, which the worker calls to get the kernel; then the worker checks it and,
if it passed, times it, and sends back a `TrialResult`. A kernel that hangs (no answer
within the limit), kills its process (segfault, abort) or poisons its CUDA context
(illegal memory access: every later CUDA call fails) costs that one trial: the worker
is killed or retires, a fresh one is spawned for the next job, and the run goes on.

Workers use the spawn start method, so CUDA is initialised in the worker only, never
inherited. Each worker leads a session (process group) of its own, and a worker that is
killed takes its whole group with it: a process a kernel started cannot outlive its trial.

Starting a worker (a Python interpreter, torch, a CUDA context) takes seconds, so a runner can
start its worker ahead (`start_soon`) while the caller proposes and builds, and with
`standby=N` keeps N more started and idle: a job that must run in a newly started worker
(`run(..., fresh=True)`, a would-be winner's confirmation) takes a standby, which has run
nothing, instead of waiting for a start. Standbys are started N at a time, once the last is
taken: they start side by side in about one start's time, so a caller that waits for them
(`ready(standby=True)`, which keeps starts out of its timings) waits once per N fresh jobs.

A job with `problem=None` is a plain job: the loaded callable is called once
with no arguments and what it returns comes back as `TrialResult.value` (the runner's
own tests use these with `Runner(gpu=False)`; a search script may measure a whole
group of kernels inside one such job).
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import sys
import time as _clock
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from gemmgen import backends, dsl
from gemmgen.dsl.ir import Problem
from gemmgen.measure.candidates import resolve
from gemmgen.measure.comparison import speedup_noise
from gemmgen.measure.errors import MeasureError
from gemmgen.measure.timing import TimingOptions, time_many

STATUSES = ("ok", "failed_check", "timeout", "crash", "error")
#: GPU memory an idle worker may keep in torch's cache between jobs (more is handed back)
KEEP_CACHED_BYTES = 2 << 30


@dataclass(frozen=True)
class Job:
    name: str
    load: Callable[..., Callable]
    args: tuple = ()
    problem: Optional[Problem] = None
    check: bool = True
    mode: Optional[str] = "offline"      # None: check only
    seed: Optional[int] = None
    timing: TimingOptions = field(default_factory=TimingOptions)
    timeout_s: Optional[float] = None    # None: the runner's
    # A baseline (gemmgen.measure.baselines name) timed with the kernel in the worker's own
    # session, interleaved: a comparison across processes carries the processes' difference
    # (about 0.3-0.8 % on the H200 for one and the same cuBLAS kernel).
    reference: Optional[str] = None


@dataclass(frozen=True)
class TrialResult:
    name: str
    status: str
    message: str = ""
    check: Optional[dict] = None
    timing: Optional[dict] = None
    wall_s: float = 0.0
    exitcode: Optional[int] = None
    value: Any = None                    # what a CPU-style job's callable returned (if picklable)
    reference_timing: Optional[dict] = None   # Job.reference's Timing.to_dict(), or {"error": why}

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ---- loaders: top-level, so a job can name them -------------------------------------------

def load_backend(backend: str, artifact, program_text: str) -> Callable:
    """A built kernel: gemmgen.backends.load(artifact, gemmgen.dsl.parse(text)) (the program
    names its backend; `backend` is kept in the job for what it reports)."""

    return backends.load(artifact, dsl.parse(program_text))


def load_named(spec: str, problem: Problem) -> Callable:
    """A kernel from a 'module:function' factory called with the problem."""

    made = resolve(spec)(problem)
    return getattr(made, "fn", made)


# ---- the worker side ----------------------------------------------------------------------

def _cuda_healthy() -> bool:
    torch = sys.modules.get("torch")      # a job that never imported torch cannot have broken CUDA
    if torch is None:
        return True
    try:
        if not torch.cuda.is_initialized():
            return True
        torch.cuda.synchronize()
        return float(torch.ones(1, device="cuda").add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001 - any failure means the context is gone
        return False


def _execute(job: Job) -> TrialResult:
    start = _clock.perf_counter()

    def done(status: str, message: str = "", **kw) -> TrialResult:
        return TrialResult(job.name, status, message, wall_s=_clock.perf_counter() - start, **kw)

    try:
        kernel = job.load(*job.args)
        if job.problem is None:
            value = kernel()
            try:
                pickle.dumps(value)
            except Exception as exc:  # noqa: BLE001 - the job ran; only its answer cannot travel
                return done("ok", f"the returned value cannot be sent back ({type(exc).__name__})")
            return done("ok", value=value)
        # Deferred: torch (optional, heavy to import).
        from gemmgen.measure.checking import check
        from gemmgen.measure.timing import time as time_kernel

        checked = check(kernel, job.problem, seed=job.seed).to_dict() if job.check else None
        if checked is not None and not checked["passed"]:
            return done("failed_check", "; ".join(checked["failures"]), check=checked)
        timed = reference = None
        if job.mode is not None and job.reference:
            timed, reference = _time_with_reference(kernel, job)
        elif job.mode is not None:
            timed = time_kernel(kernel, job.problem, job.mode, options=job.timing).to_dict()
        return done("ok", check=checked, timing=timed, reference_timing=reference)
    except Exception as exc:  # noqa: BLE001 - a failed trial, reported, never the worker's end
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return done("error", last)


def _time_with_reference(kernel, job: Job) -> tuple[dict, dict]:
    """The kernel's Timing and its reference's, from one interleaved session."""
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure import baselines

    ref = baselines.make(job.reference, job.problem)
    got = time_many([("kernel", kernel, job.problem), ("reference", ref.fn, job.problem)], job.mode,
                    options=job.timing)
    mine, theirs = got["kernel"], got["reference"]
    if isinstance(mine, Exception):
        raise mine
    if isinstance(theirs, Exception):
        return mine.to_dict(), {"error": str(theirs)}
    noise = speedup_noise(mine.samples_ms, theirs.samples_ms)
    return mine.to_dict() | {"speedup_noise": noise}, theirs.to_dict()


def _serve(conn, gpu: bool) -> None:
    os.setsid()             # a group of its own, which the parent kills whole (Runner._retire)
    if gpu:
        try:
            # Deferred: torch (optional, heavy to import).
            import torch

            torch.cuda.init()
            torch.ones(1, device="cuda").sum().item()
        except Exception as exc:  # noqa: BLE001 - no GPU, no CUDA build of torch, no memory: say which
            try:
                conn.send(("no CUDA", f"{type(exc).__name__}: {exc}"))
            except OSError:
                pass
            return
        # The harness a job needs, imported and its timer started while the worker starts.
        # Deferred: torch (optional, heavy to import).
        import gemmgen.measure.checking  # noqa: F401
        from gemmgen.measure.baselines import warm_up_timer

        try:
            warm_up_timer()
        except Exception:  # noqa: BLE001 - a timer that cannot start fails each job, which says why
            pass
    try:
        conn.send("ready")
    except OSError:         # BrokenPipeError: the parent ended this worker while it started
        return
    _serve_jobs(conn)


def _serve_jobs(conn) -> None:
    """Run jobs until the parent sends None or goes away. A parent killed mid-run (a `timeout`
    around a tuning command) leaves the pipe closed or reset: the worker leaves quietly then,
    not with a traceback of its own under the parent's."""
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        result = _execute(job)
        healthy = _cuda_healthy()
        if not healthy:
            result = TrialResult(job.name, "crash", "CUDA context poisoned (illegal address or similar): "
                                 + result.message, result.check, result.timing, result.wall_s)
        try:
            conn.send((result, healthy))
        except OSError:
            return
        if not healthy:
            return          # retire: the parent starts a fresh worker for the next job
        hand_back_cached_memory()


def hand_back_cached_memory() -> None:
    """Return what torch's allocator still caches from the last job, when that is much: an idle
    worker holding an LM head's peak (tens of GB) left the parent too little to time baselines."""
    torch = sys.modules.get("torch")        # a CPU worker never imported it
    if torch is None or not torch.cuda.is_initialized():
        return
    if torch.cuda.memory_reserved() > KEEP_CACHED_BYTES:
        gc.collect()        # the job's kernel and tensors can sit in reference cycles
        torch.cuda.empty_cache()


# ---- the parent side ----------------------------------------------------------------------

def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _kill_group(pid: Optional[int]) -> None:
    """SIGKILL the worker's process group (its pid: it called setsid), grandchildren included.
    Called before the worker is reaped, so its pid cannot have been reused."""
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass                # no such group (the worker died before setsid): nothing else to end


def _end(proc, conn, kill: bool) -> Optional[int]:
    """Reap a worker (its whole group killed first if `kill`) and close its pipe; its exit code."""
    if kill:
        _kill_group(proc.pid)
        if proc.is_alive():
            proc.kill()
    proc.join(10)
    if conn is not None:
        conn.close()
    return proc.exitcode


class _Started:
    """A worker process started, whose 'ready' has not been read yet."""

    def __init__(self, ctx, gpu: bool):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, gpu), name="gemmgen-worker")
        self.proc.start()
        child.close()   # only the worker holds it now: its death reads as EOF here
        self.said_ready = False

    def ready(self, timeout_s: float):
        """(process, connection) once the worker said it is ready."""
        if self.said_ready:
            return self.proc, self.conn
        if not self.conn.poll(timeout_s):
            self.stop()
            raise MeasureError(f"the measurement worker did not start within {timeout_s:.0f} s")
        try:
            said = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise MeasureError(f"the measurement worker died at start ({_describe_exit(self.proc.exitcode)})") from None
        if said != "ready":
            self.stop()
            raise MeasureError(f"the measurement worker could not start CUDA ({said[1]}); it needs an NVIDIA "
                               "Hopper GPU and torch with CUDA")
        self.said_ready = True
        return self.proc, self.conn

    def stop(self) -> None:
        _end(self.proc, self.conn, kill=True)


class Runner:
    """Runs jobs in a worker process; a hang, crash or poisoned context costs one trial.

        with Runner(timeout_s=60) as runner:
            result = runner.run(Job("k0", load_backend, ("triton", artifact, text), problem))

    `standby`: how many more workers to keep started for `run(..., fresh=True)` (module
    docstring; True is one).
    """

    def __init__(self, *, timeout_s: float = 120.0, gpu: bool = True, startup_timeout_s: float = 180.0,
                 standby: int = 0):
        self.timeout_s = timeout_s
        self.gpu = gpu
        self.startup_timeout_s = startup_timeout_s
        self.standby = int(standby)
        self.restarts = 0
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
        self._conn = None
        self._starting: Optional[_Started] = None     # the next active worker, started ahead
        self._spares: list[_Started] = []             # the standbys, for fresh jobs

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start_soon(self) -> None:
        """Start the worker (and the standbys, if none is left) now, without waiting for them."""
        if self._proc is None and self._starting is None:
            self._starting = _Started(self._ctx, self.gpu)
        if not self._spares:
            self._spares = [_Started(self._ctx, self.gpu) for _ in range(self.standby)]

    def ready(self, standby: bool = False) -> None:
        """Wait until a worker is ready for the next job (starting one if none is); `standby`:
        and until the standby is, so that nothing is starting while jobs are timed."""
        if self._proc is not None and not self._proc.is_alive():
            self._retire(kill=True)
        if self._proc is None:
            started, self._starting = self._starting or _Started(self._ctx, self.gpu), None
            self._proc, self._conn = started.ready(self.startup_timeout_s)
        if standby:
            for spare in list(self._spares):
                try:
                    spare.ready(self.startup_timeout_s)
                except MeasureError:
                    self._spares.remove(spare)     # a fresh job starts its own worker instead

    def _retire(self, kill: bool, replaced: bool = True) -> Optional[int]:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None:
            return None
        self.restarts += int(replaced)
        return _end(proc, conn, kill)

    def run(self, job: Job, *, fresh: bool = False) -> TrialResult:
        """Run `job`; `fresh`: in a newly started worker (its own process and CUDA context, that
        has run no job before), as a candidate's confirmation is."""
        try:
            payload = pickle.dumps(job)
        except Exception as exc:  # noqa: BLE001
            raise MeasureError(f"job {job.name!r} cannot be sent to a worker: {exc}; "
                               "its load function must be a module-level function") from None
        if fresh:
            self._retire(kill=True, replaced=False)     # idle: nothing to finish, and a CUDA exit takes seconds
            if self._starting is None and self._spares:  # one started ahead has run nothing either
                self._starting = self._spares.pop(0)
        self.ready()
        try:
            return self._send(job, payload)
        finally:
            if fresh:
                self.start_soon()         # the next standbys start once this job is done, if none is left

    def _send(self, job: Job, payload: bytes) -> TrialResult:
        start = _clock.perf_counter()
        self._conn.send_bytes(payload)
        limit = job.timeout_s or self.timeout_s
        if not self._conn.poll(limit):
            self._retire(kill=True)
            return TrialResult(job.name, "timeout", f"no answer within {limit:g} s; the worker was killed and replaced",
                               wall_s=_clock.perf_counter() - start)
        try:
            result, healthy = self._conn.recv()
        except (EOFError, OSError):
            code = self._retire(kill=True)
            return TrialResult(job.name, "crash", f"the worker died ({_describe_exit(code)}); replaced",
                               wall_s=_clock.perf_counter() - start, exitcode=code)
        if not healthy:
            self._retire(kill=False)
        return result

    def close(self) -> None:
        self._retire(kill=True, replaced=False)
        for started in [self._starting, *self._spares]:
            if started is not None:
                started.stop()
        self._starting, self._spares = None, []


__all__ = ["Job", "Runner", "STATUSES", "TrialResult", "load_backend", "load_named"]
