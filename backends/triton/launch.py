"""Loading a built Triton artifact and calling it with little host overhead.

The cubins from `build` are loaded with triton's driver utilities and launched
through triton's own generated C launcher (`make_launcher`), not through the JIT:
no signature specialisation, no cache lookup, no Python-level argument parsing
per call. What can be computed once is computed once per shape ("plan"): grids,
strides, the argument template. TMA descriptors are cached per operand pointer,
split-K workspaces per (device, stream). A call then costs a dictionary lookup,
a few pointer reads and one C launch per kernel.

Shape-generic programs are compiled assuming M, N, K and row strides are
multiples of 16 (what triton's JIT would specialise for); a call that breaks an
assumption uses a second, unhinted build of the same source, compiled on first
need and cached like any other.
"""
from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gemmgen.backends import build as builds
from gemmgen.backends.base import Artifact, BackendError, TensorArg, check_launch, refuse_int32_overflow
from gemmgen.backends.triton.compiler import compile_kernels, import_text, toolchain
from gemmgen.backends.triton.lowering import grid_size, workspace_need
from gemmgen.backends.triton.rules import INDEXES, index_counts
from gemmgen.backends.workspace import persistent_buffer
from gemmgen.dsl.ir import Program

from gemmgen.errors import NoGPUError

TORCH_DTYPE_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}
DESC_CACHE_LIMIT = 64
# Roles whose values come with each call (the rest are fixed per shape, in the plan).
PER_CALL_ROLES = frozenset({"a", "b", "out", "bias", "residual", "c", "stride_c", "stride_residual",
                            "alpha", "beta", "workspace", "a_desc", "b_desc", "out_desc"})


class _LoadedKernel:
    """One cubin loaded on one device, with its generated C launcher."""

    def __init__(self, built: dict, kernel: dict, device: int):
        # Deferred: triton (optional, heavy to import).
        from triton.backends.nvidia import driver as nv
        from triton.runtime import driver
        from triton.runtime.build import compile_module_from_src

        meta = built["metadata"]
        self.name = built["name"]
        self.tensordesc_meta = meta.get("tensordesc_meta") or None
        if meta.get("global_scratch_size", 0) or meta.get("profile_scratch_size", 0):
            raise BackendError(f"{self.name} needs a global scratch buffer, which this launcher does not provide")
        utils = driver.active.utils
        _, self.function, self.n_regs, self.n_spills, max_threads = utils.load_binary(
            self.name, built["cubin"], meta["shared"], device)
        if meta["num_warps"] * 32 > max_threads:
            raise BackendError(f"{self.name} needs {meta['num_warps'] * 32} threads; the device allows {max_threads}")
        signature = {name: ty for name, ty, _ in kernel["params"]}
        constants = {(i,): kernel["constexprs"][name]
                     for i, (name, ty, _) in enumerate(kernel["params"]) if ty == "constexpr"}
        src = nv.make_launcher(constants, signature, self.tensordesc_meta)
        module = compile_module_from_src(src=src, name="__triton_launcher", library_dirs=nv.library_dirs(),
                                         include_dirs=nv.include_dirs, libraries=nv.libraries)
        self.launch = module.launch
        self.packed = (meta["num_warps"], meta.get("num_ctas", 1), meta["shared"])
        self.cooperative = bool(meta.get("launch_cooperative_grid", False))
        self.pdl = bool(meta.get("launch_pdl", False))
        self.make_desc_arg = nv.make_tensordesc_arg


def _none() -> None:
    return None


def _weak(t):
    """A weak reference to a tensor, or to nothing for None (called, it gives None back)."""
    return _none if t is None else weakref.ref(t)


def _address(x):
    """A tensor argument as its device address (Triton's launcher takes either)."""
    return x.data_ptr() if hasattr(x, "data_ptr") else x


@dataclass
class _Plan:
    """Everything about a call that depends only on the shape, strides, dtypes and device."""

    device: int
    kernels: list                  # [(loaded kernel, grid, argument template, dynamic slots)]
    workspace_elems: int
    zero_workspace: bool
    shape: tuple                   # (M, N)
    row_align: int                 # what c's and residual's row strides must divide by (the compiled hint)
    torch_device: Any = None
    desc_cache: dict = field(default_factory=dict)
    workspaces: dict = field(default_factory=dict)


