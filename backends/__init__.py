"""Backends: a DSL program in, CUDA out (Triton, CUTLASS templates, raw CUDA C).

One package per backend (`triton/`, `cutlass/`, `cuda/`), each with lower, build, launch
and space; `registry` is the one list of them. `lower` and `load` are the way in for a
program: they hand the backend the program it computes (`swap_ab`: the transposed problem).
`validate` and `diagnose` compose the language's checks with the chosen backend's rules:
that is what a program must pass before it is built.
"""
from __future__ import annotations

from gemmgen.backends.base import Artifact, BackendError, BackendModule, Launcher, Source, Support
from gemmgen.backends.registry import NAMES, get, names
from gemmgen.backends.support import diagnose, fact_rows, validate
from gemmgen.backends.swap import load, lower

__all__ = ["NAMES", "Artifact", "BackendError", "BackendModule", "Launcher", "Source", "Support",
           "diagnose", "fact_rows", "get", "load", "lower", "names", "validate"]
