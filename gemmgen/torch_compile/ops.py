"""The `gemmgen::gemm` torch operator: what the graph pass puts in place of a matmul.

One op serves every rewritten node. Its arguments carry the static facts of the
problem (operand majors, activation, alpha, beta; M, N, K are the operands' shapes),
so at run time the kernel is one dict lookup away. Kernels are chosen by
`gemmgen.compile` at graph-compile time (`resolve`) and again on a miss at run time
(a graph served from inductor's cache never ran the pass in this process).

On CUDA the op calls the gemmgen Kernel. On CPU it computes the reference in fp32
torch: that path exists so that CPU-only CI can run rewritten models end to end
(`devices=("cuda", "cpu")`); it is not a fast path.

A residual (`out = acc + residual`, the add into a decoder's residual stream) is one more
optional operand of `gemmgen::gemm`. Joined siblings (q, k, v) are a `gemmgen::gemm` over a
weight the pass joined at compile time and registered as a constant of the graph.

`gemmgen::gemm_gated(a, b, a_major, gate)` computes silu(acc[:, :N]) * acc[:, N:] of one product
over the joined weight [W_gate; W_up] (b = K x 2N, column-major): a gated MLP's gate and up
in one GEMM (`Epilogue(gate=..., halves="stacked")`).
"""
from __future__ import annotations

import threading
import warnings

import torch

from gemmgen.compile import compile as gemmgen_compile
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.errors import GemmgenError
from gemmgen.kernel import check_major
from gemmgen.runtime.epilogue import ACTIVATIONS as EPILOGUE_ACTIVATIONS
from gemmgen.runtime.epilogue import reference as epilogue_reference

ACTIVATIONS = ("none", *EPILOGUE_ACTIVATIONS)

#: (m, n, k, a_major, b_major, has_bias, has_c, activation, alpha, beta, device, has_residual, gate)
#: -> Kernel (m None: the DispatchKernel over M; a gated key's n is N, its B has 2N columns)
_KERNELS: dict = {}
#: the same keys -> the Kernel a call at that M runs (`serve`)
_SERVED: dict = {}
_LOCK = threading.Lock()
#: Where run-time misses look kernels up (set by the backend that compiled the graph).
_LOOKUP = {"db": None}


def set_lookup_db(db) -> None:
    """The tuning database that run-time misses use (the last backend compiled wins)."""
    _LOOKUP["db"] = db


def epilogue_of(has_bias: bool, has_c: bool, activation: str, alpha: float, beta: float,
                has_residual: bool = False, gate: str = "none") -> Epilogue:
    """The Epilogue a rewritten node computes: act(alpha * acc + beta * c + bias) + residual, or
    with a gate, gate(acc[:, :N]) * acc[:, N:]."""
    if gate != "none":
        return Epilogue(gate=gate, halves="stacked")
    return Epilogue(alpha=float(alpha), beta=float(beta) if has_c else 0.0,
                    bias="n" if has_bias else None,
                    activation=None if activation == "none" else activation, residual=bool(has_residual))


def kernel_key(m, n, k, a_major, b_major, has_bias, has_c, activation, alpha, beta, device,
               has_residual: bool = False, gate: str = "none") -> tuple:
    return (m, n, k, a_major, b_major, has_bias, has_c, activation, float(alpha), float(beta), device,
            bool(has_residual), gate)


def gated_key(m, n, k, a_major, device, gate: str = "silu") -> tuple:
    """The op key of a gated product: N output columns, B K x 2N column-major (the joined weight)."""
    return kernel_key(m, n, k, a_major, "col", False, False, "none", 1.0, 0.0, device, False, gate)


def problem_of(key: tuple):
    """The gemmgen Problem an op key stands for."""

    m, n, k, a_major, b_major, has_bias, has_c, activation, alpha, beta, _device, residual, gate = key
    return Problem(m, n, k, a_major, b_major,
                   epilogue=epilogue_of(has_bias, has_c, activation, alpha, beta, residual, gate))


def problem_key(key: tuple) -> str:
    """The gemmgen problem key (`Problem.key`) of an op key: what to tune for it."""
    return problem_of(key).key


