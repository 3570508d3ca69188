"""Errors a user meets. The command line prints these as one line, never a traceback."""

import math

from gemmgen.dsl.diagnostics import GemmgenError

__all__ = ["GemmgenError", "NoGPUError", "finite_number"]


def finite_number(value) -> bool:
    """An int or float (not a bool), neither infinite nor NaN: what a user's seconds or
    microseconds must be before its range is checked."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and -math.inf < value < math.inf


class NoGPUError(GemmgenError):
    """The call needs a CUDA device and there is none."""

    def __init__(self, what: str = "this call"):
        super().__init__(
            f"{what} needs an NVIDIA Hopper GPU (sm_90a) and torch with CUDA; none was found. "
            "Inspection, lowering and building work without one."
        )
