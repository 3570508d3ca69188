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
    "gemmgen": "gemmgen.measure.candidates:compiled",
}
#: name -> 'module:function' giving notes to record with the candidate's row (what was chosen),
#: computed in the bench process: the isolated worker returns only measurements.
NOTES: dict[str, str] = {
    "gemmgen": "gemmgen.measure.candidates:compiled_notes",
}


def compiled(problem) -> Callable:
    """gemmgen.compile(problem): the product itself, as a user gets it, in the kernel convention."""
    import gemmgen

    compile_fn = getattr(gemmgen, "compile", None)
    if compile_fn is None:
        raise UnknownName("candidate 'gemmgen' needs gemmgen.compile, which this build does not have yet")
    kernel = compile_fn(problem)

    def fn(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        kernel(a, b, bias=bias, residual=residual, c=c, out=out, alpha=alpha, beta=beta)

    fn.kernel = kernel      # provenance for whoever wants it
    return fn


def compiled_notes(problem) -> dict:
    """What gemmgen.compile served: exact winner, a neighbour's re-bound program, or the baseline."""
    import gemmgen

    kernel = gemmgen.compile(problem)
    p = kernel.provenance
    notes = {"how": p.how, "backend": kernel.backend}
    if p.how == "nearest":
        notes.update(tuned_problem=p.tuned_problem, distance=round(p.distance, 4))
    return notes


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
