"""gemmgen.compile: the fastest known kernel for a problem, found in the tuning database.

Lookup, in order:
1. the winner for this exact problem on the GPU looked up (by GPU name), unless determinism is asked
   for (`deterministic=True`, or torch's deterministic mode) and its split-K adds partials in
   arrival order;
2. a recorded library choice for this exact problem on that GPU: cuBLASLt's fastest
   algorithm, checked and timed beside torch.matmul, served only if it beat it by more
   than its noise (`library_winners`: the noise of the paired comparison,
   `gemmgen.measure.comparison`, or for older choices the spread of its time) and not
   slower in server mode beyond that mode's noise; where both a winner and a library
   choice exist, the one with the larger speedup over torch.matmul (each timed beside
   it) serves;
3. otherwise the baseline: torch.matmul (cuBLAS) with the epilogue in torch.

`compile((None, N, K), ...)` leaves M to the call: it returns a `gemmgen.dispatch.DispatchKernel`
that serves each M from a table of the Ms measured for (·, N, K).

A program is served only where it was measured faster: a neighbour's winner, re-bound to a
shape it was never timed at, measured 0.75x torch.matmul at some off-grid shapes on the H200,
so it is a candidate for tuning (`gemmgen tune` proposes it, `gemmgen.tune.neighbours`),
never a served kernel.

A winner is a trial that passed its check and satisfies the never-slower rule
    device_ms * (1 + noise) < best_baseline_ms
with both times from the same tuning run (the `winners` view of the database); `noise` is
that of its speedup over torch.matmul timed beside it, or for older trials its spread.

Kernels are cached in memory by the call's arguments, so a warm lookup is a dict hit;
built artifacts are cached on disk by the backends' builder.
"""
from __future__ import annotations

import math
import operator
from dataclasses import replace
import re
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Optional, Union

from gemmgen import backends
from gemmgen.backends.base import INT32_LIMIT
from gemmgen.dsl import parse
from gemmgen.dsl import parse_epilogue as dsl_parse_epilogue
from gemmgen.dsl.diagnostics import ProgramError
from gemmgen.dispatch import DispatchKernel, Row, table
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.dsl.checks import gate_findings
from gemmgen.errors import GemmgenError, NoGPUError, finite_number
from gemmgen.kernel import Kernel, Provenance, build_ahead
from gemmgen.tune import reports_summary
from gemmgen.tune.adapters import this_device
from gemmgen.tune.on_demand import tune_now
from gemmgen.tuning_db import (
    DEFAULT_DEVICE_NAME,
    Database,
    WinnerIndex,
    default_db_path,
    open_layers,
    shipped_database,
)
from gemmgen.tuning_db.records import SAME_SESSION_BASELINE, toolchain_of

_KERNELS: dict = {}          # call arguments -> Kernel (the warm path)
_BY_PROBLEM: dict = {}       # (Problem, device name, db token) -> Kernel
_INDEXES: dict = {}          # (db token, device name) -> WinnerIndex
_DEVICE_NAMES: dict = {}     # device argument -> GPU name
_LOCK = threading.Lock()


#: Every dimension and every operand's element count stays below this: the kernels index with
#: signed 32-bit integers (the CUDA launchers pass M, N and K as C `int`; Triton's offsets are
#: int32). The backends' own limit, so that compile refuses what no kernel could serve.
INDEX_LIMIT = INT32_LIMIT
_ALLOWED = (f"M, N and K must each be a whole number from 1 to {INDEX_LIMIT - 1:,} "
            "(the kernels index with 32-bit integers)")
_EXAMPLE = "write MxNxK, e.g. 4096x4096x4096"
_DIMENSION = re.compile(r"[+-]?\d+")


class CompileError(GemmgenError):
    """Arguments of gemmgen.compile that do not describe a problem."""


class ShapeError(CompileError):
    """A shape that is not three whole numbers within the kernels' limits."""


