"""Does the chosen backend support every feature the program uses? And the composed
`validate` / `diagnose` (the language's checks, then the backend's) and `fact_rows` (the
language's derived facts, with the rows the backend realises otherwise).

Each backend package declares a `SUPPORT` (backends/base.py `Support`); it is read
lazily through the registry, so validation needs neither triton nor CUTLASS. Validation
fails closed: a backend that does not import, or a rule that raises, is a finding that
refuses the program, never a skipped check.
"""
from __future__ import annotations

from typing import Iterator, Optional

from gemmgen.backends import registry
from gemmgen.dsl.diagnostics import Diagnostic
from gemmgen.dsl.facts import facts
from gemmgen.dsl.hardware import SM90A, Hardware
from gemmgen.dsl.ir import Program
from gemmgen.dsl.parser import STATEMENTS
from gemmgen.dsl.validate import diagnose as language_diagnose, validate as language_validate

Finding = tuple[str, str]

# A field named by a backend's extra rule -> the statement that sets it.
FIELD_STATEMENT = {
    "problem": "gemm", "m": "gemm", "n": "gemm", "k": "gemm", "a_major": "gemm", "b_major": "gemm",
    "c_major": "gemm", "in_dtype": "gemm", "acc_dtype": "gemm",
    "alpha": "epilogue", "beta": "epilogue", "bias": "epilogue", "activation": "epilogue",
    "residual": "epilogue", "out_dtype": "epilogue", "epilogue": "epilogue", "gate": "epilogue", "halves": "epilogue",
    "swizzle": "raster", "raster": "raster", "split_k_reduce": "split_k", "num_warps": "warps",
    "epilogue_tile": "tile",
}


def statement_of(field: str) -> str:
    name = FIELD_STATEMENT.get(field, field)
    return name if name in STATEMENTS else "backend"


class BackendUnavailable(Exception):
    """The backend's package did not import, so what it supports is unknown."""


def backend_support(name: str):
    """The backend's `Support`; None for a name outside the registry (the language's value
    check reports it). Raises BackendUnavailable if the backend's package does not import."""
    if name not in registry.NAMES:
        return None
    try:
        module = registry.get(name)
    except Exception as exc:  # noqa: BLE001  any import failure leaves the support unknown
        raise BackendUnavailable(f"{exc.__class__.__name__}: {exc}") from exc
    return module.SUPPORT


def _list(values) -> str:
    return ", ".join(sorted("auto" if v is None else str(v) for v in values))


