"""A vendor library's own algorithms as candidates: the fastest cuBLASLt algorithm per problem.

cuBLAS picks one algorithm per call by heuristic; cuBLASLt offers the list behind that
pick. On the H200 the fastest of that list measured up to 1.2x torch.matmul on shapes
with small K (benchmarks/results/gemmgen_sample100_offline_s5, the `lt_autotune`
baseline). `search_cublaslt` does what the tuning database needs to serve such an
algorithm honestly:

1. time every algorithm the heuristic offers (up to 100) with the device timer, cold L2;
2. check the fastest one on fresh random inputs (`gemmgen.measure.check`);
3. time it beside torch.matmul, interleaved in one session, so the comparison shares the
   GPU's clock state (a separate session can differ by 10 % or more under the power cap:
   benchmarks/results/process_bias/).

It runs in the isolated worker (`library_job`), like every candidate, and returns plain
data the tuning loop records as a `tuning_db.LibraryChoice`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

from gemmgen.dsl.ir import Problem
from gemmgen.measure.timing import TimingOptions

LIBRARY = "cublaslt"
#: calls per algorithm while choosing (the median of 10 separates algorithms a few % apart;
#: the chosen one is then timed with the full options beside torch.matmul)
SELECTION_REPS = 10


def search_cublaslt(problem: Problem, seed: Optional[int] = None, timing_options=None) -> dict[str, Any]:
    """Select, check and time the fastest cuBLASLt algorithm for `problem` (needs a GPU).

    The chosen algorithm is checked and timed through its recorded text form and the
    launcher that `gemmgen.compile` serves, so what is recorded is what runs later."""
    from gemmgen.measure.baselines import algorithm_config, algorithm_to_hex, autotune_lt, cublaslt_version, make_torch
    from gemmgen.measure.checking import check
    from gemmgen.measure.timing import time_many

    options = timing_options or TimingOptions()
    # selection among up to 100 algorithms: fewer calls each; the chosen one is timed in full below
    lt, algos, index, _ = autotune_lt(problem, replace(options, min_reps=SELECTION_REPS,
                                                       max_reps=max(SELECTION_REPS, options.max_reps // 4)))
    chosen = algos[index]
    version = cublaslt_version() or ""
    record: dict[str, Any] = {"library": LIBRARY, "version": version, "candidates": len(algos),
                              "config": algorithm_config(chosen), "algorithm": algorithm_to_hex(chosen)}
    del lt, algos, chosen
    fn = library_launcher(problem, record["algorithm"], version)
    checked = check(fn, problem, seed=seed)
    record.update(check_passed=checked.passed, max_rel_err=checked.max_rel_err, err_bound=checked.bound,
                  check_seed=checked.seed, check_failures=list(checked.failures))
    if not checked.passed:
        return record
    timed = time_many([("library", fn, problem), ("torch", make_torch(problem).fn, problem)],
                      "offline", options=options)
    failed = [f"{name} could not be timed: {t}" for name, t in timed.items() if isinstance(t, Exception)]
    if failed:
        record["error"] = "; ".join(failed)
        return record
    mine, torch_ = timed["library"], timed["torch"]
    record.update(device_ms=mine.device_ms, spread=mine.spread, host_ms=mine.host_ms, torch_ms=torch_.device_ms,
                  torch_spread=torch_.spread, torch_host_ms=torch_.host_ms, clocks=mine.clocks)
    return record


def library_job(problem: Problem, seed: Optional[int], timing_options) -> Callable[[], dict]:
    """A gemmgen.measure.worker plain job's load function: the search, to be called in the worker."""
    return lambda: search_cublaslt(problem, seed, timing_options)


def library_launcher(problem: Problem, algorithm_hex: str, version: str) -> Callable:
    """The harness-convention call of a recorded cuBLASLt algorithm (needs a GPU).

    An algorithm is valid for the cuBLASLt version that offered it; under another version
    this raises, and the caller falls back to torch.matmul."""
    from gemmgen.errors import GemmgenError
    from gemmgen.measure.baselines import cublaslt_version

    here = cublaslt_version()
    if version and here and here != version:
        raise GemmgenError(f"the cuBLASLt algorithm was recorded with cuBLASLt {version}; this is {here}")
    return DirectLt(problem, algorithm_hex).call


class DirectLt:
    """One cublasLtMatmul per product, with the descriptors nvmath planned for the problem.

    nvmath's `Matmul.execute` costs about 40 us of host time per call more than
    torch.matmul (stream and workspace bookkeeping, and `reset_operands` for every new
    tensor); a graph of many small products would wait on the host. Here nvmath plans once
    (layouts, compute type, the recorded algorithm) and each call is one binding call with
    the operands' pointers, on torch's current stream, with a workspace allocated once."""

    def __init__(self, problem: Problem, algorithm_hex: str):
        import torch
        from nvmath.bindings import cublasLt

        from gemmgen.measure.baselines import LtMatmul, algorithm_from_hex

        self.problem = problem
        self._plan = LtMatmul(problem, algorithms=[algorithm_from_hex(algorithm_hex)])
        mm = self._plan.mm
        chosen = mm.algorithm_object_to_buffer[self._plan.algorithms[0]]
        self._algo = chosen["algo"]                       # the struct cuBLASLt reads; kept alive here
        size = int(chosen["workspace_size"].reshape(-1)[0])  # a one-record array
        self._workspace = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
        self._matmul = cublasLt.matmul
        self._alpha, self._beta = mm.alpha, mm.beta       # host scalars (numpy), read at each call
        self._static = (mm.handle, mm.mm_desc, mm.alpha.ctypes.data, mm.a_layout_ptr, mm.b_layout_ptr,
                        mm.beta.ctypes.data, mm.c_layout_ptr, mm.d_layout_ptr, self._algo.ctypes.data,
                        self._workspace.data_ptr(), size)
        self._stream = torch.cuda.current_stream
        self._device = torch.cuda.current_device()        # descriptors and workspace live there
        self._plan.drop_operands()                        # A, B and C of planning: not needed now

    def call(self, a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        from gemmgen.measure.baselines import _epilogue_after

        if a.device.index != self._device:
            from gemmgen.errors import GemmgenError
            raise GemmgenError(f"this cuBLASLt kernel was planned on cuda:{self._device}; the operands are on "
                               f"{a.device}: use one kernel per GPU, first called while that GPU is current")
        handle, desc, alpha_ptr, a_layout, b_layout, beta_ptr, c_layout, d_layout, algo, ws, size = self._static
        self._alpha[0], self._beta[0] = alpha, beta
        if beta != 0.0:
            out.copy_(c)                  # in place: C is out, so beta*C needs c copied in first
        ptr = out.data_ptr()
        self._matmul(handle, desc, alpha_ptr, a.data_ptr(), a_layout, b.data_ptr(), b_layout, beta_ptr,
                     ptr, c_layout, ptr, d_layout, algo, ws, size, self._stream().cuda_stream)
        _epilogue_after(out, self.problem, bias, residual)


__all__ = ["DirectLt", "LIBRARY", "library_job", "library_launcher", "search_cublaslt"]
