"""A recorded cuBLASLt algorithm, planned once through nvmath-python and called directly.

`LtMatmul` plans nvmath's Matmul for a problem (the baselines use it to time cuBLASLt's
heuristic and its candidates); `DirectLt` keeps that plan's descriptors and makes one
cublasLtMatmul call per product. nvmath is imported inside the functions that need it: it
is an optional dependency (the `gpu` extra).

nn.Linear's bias (`Problem.linear_bias`) goes into cuBLASLt's BIAS epilogue, as torch.addmm
puts it. That epilogue adds one value per row of a column-major result, so the product is
planned transposed: D^T = B^T A^T, whose rows are the problem's N columns, over the same bytes.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

import numpy as np
import torch

from gemmgen.backends.workspace import keep_for_current_stream, outside_graph_pool
from gemmgen.dsl.ir import Problem
from gemmgen.errors import GemmgenError
from gemmgen.runtime.epilogue import apply_in_place
from gemmgen.runtime.tensors import operands

WORKSPACE_BYTES = 32 << 20


class LtMatmul:
    """One planned nvmath Matmul bound to whatever tensors the caller passes in."""

    def __init__(self, problem: Problem, limit: int = 1, algorithms: Optional[list] = None):
        """Plan with cuBLASLt's heuristic (up to `limit` algorithms), or with the given ones."""
        # Deferred: nvmath (optional, heavy to import).
        from nvmath.linalg.advanced import (
            Matmul,
            MatmulComputeType,
            MatmulEpilog,
            MatmulOptions,
            MatmulPlanPreferences,
        )

        self.problem = problem
        self.bias_in_epilogue = problem.linear_bias
        #: what is left for torch ops after the product
        self.after = replace(problem.epilogue, bias=None) if self.bias_in_epilogue else problem.epilogue
        (a, b, out), kwargs = operands(problem, seed=0, device="cuda")
        options = MatmulOptions(inplace=True, memory_limit=WORKSPACE_BYTES,
                                compute_type=MatmulComputeType.COMPUTE_32F)
        ep = problem.epilogue
        first, second, result = self.planned(a, b, out)
        self.mm = Matmul(first, second, c=result, alpha=ep.alpha, beta=ep.beta, options=options,
                         stream=torch.cuda.current_stream())
        epilog = ({"epilog": MatmulEpilog.BIAS, "epilog_inputs": {"bias": kwargs["bias"]}}
                  if self.bias_in_epilogue else {})
        if algorithms is not None:
            self.algorithms = self.mm.plan(algorithms=algorithms, stream=torch.cuda.current_stream(), **epilog)
        else:
            self.algorithms = self.mm.plan(preferences=MatmulPlanPreferences(limit=limit),
                                           stream=torch.cuda.current_stream(), **epilog)
        self.bound = self._pointers(a, b, out, kwargs.get("bias"))
        self._keep = (a, b, out, kwargs.get("bias"))

    def planned(self, a, b, out) -> tuple:
        """The first and second operands and the result as cuBLASLt is given them: transposed
        views where the bias goes into the epilogue (module docstring)."""
        return (b.t(), a.t(), out.t()) if self.bias_in_epilogue else (a, b, out)

    def _pointers(self, a, b, out, bias) -> tuple:
        return (a.data_ptr(), b.data_ptr(), out.data_ptr(), bias.data_ptr() if self.bias_in_epilogue else 0)

    def fn(self, algorithm=None) -> Callable:
        after = self.after

        def call(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
            ptrs = self._pointers(a, b, out, bias)
            stream = torch.cuda.current_stream()
            if ptrs != self.bound:
                first, second, result = self.planned(a, b, out)
                inputs = {"epilog_inputs": {"bias": bias}} if self.bias_in_epilogue else {}
                self.mm.reset_operands(a=first, b=second, c=result, stream=stream, **inputs)
                self.bound, self._keep = ptrs, (a, b, out, bias)
            if beta != 0.0:
                out.copy_(c)          # in place: C is out, so beta*C needs c copied in first
            self.mm.execute(algorithm=algorithm, stream=stream)
            apply_in_place(out, after, bias, residual)

        return call

    def free(self) -> None:
        """Release the plan, its workspace and every tensor it holds now, not at some later
        garbage collection: a tuning run plans two of these at every problem, and at an LM
        head's size their memory, kept, ran an 80 GB GPU out (`fn` must not be used after)."""
        if self.mm is not None:
            self.mm.free()
        self.mm = None
        self._keep = self.bound = None

    def drop_operands(self) -> None:
        """Release the tensors planning used (a caller that passes its own pointers to
        cublasLtMatmul keeps only the descriptors); `fn` must not be used afterwards."""
        self.mm.operands = None
        self._keep = self.bound = None

    def notes(self) -> dict[str, Any]:
        notes: dict[str, Any] = {"workspace_cap_bytes": WORKSPACE_BYTES, "compute_type": "COMPUTE_32F",
                                 "epilogue": ("alpha/beta and nn.Linear's bias in cuBLASLt (planned transposed); "
                                              "activation, residual as torch ops" if self.bias_in_epilogue else
                                              "alpha/beta in cuBLASLt; bias, activation, residual as torch ops")}
        version = cublaslt_version()
        if version:
            notes["cublaslt_version"] = version
        return notes


def algorithm_to_hex(algorithm) -> str:
    """A cuBLASLt algorithm (nvmath Algorithm) as text: its serialised heuristic result."""
    return algorithm.as_numpy().tobytes().hex()


def algorithm_from_hex(text: str):
    """The nvmath Algorithm `algorithm_to_hex` wrote (valid for the same cuBLASLt version)."""
    # Deferred: nvmath (optional, heavy to import).
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


def library_launcher(problem: Problem, algorithm_hex: str, version: str) -> Callable:
    """The harness-convention call of a recorded cuBLASLt algorithm (needs a GPU).

    An algorithm is valid for the cuBLASLt version that offered it; under another version
    this raises, and the caller falls back to torch.matmul."""
    here = cublaslt_version()
    if version and here and here != version:
        raise GemmgenError(f"the cuBLASLt algorithm was recorded with cuBLASLt {version}; this is {here}")
    # The first call may be a CUDA graph's warm-up: planning's operands and the workspace kept
    # from call to call must not land in the graph's pool.
    device = torch.cuda.current_device()
    lt = outside_graph_pool(lambda: DirectLt(problem, algorithm_hex), device)
    keep_for_current_stream(lt.workspace, device)
    return lt.call


class DirectLt:
    """One cublasLtMatmul per product, with the descriptors nvmath planned for the problem.

    nvmath's `Matmul.execute` costs about 40 us of host time per call more than
    torch.matmul (stream and workspace bookkeeping, and `reset_operands` for every new
    tensor); a graph of many small products would wait on the host. Here nvmath plans once
    (layouts, compute type, the recorded algorithm) and each call is one binding call with
    the operands' pointers, on torch's current stream, with a workspace allocated once."""

    def __init__(self, problem: Problem, algorithm_hex: str):
        # Deferred: nvmath (optional, heavy to import).
        from nvmath.bindings import cublasLt

        self.problem = problem
        self._plan = LtMatmul(problem, algorithms=[algorithm_from_hex(algorithm_hex)])
        mm = self._plan.mm
        chosen = mm.algorithm_object_to_buffer[self._plan.algorithms[0]]
        self._algo = chosen["algo"]                       # the struct cuBLASLt reads; kept alive here
        size = int(chosen["workspace_size"].reshape(-1)[0])  # a one-record array
        self.workspace = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
        self._matmul = cublasLt.matmul
        self._alpha, self._beta = mm.alpha, mm.beta       # host scalars (numpy), read at each call
        self._static = (mm.handle, mm.mm_desc, mm.alpha.ctypes.data, mm.a_layout_ptr, mm.b_layout_ptr,
                        mm.beta.ctypes.data, mm.c_layout_ptr, mm.d_layout_ptr, self._algo.ctypes.data,
                        self.workspace.data_ptr(), size)
        self._stream = torch.cuda.current_stream
        self._device = torch.cuda.current_device()        # descriptors and workspace live there
        # planned transposed (module docstring): B's pointer goes first, A's second
        self._transposed = self._plan.bias_in_epilogue
        # the bias pointer is a descriptor attribute: set before each call (a few us of host time)
        self._desc = mm.mm_desc_ifc if self._transposed else None
        self._after = self._plan.after
        self._plan.drop_operands()                        # A, B and C of planning: not needed now

    def call(self, a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        if a.device.index != self._device:
            raise GemmgenError(f"this cuBLASLt kernel was planned on cuda:{self._device}; the operands are on "
                               f"{a.device}: use one kernel per GPU, first called while that GPU is current")
        handle, desc, alpha_ptr, a_layout, b_layout, beta_ptr, c_layout, d_layout, algo, ws, size = self._static
        self._alpha[0], self._beta[0] = alpha, beta
        if beta != 0.0:
            out.copy_(c)                  # in place: C is out, so beta*C needs c copied in first
        if self._desc is not None:
            self._desc.bias_pointer = bias.data_ptr()
        first, second = (b, a) if self._transposed else (a, b)
        ptr = out.data_ptr()
        self._matmul(handle, desc, alpha_ptr, first.data_ptr(), a_layout, second.data_ptr(), b_layout, beta_ptr,
                     ptr, c_layout, ptr, d_layout, algo, ws, size, self._stream().cuda_stream)
        apply_in_place(out, self._after, bias, residual)
