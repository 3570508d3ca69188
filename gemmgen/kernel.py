"""`Kernel`: what gemmgen.compile returns, callable on torch tensors, inspectable without a GPU.

A kernel holds the program chosen for one problem (or none: a recorded cuBLASLt algorithm,
`library`, or the torch.matmul baseline), where that choice came from (`Provenance`), and,
once first called on a GPU, the loaded launcher. Calls check the operands against the
compiled problem (dtype, device, shape, major-ness, epilogue operands, finite alpha and beta,
an `out` that overlaps no input, 16-byte aligned operands for a tuned kernel) and raise
`KernelCallError` with what to change.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional

from gemmgen import backends
from gemmgen.backends.base import BackendError, TensorArg, refuse_aliasing
from gemmgen.backends.build import build_many
from gemmgen.dsl import to_text
from gemmgen.dsl.ir import Problem, Program
from gemmgen.errors import GemmgenError, NoGPUError
from gemmgen.tuning_db.records import SAME_SESSION_BASELINE

_TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


#: The start alignment generated kernels and library algorithms need (16-byte vector moves).
ALIGNMENT = 16


class KernelCallError(GemmgenError):
    """A kernel was called with operands that do not match the problem it was compiled for."""


#: Backends and databases as a user calls them.
BACKEND_NAMES = {"triton": "Triton", "cutlass": "CUTLASS", "cuda": "CUDA C"}
_LAYERS = {"user": "your tuning database", "shipped": "the records shipped with gemmgen"}


@dataclass(frozen=True)
class Provenance:
    """Where a kernel's program came from.

    how: 'exact' (the winner measured at this problem), 'library' (a vendor library's
    fastest algorithm for this problem, measured beside torch.matmul), 'range' (a dynamic-M
    kernel's program that won at the measured Ms on both sides of this one, `gemmgen.dispatch`)
    or 'baseline' (torch.matmul; `note` says why). `summary` and `describe()` say the same in words.
    """

    how: str
    gpu: str
    trial_id: Optional[int] = None
    layer: Optional[str] = None            # 'user' or 'shipped' database
    tuned_problem: Optional[str] = None    # the problem key the program was measured on
    speedups: Mapping[str, float] = field(default_factory=dict, hash=False)
    device_ms: Optional[float] = None
    spread: Optional[float] = None
    noise: Optional[float] = None          # of the speedup over torch.matmul (gemmgen.measure.comparison)
    best_baseline: Optional[str] = None
    best_baseline_ms: Optional[float] = None
    proposer: str = ""
    date: str = ""
    note: str = ""
    backend: str = ""                      # the program's backend (exact)

    @property
    def measured_here(self) -> bool:
        """Whether what serves was measured at this very problem (a winner or a library choice)."""
        return self.how in ("exact", "library")

    @property
    def baseline_ms_here(self) -> Optional[float]:
        """The best baseline's device time measured at this very problem (None: never measured)."""
        return self.best_baseline_ms

    @property
    def torch_speedup(self) -> Optional[float]:
        """Over torch.matmul: timed beside it in the same session where it was, else in the same run."""
        return self.speedups.get(SAME_SESSION_BASELINE, self.speedups.get("torch"))

    @property
    def summary(self) -> str:
        """Why this kernel serves, in one line."""
        program = f"{BACKEND_NAMES.get(self.backend, self.backend or 'a')} program"
        versus = (f"{self.torch_speedup:.2f}x torch.matmul" if self.torch_speedup
                  else f"{self.best_baseline_ms / self.device_ms:.2f}x {self.best_baseline}"
                  if self.device_ms and self.best_baseline_ms else "")
        if self.how == "exact":
            return f"measured fastest for this shape on {self.gpu}: {program}" + (f", {versus}" if versus else "")
        if self.how == "library":
            return f"cuBLASLt algorithm measured {versus or 'faster than torch.matmul'} for this shape on {self.gpu}"
        if self.how == "range":
            return f"{program} {self.note}"
        return self.note or f"serving torch.matmul (cuBLAS): no tuned kernel for this shape on {self.gpu}"

    def describe(self) -> str:
        lines = [f"provenance: {self.summary}"]
        where = _LAYERS.get(self.layer or "", f"the {self.layer} database")
        if self.trial_id is not None:
            lines.append(f"  measured {self.date or '(no date)'}: record #{self.trial_id} of {where}")
            lines.append(f"  device time: {self.device_ms:.4f} ms (spread {100 * (self.spread or 0):.1f} %"
                         + (f", speedup noise {100 * self.noise:.1f} %" if self.noise is not None else "") + ")"
                         + (f"; the fastest library call in that run, {self.best_baseline}: {self.best_baseline_ms:.4f} ms"
                            if self.best_baseline_ms is not None else ""))
            if self.speedups:
                lines.append("  speedup over: " + ", ".join(f"{n} {s:.3f}x" for n, s in self.speedups.items()))
            if self.proposer:
                lines.append(f"  proposed by: {self.proposer}")
        elif self.how == "library" and self.device_ms and self.best_baseline_ms:
            lines.append(f"  {self.note}" if self.note else "")
            lines.append(f"  measured {self.date} ({where}): {self.device_ms:.4f} ms (spread "
                         f"{100 * (self.spread or 0):.1f} %) against torch.matmul {self.best_baseline_ms:.4f} ms "
                         f"in the same session, {self.best_baseline_ms / self.device_ms:.3f}x"
                         + (f" (noise {100 * self.noise:.1f} %)" if self.noise is not None else ""))
            if "torch, server mode" in self.speedups:
                lines.append(f"  server mode (idle gaps before each call): "
                             f"{self.speedups['torch, server mode']:.3f}x torch.matmul")
        return "\n".join(line for line in lines if line)

    def __str__(self) -> str:
        return self.summary


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

                self._source = backends.lower(self.ir).text
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
        _operand("b (the joined [B_gate B_up], K x 2N)" if e.gate else "b", b, (k, p.b_cols), p.b_major, dtype, torch,
                 device)
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
        inputs = {"a": a, "b": b, "bias": bias, "residual": residual, "c": c}
        if out is None:
            out = torch.empty((m, n), dtype=out_dtype, device=device)
        else:
            _operand("out", out, (m, n), p.c_major, out_dtype, torch, device)
            check_no_alias(out, inputs)
        launch = self.launcher
        if self.ir is not None or self.library is not None:
            offset = misaligned({**inputs, "out": out})
            if offset:
                # Generated kernels and library algorithms move 16-byte vectors; torch.matmul
                # takes any view, so such a call runs the baseline rather than failing.
                warnings.warn(f"gemmgen: {', '.join(offset)} of this call start off a 16-byte boundary (an "
                              f"offset view?); the {self.backend} kernel needs aligned operands, so this call "
                              "runs torch.matmul: pass aligned tensors (.clone()) for the tuned kernel",
                              RuntimeWarning, stacklevel=2)
                launch = baseline_launcher(p)
        launch(a, b, out, bias=bias, residual=residual, c=c, alpha=alpha, beta=beta)
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
            source = backends.lower(self.ir)
            # build() goes through the backends' on-disk artifact cache (backends/build.py)
            self._launch = backends.load(backends.get(source.backend).build(source), self.ir)
        except GemmgenError as exc:
            warnings.warn(f"gemmgen: the {self.ir.backend} kernel for {self.problem.key} could not be "
                          f"built or loaded ({exc}); using torch.matmul instead", RuntimeWarning)
            self._launch = baseline_launcher(self.problem)
        return self._launch


def build_ahead(kernels, *, jobs: Optional[int] = None) -> dict:
    """Build, in parallel on every core, the artifacts of these kernels' programs into the disk
    cache, so that their first calls load instead of compiling. Counts: kernels, baselines
    (nothing to build), built, failed."""
    kernels = list(kernels)
    tuned = [k for k in kernels if k.ir is not None]
    sources = [backends.lower(k.ir) for k in tuned]
    results = build_many(sources, jobs=jobs) if sources else []
    failed = [f"{k.problem.key}: {r}" for k, r in zip(tuned, results) if isinstance(r, Exception)]
    return {"kernels": len(kernels), "baselines": len(kernels) - len(tuned),
            "built": len(tuned) - len(failed), "failed": failed}


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


def check_no_alias(out, inputs: Mapping[str, Any]) -> None:
    """Refuse an `out` whose storage overlaps an input's (the launchers' own check,
    `gemmgen.backends.base.refuse_aliasing`): the kernel would read what it already overwrote."""
    others = [TensorArg.of(name, t) for name, t in inputs.items()
              if t is not None and t.device == out.device and t.numel()]
    try:
        refuse_aliasing(TensorArg.of("out", out), others)
    except BackendError as exc:
        raise KernelCallError(str(exc)) from None


def misaligned(operands: Mapping[str, Any]) -> list[str]:
    """The operands that do not start on a 16-byte boundary (offset views such as x[1:])."""
    return [name for name, t in operands.items() if t is not None and t.data_ptr() % ALIGNMENT]


def _scalar(name: str, given, compiled: float, runtime: bool) -> float:
    if given is None:
        return compiled
    try:
        value = float(given)
    except (TypeError, ValueError):
        raise KernelCallError(f"{name}={given!r} is not a number") from None
    if not math.isfinite(value):
        raise KernelCallError(f"{name}={given}: {name} must be a finite number (NaN or infinity would "
                              "poison every output element)")
    if value == compiled:
        return compiled
    if not runtime:
        raise KernelCallError(f"{name}={given} differs from the compiled {name}={compiled}; compile with "
                              f"epilogue {name}=... so that {name} is a runtime argument")
    return value


# -- the sources shown for a library kernel and for the baseline -----------------------


def library_source(problem: Problem, choice) -> str:
    """What a library kernel runs: the recorded algorithm's configuration and the call."""
    config = ", ".join(f"{k}={v}" for k, v in sorted(choice.config.items()))
    lines = [f"# gemmgen library kernel: cuBLASLt {choice.version}, the fastest of {choice.candidates} "
             "algorithms its heuristic offered for this problem",
             f"# algorithm: {config}",
             *_lt_plan_source(problem.linear_bias)]
    # nn.Linear's bias goes into cuBLASLt's epilogue (runtime.cublaslt); the rest follows in torch
    rest = replace(problem.epilogue, bias=None) if problem.linear_bias else problem.epilogue
    from gemmgen.runtime.epilogue import in_place_source  # deferred: imports torch

    epilogue = in_place_source(rest)
    lines += ["# then the epilogue in torch:", *epilogue] if epilogue else []
    return "\n".join(lines) + "\n"


def _lt_plan_source(transposed: bool) -> list[str]:
    """How a recorded cuBLASLt algorithm is planned and called; transposed, with the BIAS
    epilogue, for nn.Linear's bias (runtime.cublaslt's module docstring)."""
    operands, first, second = ("b.t(), a.t(), c=out.t()", "b", "a") if transposed else ("a, b, c=out", "a", "b")
    epilog = ", epilog=MatmulEpilog.BIAS, epilog_inputs={'bias': bias}" if transposed else ""
    bias = "the bias pointer on the descriptor, then " if transposed else ""
    return [f"# planned once: nvmath.linalg.advanced.Matmul({operands}, compute_type=COMPUTE_32F, inplace=True)",
            f"#   .plan(algorithms=[Algorithm.from_numpy(<recorded>)]{epilog})",
            f"# each call: {bias}cublasLtMatmul(handle, desc, {first}, {second}, out, out, <recorded algorithm>, "
            "workspace, stream)"]


def baseline_launcher(problem: Problem):
    """The harness's own torch baseline (torch.matmul / addmm, epilogue as torch ops): the
    fallback is exactly what every winner was measured against."""
    # Deferred: the runtime imports torch.
    from gemmgen.runtime.torch_call import torch_call

    return torch_call(problem)
