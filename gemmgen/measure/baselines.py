"""Baselines every claim is measured against, as kernels with the common calling convention.

`make(name, problem)` returns a `Kernel`: the fn, the problem it actually runs (cuBLAS
NN/TN change B's storage, the way a user stores a weight), and notes recorded with
each result. Epilogues are done as a user would: after the product, with torch ops
in place on `out`; alpha and beta go into the GEMM call itself (torch.addmm, cuBLASLt),
and so does nn.Linear's bias (`Problem.linear_bias`: `torch.addmm(bias, a, b)` where rows are
16-byte aligned, `runtime.torch_call.bias_in_product`; cuBLASLt's BIAS epilogue), as every model
adds it.

- `torch`: torch.matmul(a, b, out=out) on the problem's own layout, with torch's own
  reduction setting (the user's baseline; gemmgen's served fallback sums in fp32).
- `cublas_nn` / `cublas_tn`: the same call with B stored row-major (cuBLAS receives
  N,N) or column-major, i.e. B = W.T (cuBLAS receives T,N: both operands K-contiguous).
  `cublas` is the better of the two as measured; the bench derives it (DERIVED).
- `lt_heuristic`: cuBLASLt's top-1 heuristic algorithm through nvmath-python's
  `Matmul` (compute type 32F), planned once with a 32 MiB workspace cap, executed per
  call on the current stream, writing `out` in place (inplace=True with C = out).
- `lt_autotune`: every algorithm the heuristic returns when asked for 100 (nvmath's
  `MatmulPlanPreferences.limit` defaults to 8 and is passed unchanged to
  cublasLtMatmulAlgoGetHeuristic as requestedAlgoCount: the 8 seen before was nvmath's
  default; what cuBLASLt returns for 100 is recorded as `n_algorithms`), each timed with
  this room's cold-L2 device timer; the fastest is kept (select with the timer you report with).

A gated problem (out = gate(A B_gate) * (A B_up) over a joined B) has no library epilogue: each
baseline runs its product over the joined B (M x 2N x K) into a scratch and the gate's tail as
torch ops after it (runtime.epilogue.with_gate_tail), what a user without the fused kernel writes.

The calls themselves live in `gemmgen.runtime` (torch_call, cublaslt), which serving uses too.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional

from gemmgen.dsl.ir import Problem
from gemmgen.measure.errors import MeasureError, UnknownName
from gemmgen.measure.timing import time_many
from gemmgen.runtime.cublaslt import LtMatmul
from gemmgen.runtime.epilogue import in_place_source, product_problem, with_gate_tail
from gemmgen.runtime.torch_call import torch_call

AUTOTUNE_LIMIT = 100


@dataclass(frozen=True)
class Kernel:
    name: str
    fn: Callable
    problem: Problem
    notes: Mapping[str, Any] = field(default_factory=dict)
    close: Optional[Callable[[], None]] = None     # frees what the kernel holds (a cuBLASLt plan)


def make_torch(problem: Problem, **_) -> Kernel:
    """torch.matmul as the user calls it: torch's own reduction setting, not the fp32 reduction
    gemmgen serves (gemmgen.runtime.torch_call); where it fails the check, the bench says so."""
    return Kernel("torch", torch_call(problem, fp32_reduction=False), problem,
                  {"call": "torch.matmul / torch.addmm (a bias over N in addmm), epilogue as torch ops"})


def make_cublas_nn(problem: Problem, **_) -> Kernel:
    p = replace(problem, b_major="row")
    return Kernel("cublas_nn", torch_call(p, fp32_reduction=False), p, {"b_major": "row", "cublas_ops": "N,N"})


def make_cublas_tn(problem: Problem, **_) -> Kernel:
    p = replace(problem, b_major="col")
    return Kernel("cublas_tn", torch_call(p, fp32_reduction=False), p, {"b_major": "col", "cublas_ops": "T,N"})


def make_lt_heuristic(problem: Problem, **_) -> Kernel:
    lt = LtMatmul(problem, limit=1)
    return Kernel("lt_heuristic", lt.fn(), problem, lt.notes(), close=lt.free)


def autotune_lt(problem: Problem, timing_options=None) -> tuple[LtMatmul, list, int, dict]:
    """Time every algorithm cuBLASLt's heuristic offers (up to AUTOTUNE_LIMIT) with our device
    timer (cold L2): (the planned matmul, its algorithms, the fastest one's index, the timings)."""

    lt = LtMatmul(problem, limit=AUTOTUNE_LIMIT)
    algos = list(lt.algorithms)
    timed = time_many([(f"algo{i}", lt.fn(alg), problem) for i, alg in enumerate(algos)],
                      "offline", options=timing_options)
    ok = {name: t for name, t in timed.items() if not isinstance(t, Exception)}
    if not ok:
        # Deferred: torch (optional, heavy to import).
        import torch

        first = next(iter(timed.values()))
        if isinstance(first, torch.OutOfMemoryError):
            raise first           # the caller says the problem did not fit, never drops the baseline
        raise MeasureError(f"lt_autotune: no cuBLASLt candidate could be timed ({first})")
    best = min(ok, key=lambda name: ok[name].device_ms)
    return lt, algos, int(best[len("algo"):]), ok


def make_lt_autotune(problem: Problem, *, timing_options=None, **_) -> Kernel:
    """The fastest of cuBLASLt's heuristic candidates, as our timer measures them."""
    lt, algos, index, ok = autotune_lt(problem, timing_options)
    notes = lt.notes()
    notes.update({
        "n_algorithms": len(algos), "requested": AUTOTUNE_LIMIT, "chosen_index": index,
        "chosen_algorithm_id": getattr(algos[index], "algorithm_id", None),
        "selection_device_ms": {n: round(t.device_ms, 6) for n, t in ok.items()},
        "selection_timer": "cupti, offline, cold L2",
    })
    return Kernel("lt_autotune", lt.fn(algos[index]), problem, notes, close=lt.free)


BASELINES: dict[str, Callable[..., Kernel]] = {
    "torch": make_torch,
    "cublas_nn": make_cublas_nn,
    "cublas_tn": make_cublas_tn,
    "lt_heuristic": make_lt_heuristic,
    "lt_autotune": make_lt_autotune,
}
# Names measured as the better of others, per shape.
DERIVED: dict[str, tuple[str, ...]] = {"cublas": ("cublas_nn", "cublas_tn")}


def names() -> tuple[str, ...]:
    return tuple(BASELINES) + tuple(DERIVED)


def expand(requested: list[str]) -> list[str]:
    """The baselines to measure for a request: derived names pull in their parts."""
    unknown = [n for n in requested if n not in BASELINES and n not in DERIVED]
    if unknown:
        raise UnknownName(f"unknown baseline(s) {', '.join(unknown)}; choose from {', '.join(names())}")
    measured: list[str] = []
    for name in requested:
        for part in DERIVED.get(name, (name,)):
            if part not in measured:
                measured.append(part)
    return measured


def warm_up_timer() -> None:
    """Pay the timer's one-time start-up on a tiny product: a process's first `time_many` took
    5.8 s on the H200 (the profiler's and cuBLAS's set-up), the next ones 0.2 s."""
    problem = Problem(64, 64, 64)
    time_many([("warm-up", make_torch(problem).fn, problem)])


def make(name: str, problem: Problem, **kwargs) -> Kernel:
    try:
        factory = BASELINES[name]
    except KeyError:
        raise UnknownName(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}") from None
    if not problem.epilogue.gate:
        return factory(problem, **kwargs)
    product = factory(product_problem(problem), **kwargs)
    gated = replace(problem, b_major=product.problem.b_major)
    return Kernel(name, with_gate_tail(product.fn, gated), gated,
                  {**product.notes, "gate_tail": "; ".join(in_place_source(problem.epilogue))},
                  close=product.close)


def release(kernels: list[Kernel]) -> None:
    """Free the kernels' plans and hand their GPU memory back: a caller timing problem after
    problem (tuning, the bench) calls this after each, so that nothing one problem allocated
    is still held at the next."""
    # Deferred: torch (optional, heavy to import).
    import torch

    for kernel in kernels:
        if kernel.close is not None:
            kernel.close()
    kernels.clear()
    gc.collect()          # a plan's objects can sit in reference cycles that hold GPU tensors
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def better_of(timings: Mapping[str, Optional[float]], parts: tuple[str, ...]) -> Optional[str]:
    """The part with the smallest device time (None where none was measured)."""
    measured = {p: t for p, t in timings.items() if p in parts and t is not None}
    return min(measured, key=measured.get) if measured else None
