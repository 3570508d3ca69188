"""Backends: a DSL program in, CUDA out (Triton, CUTLASS templates, raw CUDA C).

`get(name)` imports one backend module lazily, so that the validator can read a
backend's `SUPPORT` without importing triton or CUTLASS.
"""
from __future__ import annotations

import importlib

from gemmgen.backends.base import Artifact, BackendError, BackendModule, Launcher, Source, Support

_MODULES = {
    "triton": "gemmgen.backends.triton",
    "cutlass": "gemmgen.backends.cutlass",
    "cuda": "gemmgen.backends.cuda",
}


def get(name: str) -> BackendModule:
    """The backend module called `name` (one of triton, cutlass, cuda)."""
    try:
        module = _MODULES[name]
    except KeyError:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(_MODULES)}") from None
    return importlib.import_module(module)  # type: ignore[return-value]


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


__all__ = ["Artifact", "BackendError", "BackendModule", "Launcher", "Source", "Support", "get", "names"]
