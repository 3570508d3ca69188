"""The contract every backend keeps: support as data, then lower -> build -> load.

Lowering is pure (program in, source text out). Building is CPU work and may run
in a process pool, so `Source` and `Artifact` are plain picklable data. Loading
needs the GPU and returns a `Launcher` that runs on torch's current stream.

A module of this room must import without triton, CUTLASS or a GPU: the heavy
imports happen inside `build` and `load`.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Optional, Protocol, Sequence

from gemmgen.dsl.ir import Program
from gemmgen.errors import GemmgenError


@dataclass(frozen=True)
class Support:
    """Which DSL choices a backend can realise; the validator reads this.

    Each field lists the accepted values; `extra_rules` holds backend-specific
    checks, each returning `(program field, message)` pairs for what it refuses.
    """

    mainloops: frozenset[str]
    schedulers: frozenset[str]
    instr_kinds: frozenset[Optional[str]]
    split_k_reduces: frozenset[str]
    activations: frozenset[str]
    bias: bool = True
    residual: bool = True
    beta: bool = True
    max_cluster: int = 1
    smem_swizzles: frozenset[Optional[int]] = frozenset({None})
    auto_stages: bool = False
    grid_sms: bool = False           # takes `scheduler persistent N` (a persistent grid on N SMs)
    epilogue_tile: bool = False      # takes `tile ... epilogue=MxN` (the store's sub-tile)
    gated: bool = False              # takes `epilogue gate=ACT halves=...` (two halves of B, one product)
    majors_a: frozenset[str] = frozenset({"row", "col"})
    majors_b: frozenset[str] = frozenset({"row", "col"})
    majors_c: frozenset[str] = frozenset({"row"})
    out_dtypes: frozenset[str] = frozenset({"f16"})
    in_dtypes: frozenset[str] = frozenset({"f16"})
    extra_rules: tuple[Callable[[Program], list[tuple[str, str]]], ...] = ()
    # `gemmgen inspect` rows, by name, that this backend realises otherwise than the
    # language's model says (e.g. stages it ignores)
    fact_rows: Optional[Callable[[Program], list[tuple[str, str]]]] = None


@dataclass(frozen=True)
class Source:
    """Lowered text plus what the builder and loader need beside it."""

    backend: str
    text: str
    entry: str
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        h = hashlib.sha256(self.backend.encode())
        h.update(self.text.encode())
        h.update(repr(sorted(self.meta.items())).encode())
        return h.hexdigest()[:24]


@dataclass(frozen=True)
class Artifact:
    """A built kernel: a path on disk (cubin, shared library) or inline bytes."""

    backend: str
    key: str
    path: Optional[str] = None
    data: Optional[bytes] = None
    meta: Mapping[str, Any] = field(default_factory=dict)


class Launcher(Protocol):
    """Writes the result into `out`; launches on torch's current stream."""

    def __call__(self, a, b, out, *, bias=None, residual=None, c=None,
                 alpha: float = 1.0, beta: float = 0.0) -> Any: ...


class BackendModule(Protocol):
    NAME: str
    SUPPORT: Support

    def lower(self, program: Program) -> Source: ...

    def build(self, source: Source, arch: str = "sm_90a") -> Artifact: ...

    def load(self, artifact: Artifact, program: Program) -> Launcher: ...


class BackendError(GemmgenError):
    """A backend could not build or load a program; the message says why."""


def refuse_swapped(program: Program) -> None:
    """A backend lowers the program it computes; a `swap_ab` one goes through `backends.lower`."""
    if program.swap_ab:
        raise BackendError("a swap_ab program is lowered and loaded through gemmgen.backends.lower / load, "
                           "which hand the backend the transposed problem it computes")


# ---- the limits and argument checks every launcher applies (pure: shapes, pointers, devices) ----

#: The generated kernels count in 32-bit integers (dimensions, tile counts, and in Triton's
#: kernels element offsets too): every such count must stay below this. Each backend's rules
#: refuse a bound problem past it, and its launcher refuses such a call.
INT32_LIMIT = 2**31
FLOAT32_MAX = 3.4028234663852886e38   # alpha and beta reach the kernels as fp32


def int32_overflows(counts: Mapping[str, int], indexes: str) -> list[str]:
    """A message for each named count at or past INT32_LIMIT; `indexes` says what the kernel
    holds in 32-bit integers."""
    return [f"{name} is {value}, at or past the 32-bit index limit 2^31 = {INT32_LIMIT}: {indexes}; "
            "split the problem into parts below 2^31 (e.g. along M)"
            for name, value in counts.items() if value >= INT32_LIMIT]


