"""Where tuning results live: the shipped H200 records under the user's own database.

The shipped records (`shipped/h200.jsonl.gz`, the export format, gzip-compressed) load into an in-memory,
read-only layer. The user's database (GEMMGEN_DB, default
~/.cache/gemmgen/tuning.sqlite) lies over it: for a problem tuned in both, the user's
winner is used, since it was measured on this machine. Library choices (a vendor library's
fastest algorithm, `LibraryChoice`) are layered the same way.

Lookups read the user's file through a read-only connection and never write or migrate it;
one that cannot be read (permissions, I/O) gives way to the shipped records with a warning.
Every program is validated (`gemmgen.backends.validate`) before it is handed out: a record
that fails, crafted or written by an older gemmgen, is skipped with a warning naming it.
"""
from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import time
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator, Optional

from gemmgen.backends import validate
from gemmgen.cache import cache_root
from gemmgen.dsl import parse
from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db.database import SCHEMA_VERSION, Database, DatabaseAccessError
from gemmgen.tuning_db.exchange import read_jsonl
from gemmgen.tuning_db.records import Device, LibraryChoice, Trial

#: The shipped records, one file for each GPU model they were measured on (a record serves only
#: on its own model, so a file never mixes them).
SHIPPED_FILE_OF_GPU = {"NVIDIA H200": "h200.jsonl.gz", "NVIDIA H100 80GB HBM3": "h100.jsonl.gz"}
SHIPPED_FILES = tuple(SHIPPED_FILE_OF_GPU.values())
#: How messages and `gemmgen db stats` name the shipped layer (it lives in memory).
SHIPPED_LABEL = "the shipped records (" + ", ".join(SHIPPED_FILES) + ")"


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
        db = Database(":memory:", label=SHIPPED_LABEL)
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
    db = Database(":memory:", label=SHIPPED_LABEL)
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
    """Every winner for one device name, from all layers, held in memory for fast lookup.

    current: this machine's driver and versions (a `Device`); given, only winners measured under
    them serve, and those measured under others are kept in `stale` (re-measure to serve them).
    Each program is validated the first time it would be handed out; one that fails never is."""

    def __init__(self, layers: list[tuple[str, Database]], device_name: str, *,
                 current: Optional[Device] = None):
        self.device_name = device_name
        self.current = current
        self._names = {layer: db.name for layer, db in layers}
        self.exact: dict[str, list[tuple[str, Trial]]] = {}   # problem key -> winners, upper layer first
        for layer, db in layers:
            for trial in db.winners(device_name, current):
                self.exact.setdefault(trial.problem.key, []).append((layer, trial))
        self.stale: dict[str, tuple[str, Trial]] = {}         # winners measured under other versions
        if current is not None:
            for layer, db in layers:
                for trial in db.winners(device_name):
                    if trial.problem.key not in self.exact:
                        self.stale.setdefault(trial.problem.key, (layer, trial))
        self.tuned: dict[str, float] = {}     # problem key -> least best-baseline ms, any layer
        for _, db in layers:
            for key, ms in db.tuned_problems(device_name).items():
                self.tuned[key] = min(ms, self.tuned.get(key, ms))
        self.by_family: dict[str, list[str]] = {}
        for key, hits in self.exact.items():
            self.by_family.setdefault(family(hits[0][1].problem), []).append(key)
        self.library: dict[str, tuple[str, LibraryChoice]] = {}   # problem key -> what serves it
        for layer, db in reversed(layers):
            for choice in db.library_winners(device_name):
                self.library[choice.problem.key] = (layer, choice)
        # problems whose cuBLASLt search ran here, whether or not its choice serves: key -> the
        # least torch.matmul time measured beside a search, any layer (None: none measured)
        self.library_searched: dict[str, Optional[float]] = {}
        for _, db in layers:
            for key, ms in db.library_searched(device_name).items():
                known = [t for t in (ms, self.library_searched.get(key)) if t]
                self.library_searched[key] = min(known) if known else None
        self._valid: dict[tuple[str, Optional[int]], bool] = {}
        self._m_points: Optional[dict[str, set[int]]] = None   # "NxK:..." -> Ms with records, built on first need

    def __len__(self) -> int:
        return len(self.exact)

    def lookup(self, problem: Problem) -> Optional[Found]:
        """The winner measured at this exact problem whose program validates, upper layer first."""
        for layer, trial in self.exact.get(problem.key, ()):
            if self.servable(layer, trial):
                return Found(trial, layer, True)
        return None

    def m_points(self, problem: Problem) -> list[int]:
        """The Ms with a record for `problem`'s N, K, majors and epilogue (its M is ignored): a
        winner, a library choice or a tuning run, in any layer; ascending."""
        if self._m_points is None:
            self._m_points = {}
            for key in (*self.exact, *self.tuned, *self.library):
                m, _, rest = key.partition("x")
                if m.isdigit():
                    self._m_points.setdefault(rest, set()).add(int(m))
        return sorted(self._m_points.get(problem.key.partition("x")[2], ()))

    def stale_winner(self, problem: Problem) -> Optional[Found]:
        """The winner at this problem that does not serve because it was measured under another
        driver or toolchain than `current` (see `Trial.toolchain`)."""
        hit = self.stale.get(problem.key)
        return Found(hit[1], hit[0], True) if hit else None

    def library_choice(self, problem: Problem) -> Optional[tuple[str, LibraryChoice]]:
        """(layer, choice) of the library algorithm that serves this exact problem, if any."""
        return self.library.get(problem.key)

    def nearest(self, problem: Problem) -> Iterator[Found]:
        """Winners of the same family whose programs validate, nearest first in log-shape space
        (ties: by key); validated lazily, as the caller walks them."""
        keys = self.by_family.get(family(problem), [])
        ranked = sorted((log_distance(problem, self.exact[key][0][1].problem), key)
                        for key in keys if key != problem.key)
        for distance, key in ranked:
            for layer, trial in self.exact[key]:
                if self.servable(layer, trial):
                    yield Found(trial, layer, False, distance)
                    break

    def servable(self, layer: str, trial: Trial) -> bool:
        """Whether the trial's program parses and validates at its own problem; the first time it
        does not, a warning names the record. Checked once per record."""
        key = (layer, trial.id)
        if key not in self._valid:
            why = _invalid(trial)
            if why:
                warnings.warn(f"gemmgen: not serving trial #{trial.id} of {self._names.get(layer, layer)} for "
                              f"{trial.problem.key}: its program {why}; re-tune that problem (gemmgen tune)",
                              RuntimeWarning, stacklevel=3)
            self._valid[key] = not why
        return self._valid[key]


