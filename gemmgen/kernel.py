"""`Kernel`: what gemmgen.compile returns, callable on torch tensors, inspectable without a GPU.

A kernel holds the program chosen for one problem (or none: a recorded cuBLASLt algorithm,
`library`, or the torch.matmul baseline), where that choice came from (`Provenance`), and,
once first called on a GPU, the loaded launcher. Calls check the operands against the
compiled problem (dtype, device, shape, major-ness, epilogue operands) and raise
`KernelCallError` with what to change.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from gemmgen import backends
from gemmgen.dsl import to_text
from gemmgen.dsl.ir import Problem, Program
from gemmgen.errors import GemmgenError, NoGPUError

_TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


class KernelCallError(GemmgenError):
    """A kernel was called with operands that do not match the problem it was compiled for."""


@dataclass(frozen=True)
class Provenance:
    """Where a kernel's program came from.

    how: 'exact' (the winner for this problem), 'nearest' (the winner of the nearest
    tuned problem, re-bound: not measured at this shape), 'library' (a vendor library's
    fastest algorithm for this problem, measured beside torch.matmul) or 'baseline'.
    """

    how: str
    gpu: str
    trial_id: Optional[int] = None
    layer: Optional[str] = None            # 'user' or 'shipped' database
    tuned_problem: Optional[str] = None    # the problem key the program was measured on
    distance: float = 0.0                  # log-space distance to it (nearest only)
    speedups: Mapping[str, float] = field(default_factory=dict, hash=False)
    device_ms: Optional[float] = None
    spread: Optional[float] = None
    noise: Optional[float] = None          # of the speedup over torch.matmul (gemmgen.measure.comparison)
    best_baseline: Optional[str] = None
    best_baseline_ms: Optional[float] = None
    proposer: str = ""
    date: str = ""
    note: str = ""

    @property
    def baseline_ms_here(self) -> Optional[float]:
        """The best baseline's device time measured at this very problem (None: never measured)."""
        return self.best_baseline_ms if self.how in ("exact", "library", "baseline") else None

    def describe(self) -> str:
        lines = [f"provenance: {self.how} ({self.note})" if self.note else f"provenance: {self.how}",
                 f"  gpu: {self.gpu}"]
        if self.trial_id is not None:
            lines.append(f"  trial: #{self.trial_id} in the {self.layer} database, measured {self.date}"
                         f" on {self.tuned_problem}")
            lines.append(f"  device time: {self.device_ms:.4f} ms (spread {100 * (self.spread or 0):.1f} %"
                         + (f", speedup noise {100 * self.noise:.1f} %" if self.noise is not None else "")
                         + f"); best baseline {self.best_baseline} {self.best_baseline_ms:.4f} ms")
            if self.speedups:
                lines.append("  speedup over: " + ", ".join(f"{n} {s:.3f}x" for n, s in self.speedups.items()))
            if self.proposer:
                lines.append(f"  proposed by: {self.proposer}")
        elif self.how == "library" and self.device_ms and self.best_baseline_ms:
            lines.append(f"  measured {self.date} ({self.layer} database): {self.device_ms:.4f} ms (spread "
                         f"{100 * (self.spread or 0):.1f} %) against torch.matmul {self.best_baseline_ms:.4f} ms "
                         f"in the same session, {self.best_baseline_ms / self.device_ms:.3f}x"
                         + (f" (noise {100 * self.noise:.1f} %)" if self.noise is not None else ""))
            if "torch, server mode" in self.speedups:
                lines.append(f"  server mode (idle gaps before each call): "
                             f"{self.speedups['torch, server mode']:.3f}x torch.matmul")
        return "\n".join(lines)


