"""A built CUTLASS instance (a shared library with a C ABI) as a gemmgen Launcher.

Per call: argument checks in Python, one ctypes call that builds CUTLASS's
arguments, zeroes the stream-K barriers (async, when the run has any) and
launches on torch's current stream. No device synchronisation, no allocation:
the workspace is a cached torch buffer that only grows, and the shared-memory
attribute and cluster occupancy are set once, when the library is loaded.
"""
from __future__ import annotations

import ctypes
from typing import Optional

from gemmgen.backends.base import BackendError, TensorArg, check_launch, refuse_int32_overflow
from gemmgen.backends.cutlass.emit import InstanceSpec, RuntimeArgs
from gemmgen.backends.cutlass.rules import INDEXES, index_counts
from gemmgen.backends.workspace import persistent_buffer

from gemmgen.errors import NoGPUError

_INIT_ERRORS = {
    1: "cudaSetDevice failed (no such CUDA device?)",
    2: "could not read the SM count",
    3: "cudaFuncSetAttribute refused the kernel's shared memory size",
    4: "cudaOccupancyMaxActiveClusters says no cluster of this shape fits on the device",
}
_STATUS = {0: "success", 1: "misaligned operand", 2: "invalid data type", 3: "invalid layout",
           4: "invalid problem", 5: "not supported", 6: "workspace null", 7: "internal error",
           8: "arch mismatch", 9: "insufficient driver", 10: "memory allocation", 11: "invalid status"}
_PHASE = {1: "can_implement refused the arguments", 2: "workspace initialisation failed", 3: "launch failed"}
# Codes of a `split_k N workspace` library's own checks (no CUTLASS status in them).
_SLICED_ERRORS = {4: "K does not cut into split_k slices whose length is a multiple of 8 (16-byte TMA steps); "
                     "choose a split_k that divides K into such slices",
                  5: "the split-K reduce kernel did not launch"}

_c = ctypes
_RUN_ARGTYPES = [_c.c_void_p] * 5 + [_c.c_int] * 3 + [_c.c_longlong] * 4 + [_c.c_float] * 2 + \
    [_c.c_int] * 6 + [_c.c_void_p, _c.c_void_p]


