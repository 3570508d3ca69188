"""Export and merge: the sorted JSON-lines text that carries tuning results between machines.

`export` writes one trial (or library choice) per line, sorted by problem key, then program
text (then device name and time), so an export diffs cleanly in review. `merge` reads such a
file or another database file; records already present are skipped, so merging is idempotent.
Merged records are marked unverified: their times were measured elsewhere and are not trusted,
so they never serve until tuning measures their programs on this kind of GPU. An export keeps
the mark (`"unverified": true`), so a record cannot lose it by travelling.

A path ending in `.gz` is written gzip-compressed (with no timestamp, so the same records
give the same bytes) and any gzip file is read as such: the shipped H200 records are kept
that way, since as text (12.6 MiB, 8,362 records, one device description repeated on every
line) they were past the repository's 5 MiB limit for a tracked file. `zcat` shows the text.
"""
from __future__ import annotations

import gzip
import io
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from gemmgen.tuning_db.database import Database
from gemmgen.tuning_db.records import (LibraryChoice, RecordError, Trial, export_sort_key, library_to_json,
                                       record_from_json, trial_to_json)

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


def export_lines(db: Database, *, winners_only: bool = False, problems=None, devices=None) -> list[str]:
    """`problems`: problem keys to keep; `devices`: GPU names to keep (None: every one)."""
    trials = db.trials()
    library = db.library_choices()
    if problems is not None:
        trials = [t for t in trials if t.problem.key in problems]
        library = [c for c in library if c.problem.key in problems]
    if devices is not None:
        trials = [t for t in trials if t.device.name in devices]
        library = [c for c in library if c.device.name in devices]
    if winners_only:
        ids = {row[0] for row in db.conn.execute("SELECT id FROM winners")}
        trials = [t for t in trials if t.id in ids]
        serving = {row[0] for row in db.conn.execute("SELECT id FROM library_winners")}
        library = [c for c in library if c.id in serving]
    records: list[Trial | LibraryChoice] = [*trials, *library]
    return [library_to_json(r) if isinstance(r, LibraryChoice) else trial_to_json(r)
            for r in sorted(records, key=export_sort_key)]


def export(db: Database, path: str | Path, *, winners_only: bool = False, problems=None, devices=None) -> int:
    """Write the database (or only what serves each problem per GPU; or only the problems whose
    keys `problems` holds; or only the GPUs `devices` names) as sorted JSON lines; returns the
    number of records written."""
    target = Path(path)
    if target.is_dir():
        raise RecordError(f"{target} is a folder: give a file name for the export, e.g. {target / 'records.jsonl.gz'}")
    if db.path != ":memory:" and target.exists() and target.resolve() == Path(db.path).resolve():
        raise RecordError(f"{target} is the database being exported: give another file name")
    lines = export_lines(db, winners_only=winners_only, problems=problems, devices=devices)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=9, mtime=0)
    tmp.write_bytes(data)
    tmp.replace(path)
    return len(lines)


def read_jsonl(path: str | Path) -> Iterator[Trial | LibraryChoice]:
    """Records of an export file (plain or gzip), each line checked; errors name the file and line."""
    with open(path, "rb") as raw:
        compressed = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    opened = gzip.open(path, "rt", encoding="utf-8") if compressed else io.open(path, encoding="utf-8")
    number = 0
    try:
        with opened as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    yield record_from_json(line, where=f"{path}:{number}")
    except UnicodeDecodeError:
        raise RecordError(f"{path}:{number + 1}: not UTF-8 text; give a `gemmgen db export` file "
                          "(JSON lines, plain or gzip) or a tuning database") from None
    except (EOFError, gzip.BadGzipFile, zlib.error):
        raise RecordError(f"{path}: a damaged or truncated gzip file (it ends after line {number})") from None


def read_any(path: str | Path) -> Iterator[Trial | LibraryChoice]:
    """Records of an export file or of another tuning database file."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head == SQLITE_MAGIC:
        other = Database(path, readonly=True)
        try:
            yield from other.trials()
            yield from other.library_choices()
        finally:
            other.close()
    else:
        yield from read_jsonl(path)


def merge(db: Database, path: str | Path, *, verified: bool = False) -> tuple[int, int]:
    """Import every record of `path` into `db`; returns (new records, records already present).

    Records are unverified (never served, measured again by tuning) unless `verified`: only
    for a file this project's own tuning run wrote on this GPU model, such as a run resuming
    from its own export or the shipped records."""
    return merge_records(db, list(read_any(path)), verified=verified)   # all checked, then written


def merge_records(db: Database, records, *, verified: bool = False) -> tuple[int, int]:
    """`merge` of records already read; returns (new records, records already present)."""
    new = seen = 0
    for record in records:
        if db.record_any(record if verified else replace(record, unverified=True)) is None:
            seen += 1
        else:
            new += 1
    return new, seen