def _invalid(trial: Trial) -> str:
    """'' if the trial's program may be served at its problem, else why not."""
    try:
        program = parse(trial.program)
    except Exception as exc:  # noqa: BLE001 - whatever the record holds, it is refused, not served
        return f"no longer parses ({_first_line(exc)})"
    try:
        validate(program.bind(trial.problem))
    except Exception as exc:  # noqa: BLE001
        return f"fails validation ({_first_line(exc)})"
    return ""


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def open_layers(user_db: Optional[str | Path] = None, *, shipped: bool = True) -> list[tuple[str, Database]]:
    """The layers a lookup reads, upper first: the user's database (if it exists), the shipped one.

    The user's file is opened read-only and never written or migrated. If it cannot be read
    (read-only to this process in a way SQLite cannot read past, an I/O error, ...), the lookup
    goes on with the shipped records and says so in a warning; a file that is not a tuning
    database (an empty file, another program's) is refused with `DatabaseFileError`."""
    layers: list[tuple[str, Database]] = []
    path = Path(user_db) if user_db is not None else default_db_path()
    if str(path) != ":memory:" and path.exists():   # ':memory:' would be a new, empty database
        try:
            layers.append(("user", Database(path, readonly=True)))
        except DatabaseAccessError as exc:
            warnings.warn(f"gemmgen: {exc}. Serving from the shipped records only until then",
                          RuntimeWarning, stacklevel=2)
    if shipped:
        layers.append(("shipped", shipped_database()))
    return layers