class TritonLauncher:
    """`fn(a, b, out, *, bias=None, residual=None, c=None, alpha=None, beta=None)`.

    alpha/beta default to the program's values; passing a different value works
    when the program's epilogue has that scalar (alpha != 1 or beta != 0).
    """

    def __init__(self, artifact: Artifact, program: Program):
        # Deferred: torch (optional, heavy to import).
        import torch

        if artifact.backend != "triton":
            raise BackendError(f"the triton backend cannot load a {artifact.backend} artifact")
        if not torch.cuda.is_available():
            raise NoGPUError("loading a Triton kernel")
        self.artifact = artifact
        self.program = program
        self.source = artifact.meta["source"]
        self.meta = self.source.meta
        e = program.problem.epilogue
        self.alpha = float(e.alpha)
        self.beta = float(e.beta)
        self.needs = {"bias": bool(e.bias), "residual": e.residual, "c": e.beta != 0.0}
        self.shape = self.meta["shape"]
        self.in_dtype = getattr(torch, TORCH_DTYPE_NAMES[self.meta["in_dtype"]])
        self.out_dtype = getattr(torch, TORCH_DTYPE_NAMES[self.meta["out_dtype"]])
        self._torch = torch
        # What triton itself uses for the current stream: an int, no Stream object per call.
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream",
                                   lambda device: torch.cuda.current_stream(device).cuda_stream)
        self._plans: dict = {}
        self._last = None             # the previous call's tensors and bound launches (the fast path)
        self._loaded: dict = {}      # (device, hinted) -> [_LoadedKernel]
        self._unhinted: Optional[list] = None

    # -- per-shape work, done once -------------------------------------------------------------

    def _loaded_kernels(self, device: int, hinted: bool) -> list:
        key = (device, hinted)
        if key not in self._loaded:
            built = self.artifact.meta["kernels"] if hinted else self._unhinted_build()
            with self._torch.cuda.device(device):
                self._loaded[key] = [_LoadedKernel(b, k, device) for b, k in zip(built, self.meta["kernels"])]
        return self._loaded[key]

    def _unhinted_build(self) -> list:
        if self._unhinted is None:

            def compile_fn(key: str, directory: Path) -> Artifact:
                return Artifact(backend="triton", key=key, path=str(directory),
                                meta={"kernels": tuple(compile_kernels(self.source, directory, hinted=False))})

            art = builds.cached_build(self.source, "sm_90a", toolchain(), ("unhinted",), compile_fn)
            self._unhinted = list(art.meta["kernels"])
        return self._unhinted

    def _check_operands(self, a, b, out, m: int, n: int, k: int) -> None:
        b_cols = n * (2 if self.meta["gated"] else 1)       # a gated B: its gate and up halves side by side
        if b.dim() != 2 or out.dim() != 2 or tuple(b.shape) != (k, b_cols) or tuple(out.shape) != (m, n):
            want_b = "(K, 2N): the gate half, then the up half" if self.meta["gated"] else "(K, N)"
            raise BackendError(f"shapes do not match: A {tuple(a.shape)}, B {tuple(b.shape)}, out {tuple(out.shape)}; "
                               f"want A (M, K), B {want_b}, out (M, N)")
        if self.shape is not None and (m, n, k) != tuple(self.shape):
            raise BackendError(f"this program is bound to M, N, K = {tuple(self.shape)}, called with {(m, n, k)}: "
                               "bind the program to the new shape and build it")
        for name, t, dtype in (("A", a, self.in_dtype), ("B", b, self.in_dtype), ("out", out, self.out_dtype)):
            if t.dtype != dtype:
                raise BackendError(f"{name} is {t.dtype}, the program was built for {dtype}")
        self._check_device(a, b, out)
        a_major, b_major = self.meta["majors"]
        for name, t, major, (rows, cols) in (("A", a, a_major, (m, k)), ("B", b, b_major, (k, b_cols))):
            want = (cols, 1) if major == "row" else (1, rows)
            if rows > 1 and cols > 1 and tuple(t.stride()) != want:
                raise BackendError(f"{name} has strides {tuple(t.stride())}; a {major}-major {name} of this shape "
                                   f"needs {want} (make it contiguous, or pass the transposed view)")
        c_major = self.meta["c_major"]
        inner = out.stride(1) if c_major == "row" else out.stride(0)
        if inner != 1 and (n if c_major == "row" else m) > 1:
            raise BackendError(f"out has strides {tuple(out.stride())}; the kernel writes {c_major}-major output")

    def _check_device(self, *tensors) -> None:
        device = tensors[0].device
        for t in tensors:
            if not t.is_cuda or t.device != device:
                raise BackendError(f"all operands must be on one CUDA device; got {t.device} and {device}")

    def _plan(self, a, b, out) -> _Plan:
        m, k = a.shape
        n = out.shape[1]
        self._check_operands(a, b, out, m, n, k)
        device = a.get_device()
        values = static_values(self.meta, a, b, out)
        hinted = hints_hold(self.meta, values)
        if self.meta["persistent"]:
            rows = [("A", values["stride_a"] * a.element_size()), ("B", values["stride_b"] * b.element_size())]
            if "out" in self.meta["kernels"][0]["grid"]["boxes"]:
                rows.append(("out", values["stride_out"] * out.element_size()))
            for name, row_bytes in rows:
                if row_bytes % 16:
                    raise BackendError(f"{name}'s row stride ({row_bytes} bytes) is not a multiple of 16 bytes, "
                                       "which TMA needs: use a `scheduler tile` program for this shape")
        loaded = self._loaded_kernels(device, hinted)
        kernels = []
        for lk, kern in zip(loaded, self.meta["kernels"]):
            template, slots = [], []
            for name, ty, role in kern["params"]:
                if ty.startswith("tensordesc"):
                    slots.append((len(template), role, 5))   # descriptor, 2 shape dims, 2 strides
                    template.extend([None] * 5)
                elif role in values and role not in PER_CALL_ROLES:
                    template.append(values[role])
                else:
                    if role != "const":
                        slots.append((len(template), role, 1))
                    template.append(None)
            kernels.append((lk, grid_size(kern["grid"], m, n, k), template, tuple(slots)))
        ws, zeroed = workspace_need(self.meta, m, n, k)
        row_align = max([kern["hints"].get(name, 1) for kern in self.meta["kernels"]
                         for name, _, role in kern["params"] if role in ("stride_c", "stride_residual")] or [1])
        if not hinted:
            row_align = 1
        return _Plan(device=device, kernels=kernels, workspace_elems=ws, zero_workspace=zeroed, shape=(m, n),
                     row_align=row_align, torch_device=a.device)

    # -- per call ---------------------------------------------------------------------------

    def _descriptor(self, plan: _Plan, role: str, t, lk: _LoadedKernel, index: int) -> list:
        ptr = t.data_ptr()
        key = (role, ptr)
        hit = plan.desc_cache.get(key)
        if hit is None:
            desc = tensor_descriptor(self.meta, _desc_operand(role), t)
            hit = [_address(x) for x in lk.make_desc_arg(desc, lk.tensordesc_meta[index])]
            if len(plan.desc_cache) >= DESC_CACHE_LIMIT:
                plan.desc_cache.clear()
            plan.desc_cache[key] = hit
        return hit

    def _workspace(self, plan: _Plan, stream: int):
        ws = plan.workspaces.get(stream)
        if ws is None:
            ws = persistent_buffer(plan.workspace_elems, self._torch.float32, plan.torch_device,
                                   zero=plan.zero_workspace)
            plan.workspaces[stream] = ws
        return ws

    def __call__(self, a, b, out, *, bias=None, residual=None, c=None, alpha=None, beta=None):
        # Fast path: the very tensors (and scalars, and stream) of the previous call. Their
        # shapes, strides and pointers are then those already checked, so the bound launches
        # are replayed as they are. (Resizing a tensor in place between calls defeats this;
        # nothing in a GEMM's life does that.) The previous call's tensors are held weakly and
        # the bound launches carry their addresses, not the tensors: a launcher keeps no
        # activation alive (inside a CUDA graph's pool inductor refuses one it does not track).
        last = self._last
        if (last is not None and last[0]() is a and last[1]() is b and last[2]() is out and last[3]() is bias
                and last[4]() is residual and last[5]() is c and alpha == last[6] and beta == last[7]
                and self._raw_stream(last[8]) == last[9]):
            for launch, gx, gy, gz, stream, function, coop, pdl, packed, args in last[10]:
                launch(gx, gy, gz, stream, function, coop, pdl, None, None, packed, None, None, None, *args)
            return out
        return self._call(a, b, out, bias, residual, c, alpha, beta)

    def _call(self, a, b, out, bias, residual, c, alpha, beta):
        key = (a.get_device(), a.shape, b.shape, a.stride(), b.stride(), out.stride(), a.dtype, b.dtype, out.dtype)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(a, b, out)
        if (a.data_ptr() | b.data_ptr() | out.data_ptr()) % 16:
            raise BackendError("A, B and out must start at 16-byte aligned addresses")
        dyn = {"a": a, "b": b, "out": out}
        for role, t in (("bias", bias), ("residual", residual), ("c", c)):
            if self.needs[role]:
                if t is None:
                    raise BackendError(f"this program's epilogue reads {role}; pass {role}=")
                self._check_extra(role, t, plan)
            dyn[role] = t
        if residual is not None:
            dyn["stride_residual"] = line_stride(residual, self.meta)
        if c is not None:
            dyn["stride_c"] = line_stride(c, self.meta)
        dyn["alpha"] = self.alpha if alpha is None else alpha
        dyn["beta"] = self.beta if beta is None else beta
        check_call(self.program, plan.device, *_call_args(a, b, out, bias, residual, c),
                   dyn["alpha"], dyn["beta"])
        dyn["alpha"], dyn["beta"] = float(dyn["alpha"]), float(dyn["beta"])
        if (dyn["alpha"] != self.alpha and self.alpha == 1.0) or (dyn["beta"] != self.beta and self.beta == 0.0):
            raise BackendError("this program's epilogue has no alpha/beta to vary: "
                               "write alpha=/beta= in its epilogue")
        stream = self._raw_stream(plan.device)
        if plan.workspace_elems:
            dyn["workspace"] = self._workspace(plan, stream)
        launches = []
        for lk, grid, template, slots in plan.kernels:
            args = list(template)
            desc_index = 0
            for pos, role, width in slots:
                if width == 1:
                    args[pos] = _address(dyn[role])
                else:
                    args[pos:pos + width] = self._descriptor(plan, role, dyn[_desc_operand(role)], lk, desc_index)
                    desc_index += 1
            launches.append((lk.launch, grid[0], grid[1], grid[2], stream, lk.function, lk.cooperative, lk.pdl,
                             lk.packed, tuple(args)))
        for launch, gx, gy, gz, stream, function, coop, pdl, packed, args in launches:
            launch(gx, gy, gz, stream, function, coop, pdl, None, None, packed, None, None, None, *args)
        self._last = (*(_weak(t) for t in (a, b, out, bias, residual, c)), alpha, beta, plan.device, stream,
                      tuple(launches))
        return out

    def _check_extra(self, role: str, t, plan: "_Plan") -> None:
        """bias / residual / c: the output's dtype, on the GPU, long enough, rows contiguous and aligned."""
        if t.dtype != self.out_dtype or t.device != plan.torch_device:
            raise BackendError(f"{role} must be a {self.out_dtype} tensor on {plan.torch_device}, "
                               f"got {t.dtype} on {t.device}")
        m, n = plan.shape
        if role == "bias":
            need = n if self.program.problem.epilogue.bias == "n" else m
            if t.dim() != 1 or t.shape[0] < need or t.stride(0) != 1:
                raise BackendError(f"bias must be a contiguous 1-D tensor of length {need}")
        elif (tuple(t.shape) != (m, n) or t.stride(1 if self.meta["c_major"] == "row" else 0) != 1
              or line_stride(t, self.meta) % plan.row_align):
            lines = "rows" if self.meta["c_major"] == "row" else "columns"
            raise BackendError(f"{role} must be ({m}, {n}) with contiguous {lines} whose stride is a multiple of "
                               f"{plan.row_align}; got shape {tuple(t.shape)}, strides {tuple(t.stride())}")
        if t.data_ptr() % 16:
            raise BackendError(f"{role} must start at a 16-byte aligned address")