def clear_cache() -> None:
    """Forget cached kernels and database indexes (after tuning in this process, say)."""
    with _LOCK:
        _KERNELS.clear()
        _BY_PROBLEM.clear()
        _INDEXES.clear()
        _DEVICE_NAMES.clear()


def compile(problem: Union[Problem, tuple], *, a_major: str = "row", b_major: str = "row",
            epilogue: Union[Epilogue, str, None] = None, device=None, db=None,
            deterministic: Optional[bool] = None, tune: Optional[float] = None) -> Kernel:
    """The kernel for `problem` (a Problem, or an (M, N, K) tuple with the keywords).

    M, N and K are integers (int or numpy's) within the kernels' 32-bit limits (`check_shape`);
    alpha and beta are finite. Anything else raises a CompileError that names it. M may be
    None: the batch is then read at each call (`gemmgen.dispatch.DispatchKernel`).

    device: None (the current CUDA device, or 'NVIDIA H200' without a GPU), a CUDA
    device (index, 'cuda:1', torch.device) or a GPU name to look records up for.
    db: a tuning database path or `Database` laid over the shipped records
    (default: GEMMGEN_DB or ~/.cache/gemmgen/tuning.sqlite).
    deterministic: pass over programs whose split-K partials are added in arrival order
    (`split_k N unordered`: results may differ in the last bits from run to run); None
    follows `torch.are_deterministic_algorithms_enabled()`.
    tune: seconds to tune the problem on this GPU first if it was never tuned here (the user's
    database, `gemmgen.tune.on_demand`; a progress bar and one summary line on stderr); a
    problem tuned once is not tuned again. Needs a GPU.
    """
    if _dynamic_m(problem):
        if tune is not None:
            raise CompileError("tune= needs the M to tune at: compile (M, N, K) for each batch size to tune, "
                               "then (None, N, K) serves what was measured")
        return _compile_dynamic(problem, a_major=a_major, b_major=b_major, epilogue=epilogue, device=device,
                                db=db, deterministic=_torch_deterministic() if deterministic is None else deterministic)
    if tune is not None:
        return _compile_tuned(problem, tune, a_major=a_major, b_major=b_major, epilogue=epilogue,
                              device=device, db=db, deterministic=deterministic)
    if deterministic is None:
        deterministic = _torch_deterministic()
    key = (problem, a_major, b_major, epilogue, device, db, deterministic)
    warm = _exact_ints(problem)
    if warm:
        try:
            return _KERNELS[key]
        except (KeyError, TypeError):
            pass
    prob = as_problem(problem, a_major=a_major, b_major=b_major, epilogue=epilogue)
    gpu = device_name(device)
    token = _db_token(db)
    with _LOCK:
        kernel = _BY_PROBLEM.get((prob, gpu, token, deterministic))
        if kernel is None:
            kernel = _lookup(prob, gpu, _index(token, db, gpu), deterministic=deterministic)
            _BY_PROBLEM[(prob, gpu, token, deterministic)] = kernel
        try:
            if warm:
                _KERNELS[key] = kernel
        except TypeError:  # unhashable argument: no warm path for it
            pass
    return kernel


def _dynamic_m(problem) -> bool:
    """(None, N, K), or a Problem whose M alone is None."""
    if isinstance(problem, Problem):
        return problem.m is None and problem.n is not None and problem.k is not None
    return isinstance(problem, tuple) and len(problem) == 3 and problem[0] is None


