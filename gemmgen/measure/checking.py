"""check(fn, problem): is this kernel right, by rules a cheating kernel cannot pass.

(Implemented here; check.py re-exports it as a callable module, so `gemmgen.measure.check`
is callable however it was imported.)

Each case (cases.py: main, precision probe, mantissa probe, second input set) runs this protocol:

1. operands are allocated in the problem's majors and hold zeros (decoys); `out` is a
   view 4 KiB into a larger buffer whose two guard bands hold a sentinel bit pattern;
2. on a fresh non-default stream S: a busy kernel (~1 ms), then the real input values
   are copied in, then `out` is poisoned with NaN and the guards re-armed, then
   `fn(a, b, out, ...)` is called with S current, then S copies out to pinned host
   memory (copy engine: it does not queue behind kernels holding the SMs);
3. the host waits for S only (not the device) and judges that snapshot, then waits for
   the device and judges the final state: out, guards, inputs.

So a kernel that works on another stream without ordering itself after S reads the
decoys or writes before the poison; one that does not join S back is caught
unfinished in the snapshot. Failing rules: any NaN left in out (unwritten elements),
a guard byte changed (out-of-bounds write), an input changed, the relative Frobenius
error above the bound or any element off by more than the elementwise bound
(numerics.py) on any case (the precision probe fails fp16 accumulation, the mantissa
probe inputs rounded to bf16), and identical outputs for two different input sets (constant or
input-independent output). On CPU tensors (device="cpu", for tests of the harness)
the stream steps are skipped.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from gemmgen.dsl.ir import Problem
from gemmgen.errors import NoGPUError
from gemmgen.measure.cases import (
    BITS_DTYPES,
    TORCH_DTYPES,
    Case,
    bits,
    empty_laid_out,
    fresh_seed,
    make_cases,
)
from gemmgen.measure.errors import MeasureError

GUARD_BYTES = 4096          # each side; out starts 4 KiB in, as aligned as a fresh allocation
SENTINEL = 0x5A5A           # guard pattern (0x5A5A5A5A for 4-byte outputs)
SPIN_MS = 1.0               # busy kernel ahead of the call on the calling stream
ASSUMED_CLOCK_HZ = 1.98e9   # H200 boost clock; a slower clock only lengthens the spin


@dataclass(frozen=True)
class CaseResult:
    name: str
    seed: int
    rel_err: float
    bound: float
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    max_rel_err: float
    bound: float                      # the main case's bound
    seed: int
    failures: tuple[str, ...]
    cases: tuple[CaseResult, ...] = ()
    problem: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cases"] = [asdict(c) for c in self.cases]
        return d


@dataclass
class _Slots:
    """The tensors handed to the kernel for one case, and where out lives in its buffer."""

    a: torch.Tensor
    b: torch.Tensor
    extras: dict[str, torch.Tensor]
    buffer: torch.Tensor
    out: torch.Tensor
    guard: int
    size: int


def _new_slots(problem: Problem, device) -> _Slots:
    m, n, k = problem.m, problem.n, problem.k
    ep = problem.epilogue
    in_dt, out_dt = TORCH_DTYPES[problem.in_dtype], TORCH_DTYPES[ep.out_dtype]
    a = empty_laid_out(m, k, problem.a_major, in_dt, device).zero_()
    b = empty_laid_out(k, problem.b_cols, problem.b_major, in_dt, device).zero_()
    extras: dict[str, torch.Tensor] = {}
    if ep.bias:
        extras["bias"] = torch.zeros((n if ep.bias == "n" else m,), dtype=out_dt, device=device)
    if ep.residual:
        extras["residual"] = empty_laid_out(m, n, problem.c_major, out_dt, device).zero_()
    if ep.beta != 0.0:
        extras["c"] = empty_laid_out(m, n, problem.c_major, out_dt, device).zero_()
    item = torch.empty((), dtype=out_dt).element_size()
    guard = GUARD_BYTES // item
    size = m * n
    buffer = torch.empty(guard + size + guard, dtype=out_dt, device=device)
    if problem.c_major == "row":
        out = buffer.as_strided((m, n), (n, 1), guard)
    else:
        out = buffer.as_strided((m, n), (1, m), guard)
    return _Slots(a, b, extras, buffer, out, guard, size)


def _arm(slots: _Slots, case: Case, problem: Problem) -> None:
    """Copy the case's values in, poison out with NaN, fill the guards with the sentinel."""
    slots.a.copy_(case.a)
    slots.b.copy_(case.b)
    for name, t in slots.extras.items():
        t.copy_(getattr(case, name))
    raw = slots.buffer.view(BITS_DTYPES[slots.buffer.dtype])
    pattern = SENTINEL if raw.element_size() == 2 else (SENTINEL << 16) | SENTINEL
    raw[: slots.guard].fill_(pattern)
    raw[slots.guard + slots.size:].fill_(pattern)
    slots.out.fill_(float("nan"))


