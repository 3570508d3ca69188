"""The tuning database: one SQLite file (WAL, busy timeout, versioned schema).

Every trial is committed on its own (`BEGIN IMMEDIATE` ... `COMMIT`), so several tuning
processes can write at once and an interrupted run loses at most the trial in flight.
A file that is not a gemmgen database (another program's SQLite file, a damaged file,
one from a newer gemmgen) raises `DatabaseFileError` naming the file, at open time; a good
file that cannot be read or written (read-only, full disk, locked, I/O error) raises
`DatabaseAccessError`, which says so and never tells the user to throw the file away.

A read-only open (what lookups use) never writes the file: a file at an older schema is copied
into memory and migrated there.
"""
from __future__ import annotations

import functools
import json
import math
import sqlite3
from importlib import resources
from pathlib import Path
from typing import Iterable, Optional
from urllib.parse import quote

from gemmgen.dsl.ir import Problem
from gemmgen.errors import GemmgenError
from gemmgen.tuning_db import queries
from gemmgen.tuning_db.records import (BaselineTime, Device, LibraryChoice, Trial, TunedProblem, now_utc,
                                       problem_from_key, toolchain_of)

#: 'GEMM' in ASCII: marks a SQLite file as ours (PRAGMA application_id).
APPLICATION_ID = 0x47454D4D

#: Schema migrations in order; PRAGMA user_version = how many have been applied.
MIGRATIONS = ("migration_001_initial.sql", "migration_002_server_mode.sql",
              "migration_003_same_session.sql", "migration_004_library.sql",
              "migration_005_speedup_noise.sql", "migration_006_trial_noise.sql",
              "migration_007_superseded_arrival_order.sql", "migration_008_trust.sql",
              "migration_009_bias_in_product.sql")
SCHEMA_VERSION = len(MIGRATIONS)

BUSY_TIMEOUT_MS = 60_000


class DatabaseFileError(GemmgenError):
    """The file is not a usable gemmgen tuning database."""


class DatabaseAccessError(DatabaseFileError):
    """The file may well be a good database, but it could not be read or written: `reason` is
    'read-only', 'cannot open', 'full', 'locked' or 'io'."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def migration_sql(index: int) -> str:
    return resources.files("gemmgen.tuning_db").joinpath(MIGRATIONS[index]).read_text()


def _foreign(path: str, why: str) -> DatabaseFileError:
    return DatabaseFileError(
        f"{path} is not a gemmgen tuning database ({why}); move it aside, or point "
        "GEMMGEN_DB / --db at another path and gemmgen will create a fresh one there")


#: SQLite's result codes (by name prefix, extended codes included) for a file that could not be
#: read or written -> (reason, what happened, what to do). The file itself is not blamed.
_ACCESS = (
    (("SQLITE_READONLY", "SQLITE_PERM"), "read-only", "is read-only to this process",
     "make it and its folder writable (its -wal and -shm files live there too), or point "
     "--db / GEMMGEN_DB at a writable path"),
    (("SQLITE_CANTOPEN",), "cannot open", "cannot be opened",
     "check that it and its folder exist and that you may read and write them"),
    (("SQLITE_FULL",), "full", "could not be written: the disk holding it is full",
     "free space on that disk and run the command again; what was committed before is intact"),
    (("SQLITE_BUSY", "SQLITE_LOCKED"), "locked",
     f"stayed locked by another process for {BUSY_TIMEOUT_MS // 1000} s",
     "retry when the other gemmgen process (a tune or a merge) is done"),
    (("SQLITE_IOERR",), "io", "could not be read or written: the disk reported an I/O error",
     "check the disk and its file system (dmesg, df), then retry; the file may well be intact, "
     "so keep it"),
)
#: The same, recognised by SQLite's message where the exception carries no code name.
_ACCESS_MESSAGES = {"readonly": "SQLITE_READONLY", "unable to open": "SQLITE_CANTOPEN",
                    "disk is full": "SQLITE_FULL", "locked": "SQLITE_BUSY", "busy": "SQLITE_BUSY",
                    "disk i/o error": "SQLITE_IOERR"}


def _error(path: str, exc: sqlite3.Error) -> DatabaseFileError:
    """A SQLite failure as the error it is: access (the file may be fine) or not a database."""
    code = getattr(exc, "sqlite_errorname", "") or next(
        (name for text, name in _ACCESS_MESSAGES.items() if text in str(exc).lower()), "")
    for prefixes, reason, happened, todo in _ACCESS:
        if code.startswith(prefixes):
            return DatabaseAccessError(f"{path} {happened} (SQLite says: {exc}); {todo}", reason)
    return _foreign(path, f"SQLite says: {exc}")


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already (it does on a full disk, say); a
    failing rollback must not hide the error that led to it."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _sql_errors(method):
    """SQLite failures after open (a file damaged, locked or unwritable meanwhile) as one clear error."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.DatabaseError as exc:
            raise _error(self.name, exc) from None

    return wrapper


