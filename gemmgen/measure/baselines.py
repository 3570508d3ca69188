"""Baselines every claim is measured against, as kernels with the common calling convention.

`make(name, problem)` returns a `Kernel`: the fn, the problem it actually runs (cuBLAS
NN/TN change B's storage, the way a user stores a weight), and notes recorded with
each result. Epilogues are done as a user would: after the product, with torch ops
in place on `out`; alpha and beta go into the GEMM call itself (torch.addmm, cuBLASLt).

- `torch`: torch.matmul(a, b, out=out) on the problem's own layout.
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

nvmath and torch are imported inside the factories: this module imports anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional

from gemmgen.dsl.ir import Problem
from gemmgen.measure.errors import MeasureError, UnknownName

WORKSPACE_BYTES = 32 << 20
AUTOTUNE_LIMIT = 100


@dataclass(frozen=True)
class Kernel:
    name: str
    fn: Callable
    problem: Problem
    notes: Mapping[str, Any] = field(default_factory=dict)


def _epilogue_after(out, problem: Problem, bias, residual) -> None:
    """bias, activation, residual as torch ops in place on out (alpha/beta already applied)."""
    import torch

    ep = problem.epilogue
    if ep.bias == "n":
        out.add_(bias)
    elif ep.bias == "m":
        out.add_(bias[:, None])
    if ep.activation == "relu":
        out.relu_()
    elif ep.activation == "gelu":
        out.copy_(torch.nn.functional.gelu(out))
    elif ep.activation == "silu":
        torch.nn.functional.silu(out, inplace=True)
    if ep.residual:
        out.add_(residual)


def _torch_fn(problem: Problem) -> Callable:
    import torch

    plain = problem.epilogue.alpha == 1.0 and problem.epilogue.beta == 0.0

    def fn(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        if plain:
            torch.matmul(a, b, out=out)
        else:
            torch.addmm(c if beta != 0.0 else out, a, b, beta=beta, alpha=alpha, out=out)
        _epilogue_after(out, problem, bias, residual)

    return fn


def make_torch(problem: Problem, **_) -> Kernel:
    return Kernel("torch", _torch_fn(problem), problem, {"call": "torch.matmul / torch.addmm, epilogue as torch ops"})


def make_cublas_nn(problem: Problem, **_) -> Kernel:
    p = replace(problem, b_major="row")
    return Kernel("cublas_nn", _torch_fn(p), p, {"b_major": "row", "cublas_ops": "N,N"})


def make_cublas_tn(problem: Problem, **_) -> Kernel:
    p = replace(problem, b_major="col")
    return Kernel("cublas_tn", _torch_fn(p), p, {"b_major": "col", "cublas_ops": "T,N"})


class LtMatmul:
    """One planned nvmath Matmul bound to whatever tensors the caller passes in."""

    def __init__(self, problem: Problem, limit: int = 1, algorithms: Optional[list] = None):
        """Plan with cuBLASLt's heuristic (up to `limit` algorithms), or with the given ones."""
        import torch
        from nvmath.linalg.advanced import Matmul, MatmulComputeType, MatmulOptions, MatmulPlanPreferences

        from gemmgen.measure.timing import _operands

        self.problem = problem
        (a, b, out), kwargs = _operands(problem, seed=0, device="cuda")
        options = MatmulOptions(inplace=True, memory_limit=WORKSPACE_BYTES,
                                compute_type=MatmulComputeType.COMPUTE_32F)
        ep = problem.epilogue
        self.mm = Matmul(a, b, c=out, alpha=ep.alpha, beta=ep.beta, options=options,
                         stream=torch.cuda.current_stream())
        if algorithms is not None:
            self.algorithms = self.mm.plan(algorithms=algorithms, stream=torch.cuda.current_stream())
        else:
            self.algorithms = self.mm.plan(preferences=MatmulPlanPreferences(limit=limit),
                                           stream=torch.cuda.current_stream())
        self.bound = (a.data_ptr(), b.data_ptr(), out.data_ptr())
        self._keep = (a, b, out)

    def fn(self, algorithm=None) -> Callable:
        import torch

        problem = self.problem

        def call(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
            ptrs = (a.data_ptr(), b.data_ptr(), out.data_ptr())
            stream = torch.cuda.current_stream()
            if ptrs != self.bound:
                self.mm.reset_operands(a=a, b=b, c=out, stream=stream)
                self.bound, self._keep = ptrs, (a, b, out)
            if beta != 0.0:
                out.copy_(c)          # in place: C is out, so beta*C needs c copied in first
            self.mm.execute(algorithm=algorithm, stream=stream)
            _epilogue_after(out, problem, bias, residual)

        return call

    def drop_operands(self) -> None:
        """Release the tensors planning used (a caller that passes its own pointers to
        cublasLtMatmul keeps only the descriptors); `fn` must not be used afterwards."""
        self.mm.operands = None
        self._keep = self.bound = None

    def notes(self) -> dict[str, Any]:
        notes: dict[str, Any] = {"workspace_cap_bytes": WORKSPACE_BYTES, "compute_type": "COMPUTE_32F",
                                 "epilogue": "alpha/beta in cuBLASLt; bias, activation, residual as torch ops"}
        version = cublaslt_version()
        if version:
            notes["cublaslt_version"] = version
        return notes


def make_lt_heuristic(problem: Problem, **_) -> Kernel:
    lt = LtMatmul(problem, limit=1)
    return Kernel("lt_heuristic", lt.fn(), problem, lt.notes())


def autotune_lt(problem: Problem, timing_options=None) -> tuple[LtMatmul, list, int, dict]:
    """Time every algorithm cuBLASLt's heuristic offers (up to AUTOTUNE_LIMIT) with our device
    timer (cold L2): (the planned matmul, its algorithms, the fastest one's index, the timings)."""
    from gemmgen.measure.timing import time_many

    lt = LtMatmul(problem, limit=AUTOTUNE_LIMIT)
    algos = list(lt.algorithms)
    timed = time_many([(f"algo{i}", lt.fn(alg), problem) for i, alg in enumerate(algos)],
                      "offline", options=timing_options)
    ok = {name: t for name, t in timed.items() if not isinstance(t, Exception)}
    if not ok:
        first = next(iter(timed.values()))
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
    return Kernel("lt_autotune", lt.fn(algos[index]), problem, notes)


def algorithm_to_hex(algorithm) -> str:
    """A cuBLASLt algorithm (nvmath Algorithm) as text: its serialised heuristic result."""
    return algorithm.as_numpy().tobytes().hex()


def algorithm_from_hex(text: str):
    """The nvmath Algorithm `algorithm_to_hex` wrote (valid for the same cuBLASLt version)."""
    import numpy as np
    from nvmath.bindings.cublasLt import matmul_heuristic_result_dtype
    from nvmath.linalg.advanced import Algorithm

    return Algorithm.from_numpy(np.frombuffer(bytes.fromhex(text), dtype=matmul_heuristic_result_dtype))


def algorithm_config(algorithm) -> dict[str, Any]:
    """What a reviewer reads of a cuBLASLt algorithm: id, tile, stages, split-K, swizzle, cluster."""
    out: dict[str, Any] = {}
    for name in ("algorithm_id", "tile", "stages", "split_k", "reduction_scheme", "cta_swizzling",
                 "custom_option", "inner_shape", "cluster_shape"):
        try:
            value = getattr(algorithm, name)
        except Exception:  # noqa: BLE001 - a field this cuBLASLt does not report
            continue
        out[name] = value if isinstance(value, (int, str, bool)) else str(value)
    return out


def cublaslt_version() -> Optional[str]:
    try:
        from nvmath.bindings import cublasLt
        return str(cublasLt.get_version())
    except Exception:  # noqa: BLE001
        return None


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


def make(name: str, problem: Problem, **kwargs) -> Kernel:
    try:
        factory = BASELINES[name]
    except KeyError:
        raise UnknownName(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}") from None
    return factory(problem, **kwargs)


def better_of(timings: Mapping[str, Optional[float]], parts: tuple[str, ...]) -> Optional[str]:
    """The part with the smallest device time (None where none was measured)."""
    measured = {p: t for p, t in timings.items() if p in parts and t is not None}
    return min(measured, key=measured.get) if measured else None
