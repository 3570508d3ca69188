"""The one list of backends: name -> module, imported lazily so that reading a backend's
`SUPPORT` needs neither triton nor CUTLASS. The grammar's `backend` words and every
proposer read or are checked against `NAMES`."""
from __future__ import annotations

import importlib

from gemmgen.backends.base import BackendError, BackendModule

MODULES = {
    "triton": "gemmgen.backends.triton",
    "cutlass": "gemmgen.backends.cutlass",
    "cuda": "gemmgen.backends.cuda",
}
NAMES: tuple[str, ...] = tuple(MODULES)


def get(name: str) -> BackendModule:
    """The backend module called `name` (one of NAMES)."""
    try:
        module = MODULES[name]
    except KeyError:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}") from None
    return importlib.import_module(module)  # type: ignore[return-value]


def names() -> tuple[str, ...]:
    return NAMES
