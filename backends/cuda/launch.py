"""Loading cubins and launching them through the CUDA driver API (cuda-bindings).

GPU-side edge of the raw CUDA backend: module handles are cached per (cubin,
device); each launcher keeps its kernel-argument storage in ctypes structures
that it refills per call, so a call allocates nothing on the device and never
synchronizes. Split-K workspaces are allocated once per output shape.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

from gemmgen.backends.base import BackendError, TensorArg, check_launch, int32_overflows, refuse_int32_overflow
from gemmgen.backends.cuda.source import stored

_MODULES: dict[tuple[str, int], Any] = {}
_LOCK = threading.Lock()
SMEM_WITHOUT_OPT_IN = 48 * 1024   # static + dynamic shared memory a CTA gets unless its function opts in


def needs_smem_opt_in(dynamic: int, static: int) -> bool:
    """Whether a launch of `dynamic` bytes needs the function's dynamic limit raised: the default
    limit is what the function's static shared memory leaves of 48 KB, so a ring of exactly 48 KB
    beside a small static `__shared__` flag fails to launch without it."""
    return dynamic + static > SMEM_WITHOUT_OPT_IN


def check(result, what: str):
    """Unwrap a cuda-bindings result tuple, raising BackendError on any error code."""
    # Deferred: cuda (optional, heavy to import).
    from cuda.bindings import driver
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise BackendError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def ensure_context(device_index: int) -> None:
    """Make torch's primary context current on this thread for driver-API calls."""
    # Deferred: cuda, torch (optional, heavy to import).
    import torch
    from cuda.bindings import driver
    torch.cuda.init()
    torch.cuda.set_device(device_index)
    check(driver.cuInit(0), "cuInit")
    ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        dev = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def load_functions(key: str, cubin: bytes, names: tuple[str, ...], device_index: int, smem: int) -> dict[str, Any]:
    """CUfunction handles of `names` in `cubin`, loaded once per device; dynamic smem raised once."""
    # Deferred: cuda (optional, heavy to import).
    from cuda.bindings import driver
    with _LOCK:
        module = _MODULES.get((key, device_index))
        if module is None:
            ensure_context(device_index)
            module = check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
            _MODULES[(key, device_index)] = module
    funcs = {}
    for name in names:
        fn = check(driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
        static = check(driver.cuFuncGetAttribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                       f"cuFuncGetAttribute({name}, static shared memory)")
        if needs_smem_opt_in(smem, static):
            check(driver.cuFuncSetAttribute(
                fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                f"cuFuncSetAttribute({name}, {smem} bytes of dynamic smem)")
            # Only a hint to the driver, asked for so that a kernel whose ring leaves room for two
            # or three CTAs gets them on every SM (a GPU test reads the count back).
            check(driver.cuFuncSetAttribute(
                fn, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                int(driver.CUshared_carveout.CU_SHAREDMEM_CARVEOUT_MAX_SHARED)),
                f"cuFuncSetAttribute({name}, shared memory carveout)")
        funcs[name] = fn
    return funcs


class ArgPack:
    """Kernel parameters as ctypes objects plus the void*[] array cuLaunchKernel reads."""

    def __init__(self, *values: ctypes._SimpleCData | ctypes.Structure):
        self.values = values
        self.array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def resident_ctas(fn, threads: int, smem: int) -> int:
    """CTAs of `fn` one SM holds at once (the driver's occupancy calculator)."""
    # Deferred: cuda (optional, heavy to import).
    from cuda.bindings import driver
    return check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, smem),
                 "cuOccupancyMaxActiveBlocksPerMultiprocessor")


