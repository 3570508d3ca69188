"""`diagnose(program)` lists every problem, located; `validate(program)` raises the first.

The language's own checks live in checks.py (hardware and problem). What a backend
can realise is the backends' knowledge: `gemmgen.backends.validate` passes their rules
in as `backend_rules`, so the language imports no one. This module runs the checks in
order and attaches each finding to the (line, column) of its statement, 0:0 for a
program built in code.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Optional

from gemmgen.dsl.checks import CHECKS, VALUE_CHECKS
from gemmgen.dsl.diagnostics import Diagnostic, ProgramError
from gemmgen.dsl.hardware import SM90A, Hardware
from gemmgen.dsl.ir import Program

#: (program, run_extra_rules) -> (statement, message) findings of the program's backend.
BackendRules = Callable[[Program, bool], Iterable[tuple[str, str]]]


def _locate(program: Program, statement: str, message: str) -> Diagnostic:
    spans = program.spans or {}
    if statement in spans:
        line, column = spans[statement]
    elif spans:
        # A defaulted statement: point at the gemm line and say the default is at fault.
        line, column = spans.get("gemm", (1, 1))
        message = f"{message} (there is no `{statement}` line, so its default applies; add one)"
    else:
        line, column = 0, 0
    return Diagnostic(line, column, message, statement)


def diagnose(program: Program, hw: Hardware = SM90A, *,
             backend_rules: Optional[BackendRules] = None) -> list[Diagnostic]:
    """Every problem found: hardware and problem errors, then the backend's, each group in
    source order (value errors alone if a field holds something outside the language).
    A backend's extra rules run only on a program the language accepts. A `swap_ab` program is
    checked as the program it computes (`Program.computed`), each finding saying so."""
    if program.swap_ab and program.problem.epilogue.gate:
        return [_locate(program, "swap_ab", "swap_ab cannot transpose a gated product (its two halves are columns "
                                            "of B, and would become rows): drop swap_ab")]
    if program.swap_ab:
        t = program.computed.problem
        dims = "x".join("*" if d is None else str(d) for d in (t.m, t.n, t.k))
        return [replace(d, message=f"with swap_ab the kernel computes C^T = B^T A^T ({dims}, "
                                   f"a={t.a_major} b={t.b_major} c={t.c_major}): {d.message}")
                for d in diagnose(program.computed, hw, backend_rules=backend_rules)]
    value_errors = [f for check in VALUE_CHECKS for f in check(program, hw)]
    if value_errors:
        return _in_order(program, value_errors)
    findings = [f for check in CHECKS for f in check(program, hw)]
    support = list(backend_rules(program, not findings)) if backend_rules else []
    # Hardware and problem errors come first: they hold whatever the backend.
    return _in_order(program, findings) + _in_order(program, support)


def _in_order(program: Program, findings) -> list[Diagnostic]:
    located = [_locate(program, statement, message) for statement, message in findings]
    return sorted(located, key=lambda d: (d.line, d.column))


def validate(program: Program, hw: Hardware = SM90A, filename: Optional[str] = None, *,
             backend_rules: Optional[BackendRules] = None) -> Program:
    """The program itself if it passes; otherwise `ProgramError` for its first problem."""
    problems = diagnose(program, hw, backend_rules=backend_rules)
    if problems:
        raise ProgramError.from_diagnostic(problems[0], filename)
    return program
