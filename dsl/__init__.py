"""The kernel language: grammar, typed IR, parser, printer, validator, hardware model."""
from gemmgen.dsl.ir import Epilogue, Instr, Problem, Program, Tile

__all__ = ["Epilogue", "Instr", "Problem", "Program", "Tile"]
