"""Errors of the measurement room; each message says what to do."""
from gemmgen.errors import GemmgenError


class MeasureError(GemmgenError):
    """A measurement could not be made honestly; nothing was recorded."""


class TimedCheckFailure(MeasureError):
    """A kernel's timed calls did not pass the check its outputs are sampled against."""


class FloorViolation(MeasureError):
    """A device time below the physical floor: a broken timer or a cheat, never a result."""


class ShapesError(MeasureError):
    """A shapes file or a --shard/--baselines argument is malformed."""


class UnknownName(MeasureError):
    """A baseline or candidate name that no registry knows."""