def resolve(key: tuple, db=None):
    """The gemmgen Kernel for a key, from the cache or `gemmgen.compile` (then cached): what it
    serves at that very problem; for M = None, the DispatchKernel over M (`gemmgen.dispatch`)."""
    kernel = _KERNELS.get(key)
    if kernel is not None:
        return kernel

    m, n, k, a_major, b_major, has_bias, has_c, activation, alpha, beta, device, residual, gate = key
    epilogue = epilogue_of(has_bias, has_c, activation, alpha, beta, residual, gate)
    kernel = gemmgen_compile((m, n, k), a_major=a_major, b_major=b_major, epilogue=epilogue,
                             device=device, db=db if db is not None else _LOOKUP["db"])
    with _LOCK:
        _KERNELS.setdefault(key, kernel)
    return _KERNELS[key]


def serve(key: tuple):
    """The Kernel a call at the key's M runs: what the dynamic-M table of its (., N, K) serves there
    (at a measured M exactly `resolve(key)`; between two Ms where one program won, that program)."""
    kernel = _SERVED.get(key)
    if kernel is None:
        kernel = resolve((None, *key[1:])).kernel_for(key[0])
        with _LOCK:
            _SERVED.setdefault(key, kernel)
    return kernel


def served_kernels() -> dict:
    """Op key -> the Kernel its calls ran, for every key called since `clear_kernels`."""
    return dict(_SERVED)


def clear_kernels() -> None:
    """Forget the op's kernels (after tuning in this process, say)."""
    with _LOCK:
        _KERNELS.clear()
        _SERVED.clear()
        _LAUNCHERS.clear()
        _GATED_FALLBACK.clear()


def _stride_tag():
    """Inductor must hand the op exactly the strides the pass saw (the majors depend on them)."""
    tag = getattr(torch.Tag, "needs_exact_strides", None) or torch.Tag.needs_fixed_stride_order
    return (tag,)


def pin_input_strides(node) -> None:
    """Make inductor honour the stride tag for a node the pass inserted.

    Inductor enforces `needs_exact_strides` against the node's `eager_input_vals` and, where a
    custom pass left none, not at all. Then a pointwise producer may come out row-major where
    the traced value was column-major, and the op would get operands of another major than
    its arguments say (`(x.t() + y) @ w.t()` did, on torch 2.13). With the traced values here,
    inductor copies such an operand to the strides the pass saw."""
    # Deferred: torch (optional, heavy to import).
    from torch.fx.node import map_arg

    node.meta["eager_input_vals"] = (map_arg(node.args, lambda n: n.meta["val"]), {})


# Defined through torch.library.Library rather than the @custom_op decorator: same dispatcher
# op, but about half the per-call host overhead (no autograd wrapper; the op only ever appears
# in post-grad graphs, after autograd), which is what decode-sized matmuls pay for.
_LIB = torch.library.Library("gemmgen", "DEF")
_LIB.define("gemm(Tensor a, Tensor b, Tensor? bias, Tensor? c, str a_major, str b_major, str activation, "
            "float alpha, float beta, Tensor? residual=None) -> Tensor", tags=_stride_tag())
#: (key, a's strides, b's strides) -> the kernel's launcher, once a checked call of operands of
#: those strides went through (the warm path).
_LAUNCHERS: dict = {}


def gemm_cuda(a, b, bias, c, a_major, b_major, activation, alpha, beta, residual=None):
    """out = act(alpha * a @ b + beta * c + bias) + residual, fp16 out, fp32 accumulation, by a
    gemmgen Kernel."""
    m, k = a.shape
    n = b.shape[1]
    key = (m, n, k, a_major, b_major, bias is not None, c is not None, activation, alpha, beta,
           a.device.index, residual is not None, "none")
    # Operands of these very strides went through the checked call before: skip the checks.
    # (The strides are in the key so that no other layout ever takes this path unchecked.)
    launch = _LAUNCHERS.get((key, a.stride(), b.stride()))
    if launch is not None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        launch(a, b, out, bias=bias, residual=residual, c=c, alpha=alpha, beta=beta)
        return out
    kernel = _SERVED.get(key) or serve(key)
    out = kernel(a, b, bias=bias, c=c, residual=residual)   # the checked call: operands against the problem
    _LAUNCHERS[(key, a.stride(), b.stride())] = kernel.launcher
    return out


