"""The contract every backend keeps: support as data, then lower -> build -> load.

Lowering is pure (program in, source text out). Building is CPU work and may run
in a process pool, so `Source` and `Artifact` are plain picklable data. Loading
needs the GPU and returns a `Launcher` that runs on torch's current stream.

A module of this room must import without triton, CUTLASS or a GPU: the heavy
imports happen inside `build` and `load`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

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
    majors_a: frozenset[str] = frozenset({"row", "col"})
    majors_b: frozenset[str] = frozenset({"row", "col"})
    majors_c: frozenset[str] = frozenset({"row"})
    out_dtypes: frozenset[str] = frozenset({"f16"})
    in_dtypes: frozenset[str] = frozenset({"f16"})
    extra_rules: tuple[Callable[[Program], list[tuple[str, str]]], ...] = ()


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
