"""The runner: honest correctness checks, device timing, baselines, isolation, `gemmgen bench`.

    from gemmgen.measure import check, time
    result = check(fn, problem)              # CheckResult: .passed .max_rel_err .bound .seed .failures
    timing = time(fn, problem, "offline")    # Timing: .device_ms .host_ms .spread ...

Names are loaded on first use, so importing gemmgen.measure does not import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "check": "gemmgen.measure.checking",
    "CheckResult": "gemmgen.measure.checking",
    "time": "gemmgen.measure.timing",
    "time_many": "gemmgen.measure.timing",
    "Timing": "gemmgen.measure.timing",
    "TimingOptions": "gemmgen.measure.timing",
    "FloorViolation": "gemmgen.measure.errors",
    "MeasureError": "gemmgen.measure.errors",
    "Runner": "gemmgen.measure.worker",
    "Job": "gemmgen.measure.worker",
    "TrialResult": "gemmgen.measure.worker",
    "environment": "gemmgen.measure.env",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gemmgen.measure' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