def _call(fn: Callable, slots: _Slots, problem: Problem) -> None:
    ep = problem.epilogue
    fn(slots.a, slots.b, slots.out, alpha=ep.alpha, beta=ep.beta, **slots.extras)


def _out_view(storage: torch.Tensor, problem: Problem) -> torch.Tensor:
    """out's logical (M, N) view of its own storage (M*N elements, c_major)."""
    m, n = problem.m, problem.n
    return storage.as_strided((m, n), (n, 1) if problem.c_major == "row" else (1, m), 0)


def _snapshot_out(slots: _Slots, on_gpu: bool) -> torch.Tensor:
    """out as the calling stream sees it now, copied by the copy engine (DMA to pinned host
    memory), so the snapshot does not wait for SMs a still-running side kernel holds."""
    region = slots.buffer[slots.guard: slots.guard + slots.size]
    if not on_gpu:
        return region.clone()
    host = torch.empty(region.shape, dtype=region.dtype, pin_memory=True)
    host.copy_(region, non_blocking=True)
    return host


_HINTS = {"precision": " (fp16 accumulation?)", "mantissa": " (inputs rounded to bf16 or narrower?)"}


def out_stats(out: torch.Tensor, case: Case) -> torch.Tensor:
    """[unwritten elements, squared Frobenius error, elements past the elementwise bound], as
    one fp64 tensor on out's device, computed without waiting for it (the timing loop judges
    its sampled calls this way and reads the numbers after the loop)."""
    diff = out.float() - case.ref            # exact enough: ref is fp32, out at most fp32
    unwritten = torch.isnan(out).sum().double()
    over = (diff.abs() > case.tol).sum().double() if case.tol is not None else unwritten * 0
    return torch.stack([unwritten, diff.double().square().sum(), over])


@dataclass(frozen=True)
class Reading:
    """What reading a check's numbers needs of its case, kept where the case's tensors are not."""

    name: str
    bound: float
    norm_ref: float

    @classmethod
    def of(cls, case: Case) -> "Reading":
        return cls(case.name, case.bound, float(torch.linalg.vector_norm(case.ref, dtype=torch.float64)))


def stat_failures(stats: torch.Tensor, reading: Reading, problem: Problem) -> tuple[list[str], float]:
    """The failures `out_stats` shows, and the relative error (nan if unwritten)."""
    unwritten, err_sq, over = (float(x) for x in stats.cpu())
    if unwritten:
        return [f"{int(unwritten)} of {problem.m * problem.n} output elements not written (still NaN)"], math.nan
    rel_err = math.sqrt(err_sq) / reading.norm_ref if reading.norm_ref > 0 else math.inf
    if not math.isfinite(rel_err):
        return ["output holds inf: overflow or garbage"], rel_err
    hint = _HINTS.get(reading.name, "")
    failures = []
    if rel_err > reading.bound:
        failures.append(f"relative error {rel_err:.3g} above the bound {reading.bound:.3g} on the "
                        f"{reading.name} case{hint}")
    if over:
        failures.append(f"{int(over)} of {problem.m * problem.n} elements off by more than the elementwise bound "
                        f"on the {reading.name} case{hint}")
    return failures, rel_err


def judge_out(out: torch.Tensor, case: Case, problem: Problem) -> tuple[list[str], float]:
    """Unwritten elements, the normwise error against the reference (nan if unwritten) and
    the elements past the elementwise bound (with the worst of them)."""
    failures, rel_err = stat_failures(out_stats(out, case), Reading.of(case), problem)
    if case.tol is not None and any("elementwise" in f for f in failures):
        excess = (out.float() - case.ref).abs() - case.tol
        i, j = divmod(int(torch.argmax(excess)), problem.n)
        failures = [f + (f"; worst at ({i}, {j}): out {float(out[i, j]):.6g}, reference "
                         f"{float(case.ref[i, j]):.6g}, allowed error {float(case.tol[i, j]):.3g}"
                         if "elementwise" in f else "") for f in failures]
    return failures, rel_err


def _judge_rest(slots: _Slots, case: Case) -> list[str]:
    """Guard bands intact, inputs unchanged (judged after the device is idle)."""
    failures: list[str] = []
    raw = slots.buffer.view(BITS_DTYPES[slots.buffer.dtype])
    pattern = SENTINEL if raw.element_size() == 2 else (SENTINEL << 16) | SENTINEL
    before = int((raw[: slots.guard] != pattern).sum())
    after = int((raw[slots.guard + slots.size:] != pattern).sum())
    if before or after:
        failures.append(f"out-of-bounds write: {before} element(s) before and {after} after out were changed")
    given = {"A": slots.a, "B": slots.b, **slots.extras}
    logical = {"A": case.a, "B": case.b, "bias": case.bias, "residual": case.residual, "c": case.c}
    for name, t in given.items():
        changed = int((bits(t) != bits(logical[name])).sum())
        if changed:
            failures.append(f"input {name} modified by the call ({changed} elements)")
    return failures