def gemm_cpu(a, b, bias, c, a_major, b_major, activation, alpha, beta, residual=None):
    """The fp32 torch reference: lets CPU-only CI run rewritten models (devices=("cuda", "cpu")).
    It checks the operands' majors as the CUDA kernel does, so CI sees the strides inductor hands over."""

    check_major("a", a, tuple(a.shape), a_major)
    check_major("b", b, tuple(b.shape), b_major)
    if residual is not None:
        check_major("residual", residual, (a.shape[0], b.shape[1]), "row")
    return reference(a, b, bias, c, activation, alpha, beta, residual)


def gemm_fake(a, b, bias, c, a_major, b_major, activation, alpha, beta, residual=None):
    return a.new_empty((a.shape[0], b.shape[1]))


_LIB.impl("gemm", gemm_cuda, "CUDA")
_LIB.impl("gemm", gemm_cpu, "CPU")
torch.library.register_fake("gemmgen::gemm", gemm_fake, lib=_LIB)


# -- gated products (a gated MLP's gate and up over one joined weight) ----------------------------

_LIB.define("gemm_gated(Tensor a, Tensor b, str a_major, str gate) -> Tensor", tags=_stride_tag())
#: gated op keys gemmgen.compile does not serve (yet): the op computes them with torch
_GATED_FALLBACK: dict = {}


def gemm_gated_cuda(a, b, a_major, gate):
    """gate(acc[:, :N]) * acc[:, N:] of acc = a @ b (b = [B_gate | B_up], K x 2N), fp16 out.
    By the gemmgen Kernel of the gated problem; where gemmgen.compile cannot serve it, by
    torch.mm and the epilogue in torch (what inductor would have run, less its fusion)."""
    m, k = a.shape
    n = b.shape[1] // 2
    key = gated_key(m, n, k, a_major, a.device.index, gate)
    launch = _LAUNCHERS.get((key, a.stride(), b.stride()))
    if launch is not None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        launch(a, b, out, bias=None, residual=None, c=None, alpha=1.0, beta=0.0)
        return out
    if key not in _GATED_FALLBACK:
        try:
            kernel = _SERVED.get(key) or serve(key)
        except GemmgenError as exc:      # a gated problem gemmgen.compile refuses (too large, say)
            warnings.warn(f"gemmgen: gated product {problem_key(key)} served by torch: {exc}", stacklevel=2)
            _GATED_FALLBACK[key] = str(exc)
        else:
            out = kernel(a, b)
            _LAUNCHERS[(key, a.stride(), b.stride())] = kernel.launcher
            return out
    return gated_epilogue(torch.mm(a, b), gate).to(a.dtype)


def gemm_gated_cpu(a, b, a_major, gate):
    """The fp32 torch reference of the gated product (checks the majors as the kernel does)."""
    check_major("a", a, tuple(a.shape), a_major)
    check_major("b", b, tuple(b.shape), "col")
    return gated_epilogue(torch.mm(a.float(), b.float()), gate).to(a.dtype)


def gemm_gated_fake(a, b, a_major, gate):
    return a.new_empty((a.shape[0], b.shape[1] // 2))


def gated_epilogue(acc: torch.Tensor, gate: str) -> torch.Tensor:
    """gate(acc[:, :N]) * acc[:, N:] in fp32 on an M x 2N accumulator (the runtime's reference)."""
    return epilogue_reference(acc.float(), Epilogue(gate=gate, halves="stacked"))


_LIB.impl("gemm_gated", gemm_gated_cuda, "CUDA")
_LIB.impl("gemm_gated", gemm_gated_cpu, "CPU")
torch.library.register_fake("gemmgen::gemm_gated", gemm_gated_fake, lib=_LIB)


def reference(a, b, bias, c, activation: str, alpha: float, beta: float, residual=None) -> torch.Tensor:
    """The op's epilogue on an fp32 product (the runtime's one reference), cast to the operands' dtype."""
    epilogue = epilogue_of(bias is not None, c is not None, activation, alpha, beta, residual is not None)
    return epilogue_reference(torch.mm(a.float(), b.float()), epilogue, bias=bias, c=c,
                              residual=residual).to(a.dtype)
