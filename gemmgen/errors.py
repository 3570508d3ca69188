"""Errors a user meets. The command line prints these as one line, never a traceback."""

from gemmgen.dsl.diagnostics import GemmgenError

__all__ = ["GatedNotServed", "GemmgenError", "NoGPUError", "refuse_gated"]


class NoGPUError(GemmgenError):
    """The call needs a CUDA device and there is none."""

    def __init__(self, what: str = "this call"):
        super().__init__(
            f"{what} needs an NVIDIA Hopper GPU (sm_90a) and torch with CUDA; none was found. "
            "Inspection, lowering and building work without one."
        )


class GatedNotServed(GemmgenError):
    """A gated epilogue where only its lowering exists."""


def refuse_gated(epilogue, what: str) -> None:
    """A gated epilogue (`gate=`, `halves=`) is lowered by the Triton backend, but no check,
    baseline or served kernel knows it yet: refused there, never computed as a plain GEMM."""
    if epilogue.gate:
        raise GatedNotServed(f"{what}: the gated epilogue gate={epilogue.gate} halves={epilogue.halves} is lowered "
                             "(gemmgen inspect --lower triton) but not yet checked, timed or served; compile the "
                             "gate and up products as two problems")