def _compile_dynamic(problem, *, a_major, b_major, epilogue, device, db, deterministic) -> DispatchKernel:
    """The dynamic-M kernel: the table of gemmgen.dispatch over the Ms measured for (·, N, K)."""
    key = ("dynamic", problem, a_major, b_major, epilogue, device, db, deterministic)
    try:
        hit = _KERNELS.get(key)
    except TypeError:       # unhashable argument: no cache for it
        hit = None
    if hit is not None:
        return hit
    if isinstance(problem, Problem):
        first = as_problem(problem.with_shape(1, problem.n, problem.k))
    elif None in problem[1:]:
        raise ShapeError(f"shape {problem!r}: only M may be left to the call (None); give N and K, "
                         "e.g. gemmgen.compile((None, 4096, 4096))")
    else:
        first = as_problem((1, *problem[1:]), a_major=a_major, b_major=b_major, epilogue=epilogue)
    generic = replace(first, m=None)
    gpu = device_name(device)
    index = _index(_db_token(db), db, gpu)

    def at(m: int) -> Kernel:
        return compile(generic.with_shape(m, first.n, first.k), device=device, db=db, deterministic=deterministic)

    points = {m: at(m) for m in index.m_points(generic)}

    def make(m: int, row: Row) -> Kernel:
        problem_m = generic.with_shape(*check_shape((m, first.n, first.k)))
        if row.how == "range":
            program = row.program.bind(problem_m)
            if not backends.diagnose(program):
                return Kernel(problem_m, program, Provenance(
                    "range", gpu, backend=program.backend, tuned_problem=generic.key,
                    note=f"that won at M = {row.ends[0]} and M = {row.ends[1]} on {gpu}, re-bound to M = {m}"))
        return Kernel(problem_m, None, Provenance(
            "baseline", gpu, note=f"no kernel measured at M = {m} nor one program that won at the measured Ms "
                                  f"on both sides of it on {gpu}; serving torch.matmul (cuBLAS)"))

    kernel = DispatchKernel(generic, table(points), make, points)
    try:
        _KERNELS[key] = kernel
    except TypeError:
        pass
    return kernel


def _compile_tuned(problem, seconds, *, db, **kwargs) -> Kernel:
    """compile(), after tuning the problem for `seconds` where nothing was measured for it."""
    if not (finite_number(seconds) and seconds > 0):
        raise CompileError(f"tune={seconds!r}: give the seconds to spend tuning, a positive number")
    kernel = compile(problem, db=db, **kwargs)
    index = _index(_db_token(db), db, kernel.provenance.gpu)
    if kernel.provenance.how != "baseline" or kernel.problem.key in index.tuned:
        return kernel                             # measured here before: nothing to tune
    if not gpu_present():
        raise NoGPUError(f"gemmgen.compile(..., tune={seconds})")
    start = time.monotonic()
    reports = tune_now([kernel.problem], db=db, time_budget_s=seconds, progress=True)
    clear_cache()
    kernel = compile(problem, db=db, **kwargs)
    print(f"gemmgen: tuned {kernel.problem.key} in {time.monotonic() - start:.0f} s ({reports_summary(reports)}); "
          f"serving: {kernel.provenance.summary}", file=sys.stderr)
    return kernel


def _exact_ints(problem) -> bool:
    """Whether equal warm keys mean equal shapes: 4096.0 == 4096 and True == 1 hash alike, so
    other number types take the checked path every time."""
    dims = (problem.m, problem.n, problem.k) if type(problem) is Problem else problem
    return type(dims) is tuple and len(dims) == 3 and all(type(d) is int for d in dims)