def refuse_int32_overflow(counts: Mapping[str, int], indexes: str) -> None:
    """At call time, the last guard behind the rules (a shape-generic program meets sizes late)."""
    found = int32_overflows(counts, indexes)
    if found:
        raise BackendError(found[0])


class TensorArg(NamedTuple):
    """What the launch checks read of one tensor argument: never its data, so they run on fakes.
    (A named tuple, not a dataclass: a launcher builds several per call, and it is cheaper.)"""

    name: str
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]    # in elements, as torch gives them
    itemsize: int
    device: int                 # torch's device index (`get_device()`): -1 for the CPU

    @classmethod
    def of(cls, name: str, t) -> "TensorArg":
        """From a torch tensor (read by duck typing: no torch import here)."""
        return cls(name, t.data_ptr(), tuple(t.shape), t.stride(), t.element_size(), t.get_device())

    @property
    def extent(self) -> int:
        """Elements from the first addressed to one past the last (0 when empty)."""
        shape, strides = self.shape, self.strides
        if 0 in shape:
            return 0
        if len(shape) == 2:   # the common case, without a generator (launchers call this per call)
            return 1 + (shape[0] - 1) * abs(strides[0]) + (shape[1] - 1) * abs(strides[1])
        return 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides))

    def byte_range(self) -> tuple[int, int]:
        return self.ptr, self.ptr + self.extent * self.itemsize

    def rows(self) -> Optional[tuple[int, int]]:
        """(row stride, row width) of a 2-D view with one unit-stride dimension, else None."""
        if len(self.shape) != 2:
            return None
        (r, c), (sr, sc) = self.shape, self.strides
        if sc == 1 and sr >= c:
            return sr, c
        if sr == 1 and sc >= r:
            return sc, r
        return None


def device_name(index: int) -> str:
    return "cpu" if index < 0 else f"cuda:{index}"


def overlaps(x: TensorArg, y: TensorArg) -> bool:
    """Could a write through `x` change an element read through `y`? Byte ranges that meet, unless
    both are row slices of one buffer (same row stride) whose columns are disjoint."""
    (xl, xh), (yl, yh) = x.byte_range(), y.byte_range()
    if xh <= yl or yh <= xl:
        return False
    rx, ry = x.rows(), y.rows()
    if rx is None or ry is None or rx[0] != ry[0] or x.itemsize != y.itemsize or (y.ptr - x.ptr) % x.itemsize:
        return True
    if x.ptr > y.ptr:
        x, y, rx, ry = y, x, ry, rx
    period = rx[0]
    offset = ((y.ptr - x.ptr) // x.itemsize) % period
    return not (rx[1] <= offset and offset + ry[1] <= period)


def refuse_aliasing(out: TensorArg, inputs: Sequence[TensorArg]) -> None:
    """`out` may share no memory with an input: the kernel would read what it has overwritten."""
    for t in inputs:
        if overlaps(out, t):
            raise BackendError(f"{out.name} overlaps {t.name} in memory ({out.name} at {out.ptr:#x}, {t.name} at "
                               f"{t.ptr:#x}): the kernel reads {t.name} while it writes {out.name}; pass an output "
                               "tensor of its own")


def refuse_misaligned(args: Sequence[TensorArg], alignment: int = 16) -> None:
    for t in args:
        if t.ptr % alignment:
            raise BackendError(f"{t.name} starts at {t.ptr:#x}, not on a {alignment}-byte boundary, which the kernel's "
                               f"vector loads and stores need: pass a tensor (not an offset view) that starts aligned")


def refuse_other_devices(args: Sequence[TensorArg], device: int) -> None:
    for t in args:
        if t.device != device:
            raise BackendError(f"{t.name} is on {device_name(t.device)}, but this kernel runs on "
                               f"{device_name(device)}: move every tensor there")


def refuse_nonfinite(alpha: float, beta: float) -> None:
    """alpha and beta must be finite fp32 numbers (a NaN or inf would poison every output)."""
    for name, value in (("alpha", alpha), ("beta", beta)):
        try:
            ok = math.isfinite(value) and abs(value) <= FLOAT32_MAX
        except TypeError:
            ok = False
        if not ok:
            raise BackendError(f"{name}={value!r} is not a finite fp32 number: pass a finite {name}")


def check_launch(out: TensorArg, inputs: Sequence[TensorArg], device: int, alpha: float, beta: float,
                 alignment: int = 16) -> None:
    """What every launcher checks before a launch: one device, `out` aligned and apart from
    every input, finite scalars. Shapes, dtypes and majors are each launcher's own."""
    refuse_other_devices((out, *inputs), device)
    refuse_misaligned((out,), alignment)
    refuse_aliasing(out, inputs)
    refuse_nonfinite(alpha, beta)