def _call_args(a, b, out, bias=None, residual=None, c=None) -> tuple:
    """(M, N, K, out, inputs) of a call, the tensors as TensorArgs for `check_call`."""
    inputs = [TensorArg.of(name, t) for name, t in (("a", a), ("b", b), ("bias", bias), ("residual", residual),
                                                    ("c", c)) if t is not None]
    return a.shape[0], out.shape[1], a.shape[1], TensorArg.of("out", out), inputs


def check_call(program: Program, device: int, m: int, n: int, k: int, out: TensorArg, inputs: list,
               alpha: float, beta: float) -> None:
    """The launch checks (pure: runs on fake TensorArgs): one device, out 16-byte aligned and apart
    from every input, finite alpha and beta, and every offset the kernels form (each tensor's
    real extent, strides included) within int32."""
    check_launch(out, inputs, device, alpha, beta)
    counts = index_counts(program, m, n, k)
    counts.update({f"{t.name}'s extent (elements from its first to its last)": t.extent for t in (out, *inputs)})
    refuse_int32_overflow(counts, INDEXES)


def line_stride(t, meta: dict) -> int:
    """The stride between the lines of an output-shaped matrix (out, c, residual): its rows'
    for c=row, its columns' for c=col."""
    return t.stride(0) if meta["c_major"] == "row" else t.stride(1)


