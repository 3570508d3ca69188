"""The one way in to a backend for a program: `lower(program)` and `load(artifact, program)`.

A backend only ever sees the program it computes (`Program.computed`). For a `swap_ab`
program that is the transposed problem C^T = B^T A^T, and its launcher is called with the
transposed views of the caller's tensors: the weight W (N x K) becomes the first operand,
x^T the second, and the kernel writes C through C^T, column-major. No data moves; only
the roles and strides change. `bias=n` of the problem is `bias=m` of the transposed one,
the same vector.
"""
from __future__ import annotations

from gemmgen.backends.base import Artifact, Launcher, Source
from gemmgen.backends.registry import get
from gemmgen.backends.support import validate
from gemmgen.dsl.ir import Program


def lower(program: Program) -> Source:
    """The source of the kernel that computes `program`; a program the language or its backend
    refuses raises `ProgramError` with the first finding, located, before any text is made."""
    validate(program)
    computed = program.computed
    return get(computed.backend).lower(computed)


def load(artifact: Artifact, program: Program) -> Launcher:
    """A launcher called as `program`'s problem says, whatever problem its kernel computes."""
    computed = program.computed
    launcher = get(computed.backend).load(artifact, computed)
    return SwappedLauncher(launcher) if program.swap_ab else launcher


def _t(x):
    return None if x is None else x.t()


class SwappedLauncher:
    """C = A B by the kernel of C^T = B^T A^T: called with A, B and out, it launches the inner
    kernel on B^T, A^T and out^T (views), and the epilogue's matrices transposed alike."""

    def __init__(self, inner: Launcher):
        self.inner = inner

    def __call__(self, a, b, out, *, bias=None, residual=None, c=None, alpha=None, beta=None):
        self.inner(b.t(), a.t(), out.t(), bias=bias, residual=_t(residual), c=_t(c), alpha=alpha, beta=beta)
        return out
