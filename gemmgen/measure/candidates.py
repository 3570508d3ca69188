"""Candidates for `gemmgen bench --candidates`: name -> 'module:function' factory.

A factory takes a bound Problem and returns a kernel fn (or an object with `.fn`),
called like any kernel: fn(a, b, out, *, bias, residual, c, alpha, beta). Entries are
strings, looked up only when used, so this module imports nothing and other rooms add
theirs with `register("name", "package.module:function")`; a spec may also be given
directly on the command line as `module:function`.
"""
from __future__ import annotations

import importlib
from typing import Callable

from gemmgen.measure.errors import UnknownName

CANDIDATES: dict[str, str] = {
    "gemmgen": "gemmgen.compile:bench_candidate",
}
#: name -> 'module:function' giving notes to record with the candidate's row (what was chosen),
#: computed in the bench process: the isolated worker returns only measurements.
NOTES: dict[str, str] = {
    "gemmgen": "gemmgen.compile:bench_candidate_notes",
}


def notes_for(name: str, problem) -> dict:
    """The notes a candidate records with its row ({} for candidates without a notes function)."""
    spec = NOTES.get(name)
    return resolve(spec)(problem) if spec else {}


def register(name: str, spec: str) -> None:
    if ":" not in spec:
        raise UnknownName(f"candidate spec {spec!r} must read 'module:function'")
    CANDIDATES[name] = spec


def spec_of(name: str) -> str:
    if name in CANDIDATES:
        return CANDIDATES[name]
    if ":" in name:
        return name
    raise UnknownName(f"unknown candidate {name!r}; known: {', '.join(sorted(CANDIDATES))} "
                      "(or give a factory as module:function)")


def resolve(spec_or_name: str) -> Callable:
    """The factory behind a name or a 'module:function' spec, with a clear error if absent."""
    spec = spec_of(spec_or_name)
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UnknownName(f"candidate {spec_or_name!r}: module {module_name!r} not found ({exc})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownName(f"candidate {spec_or_name!r}: {module_name} has no {attr!r}") from None
