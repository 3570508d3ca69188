"""Where tuning results live: the shipped H200 records under the user's own database.

The shipped records (`shipped/h200.jsonl.gz`, the export format, gzip-compressed) load into an in-memory,
read-only layer. The user's database (GEMMGEN_DB, default
~/.cache/gemmgen/tuning.sqlite) lies over it: for a problem tuned in both, the user's
winner is used, since it was measured on this machine. Library choices (a vendor library's
fastest algorithm, `LibraryChoice`) are layered the same way.
"""
from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional

from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db.database import SCHEMA_VERSION, Database
from gemmgen.tuning_db.exchange import read_jsonl
from gemmgen.tuning_db.records import LibraryChoice, Trial

from gemmgen.cache import cache_root

SHIPPED_FILES = ("h200.jsonl.gz",)


def default_db_path() -> Path:
    env = os.environ.get("GEMMGEN_DB")
    return Path(env).expanduser() if env else cache_root() / "tuning.sqlite"


_SHIPPED: list[Database] = []


def shipped_database(*, fresh: bool = False) -> Database:
    """The shipped records as an in-memory database, read once per process (treat it as read-only).

    Parsing the export (8,400 records) takes ~5 s, so the built database is also kept on disk
    (`shipped_cache_path`), keyed by the files' bytes and the schema version; a later process
    copies it into memory in milliseconds. Without a writable cache directory it is parsed each time.
    """

    if _SHIPPED and not fresh:
        return _SHIPPED[0]
    folder = resources.files("gemmgen.tuning_db").joinpath("shipped")
    entries = [entry for entry in map(folder.joinpath, SHIPPED_FILES) if entry.is_file()]
    cache = shipped_cache_path([e.read_bytes() for e in entries])
    db = _load_copy(cache)
    if db is None:
        db = Database(":memory:")
        for entry in entries:
            with resources.as_file(entry) as path:
                db.record_many(read_jsonl(path))
        _save_copy(db, cache)
    if not fresh:
        _SHIPPED[:] = [db]
    return db


def shipped_cache_path(contents: list[bytes]) -> Path:
    """Where the database built from these shipped files is kept (the cache root, GEMMGEN_CACHE_DIR)."""
    digest = hashlib.sha256(f"schema {SCHEMA_VERSION}".encode())
    for data in contents:
        digest.update(hashlib.sha256(data).digest())
    return cache_root() / f"shipped-{digest.hexdigest()[:20]}.sqlite"


#: a kept build of other shipped files (an older release) unused this long is removed
STALE_BUILD_S = 7 * 24 * 3600


def _load_copy(cache: Path) -> Optional[Database]:
    """A kept build copied into memory; None if there is none or it cannot be read whole."""
    if not cache.is_file():
        return None
    try:
        os.utime(cache)            # in use: not stale (see _save_copy)
    except OSError:
        pass
    db = Database(":memory:")
    try:
        source = sqlite3.connect(f"file:{cache}?mode=ro", uri=True)
        try:
            if source.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                return None
            source.backup(db.conn)
        finally:
            source.close()
        if db.schema_version != SCHEMA_VERSION:
            return None
    except (sqlite3.Error, MemoryError):
        return None
    return db


def _save_copy(db: Database, cache: Path) -> None:
    """Keep the build for the next process, atomically; a cache that cannot be written is skipped."""
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        target = sqlite3.connect(tmp)
        try:
            db.conn.backup(target)
        finally:
            target.close()
        os.replace(tmp, cache)
    except (OSError, sqlite3.Error):
        tmp.unlink(missing_ok=True)
        return
    _remove_stale_builds(cache)


def _remove_stale_builds(current: Path) -> None:
    """Each release's shipped files get their own build (7-12 MB); drop those unused for a week,
    not sooner, since another installed version may share the cache directory."""
    now = time.time()
    for old in current.parent.glob("shipped-*.sqlite"):
        try:
            if old != current and now - old.stat().st_mtime > STALE_BUILD_S:
                old.unlink()
        except OSError:
            pass


@dataclass(frozen=True)
class Found:
    """A tuned program for a problem: the winner it comes from and how it was found."""

    trial: Trial
    layer: str            # 'user' or 'shipped'
    exact: bool           # False: the nearest tuned problem's program, re-bound
    distance: float = 0.0


def log_distance(a: Problem, b: Problem) -> float:
    """Euclidean distance of (log M, log N, log K)."""
    return math.sqrt(sum((math.log(x) - math.log(y)) ** 2
                         for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k))))


def family(problem: Problem) -> str:
    """The key without the shape: majors, dtypes and epilogue signature."""
    return problem.key.split(":", 1)[1]


class WinnerIndex:
    """Every winner for one device name, from all layers, held in memory for fast lookup."""

    def __init__(self, layers: list[tuple[str, Database]], device_name: str):
        self.device_name = device_name
        self.exact: dict[str, tuple[str, Trial]] = {}
        self.by_family: dict[str, list[tuple[str, Trial]]] = {}
        for layer, db in reversed(layers):  # later (upper) layers overwrite lower ones
            for trial in db.winners(device_name):
                self.exact[trial.problem.key] = (layer, trial)
        self.tuned: dict[str, float] = {}     # problem key -> least best-baseline ms, any layer
        for _, db in layers:
            for key, ms in db.tuned_problems(device_name).items():
                self.tuned[key] = min(ms, self.tuned.get(key, ms))
        for layer, trial in self.exact.values():
            self.by_family.setdefault(family(trial.problem), []).append((layer, trial))
        self.library: dict[str, tuple[str, LibraryChoice]] = {}   # problem key -> what serves it
        for layer, db in reversed(layers):
            for choice in db.library_winners(device_name):
                self.library[choice.problem.key] = (layer, choice)

    def __len__(self) -> int:
        return len(self.exact)

    def lookup(self, problem: Problem) -> Optional[Found]:
        hit = self.exact.get(problem.key)
        return Found(hit[1], hit[0], True) if hit else None

    def library_choice(self, problem: Problem) -> Optional[tuple[str, LibraryChoice]]:
        """(layer, choice) of the library algorithm that serves this exact problem, if any."""
        return self.library.get(problem.key)

    def nearest(self, problem: Problem) -> list[Found]:
        """Winners of the same family, nearest first in log-shape space (ties: by key)."""
        same = self.by_family.get(family(problem), [])
        ranked = sorted(((log_distance(problem, t.problem), t.problem.key, layer, t)
                         for layer, t in same if t.problem.key != problem.key))
        return [Found(t, layer, False, d) for d, _, layer, t in ranked]


def open_layers(user_db: Optional[str | Path] = None, *, shipped: bool = True) -> list[tuple[str, Database]]:
    """The layers a lookup reads, upper first: the user's database (if it exists), the shipped one."""
    layers: list[tuple[str, Database]] = []
    path = Path(user_db) if user_db is not None else default_db_path()
    if str(path) == ":memory:" or path.is_file():
        layers.append(("user", Database(path)))
    if shipped:
        layers.append(("shipped", shipped_database()))
    return layers
