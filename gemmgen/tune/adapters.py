"""The default builder and runner of the tuning loop, over the backends' build pool and the
measurement harness's isolated worker. The loop (tune.py) sees only their protocols."""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Mapping, Optional, Sequence

from gemmgen import backends
from gemmgen.backends.build import BuildFailed, build_many
from gemmgen.dsl import to_text
from gemmgen.dsl.ir import Problem, Program
from gemmgen.errors import GemmgenError, NoGPUError
from gemmgen.measure import Runner, TimingOptions, time_many
from gemmgen.measure.errors import MeasureError
from gemmgen.measure.env import gpu_record, package_versions
from gemmgen.measure.worker import Job, load_backend
from gemmgen.tune import BuildOutcome, Measurement
from gemmgen.tuning_db import BaselineTime, Device


class PoolBuilder:
    """Lower each program (pure), then `backends.build.build_many` on every core (disk-cached)."""

    def __init__(self, jobs: Optional[int] = None, arch: str = "sm_90a"):
        self.jobs = jobs
        self.arch = arch

    def build_many(self, programs: Sequence[Program]) -> list[BuildOutcome]:
        outcomes: list[Optional[BuildOutcome]] = [None] * len(programs)
        sources, where = [], []
        for i, program in enumerate(programs):
            try:
                sources.append(backends.lower(program))
                where.append(i)
            except Exception as exc:  # noqa: BLE001 - a lowering bug costs this trial, not the run
                outcomes[i] = BuildOutcome(program, error=f"lowering failed: {type(exc).__name__}: {exc}")
        start = time.monotonic()
        results = build_many(sources, jobs=self.jobs, arch=self.arch)
        per_build = (time.monotonic() - start) / max(1, len(sources))
        for i, result in zip(where, results):
            if isinstance(result, Exception):
                retry = isinstance(result, BuildFailed) and not result.final
                outcomes[i] = BuildOutcome(programs[i], error=str(result), seconds=per_build, retry=retry)
            else:
                outcomes[i] = BuildOutcome(programs[i], artifact=result, seconds=per_build)
        return outcomes  # type: ignore[return-value]


#: Baselines measured per shape in each tuning run (the same names as `gemmgen bench`).
DEFAULT_BASELINES = ("torch", "cublas_nn", "cublas_tn", "lt_heuristic", "lt_autotune")
#: Workers kept started for confirmations, which each take one that has run nothing. They start
#: side by side, so the loop waits for starts once per this many confirmations: on the H200 a
#: small-batch tuning run waited 112 of its 316 s for starts with one, the next 39 of 178 s with 3;
#: on an H100 eight started in 11.1 s and three in 10.6 s, and a 100 s tuning probe measured 73
#: trials with eight against 48 with three (benchmarks/results/worker_starts_h100/).
STANDBY_WORKERS = 8


def this_device() -> Device:
    """The GPU of this process, as the database records it (torch's name, like gemmgen.compile)."""
    # Deferred: torch (optional, heavy to import).
    import torch


    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    driver = (gpu_record() or {}).get("driver", "")
    libraries = {k: v for k, v in package_versions().items() if v}
    return Device(props.name, f"{props.major}.{props.minor}", props.multi_processor_count,
                  str(driver or ""), str(torch.version.cuda or ""), libraries)


