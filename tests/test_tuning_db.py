"""The tuning database: schema, records, the never-slower winners query, migrations, bad files."""
import json
import os
import sqlite3
import time

import pytest

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.tuning_db import (APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, BaselineTime, Database,
                               DatabaseFileError, Device, RecordError, problem_from_key)
from gemmgen.tuning_db.database import migration_sql, _statements
from tuning_fakes import TEST_GPU, trial

P = Problem(1024, 2048, 512)
P_EPI = Problem(1000, 4096, 11008, "row", "col", epilogue=Epilogue(alpha=0.5, bias="n", activation="gelu"))


def test_schema_tables_pragmas_and_wal(tmp_path):
    path = tmp_path / "t.sqlite"
    with Database(path) as db:
        names = {r[0] for r in db.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}
        assert {"devices", "problems", "trials", "winners"} <= names
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert db.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
        assert db.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 10_000
        cols = {r[1] for r in db.conn.execute("PRAGMA table_info(trials)")}
        assert {"program", "backend", "build_ok", "check_passed", "max_rel_err", "check_seed", "device_ms",
                "server_ms", "host_ms", "spread", "baselines", "proposer", "proposer_version", "created"} <= cols


def test_record_and_read_back_everything(tmp_path):
    with Database(tmp_path / "t.sqlite") as db:
        original = trial(P_EPI, device_ms=0.5, baseline_ms=0.6)
        tid = db.record(original)
        (back,) = db.trials()
    assert back.id == tid
    assert back.problem.key == P_EPI.key and back.device == TEST_GPU
    assert back.device.libraries == TEST_GPU.libraries
    for name in ("program", "backend", "status", "build_ok", "check_passed", "max_rel_err", "check_seed",
                 "device_ms", "spread", "host_ms", "proposer", "proposer_version"):
        assert getattr(back, name) == getattr(original, name), name
    assert back.baselines == original.baselines
    assert back.created  # stamped on record