def open_library(path: str) -> ctypes.CDLL:
    """Load an instance library (also on a machine without a GPU: nothing runs at load)."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise BackendError(f"cannot load the CUTLASS library {path}: {exc}; rebuild it "
                           "(gemmgen build --backend cutlass ...)") from None
    lib.gg_run.argtypes = _RUN_ARGTYPES
    lib.gg_run.restype = _c.c_int
    lib.gg_workspace_size.argtypes = [_c.c_int] * 9
    lib.gg_workspace_size.restype = _c.c_longlong
    lib.gg_debug_skip_workspace_init.argtypes = [_c.c_int]
    lib.gg_debug_skip_workspace_init.restype = None
    lib.gg_initialize.argtypes = [_c.c_int]
    lib.gg_initialize.restype = _c.c_int
    for name in ("gg_shared_memory_bytes", "gg_threads", "gg_stages", "gg_max_active_clusters"):
        getattr(lib, name).restype = _c.c_int
        getattr(lib, name).argtypes = []
    return lib


def describe(lib: ctypes.CDLL) -> dict:
    """What the compiled kernel turned out to be (answers without a GPU)."""
    return {"smem_bytes": lib.gg_shared_memory_bytes(), "threads": lib.gg_threads(), "stages": lib.gg_stages()}


class CutlassLauncher:
    """fn(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0) on the current stream."""

    def __init__(self, path: str, spec: InstanceSpec, runtime: RuntimeArgs):
        # Deferred: torch (optional, heavy to import).
        import torch

        if not torch.cuda.is_available():
            raise NoGPUError("running a CUTLASS kernel")
        self._torch = torch
        self.spec = spec
        self.runtime = runtime
        self._lib = open_library(path)
        self.device = torch.cuda.current_device()
        rc = self._lib.gg_initialize(self.device)
        if rc:
            raise BackendError(f"CUTLASS instance {path}: {_INIT_ERRORS.get(rc, f'initialise error {rc}')}")
        self._workspace: Optional[object] = None
        self._workspace_sizes: dict[tuple[int, int, int], int] = {}

    def _workspace_for(self, m: int, n: int, k: int, device):
        size = self._workspace_sizes.get((m, n, k))
        if size is None:
            r = self.runtime
            size = int(self._lib.gg_workspace_size(m, n, k, r.raster, r.swizzle, r.splits, r.decomposition,
                                                   r.reduction, r.grid_sms))
            self._workspace_sizes[(m, n, k)] = size
        if size == 0:
            return 0
        if self._workspace is None or self._workspace.numel() < size:
            self._workspace = persistent_buffer(size, self._torch.uint8, device)
        return self._workspace.data_ptr()

    def __call__(self, a, b, out, *, bias=None, residual=None, c=None, alpha: float = 1.0, beta: float = 0.0):
        spec = self.spec
        if a.dim() != 2 or b.dim() != 2:
            raise BackendError(f"a and b must be 2-D, (M, K) and (K, N); got {tuple(a.shape)} and {tuple(b.shape)}")
        m, k = a.shape
        n = b.shape[1]
        check_call(spec, self.device, m, n, k, TensorArg.of("out", out),
                   [TensorArg.of(name, t) for name, t in (("a", a), ("b", b), ("bias", bias), ("residual", residual),
                                                           ("c", c)) if t is not None], alpha, beta)
        lda = _leading(a, "a", spec.a_major, (m, k))
        ldb = _leading(b, "b", spec.b_major, (k, n))
        ldd = _leading(out, "out", spec.c_major, (m, n))
        source, ldc = None, ldd
        if spec.source == "residual":
            source, beta = _required(residual, "residual"), 1.0
        elif spec.source == "c":
            source = _required(c, "c")
        elif beta != 0.0:
            raise BackendError("this CUTLASS build has no C operand (its program's epilogue has beta 0); "
                               "lower a program with `beta=...` in its epilogue to pass beta")
        if spec.unscaled and alpha != 1.0:
            raise BackendError("this CUTLASS build stores the product unscaled (its program's epilogue has alpha 1); "
                               "lower a program with `alpha=...` in its epilogue to pass alpha")
        if source is not None:
            ldc = _leading(source, spec.source, spec.c_major, (m, n))
        bias_ptr = 0
        if spec.bias:
            length = m if spec.bias == "m" else n
            bias = _required(bias, "bias")
            if bias.dim() != 1 or bias.shape[0] != length or bias.stride(0) != 1 or bias.dtype != out.dtype:
                raise BackendError(f"bias={spec.bias} must be a contiguous 1-D {out.dtype} tensor of length {length}")
            bias_ptr = bias.data_ptr()
        for name, t in (("a", a), ("b", b), ("out", out), ("c/residual", source)):
            if t is not None and t.data_ptr() % 16:
                raise BackendError(f"{name} must start on a 16-byte boundary for TMA (offset view?)")
        r = self.runtime
        workspace = self._workspace_for(m, n, k, a.device)
        stream = self._torch.cuda.current_stream(a.device).cuda_stream
        rc = self._lib.gg_run(a.data_ptr(), b.data_ptr(), source.data_ptr() if source is not None else 0,
                              out.data_ptr(), bias_ptr, m, n, k, lda, ldb, ldc, ldd, float(alpha), float(beta),
                              r.raster, r.swizzle, r.splits, r.decomposition, r.reduction, r.grid_sms,
                              workspace, stream)
        if rc:
            phase, status = divmod(rc, 100)
            if phase in _SLICED_ERRORS:
                raise BackendError(f"CUTLASS {m}x{n}x{k}, split_k {r.splits}: {_SLICED_ERRORS[phase]}")
            raise BackendError(f"CUTLASS {m}x{n}x{k}: {_PHASE.get(phase, 'error')}: "
                               f"{_STATUS.get(status, status)}")
        return out


def check_call(spec: InstanceSpec, device: int, m: int, n: int, k: int, out: TensorArg, inputs: list,
               alpha, beta) -> None:
    """The launch checks (pure: runs on fake TensorArgs): one device, out 16-byte aligned and apart
    from every input, finite alpha and beta, and M, N, K within the 32-bit ints the library takes
    (ctypes would wrap a larger one silently)."""
    check_launch(out, inputs, device, alpha, beta)
    refuse_int32_overflow(index_counts(spec.tile, m, n, k), INDEXES)


def _required(t, name: str):
    if t is None:
        raise BackendError(f"this CUTLASS build reads `{name}`: pass {name}=tensor")
    return t


def _leading(t, name: str, major: str, shape: tuple[int, int]) -> int:
    """The leading dimension of a logical (rows, cols) operand stored `major`."""
    if tuple(t.shape) != shape:
        raise BackendError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    s0, s1 = t.stride()
    if major == "row" and (s1 == 1 or shape[1] == 1):
        ld = s0 if shape[0] > 1 else max(shape[1], 1)
    elif major == "col" and (s0 == 1 or shape[0] == 1):
        ld = s1 if shape[1] > 1 else max(shape[0], 1)
    else:
        raise BackendError(f"{name} with strides {t.stride()} is not {major}-major as the program says")
    if (ld * t.element_size()) % 16:
        raise BackendError(f"{name}'s leading dimension {ld} is not a multiple of 16 bytes, which TMA needs")
    return ld
