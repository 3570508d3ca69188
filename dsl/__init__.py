"""The kernel language: grammar, typed IR, parser, printer, validator, hardware model.

    from gemmgen.dsl import parse, to_text, validate, facts
    program = validate(parse(open("k.gemm").read(), filename="k.gemm"))
"""
from __future__ import annotations

import importlib.resources

from gemmgen.dsl.diagnostics import Diagnostic, ProgramError
from gemmgen.dsl.facts import Facts, facts
from gemmgen.dsl.hardware import SM90A, Hardware
from gemmgen.dsl.ir import Epilogue, Instr, Problem, Program, Tile
from gemmgen.dsl.parser import parse, parse_epilogue
from gemmgen.dsl.printer import to_text
from gemmgen.dsl.validate import diagnose, validate


def examples() -> dict:
    """The shipped example programs: name (file stem) -> path of the .gemm file."""
    folder = importlib.resources.files("gemmgen.dsl").joinpath("examples")
    return {entry.name[: -len(".gemm")]: entry for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".gemm")}


__all__ = ["SM90A", "Diagnostic", "Epilogue", "Facts", "Hardware", "Instr", "Problem", "Program",
           "ProgramError", "Tile", "diagnose", "examples", "facts", "parse", "parse_epilogue", "to_text", "validate"]
