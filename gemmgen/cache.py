"""Where gemmgen keeps what it makes on this machine: built kernels (backends), the user's
tuning database and the kept build of the shipped records (tuning_db), converted models and
training runs (policy). One definition, so the rooms agree on it."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GEMMGEN_CACHE_DIR"


def cache_root() -> Path:
    """GEMMGEN_CACHE_DIR, else ~/.cache/gemmgen; not created here (a reader may have no right to)."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "gemmgen"
