"""The `gemmgen::gemm` torch operator: what the graph pass puts in place of a matmul.

One op serves every rewritten node. Its arguments carry the static facts of the
problem (operand majors, activation, alpha, beta; M, N, K are the operands' shapes),
so at run time the kernel is one dict lookup away. Kernels are chosen by
`gemmgen.compile` at graph-compile time (`resolve`) and again on a miss at run time
(a graph served from inductor's cache never ran the pass in this process).

On CUDA the op calls the gemmgen Kernel. On CPU it computes the reference in fp32
torch: that path exists so that CPU-only CI can run rewritten models end to end
(`devices=("cuda", "cpu")`); it is not a fast path.

`gemmgen::gemm_joined` multiplies one activation by several weights of the same K at once
(Llama's q, k and v): one wider GEMM on the weights joined side by side, whose output the
graph slices. The joined copy of the weights is made on the first call and kept (it costs
their memory once more); it is made again when any of them changes in place (its version
counter moves) or is replaced, and freed with them (or by `clear_kernels()`).
"""
from __future__ import annotations

import threading
import weakref

import torch

from gemmgen.compile import compile as gemmgen_compile
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.kernel import check_major
from gemmgen.runtime.epilogue import ACTIVATIONS as EPILOGUE_ACTIVATIONS
from gemmgen.runtime.epilogue import reference as epilogue_reference

ACTIVATIONS = ("none", *EPILOGUE_ACTIVATIONS)

#: (m, n, k, a_major, b_major, has_bias, has_c, activation, alpha, beta, device) -> Kernel
#: (m None: the DispatchKernel over M)
_KERNELS: dict = {}
#: the same keys -> the Kernel a call at that M runs (`serve`)
_SERVED: dict = {}
_LOCK = threading.Lock()
#: Where run-time misses look kernels up (set by the backend that compiled the graph).
_LOOKUP = {"db": None}


def set_lookup_db(db) -> None:
    """The tuning database that run-time misses use (the last backend compiled wins)."""
    _LOOKUP["db"] = db


def epilogue_of(has_bias: bool, has_c: bool, activation: str, alpha: float, beta: float) -> Epilogue:
    """The Epilogue a rewritten node computes: act(alpha * acc + beta * c + bias)."""
    return Epilogue(alpha=float(alpha), beta=float(beta) if has_c else 0.0,
                    bias="n" if has_bias else None,
                    activation=None if activation == "none" else activation)


def kernel_key(m, n, k, a_major, b_major, has_bias, has_c, activation, alpha, beta, device) -> tuple:
    return (m, n, k, a_major, b_major, has_bias, has_c, activation, float(alpha), float(beta), device)


def problem_of(key: tuple):
    """The gemmgen Problem an op key stands for."""

    m, n, k, a_major, b_major, has_bias, has_c, activation, alpha, beta, _device = key
    return Problem(m, n, k, a_major, b_major, epilogue=epilogue_of(has_bias, has_c, activation, alpha, beta))


def problem_key(key: tuple) -> str:
    """The gemmgen problem key (`Problem.key`) of an op key: what to tune for it."""
    return problem_of(key).key


def resolve(key: tuple, db=None):
    """The gemmgen Kernel for a key, from the cache or `gemmgen.compile` (then cached): what it
    serves at that very problem; for M = None, the DispatchKernel over M (`gemmgen.dispatch`)."""
    kernel = _KERNELS.get(key)
    if kernel is not None:
        return kernel

    m, n, k, a_major, b_major, has_bias, has_c, activation, alpha, beta, device = key
    epilogue = epilogue_of(has_bias, has_c, activation, alpha, beta)
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
    clear_joined()


def _stride_tag():
    """Inductor must hand the op exactly the strides the pass saw (the majors depend on them)."""
    tag = getattr(torch.Tag, "needs_exact_strides", None) or getattr(torch.Tag, "needs_fixed_stride_order")
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
            "float alpha, float beta) -> Tensor", tags=_stride_tag())
#: (key, a's strides, b's strides) -> the kernel's launcher, once a checked call of operands of
#: those strides went through (the warm path).
_LAUNCHERS: dict = {}