def static_values(meta: dict, a, b, out) -> dict:
    """Kernel arguments fixed by the shapes and strides, keyed by role."""
    m, k = a.shape
    n = out.shape[1]
    a_major, b_major = meta["majors"]
    values = {"M": m, "N": n, "K": k, "stride_out": line_stride(out, meta),
              "stride_a": a.stride(0) if a_major == "row" else a.stride(1),
              "stride_b": b.stride(0) if b_major == "row" else b.stride(1)}
    # c and residual are read with their own row strides; they must satisfy the same hints as out's.
    values["stride_c"] = values["stride_residual"] = values["stride_out"]
    return values


def hints_hold(meta: dict, values: dict) -> bool:
    """Do this call's shapes satisfy the divisibility a shape-generic kernel was compiled to assume?"""
    for kern in meta["kernels"]:
        roles = {name: role for name, _, role in kern["params"]}
        for name in kern["assumed"]:
            if values[roles[name]] % kern["hints"][name]:
                return False
    return True


def _desc_operand(role: str) -> str:
    """The tensor a descriptor role describes: "a_desc" -> "a", "out_desc" -> "out"."""
    return role[: -len("_desc")]


def tensor_descriptor(meta: dict, operand: str, t):
    """The host TMA descriptor of "a", "b" or "out": its storage as it lies in memory, in the kernel's box."""
    # Deferred: triton (optional, heavy to import).
    from triton.tools.tensor_descriptor import TensorDescriptor

    if t.data_ptr() % 16:
        raise BackendError(f"{operand}'s data pointer is not 16-byte aligned, which TMA needs")
    major = {"a": meta["majors"][0], "b": meta["majors"][1], "out": "row"}[operand]
    # Row-major: the logical matrix is the storage. Column-major: its transpose is (A^T is K x M, W is N x K).
    storage = t if major == "row" else t.t()
    box = meta["kernels"][0]["grid"]["boxes"][operand]
    return TensorDescriptor(storage, list(storage.shape), list(storage.stride()), list(box))


