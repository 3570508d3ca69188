"""Errors a user meets. The command line prints these as one line, never a traceback."""


class GemmgenError(Exception):
    """Base of every error gemmgen raises on purpose; its message says what to do."""


class NoGPUError(GemmgenError):
    """The call needs a CUDA device and there is none."""

    def __init__(self, what: str = "this call"):
        super().__init__(
            f"{what} needs an NVIDIA Hopper GPU (sm_90a) and torch with CUDA; none was found. "
            "Inspection, lowering and building work without one."
        )