def launch(fn, grid: tuple[int, int, int], block: int, smem: int, stream: int, args: ArgPack,
           cluster: tuple[int, int, int] | None = None) -> None:
    """One launch on `stream` (torch's current stream handle); raises if the driver refuses it."""
    # Deferred: cuda (optional, heavy to import).
    from cuda.bindings import driver
    if cluster is None or cluster == (1, 1, 1):
        check(driver.cuLaunchKernel(fn, *grid, block, 1, 1, smem, driver.CUstream(stream), args.address, 0),
              "cuLaunchKernel")
        return
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = smem
    config.hStream = driver.CUstream(stream)
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
    config.attrs = [attr]
    config.numAttrs = 1
    check(driver.cuLaunchKernelEx(config, fn, args.address, 0), "cuLaunchKernelEx")


# ---- argument structures mirroring the C structs of templates/ -----------

class GemmArgs(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("ld_a", ctypes.c_longlong),
                ("b", ctypes.c_void_p), ("ld_b", ctypes.c_longlong),
                ("M", ctypes.c_int), ("N", ctypes.c_int), ("K", ctypes.c_int),
                ("workspace", ctypes.c_void_p), ("counters", ctypes.c_void_p)]


class EpilogueArgs(ctypes.Structure):
    _fields_ = [("out", ctypes.c_void_p), ("ld_out", ctypes.c_longlong),
                ("c", ctypes.c_void_p), ("ld_c", ctypes.c_longlong),
                ("bias", ctypes.c_void_p),
                ("residual", ctypes.c_void_p), ("ld_residual", ctypes.c_longlong),
                ("alpha", ctypes.c_float), ("beta", ctypes.c_float)]


_TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


def torch_dtype(name: str):
    # Deferred: torch (optional, heavy to import).
    import torch
    return getattr(torch, _TORCH_DTYPES[name])


class OperandCheck:
    """Checks a call's tensors against what the kernel was compiled for, cheaply, per call."""

    def __init__(self, program):
        p = program.problem
        self.problem = p
        self.in_dtype = torch_dtype(p.in_dtype)
        self.out_dtype = torch_dtype(p.epilogue.out_dtype)

    def operands(self, a, b, out) -> tuple[int, int, int, int, int]:
        """(M, N, K, ld_a, ld_b) after checking shapes, dtypes, majors, devices and 16-byte alignment."""
        p = self.problem
        if a.dim() != 2 or b.dim() != 2 or out.dim() != 2:
            raise BackendError("a, b and out must be 2-D (M,K), (K,N), (M,N)")
        M, K = a.shape
        K2, b_cols = b.shape
        N = out.shape[1]
        if p.epilogue.gate:   # B = [B_gate B_up], K x 2N
            if K2 != K or b_cols != 2 * N or out.shape[0] != M:
                raise BackendError(f"shapes do not chain: a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}; "
                                   "a gated program takes A (M, K), B (K, 2N): the gate half, then the up half, "
                                   "and out (M, N)")
        elif K2 != K or tuple(out.shape) != (M, b_cols):
            raise BackendError(f"shapes do not chain: a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}")
        for name, dim, want in (("M", M, p.m), ("N", N, p.n), ("K", K, p.k)):
            if want is not None and dim != want:
                raise BackendError(f"this kernel was built for {name}={want}, called with {name}={dim}")
        if a.dtype != self.in_dtype or b.dtype != self.in_dtype or out.dtype != self.out_dtype:
            raise BackendError(f"dtypes: a, b must be {self.in_dtype} and out {self.out_dtype}")
        ld_a = _lead(a, "A", p.a_major)
        ld_b = _lead(b, "B", p.b_major)
        _lead(out, "out", p.c_major)
        for name, t, ld in (("A", a, ld_a), ("B", b, ld_b)):
            if t.data_ptr() % 16 or ld % 8:
                raise BackendError(f"{name} must start 16-byte aligned with a leading dimension that is a multiple "
                                   f"of 8 (got {ld}); the kernel copies 16-byte chunks")
        return M, N, K, ld_a, ld_b

    def epilogue(self, pack: EpilogueArgs, out, bias, residual, c, alpha: float, beta: float) -> None:
        """Fill `pack` from the call, refusing tensors the compiled epilogue does not read (or needs)."""
        e = self.problem.epilogue
        M, N = out.shape
        pack.out, pack.ld_out = out.data_ptr(), out.stride(0)
        pack.alpha, pack.beta = float(alpha), float(beta)
        if e.gate and pack.alpha != 1.0:
            raise BackendError(f"a gated program computes {e.gate}(A B_gate) * (A B_up) with no scale: "
                               f"call it without alpha= (got alpha={alpha})")
        if e.beta != 0.0:
            if c is None:
                raise BackendError("the program's epilogue reads C (beta != 0): pass c=")
            _aux(c, (M, N), self.out_dtype, "c")
            pack.c, pack.ld_c = c.data_ptr(), c.stride(0)
        elif c is not None and beta != 0.0:
            raise BackendError("this kernel was built without beta*C; build a program with beta set")
        if e.bias:
            if bias is None:
                raise BackendError(f"the program's epilogue adds a bias along {e.bias.upper()}: pass bias=")
            _aux(bias, (M if e.bias == "m" else N,), self.out_dtype, "bias")
            pack.bias = bias.data_ptr()
        elif bias is not None:
            raise BackendError("this kernel was built without a bias")
        if e.residual:
            if residual is None:
                raise BackendError("the program's epilogue adds a residual: pass residual=")
            _aux(residual, (M, N), self.out_dtype, "residual")
            pack.residual, pack.ld_residual = residual.data_ptr(), residual.stride(0)
        elif residual is not None:
            raise BackendError("this kernel was built without a residual")