def check_shape(shape, shown=None) -> tuple[int, int, int]:
    """(M, N, K) as Python ints, or ShapeError naming the bad dimension and what is allowed.

    The one check of a shape, for gemmgen.compile and every command's MxNxK: integers only
    (not 4096.5, True or "64"), each from 1 to INDEX_LIMIT - 1, and no operand (A: M x K,
    B: K x N, C: M x N) with INDEX_LIMIT elements or more. `shown` is how the user wrote it."""
    written = isinstance(shown, str)      # as typed: show its parts as typed, unquoted
    shown = repr(shape) if shown is None else repr(shown)
    try:
        dims = tuple(shape)
    except TypeError:
        dims = ()
    if len(dims) != 3:
        raise ShapeError(f"shape {shown}: give three dimensions M, N and K; {_EXAMPLE}")
    values = []
    for name, dim in zip("MNK", dims):
        try:
            value = None if isinstance(dim, bool) else operator.index(dim)
        except TypeError:
            value = None
        if value is None or not 1 <= value < INDEX_LIMIT:
            raise ShapeError(f"shape {shown}: {name} = {dim if written else repr(dim)} is not allowed; {_ALLOWED}")
        values.append(value)
    m, n, k = values
    for operand, rows, cols, size in (("A", "M", "K", m * k), ("B", "K", "N", k * n), ("C", "M", "N", m * n)):
        if size >= INDEX_LIMIT:
            raise ShapeError(f"shape {shown}: {operand} ({rows} x {cols}) would have {size:,} elements; each "
                             f"operand must have fewer than {INDEX_LIMIT:,} (the kernels index with 32-bit "
                             "integers): split the problem")
    return m, n, k


def parse_shape(text: str) -> tuple[int, int, int]:
    """'MxNxK' (x, X or commas between) -> checked (M, N, K), by `check_shape`."""
    parts = [part.strip() for part in re.split(r"[xX,]", text.strip())]
    dims = [int(part) if _DIMENSION.fullmatch(part) else part for part in parts]
    return check_shape(dims, shown=text)


def check_epilogue(epilogue: Epilogue) -> Epilogue:
    """The epilogue's alpha and beta must be finite numbers (NaN or infinity poisons every output),
    and a gate must come with its halves and alone (dsl.checks.gate_findings)."""
    for finding in gate_findings(epilogue):
        raise CompileError(f"epilogue: {finding}")
    for name in ("alpha", "beta"):
        value = getattr(epilogue, name)
        if not math.isfinite(value):
            raise CompileError(f"{name}={value}: {name} must be a finite number, e.g. {name}=0.5")
    return epilogue


def as_problem(problem, *, a_major="row", b_major="row", epilogue=None) -> Problem:
    """The checked Problem for gemmgen.compile's arguments (a Problem is checked as it is)."""
    if isinstance(problem, Problem):
        if not problem.is_bound:
            raise CompileError(f"problem {problem.key} is shape-generic; give N and K (M may be left to the "
                               "call: gemmgen.compile((None, N, K)))")
        dims = (problem.m, problem.n, problem.k)
        check_epilogue(problem.epilogue)
        shape = check_shape(dims)
        return problem if all(type(d) is int for d in dims) else problem.with_shape(*shape)
    if isinstance(problem, (str, bytes)):
        raise ShapeError(f"shape {problem!r}: give a Problem or an (M, N, K) tuple of integers, "
                         "e.g. gemmgen.compile((4096, 4096, 4096))")
    m, n, k = check_shape(problem)
    for name, major in (("a_major", a_major), ("b_major", b_major)):
        if major not in ("row", "col"):
            raise CompileError(f"{name} must be 'row' or 'col', got {major!r}")
    if isinstance(epilogue, str):
        epilogue = parse_epilogue(epilogue)
    elif epilogue is not None and not isinstance(epilogue, Epilogue):
        raise CompileError(f"epilogue must be an Epilogue or text like 'bias=n gelu', got {epilogue!r}")
    return Problem(m, n, k, a_major, b_major, epilogue=check_epilogue(epilogue or Epilogue()))


def parse_epilogue(text: str) -> Epilogue:
    """'bias=n gelu residual out=f16' or 'gate=silu halves=stacked' (the DSL's epilogue items, in any
    order, commas allowed between them) -> Epilogue."""
    try:
        return dsl_parse_epilogue(" ".join(text.replace(",", " ").split()))
    except ProgramError as exc:
        raise CompileError(f"epilogue {text!r}: {exc.message}") from None


def device_name(device=None) -> str:
    """The GPU name records are looked up by (cached per argument)."""
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = _resolve_device_name(device)
    return name


