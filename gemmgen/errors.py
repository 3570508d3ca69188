"""Errors a user meets. The command line prints these as one line, never a traceback."""

from gemmgen.dsl.diagnostics import GemmgenError

__all__ = ["GemmgenError", "NoGPUError"]


class NoGPUError(GemmgenError):
    """The call needs a CUDA device and there is none."""

    def __init__(self, what: str = "this call"):
        super().__init__(
            f"{what} needs an NVIDIA Hopper GPU (sm_90a) and torch with CUDA; none was found. "
            "Inspection, lowering and building work without one."
        )