def test_problem_key_round_trip():
    for p in (P, P_EPI, Problem(64, 64, 64, "col", "row", epilogue=Epilogue(beta=1.0, residual=True,
                                                                             activation="silu", bias="m")),
              Problem(8, 14336, 4096, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked"))):
        assert problem_from_key(p.key).key == p.key
    gated = problem_from_key("8x14336x4096:rcr:f16:f32:gate_silu_stacked+f16")
    assert (gated.epilogue.gate, gated.epilogue.halves, gated.epilogue.activation) == ("silu", "stacked", None)
    with pytest.raises(RecordError):
        problem_from_key("4096x4096:rr:f16")


@pytest.mark.parametrize("device_ms, spread, baseline_ms, check, wins", [
    (1.0, 0.01, 1.2, True, True),      # 1.01 < 1.2
    (1.0, 0.05, 1.04, True, False),    # faster, but 1.05 >= 1.04: within its own noise
    (1.0, 0.0, 1.0, True, False),      # a tie is no win
    (0.5, 0.01, 1.2, False, False),    # fast but wrong
    (1.3, 0.01, 1.2, True, False),     # slower
    (1.0, None, 1.2, True, False),     # noise unknown: no claim
])
def test_never_slower_rule(device_ms, spread, baseline_ms, check, wins):
    t = trial(P, device_ms=device_ms, spread=spread, baseline_ms=baseline_ms, check_passed=check,
              status="ok" if check else "check_failed")
    assert t.beats_baseline() is wins
    db = Database(":memory:")
    db.record(t)
    winner = db.winner(P, TEST_GPU.name)
    assert (winner is not None) is wins  # the SQL view and the Python rule agree


def test_trials_timed_beside_torch_in_their_session_supersede_older_ones():
    """Once a problem has trials with the `torch_same_session` baseline on a GPU, only those
    can win there: the older trials' baselines were timed by another process."""
    from dataclasses import replace

    from gemmgen.tuning_db.records import SAME_SESSION_BASELINE

    def paired(t, torch_ms):
        return replace(t, baselines={**t.baselines, SAME_SESSION_BASELINE: BaselineTime(torch_ms, 0.01)})

    db = Database(":memory:")
    db.record(trial(P, device_ms=0.8, baseline_ms=1.0, program="old\n"))                  # 1.25x, old protocol
    db.record(trial(P, device_ms=0.8, baseline_ms=1.0, program="old\n", device=Device("Other GPU")))
    assert db.winner(P, TEST_GPU.name).program == "old\n"
    db.record(paired(trial(P, device_ms=0.8, baseline_ms=1.0, program="old\n", created="later"), 0.79))
    assert db.winner(P, TEST_GPU.name) is None          # re-measured beside torch: no lead left
    assert db.winner(P, "Other GPU").program == "old\n"  # another GPU keeps its own records
    db.record(paired(trial(P, device_ms=0.7, baseline_ms=1.0, program="new\n"), 0.8))
    assert db.winner(P, TEST_GPU.name).program == "new\n"


def test_winner_is_the_best_speedup_of_its_own_run():
    db = Database(":memory:")
    # run 1: 0.9 ms against a 1.0 ms baseline (1.11x); run 2: 0.8 ms against 0.8 ms (no win)
    db.record(trial(P, device_ms=0.9, baseline_ms=1.0, program="a\n"))
    db.record(trial(P, device_ms=0.8, baseline_ms=0.8, program="b\n"))
    db.record(trial(P, device_ms=0.85, baseline_ms=1.0, program="c\n"))  # 1.18x: best
    db.record(trial(P, device_ms=0.5, baseline_ms=1.0, program="d\n", device=Device("Other GPU")))
    assert db.winner(P, TEST_GPU.name).program == "c\n"
    assert db.winner(P, "Other GPU").program == "d\n"
    assert db.winner(P_EPI, TEST_GPU.name) is None
    assert [w.program for w in db.winners(TEST_GPU.name)] == ["c\n"]
    stats = db.stats()
    assert stats["trials"] == 4 and stats["problems"] == 1
    assert stats["winners"][TEST_GPU.name]["geomean_speedup"] == pytest.approx(1.0 / 0.85)


def test_measured_programs_for_resume():
    db = Database(":memory:")
    db.record(trial(P, program="x\n"))
    db.record(trial(P, program="y\n", status="check_failed", check_passed=False))
    assert db.measured_programs(P, TEST_GPU.name) == {"x\n", "y\n"}
    assert db.measured_programs(P, "Other GPU") == set()
    assert db.measured_programs(P_EPI, TEST_GPU.name) == set()


def _v1_file(path):
    """A database as schema version 1 wrote it, with one trial."""
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in _statements(migration_sql(0)):
        conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO devices (name) VALUES ('Test GPU')")
    conn.execute("INSERT INTO problems (key, m, n, k, a_major, b_major, c_major, in_dtype, acc_dtype, epilogue) "
                 "VALUES (?, 1024, 2048, 512, 'row', 'row', 'row', 'f16', 'f32', 'f16')", (P.key,))
    conn.execute("INSERT INTO trials (problem_id, device_id, program, backend, status, build_ok, check_passed, "
                 "device_ms, spread, best_baseline, best_baseline_ms, baselines, created) VALUES "
                 "(1, 1, 'v1 program\n', 'triton', 'ok', 1, 1, 0.9, 0.01, 'torch', 1.0, "
                 "'{\"torch\": {\"device_ms\": 1.0}}', '2026-01-01T00:00:00+00:00')")
    conn.close()


def test_migrate_v1_file(tmp_path):
    path = tmp_path / "v1.sqlite"
    _v1_file(path)
    assert "server_ms" not in {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(trials)")}
    with Database(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        family = db.conn.execute("SELECT family FROM problems").fetchone()[0]
        assert family == P.key.split(":", 1)[1]  # filled by the data migration
        (old,) = db.trials()
        assert old.program == "v1 program\n" and old.server_ms is None and old.device_ms == 0.9
        assert db.winner(P, "Test GPU").program == "v1 program\n"
        db.record(trial(P, program="v2 program\n"))
        assert len(list(db.trials())) == 2
        assert db.library_choices() == [] and db.library_winners("Test GPU") == []   # v4's table, empty


def test_garbage_file_is_refused_by_name(tmp_path):
    path = tmp_path / "tuning.sqlite"
    path.write_bytes(b"this is not a database at all\n" * 200)
    with pytest.raises(DatabaseFileError, match=str(path)) as info:
        Database(path)
    assert "GEMMGEN_DB" in str(info.value)


def test_corrupted_database_is_refused(tmp_path):
    path = tmp_path / "t.sqlite"
    with Database(path) as db:
        for i in range(300):
            db.record(trial(P, program=f"program {i}\n" * 20))
        db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    for offset in range(4096 + 100, len(data), 4096):  # scribble over every page after the first
        data[offset:offset + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(DatabaseFileError, match="not a gemmgen tuning database"):
        db = Database(path)
        list(db.trials())


def test_foreign_sqlite_and_newer_schema_are_refused(tmp_path):
    foreign = tmp_path / "other.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseFileError, match="another program's tables"):
        Database(foreign)
    newer = tmp_path / "newer.sqlite"
    Database(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(DatabaseFileError, match="newer than this gemmgen"):
        Database(newer)


def test_bad_export_line_names_file_and_line(tmp_path):
    from gemmgen.tuning_db.exchange import merge

    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"problem": P.key}) + "\n")
    with pytest.raises(RecordError, match=r"bad.jsonl:1"):
        merge(Database(":memory:"), path)


def _add_problem_and_device(db, problem=P, device=True):
    """The next row of `problems` (P) and row 1 of `devices` ('Test GPU'), written by hand into a
    file kept at an older schema version, whose insert statements differ from today's."""
    db.conn.execute("INSERT INTO problems (key, m, n, k, a_major, b_major, c_major, in_dtype, acc_dtype, "
                    "epilogue, family) VALUES (?, ?, ?, ?, 'row', 'row', 'row', 'f16', 'f32', 'f16', ?)",
                    (problem.key, problem.m, problem.n, problem.k, problem.key.split(":", 1)[1]))
    if device:
        db.conn.execute("INSERT INTO devices (name) VALUES ('Test GPU')")


def test_migrate_v4_library_choices_keep_the_spread_rule(tmp_path):
    """Choices recorded before the noise column judge by their spread; new ones by their noise."""
    path = tmp_path / "v4.sqlite"
    with Database(path, migrate_to=4) as db:
        _add_problem_and_device(db)
        db.conn.execute("INSERT INTO library_choices (problem_id, device_id, library, version, config, algorithm, "
                        "candidates, check_passed, device_ms, spread, torch_ms, torch_spread, created) VALUES "
                        "(1, 1, 'cublaslt', '130100', '{}', 'aa', 3, 1, 0.97, 0.01, 1.0, 0.01, "
                        "'2026-11-29T10:00:00+00:00')")
        db.conn.commit()
    with Database(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        (old,) = db.library_choices()
        assert old.noise is None and old.margin == 0.01
        assert [c.algorithm for c in db.library_winners("Test GPU")] == ["aa"]


@pytest.mark.parametrize("spread, noise, wins", [
    (0.10, 0.019, True),    # 1.08x with a 10 % spread: its paired noise lets it win
    (0.10, None, False),    # the same trial recorded before schema 6: its spread refuses it
    (0.01, 0.09, False),    # a steady kernel whose ratio to torch.matmul wandered: no claim
])
def test_a_trial_with_its_speedup_noise_is_judged_by_that_not_by_its_spread(spread, noise, wins):
    from dataclasses import replace

    t = replace(trial(P, device_ms=1.0, spread=spread, baseline_ms=1.08), noise=noise)
    assert t.beats_baseline() is wins and t.margin == (noise if noise is not None else spread)
    db = Database(":memory:")
    db.record(t)
    assert (db.winner(P, TEST_GPU.name) is not None) is wins   # the SQL view and the Python rule agree
    assert db.trials()[0].noise == noise


def test_export_writes_a_trials_noise_only_where_it_was_measured(tmp_path):
    from dataclasses import replace

    from gemmgen.tuning_db.exchange import merge
    from gemmgen.tuning_db.records import trial_to_json

    older = trial_to_json(trial(P, program="a\n"))
    newer = trial_to_json(replace(trial(P, program="b\n"), noise=0.021))
    assert '"noise"' not in older and '"noise":0.021' in newer        # older lines stay byte for byte
    db = Database(":memory:")
    path = tmp_path / "x.jsonl"
    path.write_text(older + "\n" + newer + "\n")
    merge(db, path)
    assert sorted((t.program, t.noise) for t in db.trials()) == [("a\n", None), ("b\n", 0.021)]


def test_migrate_v5_trials_keep_the_spread_rule(tmp_path):
    path = tmp_path / "v5.sqlite"
    with Database(path, migrate_to=5) as db:
        _add_problem_and_device(db)
        db.conn.execute("INSERT INTO trials (problem_id, device_id, program, backend, status, check_passed, "
                        "device_ms, spread, best_baseline, best_baseline_ms, baselines, created) VALUES "
                        "(1, 1, 'p\n', 'triton', 'ok', 1, 1.0, 0.01, 'torch', 1.2, "
                        "'{\"torch\": {\"device_ms\": 1.2}}', '2026-11-29T10:00:00+00:00')")
        db.conn.commit()
    with Database(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        (old,) = db.trials()
        assert old.noise is None and old.margin == 0.01
        assert db.winner(P, TEST_GPU.name) is not None


def test_migrate_v6_supersedes_arrival_order_trials_timed_with_the_old_finalize(tmp_path):
    from dataclasses import replace

    from tuning_fakes import program_text, triton_program

    small = Problem(64, 64, 4096)
    unordered = program_text(replace(triton_program(small, (64, 64, 128), 3), split_k=16, split_k_reduce="unordered"))
    path = tmp_path / "v6.sqlite"
    with Database(path, migrate_to=6) as db:   # rows as schema 6 wrote them
        _add_problem_and_device(db)
        _add_problem_and_device(db, small, device=False)
        _add_v6_trial(db, 2, unordered, "2026-11-29T22:00:00+00:00")
        _add_v6_trial(db, 1, "unsplit\n", "2026-11-29T22:00:00+00:00")                    # kept
    with Database(path) as db:
        assert {t.problem.key: t.status for t in db.trials()} == {small.key: "superseded", P.key: "ok"}
        assert db.winner(small, "Test GPU") is None and db.winner(P, "Test GPU") is not None
        assert db.measured_programs(small, "Test GPU") == set()    # the next run measures it again
        db.record(trial(small, device_ms=0.9, program=unordered, device=Device("Test GPU"),
                        created="2026-11-30T02:00:00+00:00"))
        assert db.winner(small, "Test GPU").device_ms == 0.9       # measured with today's finalize


def _add_v6_trial(db, problem_id, program, created, device_ms=0.8):
    db.conn.execute("INSERT INTO trials (problem_id, device_id, program, backend, status, check_passed, "
                    "device_ms, spread, best_baseline, best_baseline_ms, baselines, created) VALUES "
                    "(?, 1, ?, 'triton', 'ok', 1, ?, 0.01, 'torch', 1.2, '{\"torch\": {\"device_ms\": 1.2}}', ?)",
                    (problem_id, program, device_ms, created))


def test_the_shipped_records_are_kept_built_on_disk(tmp_path, monkeypatch):
    """Parsing the shipped export takes ~5 s; a later process copies the kept build instead.
    Builds of other releases' files go once unused for a week."""
    from gemmgen.tuning_db import exchange, shipped_database
    from gemmgen.tuning_db.store import STALE_BUILD_S

    monkeypatch.setenv("GEMMGEN_CACHE_DIR", str(tmp_path))
    stale, recent = tmp_path / "shipped-0000stale.sqlite", tmp_path / "shipped-0000recent.sqlite"
    for other, age in ((stale, STALE_BUILD_S + 60), (recent, STALE_BUILD_S - 3600)):
        other.write_bytes(b"a build of another release")
        os.utime(other, (time.time() - age, time.time() - age))
    first = shipped_database(fresh=True)
    assert not stale.exists() and recent.exists()
    recent.unlink()
    (kept,) = tmp_path.glob("shipped-*.sqlite")
    with monkeypatch.context() as m:
        m.setattr(exchange, "read_jsonl", lambda path: pytest.fail("parsed again despite the kept build"))
        second = shipped_database(fresh=True)
    summary = lambda db: (len(db.trials()), len(db.library_choices()),          # noqa: E731
                          [w.id for w in db.winners("NVIDIA H200")])
    assert summary(second) == summary(first) and second.schema_version == SCHEMA_VERSION
    kept.write_bytes(b"not a database" * 100)                      # damaged: parsed again, kept again
    assert summary(shipped_database(fresh=True)) == summary(first)
    assert Database(kept, readonly=True).schema_version == SCHEMA_VERSION