class Database:
    """One tuning database file (or ':memory:'), migrated to the current schema on open.

    readonly: open with a read-only connection (`file:...?mode=ro`); nothing is ever written to
    the file. label: how messages and `stats` name it (default: its path)."""

    def __init__(self, path: str | Path, *, readonly: bool = False, migrate_to: int = SCHEMA_VERSION,
                 label: Optional[str] = None):
        self.path = str(path)
        self.name = label or ("an in-memory database" if self.path == ":memory:" else self.path)
        self.readonly = readonly
        try:
            if readonly:
                self.conn = _connect(_readonly_uri(self.path, self.name), uri=True)
            else:
                if self.path != ":memory:":
                    _make_folder(Path(self.path).parent, self.name)
                self.conn = _connect(self.path)
            self._open(migrate_to)
        except sqlite3.DatabaseError as exc:
            raise _error(self.name, exc) from None
        except MemoryError:   # SQLite reports some corrupt pages as out of memory (SQLITE_NOMEM)
            raise _foreign(self.name, "SQLite ran out of memory reading it, a sign of corrupt pages") from None
        self._problem_ids: dict[str, int] = {}
        self._device_ids: dict[Device, int] = {}

    # -- opening and migrating -------------------------------------------------------

    def _open(self, migrate_to: int) -> None:
        conn = self.conn
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if self.readonly and app_id == 0 and not tables:
            raise DatabaseFileError(
                f"{self.name} is {'empty' if Path(self.path).stat().st_size == 0 else 'an empty SQLite file'}, "
                "not a gemmgen tuning database; a lookup never writes, so it was left as it is. Pass the path "
                f"of a tuning database, or make one there with `gemmgen tune --db {self.path}` or "
                f"`gemmgen db merge FILE --db {self.path}`")
        if app_id != APPLICATION_ID and (app_id != 0 or tables):
            raise _foreign(self.name, "it holds another program's tables")
        if version > SCHEMA_VERSION:
            raise DatabaseFileError(
                f"{self.name} has schema version {version}, newer than this gemmgen "
                f"understands ({SCHEMA_VERSION}); upgrade gemmgen or use another --db")
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise _foreign(self.name, f"integrity check failed: {check}")
        if self.readonly:
            if version < migrate_to:   # migrate a copy in memory: the file stays as it is
                memory = _connect(":memory:")
                conn.backup(memory)
                conn.close()
                self.conn = memory
                self.migrate(migrate_to)
            return
        if self.path != ":memory:":
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        self.migrate(migrate_to)

    def migrate(self, to: int = SCHEMA_VERSION) -> None:
        """Apply the missing migrations, each in its own transaction."""
        while self.schema_version < to:  # no write lock unless there is something to do
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version >= to:
                    conn.execute("COMMIT")
                    return
                for statement in _statements(migration_sql(version)):
                    conn.execute(statement)
                if MIGRATIONS[version] in _DATA_STEPS:
                    _DATA_STEPS[MIGRATIONS[version]](conn)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {version + 1}")
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    @property
    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------

    def _problem_id(self, problem: Problem) -> int:
        key = problem.key
        pid = self._problem_ids.get(key)
        if pid is None:
            if not problem.is_bound:
                raise GemmgenError(f"cannot record a shape-generic problem ({key}); bind M, N, K")
            self.conn.execute(queries.INSERT_PROBLEM, (
                key, problem.m, problem.n, problem.k, problem.a_major, problem.b_major,
                problem.c_major, problem.in_dtype, problem.acc_dtype,
                problem.epilogue.signature, key.split(":", 1)[1]))
            pid = self.conn.execute("SELECT id FROM problems WHERE key = ?", (key,)).fetchone()[0]
            self._problem_ids[key] = pid
        return pid

    def _device_id(self, device: Device) -> int:
        did = self._device_ids.get(device)
        if did is None:
            row = (device.name, device.cc, device.sms, device.driver, device.cuda, device.libraries_json())
            self.conn.execute(queries.INSERT_DEVICE, row)
            did = self.conn.execute(queries.SELECT_DEVICE_ID, row).fetchone()[0]
            self._device_ids[device] = did
        return did

    def _insert(self, sql: str, row_of) -> Optional[int]:
        """One INSERT in its own write transaction; `row_of(problem_id_of, device_id_of)` gives
        the values. Returns the new id (None if the row was already stored)."""
        if self.readonly:
            raise DatabaseAccessError(f"{self.name} was opened read-only (for lookups); open it without "
                                      "readonly=True to record", "read-only")
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute(sql, row_of(self._problem_id, self._device_id))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            # The cached ids may name rows of the rolled-back transaction.
            self._problem_ids.clear()
            self._device_ids.clear()
            raise
        return cur.lastrowid if cur.rowcount else None

    @_sql_errors
    def record(self, trial: Trial) -> Optional[int]:
        """Commit one trial; returns its id (None if that exact trial was already stored)."""
        best = trial.best_baseline
        return self._insert(queries.INSERT_TRIAL, lambda pid, did: (
            pid(trial.problem), did(trial.device), trial.program, trial.backend, trial.status,
            _int(trial.build_ok), trial.build_msg, trial.build_s,
            _int(trial.check_passed), trial.check_msg, trial.max_rel_err, trial.err_bound,
            trial.check_seed, trial.device_ms, trial.spread, trial.server_ms,
            trial.server_spread, trial.host_ms,
            best[0] if best else None, best[1].device_ms if best else None,
            trial.best_baseline_server_ms,
            json.dumps({n: _baseline_dict(b) for n, b in sorted(trial.baselines.items())}, sort_keys=True),
            trial.proposer, trial.proposer_version, trial.created or now_utc(), trial.noise,
            int(trial.unverified), trial.toolchain))

    @_sql_errors
    def record_library(self, choice: LibraryChoice) -> Optional[int]:
        """Commit one library choice; returns its id (None if already stored)."""
        return self._insert(queries.INSERT_LIBRARY, lambda pid, did: (
            pid(choice.problem), did(choice.device), choice.library,
            choice.version, json.dumps(dict(choice.config), sort_keys=True), choice.algorithm,
            choice.candidates, int(bool(choice.check_passed)), choice.max_rel_err, choice.err_bound,
            choice.check_seed, choice.device_ms, choice.spread, choice.torch_ms, choice.torch_spread,
            choice.noise, choice.server_ms, choice.torch_server_ms, choice.server_noise,
            choice.created or now_utc(), int(choice.unverified)))

    def record_many(self, records: Iterable[Trial | LibraryChoice]) -> int:
        """Record trials (and library choices) one by one; returns how many were new."""
        return sum(1 for r in records if self.record_any(r) is not None)

    def record_any(self, record: Trial | LibraryChoice) -> Optional[int]:
        return self.record_library(record) if isinstance(record, LibraryChoice) else self.record(record)

    # -- reading ---------------------------------------------------------------------

    @_sql_errors
    def trials(self, problem_key: Optional[str] = None, device_name: Optional[str] = None) -> list[Trial]:
        where, args = _filter(problem_key, device_name)
        rows = self.conn.execute(queries.SELECT_TRIALS + where + " ORDER BY p.key, t.program, d.name, t.created",
                                 args).fetchall()
        return [trial_from_row(row) for row in rows]

    @_sql_errors
    def measured_programs(self, problem: Problem, device: str | Device) -> set[str]:
        """Programs already tried for this problem on this kind of GPU (what resume skips): not
        merged ones, whose times are not trusted, nor superseded ones; given this machine's
        `Device`, only those measured under its driver and toolchain."""
        if isinstance(device, Device):
            rows = self.conn.execute(queries.SELECT_TRIED_PROGRAMS_UNDER,
                                     (problem.key, device.name, self._toolchains(device)))
        else:
            rows = self.conn.execute(queries.SELECT_TRIED_PROGRAMS, (problem.key, device))
        return {r[0] for r in rows}

    @_sql_errors
    def winners(self, device_name: str, current: Optional[Device] = None) -> list[Trial]:
        """The winner of every problem tuned on this kind of GPU (never-slower rule applied);
        given `current` (this machine's driver and versions), only trials measured under them
        compete."""
        if current is None:
            rows = self.conn.execute(queries.SELECT_WINNERS, (device_name,))
        else:
            rows = self.conn.execute(queries.SELECT_WINNERS_UNDER, (device_name, self._toolchains(current)))
        return [trial_from_row(r) for r in rows]

    def _toolchains(self, current: Device) -> str:
        """JSON {backend: toolchain string} of `current` for every backend with trials here."""
        backends = [r[0] for r in self.conn.execute("SELECT DISTINCT backend FROM trials")]
        return json.dumps({b: toolchain_of(current, b) for b in backends}, sort_keys=True)

    @_sql_errors
    def tuned_summary(self, device_name: Optional[str] = None) -> list[TunedProblem]:
        """Every problem with trials or library choices, per kind of GPU, and what serves it there."""
        rows = self.conn.execute(queries.SELECT_TUNED_SUMMARY, (device_name, device_name)).fetchall()
        return [TunedProblem(problem_from_key(r["problem_key"]), r["device_name"], r["trials"],
                             r["winner_backend"], r["speedup"], r["library_speedup"], bool(r["passed"]))
                for r in rows]

    @_sql_errors
    def device_names(self) -> list[str]:
        """The kinds of GPU this database holds records of."""
        return [r[0] for r in self.conn.execute("SELECT DISTINCT name FROM devices ORDER BY name")]

    @_sql_errors
    def tuned_problems(self, device_name: str) -> dict[str, float]:
        """Problems measured on this kind of GPU, whether a program won or not: key -> the
        least best-baseline device time (ms) their runs measured."""
        return dict(self.conn.execute(queries.SELECT_TUNED, (device_name,)).fetchall())

    @_sql_errors
    def winner(self, problem: Problem, device_name: str) -> Optional[Trial]:
        row = self.conn.execute(queries.SELECT_WINNER, (problem.key, device_name)).fetchone()
        return trial_from_row(row) if row else None

    @_sql_errors
    def library_choices(self, problem_key: Optional[str] = None,
                        device_name: Optional[str] = None) -> list[LibraryChoice]:
        where, args = _filter(problem_key, device_name)
        rows = self.conn.execute(queries.SELECT_LIBRARY + where + " ORDER BY p.key, c.library, d.name, c.created",
                                 args).fetchall()
        return [library_from_row(r) for r in rows]

    @_sql_errors
    def library_searched(self, device_name: str) -> dict[str, Optional[float]]:
        """The problems whose library search ran on this kind of GPU, served or not: key -> the
        least device time (ms) torch.matmul measured beside its own searches (None if none did: a
        merged record's times are not trusted)."""
        return dict(self.conn.execute(queries.SELECT_LIBRARY_SEARCHED, (device_name,)).fetchall())

    @_sql_errors
    def library_winners(self, device_name: str) -> list[LibraryChoice]:
        """Per problem tuned on this kind of GPU, the library choice that serves it (if any)."""
        return [library_from_row(r) for r in self.conn.execute(queries.SELECT_LIBRARY_WINNERS, (device_name,))]

    @_sql_errors
    def stats(self) -> dict:
        one = lambda sql: self.conn.execute(sql).fetchone()[0]  # noqa: E731
        by_status = dict(self.conn.execute(
            "SELECT status, count(*) FROM trials GROUP BY status ORDER BY status").fetchall())
        by_backend = dict(self.conn.execute(
            "SELECT backend, count(*) FROM trials GROUP BY backend ORDER BY backend").fetchall())
        devices = [r[0] for r in self.conn.execute("SELECT DISTINCT name FROM devices ORDER BY name")]
        winners = self.conn.execute(
            "SELECT device_name, count(*), avg(ln(speedup)) FROM winners GROUP BY device_name "
            "ORDER BY device_name").fetchall() if _has_ln(self.conn) else []
        return {
            "path": self.name,
            "schema_version": self.schema_version,
            "problems": one("SELECT count(*) FROM problems"),
            "trials": one("SELECT count(*) FROM trials"),
            "by_status": by_status,
            "by_backend": by_backend,
            "devices": devices,
            "library_choices": one("SELECT count(*) FROM library_choices"),
            "library_winners": dict(self.conn.execute(
                "SELECT device_name, count(*) FROM library_winners GROUP BY device_name").fetchall()),
            "winners": {name: {"problems": count, "geomean_speedup": math.exp(mean_log or 0.0)}
                        for name, count, mean_log in winners},
        }