def _lead(t, name: str, major: str) -> int:
    """Leading dimension of a 2-D tensor stored `major`; refuses other stride patterns."""
    rows, cols = t.shape
    s0, s1 = t.stride()
    if major == "row" and (s1 == 1 or cols == 1) and s0 >= cols:
        return max(s0, 1)
    if major == "col" and (s0 == 1 or rows == 1) and s1 >= rows:
        return max(s1, 1)
    raise BackendError(f"{name} must be {major}-major (strides {(s0, s1)} for shape {tuple(t.shape)})")


def _aux(t, shape: tuple[int, ...], dtype, name: str) -> None:
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise BackendError(f"{name} must be {dtype} of shape {shape}, got {t.dtype} {tuple(t.shape)}")
    if t.dim() == 2 and t.stride(1) != 1:
        raise BackendError(f"{name} must be row-major")
    if t.dim() == 1 and t.stride(0) != 1:
        raise BackendError(f"{name} must be contiguous")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LaunchGeometry:
    """What every family's launch needs besides the call's M, N, K (each family adds its own)."""

    threads: int
    smem: int
    tile_m: int
    tile_n: int


STREAM_K_MIN_ITERS = 4       # k tiles a stream-K CTA computes at least


def stream_k_grid(iterations: int, wave: int) -> int:
    """Stream-K's CTAs (multistage and TMA families): one wave, but at least STREAM_K_MIN_ITERS k
    tiles each (a tile's first CTA reads the others' partials one after another)."""
    return max(1, min(wave, iterations // STREAM_K_MIN_ITERS))


def tile_count(geo: LaunchGeometry, M: int, N: int) -> int:
    """Output tiles of an M x N product under a family's geometry (its tile_m and tile_n)."""
    return ceil_div(M, geo.tile_m) * ceil_div(N, geo.tile_n)


INDEXES = "the CUDA kernels count rows, columns and tiles in 32-bit ints"


def index_counts(program, M: int, N: int, K: int) -> dict[str, int]:
    """What the templates count in `int` at M, N, K (element offsets are 64-bit there): read by the
    backend's rules at the bound shape and by the launcher at the call's."""
    t = program.tile
    tiles = ceil_div(M, t.m) * ceil_div(N, t.n)
    counts = {"M + tile M (the rows the last tile reaches)": M + t.m, "N + tile N (its columns)": N + t.n,
              "K + tile K (the K its last k tile reaches)": K + t.k, "the output tiles": tiles}
    if program.problem.epilogue.gate:   # the joined B's columns: the up half's run to 2N
        counts["2N + tile N (the joined B's columns, gate and up)"] = 2 * N + t.n
    if program.mainloop != "multistage" or program.scheduler != "tile":
        counts["output tiles x k tiles (a walking CTA's count of k tiles)"] = tiles * ceil_div(K, t.k)
    return counts


def index_rules(program) -> list[tuple[str, str]]:
    """Refuses a bound problem whose counts overflow the templates' 32-bit ints."""
    p = program.problem
    if not p.is_bound:
        return []
    return [("gemm", message) for message in int32_overflows(index_counts(program, p.m, p.n, p.k), INDEXES)]


__all__ = ["ArgPack", "EpilogueArgs", "GemmArgs", "INDEXES", "LaunchGeometry", "OperandCheck", "STREAM_K_MIN_ITERS",
           "ceil_div", "check", "check_call", "index_counts", "index_rules", "launch", "load_functions",
           "resident_ctas", "stream_k_grid", "tile_count"]


def check_call(program, device: int, M: int, N: int, K: int, out: TensorArg, inputs: list, alpha, beta) -> None:
    """The launch checks of every raw-CUDA family (pure: runs on fake TensorArgs): one device,
    out 16-byte aligned and apart from every input, finite alpha and beta, counts within int32."""
    check_launch(out, inputs, device, alpha, beta)
    refuse_int32_overflow(index_counts(program, M, N, K), INDEXES)


class FamilyLauncher:
    """The calling convention every raw-CUDA family shares: fn(a, b, out, *, bias, residual, c, alpha, beta)
    checks the operands, returns at once on an empty output, fills the epilogue and launches on torch's
    current stream. A family fills its own kernel arguments (`_set_operands`) and launches (`_launch`)."""

    def __init__(self, artifact, program, geo, names: tuple[str, ...]):
        # Deferred: torch (optional, heavy to import).
        import torch
        self.program = program
        self.geo = geo
        self.check = OperandCheck(program)
        # c=col (swap_ab's C^T): the epilogue's tensors are checked as the stored matrix's
        self.stored_check = OperandCheck(stored(program)) if program.problem.c_major == "col" else None
        self.device = torch.cuda.current_device()
        self.funcs = load_functions(artifact.key, artifact.data, names, self.device, geo.smem)
        self.epi_args = EpilogueArgs()

    def _set_operands(self, a, b, M: int, N: int, K: int, ld_a: int, ld_b: int) -> None:
        raise NotImplementedError

    def _launch(self, M: int, N: int, stream: int) -> None:
        raise NotImplementedError

    def _fill_epilogue(self, out, bias, residual, c, alpha: float, beta: float) -> None:
        if self.stored_check is None:
            return self.check.epilogue(self.epi_args, out, bias, residual, c, alpha, beta)
        t = (lambda x: None if x is None else x.t())
        self.stored_check.epilogue(self.epi_args, out.t(), bias, t(residual), t(c), alpha, beta)

    def __call__(self, a, b, out, *, bias=None, residual=None, c=None, alpha=None, beta=None):
        # Deferred: torch (optional, heavy to import).
        import torch
        e = self.program.problem.epilogue     # alpha, beta not given: the program's (as every backend)
        alpha, beta = e.alpha if alpha is None else alpha, e.beta if beta is None else beta
        M, N, K, ld_a, ld_b = self.check.operands(a, b, out)
        check_call(self.program, self.device, M, N, K, TensorArg.of("out", out),
                   [TensorArg.of(name, t) for name, t in (("a", a), ("b", b), ("bias", bias), ("residual", residual),
                                                           ("c", c)) if t is not None], alpha, beta)
        if M == 0 or N == 0:
            return out
        self._set_operands(a, b, M, N, K, ld_a, ld_b)
        self._fill_epilogue(out, bias, residual, c, alpha, beta)
        self._launch(M, N, torch.cuda.current_stream(a.device).cuda_stream)
        return out
