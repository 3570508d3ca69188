"""What the model reads and what it writes.

The prompt is itself DSL text: a comment naming the hardware, a comment with the
problem's size in powers of two (so sizes never seen still read as "about 2^12"),
then the problem's own canonical lines (`gemm ...`, `epilogue ...`). The answer is
the rest of one canonical program: `backend ...` through `split_k ...`, one
statement per line. Prompt plus answer is a whole program that `gemmgen.dsl.parse`
reads, comments included, so a sample is judged by the language's own parser.
"""
from __future__ import annotations

import math
from functools import lru_cache

from gemmgen.dsl import parse
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import Instr, Problem, Program, Tile
from gemmgen.dsl.printer import epilogue_line, problem_line, statements

HARDWARE_LINE = f"# target {SM90A.arch} {SM90A.sms} SMs"


@lru_cache(maxsize=1)
def statement_order() -> tuple[str, ...]:
    """Every statement name in canonical order, as the DSL's printer writes them."""

    probe = Program(Problem(1, 1, 1), "triton", Tile(16, 16, 16), (1, 1), "multistage",
                    instr=Instr("mma", 16, 8, 16))
    return tuple(name for name, _ in statements(probe))


PROBLEM_STATEMENTS = ("gemm", "epilogue")


def answer_statements() -> tuple[str, ...]:
    """The statements the model writes: all but the problem's own."""
    return tuple(n for n in statement_order() if n not in PROBLEM_STATEMENTS)


def _log2(x) -> str:
    return "*" if x is None else str(round(math.log2(max(1, x))))


def prompt_text(problem: Problem) -> str:
    """The prompt for one problem (ends with a newline)."""

    size = f"# log2 m={_log2(problem.m)} n={_log2(problem.n)} k={_log2(problem.k)}"
    return "\n".join([HARDWARE_LINE, size, problem_line(problem), epilogue_line(problem.epilogue)]) + "\n"


def answer_text(program: Program) -> str:
    """The canonical answer lines of `program` (ends with a newline)."""

    return "".join(line + "\n" for name, line in statements(program) if name not in PROBLEM_STATEMENTS)


def program_from_answer(problem: Problem, answer: str) -> Program:
    """Prompt plus answer, parsed by the DSL; raises `ProgramError` if it does not parse."""

    return parse(prompt_text(problem) + answer)


def example_text(program: Program) -> tuple[str, str]:
    """(prompt, answer) of a supervised example."""
    return prompt_text(program.problem), answer_text(program)