def gemm_cuda(a, b, bias, c, a_major, b_major, activation, alpha, beta):
    """out = act(alpha * a @ b + beta * c + bias), fp16 out, fp32 accumulation, by a gemmgen Kernel."""
    m, k = a.shape
    n = b.shape[1]
    key = (m, n, k, a_major, b_major, bias is not None, c is not None, activation, alpha, beta,
           a.device.index)
    # Operands of these very strides went through the checked call before: skip the checks.
    # (The strides are in the key so that no other layout ever takes this path unchecked.)
    launch = _LAUNCHERS.get((key, a.stride(), b.stride()))
    if launch is not None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        launch(a, b, out, bias=bias, residual=None, c=c, alpha=alpha, beta=beta)
        return out
    kernel = _SERVED.get(key) or serve(key)
    out = kernel(a, b, bias=bias, c=c)            # the checked call: operands against the problem
    _LAUNCHERS[(key, a.stride(), b.stride())] = kernel.launcher
    return out


def gemm_cpu(a, b, bias, c, a_major, b_major, activation, alpha, beta):
    """The fp32 torch reference: lets CPU-only CI run rewritten models (devices=("cuda", "cpu")).
    It checks the operands' majors as the CUDA kernel does, so CI sees the strides inductor hands over."""

    check_major("a", a, tuple(a.shape), a_major)
    check_major("b", b, tuple(b.shape), b_major)
    return reference(a, b, bias, c, activation, alpha, beta)


def gemm_fake(a, b, bias, c, a_major, b_major, activation, alpha, beta):
    return a.new_empty((a.shape[0], b.shape[1]))


_LIB.impl("gemm", gemm_cuda, "CUDA")
_LIB.impl("gemm", gemm_cpu, "CPU")
torch.library.register_fake("gemmgen::gemm", gemm_fake, lib=_LIB)


# -- joined siblings ---------------------------------------------------------------------------

_LIB.define("gemm_joined(Tensor a, Tensor[] ws, str a_major) -> Tensor", tags=_stride_tag())
#: id() of each (N_i, K) weight -> (weak references to them, their version counters, the
#: joined (sum N, K) row-major copy). The op is handed the parameter objects themselves (the
#: pass passes the graph's inputs), so identity and version say whether a copy is current;
#: the copy goes when any of its weights is freed, and never keeps a weight alive.
_JOINED: dict = {}


def _forget(key: tuple):
    def drop(ref) -> None:
        with _LOCK:
            entry = _JOINED.get(key)
            if entry is not None and any(r is ref for r in entry[0]):
                del _JOINED[key]
    return drop


def joined_weights(ws) -> torch.Tensor:
    """The K x sum(N) column-major B of a @ [w_1.T | w_2.T | ...], made once per version of the
    row-major (N_i, K) weights (an in-place update moves a version counter)."""
    key = tuple(id(w) for w in ws)
    versions = tuple(w._version for w in ws)
    hit = _JOINED.get(key)
    if hit is not None and hit[1] == versions and all(r() is w for r, w in zip(hit[0], ws)):
        return hit[2].t()
    joined = torch.cat(list(ws))
    with _LOCK:
        _JOINED[key] = (tuple(weakref.ref(w, _forget(key)) for w in ws), versions, joined)
    return joined.t()


def clear_joined() -> None:
    """Free the joined weight copies (graphs that use them make them again on their next call)."""
    with _LOCK:
        _JOINED.clear()


def joined_bytes() -> int:
    """Memory held by joined weight copies (what `join_siblings` costs)."""
    return sum(entry[2].untyped_storage().nbytes() for entry in _JOINED.values())


def gemm_joined_cuda(a, ws, a_major):
    """a @ [w_1.T | w_2.T | ...] by the gemmgen Kernel of the joined problem (M x sum(N) x K)."""
    return gemm_cuda(a, joined_weights(ws), None, None, a_major, "col", "none", 1.0, 0.0)


def gemm_joined_cpu(a, ws, a_major):
    """The fp32 reference, on the same cached join as CUDA (so CPU CI sees a stale copy)."""
    return gemm_cpu(a, joined_weights(ws), None, None, a_major, "col", "none", 1.0, 0.0)


def gemm_joined_fake(a, ws, a_major):
    return a.new_empty((a.shape[0], sum(w.shape[0] for w in ws)))


_LIB.impl("gemm_joined", gemm_joined_cuda, "CUDA")
_LIB.impl("gemm_joined", gemm_joined_cpu, "CPU")
torch.library.register_fake("gemmgen::gemm_joined", gemm_joined_fake, lib=_LIB)


def reference(a, b, bias, c, activation: str, alpha: float, beta: float) -> torch.Tensor:
    """The op's epilogue on an fp32 product (the runtime's one reference), cast to the operands' dtype."""
    epilogue = epilogue_of(bias is not None, c is not None, activation, alpha, beta)
    return epilogue_reference(torch.mm(a.float(), b.float()), epilogue, bias=bias, c=c).to(a.dtype)
