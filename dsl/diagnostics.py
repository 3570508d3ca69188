"""Located problems in a program: `Diagnostic` (data) and `ProgramError` (raised).

Every message says what is wrong *and* what would fix it; the location is the
(line, column) of the statement at fault, or 0:0 for a program built in code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional



class GemmgenError(Exception):
    """Base of every error gemmgen raises on purpose; its message says what to do.

    Defined here, in the language every room builds on, so the language imports no one;
    `gemmgen.errors` is where the rest of gemmgen takes it from."""


@dataclass(frozen=True)
class Diagnostic:
    """One problem found in a program, located at a statement."""

    line: int
    column: int
    message: str
    statement: str = ""

    def format(self, filename: Optional[str] = None) -> str:
        return f"{filename or '<program>'}:{self.line}:{self.column}: {self.message}"


class ProgramError(GemmgenError):
    """A program that does not parse or cannot run; printed as `file:line:col: message`."""

    def __init__(self, message: str, line: int = 0, column: int = 0,
                 filename: Optional[str] = None, statement: str = ""):
        self.message = message
        self.line = line
        self.column = column
        self.filename = filename
        self.statement = statement
        super().__init__(self.located())

    def located(self) -> str:
        return f"{self.filename or '<program>'}:{self.line}:{self.column}: {self.message}"

    def __str__(self) -> str:
        return self.located()

    def __reduce__(self):
        return (ProgramError, (self.message, self.line, self.column, self.filename, self.statement))

    @classmethod
    def from_diagnostic(cls, d: Diagnostic, filename: Optional[str] = None) -> "ProgramError":
        return cls(d.message, d.line, d.column, filename, d.statement)

    @property
    def diagnostic(self) -> Diagnostic:
        return Diagnostic(self.line, self.column, self.message, self.statement)