def _spin(device) -> None:
    torch.cuda._sleep(int(SPIN_MS * 1e-3 * ASSUMED_CLOCK_HZ))


def _run_case(fn: Callable, problem: Problem, case: Case, device) -> tuple[CaseResult, Optional[torch.Tensor]]:
    on_gpu = torch.device(device).type == "cuda"
    slots = _new_slots(problem, device)
    if on_gpu:
        torch.cuda.synchronize(device)
        stream = torch.cuda.Stream(device=device)
        ctx = torch.cuda.stream(stream)
    else:
        stream, ctx = None, contextlib.nullcontext()
    with ctx:
        if on_gpu:
            _spin(device)
        _arm(slots, case, problem)
        _call(fn, slots, problem)
        snapshot = _snapshot_out(slots, on_gpu)
    if on_gpu:
        stream.synchronize()        # the calling stream only: what a consumer on it would see
    early, early_err = judge_out(_out_view(snapshot.to(device), problem), case, problem)
    if on_gpu:
        torch.cuda.synchronize(device)
    late, rel_err = judge_out(slots.out, case, problem)
    failures = late + _judge_rest(slots, case)
    if early and not late:
        failures.append(
            "the result was not complete when the calling stream finished: work ran on another "
            "stream without being ordered with the current one (" + "; ".join(early) + ")"
        )
    if math.isnan(rel_err):
        rel_err = early_err
    out = None if torch.isnan(slots.out).any() else slots.out.clone()
    return CaseResult(case.name, case.seed, rel_err, case.bound, tuple(failures)), out


def _warm_up(fn: Callable, problem: Problem, device) -> None:
    """One call on decoy data first, so lazy compilation cannot open the race window."""
    slots = _new_slots(problem, device)
    slots.a.normal_()
    slots.b.normal_()
    _call(fn, slots, problem)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def check(fn: Callable, problem: Problem, *, seed: Optional[int] = None,
          cases: Optional[Sequence[Case]] = None, device: Any = "cuda") -> CheckResult:
    """Judge `fn` (called as fn(a, b, out, *, bias, residual, c, alpha, beta)) on `problem`.

    `cases` may be passed in to share inputs and references between kernels of one shape
    (their seed is then the one recorded); otherwise they are drawn from `seed` (fresh
    when None).
    """
    if not problem.is_bound:
        raise MeasureError(f"problem {problem.key} is shape-generic; bind M, N and K before checking")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise NoGPUError("check()")
    if cases is None:
        seed = fresh_seed() if seed is None else int(seed)
        cases = make_cases(problem, seed, device)
    else:
        first = cases[0]
        if first.shape != (problem.m, problem.n, problem.k):
            raise MeasureError(f"cases are for {first.shape}, the problem is {problem.key}")
        seed = first.seed
    notes = [] if any(c.name == "precision" for c in cases) else [f"precision probe skipped: K={problem.k} is too short"]
    try:
        _warm_up(fn, problem, device)
    except Exception as exc:  # noqa: BLE001 - any failure of the kernel is a verdict
        return _failed_call(problem, seed, exc, notes)
    results: list[CaseResult] = []
    outs: dict[str, torch.Tensor] = {}
    for case in cases:
        try:
            res, out = _run_case(fn, problem, case, device)
        except Exception as exc:  # noqa: BLE001
            return _failed_call(problem, seed, exc, notes, results)
        results.append(res)
        if out is not None:
            outs[case.name] = out
    failures = [f"{r.name}: {f}" for r in results for f in r.failures]
    if "main" in outs and "second" in outs and torch.equal(bits(outs["main"]), bits(outs["second"])):
        failures.append("the output is the same for two different input sets: constant or input-independent")
    errs = [r.rel_err for r in results if not math.isnan(r.rel_err)]
    max_err = max(errs) if errs and len(errs) == len(results) else math.nan
    return CheckResult(
        passed=not failures, max_rel_err=max_err, bound=results[0].bound, seed=seed,
        failures=tuple(failures), cases=tuple(results), problem=problem.key, notes=tuple(notes),
    )


def _failed_call(problem: Problem, seed: int, exc: Exception, notes, results=()) -> CheckResult:
    msg = f"the call raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return CheckResult(False, math.nan, math.nan, seed, (msg,), tuple(results), problem.key, tuple(notes))