def _resolve_device_name(device) -> str:
    if isinstance(device, str) and not (device == "cuda" or device.startswith("cuda:")):
        return device
    try:
        import torch
    except ImportError:
        return DEFAULT_DEVICE_NAME
    if not torch.cuda.is_available():
        return DEFAULT_DEVICE_NAME
    return torch.cuda.get_device_name(torch.device("cuda", torch.cuda.current_device())
                                      if device is None else device)


def _db_token(db):
    if db is None:

        return ("path", str(default_db_path()))
    if isinstance(db, (str, Path)):
        return ("path", str(db))
    if not isinstance(db, Database):
        raise CompileError(f"db must be a path to a tuning database (str or Path) or a Database, "
                           f"not {type(db).__name__}")
    return ("object", id(db))


def _index(token, db, gpu: str):
    index = _INDEXES.get((token, gpu))
    if index is None:
        if isinstance(db, Database):
            layers = [("user", db), ("shipped", shipped_database())]
        else:
            layers = open_layers(token[1])
        index = _INDEXES[(token, gpu)] = WinnerIndex(layers, gpu, current=_current_device(gpu))
    return index


def _current_device(gpu: str):
    """This machine's GPU with its driver and toolchain, where it is the model the records are
    read for, so that winners measured under other versions do not serve; None without one
    (nothing to run here, so nothing to compare)."""
    if not gpu_present():
        return None
    here = this_device()
    return here if here.name == gpu else None


def _torch():
    """torch, or None where it is not installed (compile and inspect work without it)."""
    try:
        # Deferred: torch (optional, heavy to import).
        import torch
    except ImportError:
        return None
    return torch


def gpu_present() -> bool:
    """Whether torch sees a CUDA device here (tuning needs one; a kernel is checked and timed on one)."""
    torch = _torch()
    return torch is not None and torch.cuda.is_available()


def _torch_deterministic() -> bool:
    torch = _torch()
    return bool(torch and torch.are_deterministic_algorithms_enabled())


def _torch_speedup(trial) -> float:
    """A winner's speedup over torch.matmul, timed in its own session where it was (the library
    choice it competes with was timed that way too)."""

    speedups = trial.speedups()
    return speedups.get(SAME_SESSION_BASELINE, speedups.get("torch", 0.0))


def _library_speedups(choice) -> dict[str, float]:
    """Over torch.matmul, offline and (where timed) in server mode."""
    speedups = {"torch": choice.speedup}
    if choice.server_ms and choice.torch_server_ms:
        speedups["torch, server mode"] = choice.torch_server_ms / choice.server_ms
    return speedups