class Kernel:
    """A compiled GEMM: call it as kernel(a, b, bias=, residual=, c=, out=, alpha=, beta=)."""

    def __init__(self, problem: Problem, program: Optional[Program], provenance: Provenance,
                 library: Optional[Any] = None):
        self.problem = problem
        self.ir = program
        self.provenance = provenance
        self.library = library            # a tuning_db.LibraryChoice when no program serves
        self._text: Optional[str] = None
        self._source: Optional[str] = None
        self._launch: Optional[Callable[..., Any]] = None
        self._torch = None
        self._dtypes = None
        parts = problem.epilogue.signature.split("+")
        self._runtime = ("alpha" in parts, "beta" in parts)  # may alpha/beta change per call

    # -- inspection ----------------------------------------------------------------

    @property
    def program(self) -> Optional[str]:
        """The DSL text of the chosen program; None for a library algorithm or the baseline."""
        if self.ir is None:
            return None
        if self._text is None:

            self._text = to_text(self.ir)
        return self._text

    @property
    def backend(self) -> str:
        if self.ir is not None:
            return self.ir.backend
        return self.library.library if self.library is not None else "torch"

    @property
    def source(self) -> str:
        """The generated source (lowered on first access; pure, no GPU needed)."""
        if self._source is None:
            if self.library is not None:
                self._source = library_source(self.problem, self.library)
            elif self.ir is None:
                # Deferred: the runtime imports torch.
                from gemmgen.runtime.torch_call import torch_call_source

                self._source = torch_call_source(self.problem)
            else:

                self._source = backends.get(self.ir.backend).lower(self.ir).text
        return self._source

    def describe(self) -> str:
        head = f"problem: {self.problem.key}\nbackend: {self.backend}\n"
        program = self.program or ("(none: a cuBLASLt algorithm, see the source)\n" if self.library is not None
                                   else "(none: torch.matmul with the epilogue in torch)\n")
        return head + "program:\n" + program + self.provenance.describe()

    def __repr__(self) -> str:
        return f"<gemmgen.Kernel {self.problem.key} backend={self.backend} via={self.provenance.how}>"

    # -- calling -------------------------------------------------------------------

    @property
    def fn(self) -> Callable[..., Any]:
        """The call in the harness's convention, fn(a, b, out, *, bias, residual, c, alpha, beta)."""

        def fn(a, b, out, *, bias=None, residual=None, c=None, alpha=None, beta=None):
            return self(a, b, bias=bias, residual=residual, c=c, out=out, alpha=alpha, beta=beta)

        return fn

    def __call__(self, a, b, bias=None, residual=None, c=None, out=None, alpha=None, beta=None):
        torch = self._torch or self._import_torch()
        p, e = self.problem, self.problem.epilogue
        m, n, k = p.m, p.n, p.k
        dtype, out_dtype = self._dtypes
        _operand("a", a, (m, k), p.a_major, dtype, torch)
        device = a.device
        _operand("b", b, (k, n), p.b_major, dtype, torch, device)
        alpha = _scalar("alpha", alpha, e.alpha, self._runtime[0])
        beta = _scalar("beta", beta, e.beta, self._runtime[1])
        if e.bias:
            _operand("bias", bias, (m if e.bias == "m" else n,), None, out_dtype, torch, device)
        elif bias is not None:
            raise KernelCallError("bias given, but the kernel was compiled without one; "
                                  "compile with epilogue bias=n (or bias=m)")
        if e.residual:
            _operand("residual", residual, (m, n), p.c_major, out_dtype, torch, device)
        elif residual is not None:
            raise KernelCallError("residual given, but the kernel was compiled without one; "
                                  "compile with epilogue residual")
        if beta != 0.0:
            _operand("c", c, (m, n), p.c_major, out_dtype, torch, device)
        elif c is not None:
            raise KernelCallError("c given, but beta is 0; compile with epilogue beta=... to add c")
        if out is None:
            out = torch.empty((m, n), dtype=out_dtype, device=device)
        else:
            _operand("out", out, (m, n), p.c_major, out_dtype, torch, device)
        self.launcher(a, b, out, bias=bias, residual=residual, c=c, alpha=alpha, beta=beta)
        return out

    def _import_torch(self):
        try:
            import torch
        except ImportError:
            raise NoGPUError("calling a gemmgen kernel") from None
        if not torch.cuda.is_available():
            raise NoGPUError("calling a gemmgen kernel")
        self._dtypes = (getattr(torch, _TORCH_DTYPES[self.problem.in_dtype]),
                        getattr(torch, _TORCH_DTYPES[self.problem.epilogue.out_dtype]))
        self._torch = torch
        return torch

    @property
    def launcher(self):
        """The raw launcher, `fn(a, b, out, *, bias, residual, c, alpha, beta)`: no operand checks.

        For callers that checked one call already and repeat it with the same shapes and
        strides (the torch.compile op); anyone else calls the Kernel itself."""
        return self._launch or self._load()

    def _load(self):
        """Build (through the on-disk artifact cache) and load the launcher, once."""
        if self.library is not None:
            # Deferred: torch (optional, heavy to import).
            from gemmgen.runtime.cublaslt import library_launcher

            try:
                self._launch = library_launcher(self.problem, self.library.algorithm, self.library.version)
            except Exception as exc:  # noqa: BLE001 - nvmath or cuBLASLt refused the recorded algorithm
                warnings.warn(f"gemmgen: the recorded cuBLASLt algorithm for {self.problem.key} cannot be "
                              f"used here ({exc}); using torch.matmul instead", RuntimeWarning)
                self._launch = baseline_launcher(self.problem)
            return self._launch
        if self.ir is None:
            self._launch = baseline_launcher(self.problem)
            return self._launch
        try:
            from gemmgen import backends

            module = backends.get(self.ir.backend)
            # build() goes through the backends' on-disk artifact cache (backends/build.py)
            self._launch = module.load(module.build(module.lower(self.ir)), self.ir)
        except GemmgenError as exc:
            warnings.warn(f"gemmgen: the {self.ir.backend} kernel for {self.problem.key} could not be "
                          f"built or loaded ({exc}); using torch.matmul instead", RuntimeWarning)
            self._launch = baseline_launcher(self.problem)
        return self._launch