def _connect(target: str, *, uri: bool = False) -> sqlite3.Connection:
    conn = sqlite3.connect(target, uri=uri, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                           check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def _readonly_uri(path: str, name: str) -> str:
    file = Path(path)
    if file.is_dir():
        raise DatabaseFileError(f"{name} is a folder; name a database file, e.g. {file / 'tuning.sqlite'}")
    if not file.is_file():
        raise DatabaseFileError(f"{name}: no such database file")
    return f"file:{quote(str(file.resolve()))}?mode=ro"


def _make_folder(folder: Path, name: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseAccessError(f"{name}: cannot create its folder {folder} ({exc.strerror}); make it "
                                  "writable, or point --db / GEMMGEN_DB at another path", "cannot open") from None


def _fill_toolchains(conn: sqlite3.Connection) -> None:
    """Migration 008's data step: each older trial's toolchain, from its device's record."""
    pairs = conn.execute("SELECT DISTINCT t.device_id, t.backend, d.driver, d.cuda, d.libraries FROM trials t "
                         "JOIN devices d ON d.id = t.device_id WHERE t.toolchain = ''").fetchall()
    for device_id, backend, driver, cuda, libraries in pairs:
        device = Device("", driver=driver, cuda=cuda, libraries=json.loads(libraries))
        conn.execute("UPDATE trials SET toolchain = ? WHERE device_id = ? AND backend = ? AND toolchain = ''",
                     (toolchain_of(device, backend), device_id, backend))


#: Python steps that complete a migration's SQL, in its transaction, by migration file.
_DATA_STEPS = {"migration_008_trust.sql": _fill_toolchains}


def _filter(problem_key: Optional[str], device_name: Optional[str]) -> tuple[str, list]:
    """The WHERE clause (problems as p, devices as d) and its arguments for optional filters."""
    where, args = [], []
    for column, value in (("p.key", problem_key), ("d.name", device_name)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    return (" WHERE " + " AND ".join(where) if where else ""), args


def _has_ln(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT ln(1.0)")
        return True
    except sqlite3.OperationalError:
        conn.create_function("ln", 1, lambda x: math.log(x) if x and x > 0 else None,
                             deterministic=True)
        return True


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (sqlite3.complete_statement decides the ends)."""
    out, current = [], []
    for line in script.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("--")):
            continue
        current.append(line)
        text = "\n".join(current)
        if sqlite3.complete_statement(text):
            out.append(text)
            current = []
    if current and "\n".join(current).strip():
        raise GemmgenError("a migration script ends in an incomplete statement")
    return out


def _int(flag: Optional[bool]) -> Optional[int]:
    return None if flag is None else int(bool(flag))


def _bool(value) -> Optional[bool]:
    return None if value is None else bool(value)


def _baseline_dict(b: BaselineTime) -> dict:
    return {k: v for k, v in vars(b).items() if v is not None}


def _device_from_row(row: sqlite3.Row) -> Device:
    return Device(row["d_name"], row["d_cc"], row["d_sms"], row["d_driver"], row["d_cuda"],
                  json.loads(row["d_libraries"]))


def trial_from_row(row: sqlite3.Row) -> Trial:
    problem = problem_from_key(row["problem_key"])
    device = _device_from_row(row)
    baselines = {n: BaselineTime(**b) for n, b in json.loads(row["baselines"]).items()}
    return Trial(
        problem=problem, device=device, program=row["program"], backend=row["backend"],
        status=row["status"], build_ok=_bool(row["build_ok"]), build_msg=row["build_msg"],
        build_s=row["build_s"], check_passed=_bool(row["check_passed"]), check_msg=row["check_msg"],
        max_rel_err=row["max_rel_err"], err_bound=row["err_bound"], check_seed=row["check_seed"],
        device_ms=row["device_ms"], spread=row["spread"], server_ms=row["server_ms"],
        server_spread=row["server_spread"], host_ms=row["host_ms"], baselines=baselines,
        proposer=row["proposer"], proposer_version=row["proposer_version"],
        created=row["created"], noise=row["noise"], unverified=bool(row["unverified"]), id=row["id"])


def library_from_row(row: sqlite3.Row) -> LibraryChoice:
    return LibraryChoice(
        problem=problem_from_key(row["problem_key"]), device=_device_from_row(row), library=row["library"],
        version=row["version"], config=json.loads(row["config"]), algorithm=row["algorithm"],
        candidates=row["candidates"], check_passed=bool(row["check_passed"]), device_ms=row["device_ms"],
        spread=row["spread"], torch_ms=row["torch_ms"], torch_spread=row["torch_spread"], noise=row["noise"],
        server_ms=row["server_ms"], torch_server_ms=row["torch_server_ms"], server_noise=row["server_noise"],
        max_rel_err=row["max_rel_err"], err_bound=row["err_bound"], check_seed=row["check_seed"],
        created=row["created"], unverified=bool(row["unverified"]), id=row["id"])