def call_args(kernel: dict, values: dict) -> list:
    """Non-constexpr arguments of one kernel in parameter order (the interpreter's path)."""
    return [values[role] for _, ty, role in kernel["params"] if ty != "constexpr"]


def interpret(source, program: Program, a, b, out, *, bias=None, residual=None, c=None, alpha=None, beta=None):
    """Run the lowered kernels on CPU tensors with Triton's interpreter: slow, for tests and debugging.

    Exercises exactly the generated text (indexing, masks, split-K, epilogue, TMA boxes)
    that `build` compiles, without a GPU.
    """
    case = (source, program, dict(a=a, b=b, out=out, bias=bias, residual=residual, c=c), alpha, beta)
    out.copy_(interpret_many([case])[0])
    return out


def interpret_many(cases: list) -> list:
    """Interpret several (source, program, tensors, alpha, beta) cases; returns each `out`.

    Triton must be imported in interpreter mode, so unless this process started with
    TRITON_INTERPRET=1 the cases run in one fresh child process (seconds to start).
    """

    if os.environ.get("TRITON_INTERPRET") == "1":
        return [_interpret_here(*case) for case in cases]

    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"     # inherited by the spawned child at start
    try:
        with mp.get_context("spawn").Pool(1) as pool:
            return pool.apply(interpret_many, (cases,))
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