def check_support(p: Program, run_extra_rules: bool = True) -> Iterator[Finding]:
    try:
        support = backend_support(p.backend)
    except BackendUnavailable as exc:
        yield "backend", (f"the {p.backend} backend did not import ({exc}), so this program cannot be "
                          "checked against it: reinstall gemmgen with that backend's extra, or choose another backend")
        return
    if support is None:
        return
    b, pr, e = p.backend, p.problem, p.problem.epilogue
    other = "or choose another backend"
    if p.mainloop not in support.mainloops:
        yield "mainloop", f"the {b} backend has no mainloop {p.mainloop}: use one of {_list(support.mainloops)}, {other}"
    if p.scheduler not in support.schedulers:
        yield "scheduler", f"the {b} backend has no scheduler {p.scheduler}: use one of {_list(support.schedulers)}, {other}"
    if p.grid_sms is not None and not support.grid_sms:
        yield "scheduler", (f"the {b} backend sizes its own grid: write `scheduler {p.scheduler}` without the "
                            f"SM count, {other}")
    if p.epilogue_tile is not None and not support.epilogue_tile:
        yield "tile", (f"the {b} backend chooses how its epilogue stores: drop `epilogue=` from "
                       f"`tile {p.tile.m}x{p.tile.n}x{p.tile.k}`, {other}")
    kind = p.instr.kind if p.instr else None
    if kind not in support.instr_kinds:
        yield "instr", (f"the {b} backend does not take `instr {kind or 'auto'}`: use one of "
                        f"{_list(support.instr_kinds)}, {other}")
    if p.split_k > 1 and p.split_k_reduce not in support.split_k_reduces:
        allowed = _list(support.split_k_reduces) or "none (write `split_k 1`)"
        yield "split_k", f"the {b} backend cannot reduce split-K by {p.split_k_reduce}: use {allowed}"
    if e.activation and e.activation not in support.activations:
        yield "epilogue", f"the {b} backend cannot fuse {e.activation}: use one of {_list(support.activations) or 'no activation'}, {other}"
    for used, allowed, what in ((bool(e.bias), support.bias, f"bias={e.bias}"),
                                (e.residual, support.residual, "residual"),
                                (float(e.beta) != 0.0, support.beta, "beta"),
                                (bool(e.gate), support.gated, f"gate={e.gate}")):
        if used and not allowed:
            yield "epilogue", f"the {b} backend cannot fuse {what}: drop it from the epilogue {other}"
    if e.out_dtype not in support.out_dtypes:
        yield "epilogue", f"the {b} backend cannot write out={e.out_dtype}: use out={_list(support.out_dtypes)}"
    size = p.cluster[0] * p.cluster[1]
    if size > support.max_cluster:
        yield "cluster", (f"the {b} backend launches clusters of at most {support.max_cluster} CTA(s); "
                          f"cluster {p.cluster[0]}x{p.cluster[1]} has {size}: use a smaller cluster {other}")
    if p.smem_swizzle not in support.smem_swizzles:
        yield "smem_swizzle", (f"the {b} backend does not take `smem_swizzle "
                               f"{'auto' if p.smem_swizzle is None else p.smem_swizzle}`: use one of "
                               f"{_list(support.smem_swizzles)}")
    if p.stages is None and not support.auto_stages:
        yield "stages", f"the {b} backend does not choose stages itself: write `stages N`"
    if pr.in_dtype not in support.in_dtypes:
        yield "gemm", f"the {b} backend does not read in={pr.in_dtype}: use in={_list(support.in_dtypes)}"
    for operand, major, allowed in (("a", pr.a_major, support.majors_a), ("b", pr.b_major, support.majors_b),
                                    ("c", pr.c_major, support.majors_c)):
        if major not in allowed:
            yield "gemm", f"the {b} backend does not take {operand}={major}: use {operand}={_list(allowed)} {other}"
    if run_extra_rules:
        for rule in support.extra_rules:
            try:
                found = list(rule(p) or ())
            except Exception as exc:  # noqa: BLE001  a rule that cannot answer refuses the program
                yield "backend", (f"the {b} backend could not check this program ({rule.__name__} failed with "
                                  f"{exc.__class__.__name__}: {exc}); it is refused rather than built unchecked: "
                                  "report this with the program")
                continue
            for field, message in found:
                yield statement_of(field), f"the {b} backend: {message}"


def diagnose(program: Program, hw: Hardware = SM90A) -> list[Diagnostic]:
    """Every problem of the program: the language's checks, then its backend's."""
    return language_diagnose(program, hw, backend_rules=check_support)


def validate(program: Program, hw: Hardware = SM90A, filename: Optional[str] = None) -> Program:
    """The program itself if the language and its backend accept it; else `ProgramError`
    for its first problem, located."""
    return language_validate(program, hw, filename, backend_rules=check_support)


def fact_rows(program: Program) -> list[tuple[str, str]]:
    """`gemmgen inspect`'s derived facts: the language's model (`dsl.facts`), each row the
    program's backend realises otherwise replaced by the backend's own."""
    rows = facts(program).rows()
    try:
        support = backend_support(program.backend)
    except BackendUnavailable:
        return rows
    own = dict(support.fact_rows(program)) if support is not None and support.fact_rows else {}
    return [(name, own.get(name, value)) for name, value in rows]