def _operand(name, t, shape, major, dtype, torch, device=None) -> None:
    if t is None:
        raise KernelCallError(f"{name} is required by the compiled epilogue; pass a tensor of shape {shape}")
    if not isinstance(t, torch.Tensor):
        raise KernelCallError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise KernelCallError(f"{name} has dtype {t.dtype}; the kernel was compiled for {dtype}")
    if tuple(t.shape) != tuple(shape):
        raise KernelCallError(f"{name} has shape {tuple(t.shape)}; the kernel was compiled for {tuple(shape)}"
                              " (compile another kernel for another shape)")
    if major is None:
        if t.stride(0) != 1 and t.shape[0] > 1:
            raise KernelCallError(f"{name} must be contiguous")
    else:
        check_major(name, t, shape, major)
    if t.device.type != "cuda":
        raise KernelCallError(f"{name} is on {t.device}; gemmgen kernels run on CUDA tensors (.cuda())")
    if device is not None and t.device != device:
        raise KernelCallError(f"{name} is on {t.device} but a is on {device}; put every operand on one GPU")


def check_major(name, t, shape, major) -> None:
    """Refuse a 2-D operand whose strides are not those of a packed `major` matrix of `shape`
    (the layout a kernel was compiled for); the torch op's CPU path checks with it too."""
    rows, cols = shape
    row_ok = (t.stride(1) == 1 or cols == 1) and (t.stride(0) == cols or rows == 1)
    col_ok = (t.stride(0) == 1 or rows == 1) and (t.stride(1) == rows or cols == 1)
    if not (row_ok if major == "row" else col_ok):
        want = f"({cols}, 1)" if major == "row" else f"(1, {rows})"
        other = "col" if major == "row" else "row"
        fix = (f"pass such a view, or compile with {name}_major={other!r}" if name in ("a", "b")
               else "pass a tensor with those strides (.contiguous() for row-major)")
        raise KernelCallError(f"{name} has strides {tuple(t.stride())}; the kernel was compiled for "
                              f"{name if name in ('a', 'b') else 'c'}_major={major!r} (strides {want}); {fix}")


def _scalar(name: str, given, compiled: float, runtime: bool) -> float:
    if given is None or float(given) == compiled:
        return compiled
    if not runtime:
        raise KernelCallError(f"{name}={given} differs from the compiled {name}={compiled}; compile with "
                              f"epilogue {name}=... so that {name} is a runtime argument")
    return float(given)


# -- the sources shown for a library kernel and for the baseline -----------------------


def library_source(problem: Problem, choice) -> str:
    """What a library kernel runs: the recorded algorithm's configuration and the call."""
    config = ", ".join(f"{k}={v}" for k, v in sorted(choice.config.items()))
    lines = [f"# gemmgen library kernel: cuBLASLt {choice.version}, the fastest of {choice.candidates} "
             "algorithms its heuristic offered for this problem",
             f"# algorithm: {config}",
             "# planned once: nvmath.linalg.advanced.Matmul(a, b, c=out, compute_type=COMPUTE_32F, inplace=True)",
             "#   .plan(algorithms=[Algorithm.from_numpy(<recorded>)])",
             "# each call: cublasLtMatmul(handle, desc, a, b, out, out, <recorded algorithm>, workspace, stream)"]
    from gemmgen.runtime.epilogue import in_place_source  # deferred: imports torch

    epilogue = in_place_source(problem.epilogue)
    lines += ["# then the epilogue in torch:", *epilogue] if epilogue else []
    return "\n".join(lines) + "\n"


def baseline_launcher(problem: Problem):
    """The harness's own torch baseline (torch.matmul / addmm, epilogue as torch ops): the
    fallback is exactly what every winner was measured against."""
    # Deferred: the runtime imports torch.
    from gemmgen.runtime.torch_call import torch_call

    return torch_call(problem)