def _numpy2_scalars() -> None:
    """Triton 3.6's interpreter keeps scalars as 1-element arrays and calls int() on them, which
    numpy >= 2.4 refuses; read the element instead (only loop bounds and branches need this)."""
    # Deferred: triton (optional, heavy to import).
    from triton.runtime import interpreter

    if getattr(interpreter, "_gemmgen_patched", False):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        first = lambda self: self.handle.data.reshape(-1)[0]  # noqa: E731
        scope.set_attr(tensor, "__index__", lambda self: int(first(self)))
        scope.set_attr(tensor, "__bool__", lambda self: bool(first(self)) if self.handle.data.size == 1 else True)

    interpreter._patch_lang_tensor = patched
    interpreter._gemmgen_patched = True


def _interpret_here(source, program, tensors, alpha, beta):
    _numpy2_scalars()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"interp_{source.digest}.py")
        with open(path, "w") as f:
            f.write(source.text)
        spec = importlib.util.spec_from_file_location(f"interp_{source.digest}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _interpret_module(module, source.meta, program, **tensors, alpha=alpha, beta=beta)
    return tensors["out"]


def _interpret_module(module, meta, program, a, b, out, bias, residual, c, alpha, beta) -> None:
    _run_module(module, meta, program, dict(a=a, b=b, out=out, bias=bias, residual=residual, c=c), alpha, beta)


def _run_module(module, meta, program, tensors: dict, alpha, beta, workspace=None, options=None) -> None:
    """Launch the module's kernels through Triton's own front door (`kernel[grid](...)`): the
    interpreter's path and the JIT fallback's. `workspace(elements, zeroed)` supplies split-K buffers."""
    # Deferred: torch (optional, heavy to import).
    import torch

    e = program.problem.epilogue
    a, b, out = tensors["a"], tensors["b"], tensors["out"]
    values = static_values(meta, a, b, out)
    m, n, k = values["M"], values["N"], values["K"]
    values.update(tensors, alpha=float(e.alpha if alpha is None else alpha),
                  beta=float(e.beta if beta is None else beta))
    if tensors.get("residual") is not None:
        values["stride_residual"] = line_stride(tensors["residual"], meta)
    if tensors.get("c") is not None:
        values["stride_c"] = line_stride(tensors["c"], meta)
    size, zeroed = workspace_need(meta, m, n, k)
    if size:
        values["workspace"] = (workspace(size, zeroed) if workspace else
                               torch.zeros(size, dtype=torch.float32, device=a.device))
    if meta["persistent"]:
        for operand in ("a", "b", "out"):
            if operand in meta["kernels"][0]["grid"]["boxes"]:
                values[f"{operand}_desc"] = tensor_descriptor(meta, operand, tensors[operand])
    for kern in meta["kernels"]:
        fn = getattr(module, kern["name"])
        extra = {"num_warps": kern["num_warps"], "num_stages": kern["num_stages"]} if options is None else options
        fn[grid_size(kern["grid"], m, n, k)](*call_args(kern, values), **kern["constexprs"], **extra)


class JitLauncher:
    """A fallback launcher: the same generated module through Triton's JIT (GEMMGEN_TRITON_LAUNCH=jit).

    Slower per call (Triton's JIT dispatch) and with fewer argument checks than
    TritonLauncher; for when the ahead-of-time path misbehaves on some machine.
    """

    def __init__(self, artifact: Artifact, program: Program):


        self.source = artifact.meta["source"]
        self.program = program
        directory = Path(artifact.path) if artifact.path and Path(artifact.path).is_dir() else Path(tempfile.mkdtemp())
        self.module = import_text(self.source.text, f"gemmgen_triton_jit_{self.source.digest}", directory)
        self._workspaces: dict = {}

    def _workspace(self, a):
        # Deferred: torch (optional, heavy to import).
        import torch

        def get(size: int, zeroed: bool):
            key = (a.get_device(), torch.cuda.current_stream(a.device).cuda_stream, size)
            if key not in self._workspaces:
                self._workspaces[key] = persistent_buffer(size, torch.float32, a.device, zero=True)
            return self._workspaces[key]
        return get

    def __call__(self, a, b, out, *, bias=None, residual=None, c=None, alpha=None, beta=None):
        e = self.program.problem.epilogue
        check_call(self.program, a.get_device(), *_call_args(a, b, out, bias, residual, c),
                   e.alpha if alpha is None else alpha, e.beta if beta is None else beta)
        tensors = dict(a=a, b=b, out=out, bias=bias, residual=residual, c=c)
        _run_module(self.module, self.source.meta, self.program, tensors, alpha, beta, workspace=self._workspace(a))
        return out