def _lookup(problem: Problem, gpu: str, index, *, deterministic: bool = False) -> Kernel:
    found = index.lookup(problem)
    served = index.library_choice(problem)
    skipped = ""           # why the winner does not serve, where that decides
    if found is not None:
        try:
            program = parse(found.trial.program).bind(problem)
            if deterministic and not program.deterministic:
                skipped = f"the program measured fastest here on {gpu} adds split-K partials in arrival order"
            elif served is None or _torch_speedup(found.trial) >= served[1].speedup:
                return Kernel(problem, program, _provenance(found, gpu, "exact", "measured at this shape"))
        except ProgramError as exc:  # written by an older DSL: say so, then look further
            warnings.warn(f"gemmgen: the tuned program of trial #{found.trial.id} ({found.layer} database) "
                          f"no longer parses ({exc}); re-tune {problem.key}", RuntimeWarning)
    if served is not None:
        layer, choice = served
        return Kernel(problem, None, Provenance(
            "library", gpu, layer=layer, tuned_problem=problem.key, device_ms=choice.device_ms,
            spread=choice.spread, noise=choice.noise, speedups=_library_speedups(choice),
            best_baseline="torch", best_baseline_ms=choice.torch_ms, date=choice.created,
            note=f"cuBLASLt {choice.version}: the fastest of {choice.candidates} algorithms, "
                 "timed beside torch.matmul"), library=choice)
    if skipped:
        return Kernel(problem, None, Provenance(
            "baseline", gpu, best_baseline_ms=found.trial.best_baseline[1].device_ms if found.trial.best_baseline
            else None, note=f"{skipped}, and determinism was asked for; serving torch.matmul (cuBLAS)"))
    stale = index.stale_winner(problem)
    if stale is not None:
        here = toolchain_of(index.current, stale.trial.backend)
        return Kernel(problem, None, Provenance(
            "baseline", gpu, best_baseline_ms=index.tuned.get(problem.key),
            note=f"the fastest program for this shape (record #{stale.trial.id}) was measured under "
                 f"{stale.trial.toolchain}, and this machine has {here}: re-tune the shape to serve it; "
                 "serving torch.matmul (cuBLAS)"))
    searched = problem.key in index.library_searched
    # what the baselines measured here, by a program run or beside a library search
    baseline_ms = min((t for t in (index.tuned.get(problem.key), index.library_searched.get(problem.key)) if t),
                      default=None)
    if problem.key in index.tuned:
        lost = "neither a program nor a cuBLASLt algorithm" if searched else "no program"
        return Kernel(problem, None, Provenance(
            "baseline", gpu, best_baseline_ms=baseline_ms,
            note=f"{lost} beat cuBLAS when this shape was tuned on {gpu}; serving torch.matmul (cuBLAS)"))
    if searched:
        return Kernel(problem, None, Provenance(
            "baseline", gpu, best_baseline="torch" if baseline_ms else None, best_baseline_ms=baseline_ms,
            note=f"no cuBLASLt algorithm beat torch.matmul when this shape was searched on {gpu}; "
                 "serving torch.matmul (cuBLAS)"))
    return Kernel(problem, None, Provenance("baseline", gpu, note=f"no tuned kernel for this shape on {gpu}; "
                                            "serving torch.matmul (cuBLAS)"))


def _provenance(found, gpu: str, how: str, note: str) -> Provenance:
    t = found.trial
    best = t.best_baseline
    return Provenance(
        how=how, gpu=gpu, trial_id=t.id, layer=found.layer, tuned_problem=t.problem.key,
        speedups=t.speedups(), device_ms=t.device_ms, spread=t.spread,
        noise=t.noise, best_baseline=best[0] if best else None,
        best_baseline_ms=best[1].device_ms if best else None,
        proposer=f"{t.proposer} {t.proposer_version}".strip(), date=t.created, note=note, backend=t.backend)


def prebuild(problems, *, device=None, db=None, jobs: Optional[int] = None) -> dict:
    """Build, in parallel on every core, the artifacts of the kernels compile() picks for
    `problems` into the on-disk cache, so that first calls load instead of compiling.
    Returns counts: kernels, baselines (nothing to build), built, failed."""
    return build_ahead([compile(p, device=device, db=db) for p in problems], jobs=jobs)


class _CallableModule(type(threading)):
    """`gemmgen.compile` may name this module (once it was imported by name) or the function;
    both calls work."""

    def __call__(self, *args, **kwargs) -> Kernel:
        return compile(*args, **kwargs)


def bench_candidate(problem):
    """`gemmgen bench`'s candidate 'gemmgen': the kernel a user gets, in the harness's calling
    convention `fn(a, b, out, *, bias, residual, c, alpha, beta)`."""
    kernel = compile(problem)

    def fn(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        kernel(a, b, bias=bias, residual=residual, c=c, out=out, alpha=alpha, beta=beta)

    fn.kernel = kernel      # provenance for whoever wants it
    return fn


def bench_candidate_notes(problem) -> dict:
    """What `compile` served for the bench's row: the winner, a library algorithm or the baseline."""
    kernel = compile(problem)
    p = kernel.provenance
    return {"how": p.how, "backend": kernel.backend}


sys.modules[__name__].__class__ = _CallableModule