class WorkerRunner:
    """Baselines timed in this process (trusted libraries, cold L2, CUPTI); every candidate
    checked then timed in `gemmgen.measure.worker.Runner`'s isolated process.

    mode 'offline' times back to back; 'both' adds server-mode times (a second worker job).
    The worker and `standby` more for confirmations start when the runner is made
    (`Runner.start_soon`), while the loop proposes and builds.
    """

    def __init__(self, *, mode: str = "offline", timeout_s: float = 60.0,
                 baselines: Sequence[str] = DEFAULT_BASELINES, timing=None, standby: int = STANDBY_WORKERS):
        # Deferred: torch (optional, heavy to import).
        import torch


        if not torch.cuda.is_available():
            raise NoGPUError("gemmgen tune")
        if mode not in ("offline", "both"):
            raise GemmgenError(f"tuning mode {mode!r}: use offline or both")
        self.mode = mode
        self.baseline_names = tuple(baselines)
        self.timing = timing or TimingOptions()
        self.timeout_s = timeout_s
        self.device = this_device()
        self._runner = Runner(timeout_s=timeout_s, standby=standby)
        self._runner.start_soon()
        self._timer_warm = False

    def __enter__(self) -> "WorkerRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._runner.close()

    def ready(self) -> None:
        """Start this process's timer (its one-time set-up, while the workers start), then wait
        until the worker and the standbys have started, so that no start overlaps the baselines'
        timing. The loop times this as a part of its own."""
        if not self._timer_warm:
            # Deferred: torch (optional, heavy to import).
            from gemmgen.measure.baselines import warm_up_timer

            warm_up_timer()
            self._timer_warm = True
        self._runner.ready(standby=True)

    def baselines(self, problem: Problem) -> Mapping[str, BaselineTime]:
        """Each baseline timed at the problem. Out of GPU memory is a MeasureError naming the
        problem (the loop records it and goes on), never a baseline silently left out: a trial
        must not win against fewer baselines than it should."""
        # Deferred: torch (optional, heavy to import).
        import torch
        from gemmgen.measure import baselines as registry

        kernels = []
        try:
            for name in self.baseline_names:
                try:
                    kernels.append(registry.make(name, problem, timing_options=self.timing))
                except torch.OutOfMemoryError:
                    raise
                except Exception:  # noqa: BLE001 - a baseline that cannot run here is left out, not fatal
                    continue
            entries = [(k.name, k.fn, k.problem) for k in kernels]
            offline = time_many(entries, "offline", options=self.timing) if entries else {}
            server = time_many(entries, "server", options=self.timing) if entries and self.mode == "both" else {}
        except torch.OutOfMemoryError as exc:
            raise MeasureError(f"{problem.key}: out of GPU memory while timing the baselines "
                               f"({str(exc).splitlines()[0]})") from None
        finally:
            registry.release(kernels)
        out = {}
        for name, timing in offline.items():
            if isinstance(timing, torch.OutOfMemoryError):
                raise MeasureError(f"{problem.key}: out of GPU memory while timing the baseline {name}")
            if isinstance(timing, Exception):
                continue
            srv = server.get(name)
            out[name] = BaselineTime(timing.device_ms, _finite(timing.spread),
                                     None if srv is None or isinstance(srv, Exception) else srv.device_ms,
                                     _finite(timing.host_ms))
        return out

    def measure(self, program: Program, artifact, *, seed: Optional[int] = None,
                fresh: bool = False) -> Measurement:
        args = (program.backend, artifact, to_text(program))
        name = f"{program.backend}:{program.problem.key}"
        result = self._runner.run(Job(name, load_backend, args, program.problem, seed=seed, mode="offline",
                                      timing=self.timing, timeout_s=self.timeout_s, reference="torch"),
                                  fresh=fresh)
        measured = measurement_from(result)
        if self.mode == "both" and measured.device_ms is not None:
            srv = self._runner.run(Job(name, load_backend, args, program.problem, check=False, mode="server",
                                       timing=self.timing, timeout_s=self.timeout_s))
            if srv.ok and srv.timing:
                measured = replace(measured, server_ms=srv.timing["device_ms"], server_spread=srv.timing["spread"])
        return measured

    def confirm(self, program: Program, artifact) -> Measurement:
        """The candidate checked and timed again beside torch.matmul in a newly started worker
        (its own process, CUDA context and inputs): what a would-be winner must hold up to."""
        return self.measure(program, artifact, fresh=True)

    def library(self, problem: Problem) -> dict:
        """cuBLASLt's fastest algorithm for `problem`, searched in the isolated worker
        (gemmgen.measure.library); {"error": why} when the search failed."""
        # Deferred: torch (optional, heavy to import).
        from gemmgen.measure.library import library_job

        # cuBLASLt may offer 100 algorithms; each is timed, so allow for more than one trial
        result = self._runner.run(Job(f"cublaslt:{problem.key}", library_job, (problem, None, self.timing),
                                      timeout_s=4 * self.timeout_s))
        if not result.ok:
            return {"error": f"{result.status}: {result.message}"}
        return result.value if isinstance(result.value, dict) else {"error": "no result came back"}


def measurement_from(result) -> Measurement:
    """A worker's TrialResult as the loop's Measurement: a failed check keeps its numbers; a
    hang, crash or error (a floor violation included) is a failure; otherwise the times."""
    check = result.check or {}
    fields = dict(check_passed=check.get("passed"), max_rel_err=_finite(check.get("max_rel_err")),
                  err_bound=_finite(check.get("bound")), seed=check.get("seed"))
    if result.status == "failed_check":
        return Measurement(check_msg=result.message, **fields)
    if result.status != "ok":
        return Measurement(failure=f"{result.status}: {result.message}", **fields)
    timing = result.timing or {}
    ref = result.reference_timing or {}
    reference = (BaselineTime(ref["device_ms"], _finite(ref.get("spread")), None, _finite(ref.get("host_ms")))
                 if ref.get("device_ms") else None)
    return Measurement(device_ms=timing.get("device_ms"), spread=timing.get("spread"),
                       host_ms=_finite(timing.get("host_ms")), reference=reference,
                       noise=_finite(timing.get("speedup_noise")), **fields)


def _finite(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def compare_with_torch(kernel, *, seed: Optional[int] = None) -> str:
    """Check a compiled kernel and time it against torch.matmul (offline, cold L2): a short table."""
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure import baselines as registry
    from gemmgen.measure import check, time_many

    problem = kernel.problem
    checked = check(kernel.fn, problem, seed=seed)
    lines = [f"check: {'passed' if checked.passed else 'FAILED'} (max rel err {checked.max_rel_err:.2e}, "
             f"bound {checked.bound:.2e}, seed {checked.seed})"]
    lines += [f"  {f}" for f in checked.failures]
    torch_kernel = registry.make("torch", problem)
    entries = [("torch.matmul", torch_kernel.fn, problem)]
    if checked.passed:
        entries.insert(0, (f"gemmgen ({kernel.backend})", kernel.fn, problem))
    timed = time_many(entries, "offline")
    base = timed.get("torch.matmul")
    lines.append(f"{'':22} {'device ms':>10} {'host ms':>9} {'TFLOP/s':>8} {'vs torch':>9}")
    for name, t in timed.items():
        if isinstance(t, Exception):
            lines.append(f"{name:22} {t}")
            continue
        speed = (base.device_ms / t.device_ms) if base is not None and not isinstance(base, Exception) else float("nan")
        lines.append(f"{name:22} {t.device_ms:10.4f} {t.host_ms:9.4f} "
                     f"{problem.flops / (t.device_ms * 1e-3) / 1e12:8.1f} {speed:8.3f}x")
    return "\n".join(lines)
