"""Trust in the tuning database: records validated when looked up, merged times never trusted,
exclusions as conditions in the views, records tied to their driver and toolchain, database
errors named for what they are, lookups that never write, and the `gemmgen db` commands a
newcomer meets first."""
import hashlib
import os
import sqlite3
import warnings
from dataclasses import replace

import pytest

import gemmgen
from gemmgen.cli import main
from gemmgen.compile import clear_cache
from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db import (SCHEMA_VERSION, Database, DatabaseAccessError, DatabaseFileError, Device,
                               WinnerIndex, open_layers, toolchain_of)
from gemmgen.tuning_db import database as database_module
from gemmgen.tuning_db.exchange import export, merge
from gemmgen.tuning_db.records import trial_to_json
from tuning_fakes import TEST_GPU, library_choice, program_text, trial, triton_program

GPU = TEST_GPU.name
P = Problem(1024, 1024, 1024)
SMALL = Problem(256, 256, 512)
CRAFTED = program_text(replace(triton_program(P), split_k=4096))     # validates at no K this small


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One cache directory for the module: the shipped records are built into it once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def no_user_db(tmp_path, monkeypatch, cache_dir):
    monkeypatch.setenv("GEMMGEN_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("GEMMGEN_DB", str(tmp_path / "absent.sqlite"))
    clear_cache()
    yield tmp_path / "absent.sqlite"
    clear_cache()


# -- records checked when looked up ---------------------------------------------------------------

def test_a_crafted_record_is_never_served_and_a_warning_names_it():
    db = Database(":memory:")
    crafted_id = db.record(trial(P, device_ms=0.5, baseline_ms=1.0, program=CRAFTED))
    index = WinnerIndex([("user", db)], GPU)
    with pytest.warns(RuntimeWarning, match=rf"not serving trial #{crafted_id} of .* fails validation.*split_k"):
        assert index.lookup(P) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # warned once per record, not per lookup
        assert index.lookup(P) is None


def test_gemmgen_compile_does_not_serve_a_crafted_record(tmp_path):
    clear_cache()
    db = Database(tmp_path / "crafted.sqlite")
    db.record(trial(P, device_ms=0.5, baseline_ms=1.0, program=CRAFTED))
    with pytest.warns(RuntimeWarning, match="fails validation"):
        kernel = gemmgen.compile((1024, 1024, 1024), device=GPU, db=db)
    assert kernel.ir is None and kernel.backend == "torch"
    clear_cache()


def test_an_invalid_upper_record_gives_way_to_a_valid_one_below_and_to_valid_neighbours():
    user, lower = Database(":memory:"), Database(":memory:")
    user.record(trial(P, device_ms=0.5, baseline_ms=1.0, program=CRAFTED))
    good = program_text(triton_program(P))
    lower.record(trial(P, device_ms=0.9, baseline_ms=1.0, program=good))
    near = Problem(1024, 1024, 2048)
    user.record(trial(near, device_ms=0.5, baseline_ms=1.0,
                      program=program_text(replace(triton_program(near), split_k=4096))))
    index = WinnerIndex([("user", user), ("shipped", lower)], GPU)
    with pytest.warns(RuntimeWarning):
        found = index.lookup(P)
        assert found.layer == "shipped" and found.trial.program == good
        neighbours = list(index.nearest(Problem(1024, 1024, 1536)))
    assert [f.trial.problem.key for f in neighbours] == [P.key]   # the crafted neighbour is skipped


# -- merged records are unverified ----------------------------------------------------------------

def test_merged_library_choices_never_serve(tmp_path):
    source = Database(tmp_path / "a.sqlite")
    source.record_library(library_choice(P, device_ms=0.5, torch_ms=1.0))
    export(source, tmp_path / "a.jsonl")
    target = Database(tmp_path / "b.sqlite")
    merge(target, tmp_path / "a.jsonl")
    (choice,) = target.library_choices()
    assert choice.unverified and target.library_winners(GPU) == []
    index = WinnerIndex([("user", target)], GPU)
    assert index.library_choice(P) is None
    assert index.library_searched == {P.key: None}      # nor is torch.matmul's time beside it a baseline here


def test_the_shipped_records_stay_verified(no_user_db):
    from gemmgen.tuning_db import shipped_database

    shipped = shipped_database()
    assert shipped.conn.execute("SELECT count(*) FROM trials WHERE unverified = 1").fetchone()[0] == 0
    assert len(shipped.winners("NVIDIA H200")) > 100


# -- exclusions are conditions in the views -------------------------------------------------------

def test_merging_an_export_written_before_migration_007_does_not_bring_the_bad_trial_back(tmp_path):
    """Migration 007 marked arrival-order split-K trials `superseded` once; an export written
    before it still says `ok`. The winners view's own condition keeps such a trial out, whether
    it arrives by merge or is recorded as the shipped records are."""
    small = Problem(64, 64, 4096)
    unordered = program_text(replace(triton_program(small, (64, 64, 128), 3), split_k=16,
                                     split_k_reduce="unordered"))
    old = trial(small, device_ms=0.5, baseline_ms=1.0, program=unordered, created="2026-11-29T22:00:00+00:00")
    path = tmp_path / "old.jsonl"
    path.write_text(trial_to_json(old) + "\n")
    for load in (lambda db: merge(db, path), lambda db: db.record(old)):
        db = Database(":memory:")
        load(db)
        assert db.trials()[0].status == "ok"           # the row itself is kept as written
        assert db.winner(small, GPU) is None
        assert db.measured_programs(small, GPU) == set()
    db = Database(":memory:")
    db.record(replace(old, created="2026-11-30T02:00:00+00:00"))          # measured with today's kernel
    assert db.winner(small, GPU) is not None


# -- the driver and toolchain ---------------------------------------------------------------------

NEW_DRIVER = replace(TEST_GPU, driver="590.10")


def test_a_trial_knows_its_toolchain_and_older_rows_get_theirs_from_their_device(tmp_path):
    assert trial(P).toolchain == "driver 580.00, cuda 13.0, torch 2.11.0, triton 3.6.0"
    assert toolchain_of(Device("x"), "cutlass") == "driver ?, cuda ?, torch ?, nvidia-cutlass ?"
    path = tmp_path / "v7.sqlite"
    with Database(path, migrate_to=7) as db:
        db.conn.execute("INSERT INTO problems (key, m, n, k, a_major, b_major, c_major, in_dtype, acc_dtype, "
                        "epilogue, family) VALUES (?, 1024, 1024, 1024, 'row', 'row', 'row', 'f16', 'f32', "
                        "'f16', ?)", (P.key, P.key.split(":", 1)[1]))
        db.conn.execute("INSERT INTO devices (name, driver, cuda, libraries) VALUES (?, '580.00', '13.0', "
                        "'{\"torch\": \"2.11.0\", \"triton\": \"3.6.0\"}')", (GPU,))
        db.conn.execute("INSERT INTO trials (problem_id, device_id, program, backend, status, check_passed, "
                        "device_ms, spread, best_baseline, best_baseline_ms, baselines, created) VALUES "
                        "(1, 1, 'p\n', 'triton', 'ok', 1, 0.9, 0.01, 'torch', 1.2, "
                        "'{\"torch\": {\"device_ms\": 1.2}}', '2026-12-01T10:00:00+00:00')")
    with Database(path) as db:
        assert db.conn.execute("SELECT toolchain FROM trials").fetchone()[0] == trial(P).toolchain
        assert db.winners(GPU, TEST_GPU)[0].program == "p\n"


def test_a_winner_measured_under_another_driver_serves_only_once_measured_again():
    db = Database(":memory:")
    db.record(trial(P, device_ms=0.5, baseline_ms=1.0, program="old driver\n"))       # 2x, old driver
    assert [w.program for w in db.winners(GPU, TEST_GPU)] == ["old driver\n"]
    assert db.winners(GPU, NEW_DRIVER) == []
    index = WinnerIndex([("user", db)], GPU, current=NEW_DRIVER)
    assert index.lookup(P) is None and index.stale_winner(P).trial.program == "old driver\n"
    assert db.measured_programs(P, NEW_DRIVER) == set()           # resume measures it again
    assert db.measured_programs(P, GPU) == {"old driver\n"}
    good = program_text(triton_program(P))
    db.record(trial(P, device_ms=0.9, baseline_ms=1.0, program=good, device=NEW_DRIVER))   # 1.1x, this driver
    assert db.winner(P, GPU).program == "old driver\n"            # the view ranks every toolchain
    index = WinnerIndex([("user", db)], GPU, current=NEW_DRIVER)
    assert index.lookup(P).trial.program == good and index.stale_winner(P) is None


# -- database errors named for what they are ------------------------------------------------------

def _filled(path):
    db = Database(path)
    db.record(trial(P))
    return db


def test_a_full_disk_is_named_and_not_hidden_by_the_rollback(tmp_path):
    db = _filled(tmp_path / "t.sqlite")
    pages = db.conn.execute("PRAGMA page_count").fetchone()[0]
    db.conn.execute(f"PRAGMA max_page_count = {pages}")       # as if the disk were full
    with pytest.raises(DatabaseAccessError, match="disk holding it is full") as info:
        db.record(trial(P, program="x\n" * 20000))
    assert info.value.reason == "full" and "move it aside" not in str(info.value)
    assert not db.conn.in_transaction
    db.conn.execute("PRAGMA max_page_count = 1000000")
    assert db.record(trial(P, program="y\n")) is not None     # space again: it goes on


def test_a_read_only_database_is_named_so(tmp_path):
    db = _filled(tmp_path / "t.sqlite")
    db.conn.execute("PRAGMA query_only = ON")                 # SQLite refuses writes: SQLITE_READONLY
    with pytest.raises(DatabaseAccessError, match="read-only") as info:
        db.record(trial(P, program="z\n"))
    assert info.value.reason == "read-only" and "move it aside" not in str(info.value)
    with pytest.raises(DatabaseAccessError, match="opened read-only"):
        Database(tmp_path / "t.sqlite", readonly=True).record(trial(P, program="z\n"))


def test_a_locked_database_is_named_so(tmp_path, monkeypatch):
    path = tmp_path / "t.sqlite"
    _filled(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(database_module, "BUSY_TIMEOUT_MS", 50)
    db = Database(path)
    with pytest.raises(DatabaseAccessError, match="locked by another process") as info:
        db.record(trial(P, program="w\n"))
    assert info.value.reason == "locked"
    holder.execute("ROLLBACK")


@pytest.mark.parametrize("name, message, reason, says", [
    ("SQLITE_IOERR_WRITE", "disk I/O error", "io", "I/O error"),
    ("SQLITE_CANTOPEN", "unable to open database file", "cannot open", "cannot be opened"),
    ("SQLITE_READONLY_DBMOVED", "attempt to write a readonly database", "read-only", "read-only"),
    ("", "database or disk is full", "full", "is full"),                 # recognised by its message
])
def test_each_access_error_says_what_happened_and_what_to_do(name, message, reason, says):
    exc = sqlite3.OperationalError(message)
    exc.sqlite_errorname = name
    error = database_module._error("/data/tuning.sqlite", exc)
    assert isinstance(error, DatabaseAccessError) and error.reason == reason
    assert says in str(error) and "/data/tuning.sqlite" in str(error) and "move it aside" not in str(error)
    damaged = sqlite3.DatabaseError("file is not a database")
    damaged.sqlite_errorname = "SQLITE_NOTADB"
    assert "not a gemmgen tuning database" in str(database_module._error("/data/x", damaged))


def test_an_unreadable_user_database_falls_back_to_the_shipped_records(tmp_path, monkeypatch):
    path = tmp_path / "t.sqlite"
    _filled(path).close()
    real = database_module._connect

    def refuse(target, *, uri=False):
        if uri:
            exc = sqlite3.OperationalError("unable to open database file")
            exc.sqlite_errorname = "SQLITE_CANTOPEN"
            raise exc
        return real(target, uri=uri)

    monkeypatch.setattr(database_module, "_connect", refuse)
    with pytest.warns(RuntimeWarning, match=r"cannot be opened.*shipped records only"):
        layers = open_layers(path, shipped=False)
    assert layers == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_a_user_database_this_process_may_not_read_falls_back_to_the_shipped_records(tmp_path):
    path = tmp_path / "t.sqlite"
    _filled(path).close()
    path.chmod(0)
    try:
        with pytest.warns(RuntimeWarning, match="shipped records only"):
            assert open_layers(path, shipped=False) == []
    finally:
        path.chmod(0o644)


# -- lookups never write --------------------------------------------------------------------------

def test_a_lookup_reads_an_older_database_without_migrating_or_writing_it(tmp_path):
    path = tmp_path / "v7.sqlite"
    with Database(path, migrate_to=7) as db:
        db.conn.execute("PRAGMA journal_mode = DELETE")      # one file: its bytes say everything
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    ((layer, db),) = open_layers(path, shipped=False)
    assert layer == "user" and db.readonly and db.schema_version == SCHEMA_VERSION   # migrated in memory
    assert WinnerIndex([(layer, db)], GPU).lookup(P) is None
    db.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 7


def test_an_empty_file_passed_as_db_is_refused_and_stays_empty(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(DatabaseFileError, match="is empty, not a gemmgen tuning database"):
        open_layers(empty, shipped=False)
    clear_cache()
    with pytest.raises(DatabaseFileError, match="gemmgen tune --db"):
        gemmgen.compile((256, 256, 256), device=GPU, db=str(empty))
    clear_cache()
    assert main(["db", "stats", "--db", str(empty)]) == 2
    assert empty.read_bytes() == b""


# -- `gemmgen db` for a newcomer ------------------------------------------------------------------

def test_db_stats_on_a_fresh_install_reads_the_shipped_records(no_user_db, capsys):
    assert main(["db", "stats"]) == 0
    captured = capsys.readouterr()
    assert "database: the shipped records" in captured.out and ":memory:" not in captured.out
    assert "reading the shipped records" in captured.err
    assert not no_user_db.exists()                              # nothing created


@pytest.mark.parametrize("argv", [["db", "--shipped", "stats"], ["db", "stats", "--shipped"]])
def test_shipped_before_or_after_the_action(no_user_db, capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "database: the shipped records" in out and ":memory:" not in out


def test_db_show_takes_mxnxk_and_says_how_to_write_the_old_form(tmp_path, capsys):
    path = tmp_path / "t.sqlite"
    _filled(path).close()
    assert main(["db", "show", "1024x1024x1024", "--db", str(path)]) == 0
    assert "1 trials" in capsys.readouterr().out
    assert main(["db", "show", "1024", "1024", "1024", "--db", str(path)]) == 2
    assert "write `gemmgen db show 1024x1024x1024`" in capsys.readouterr().err
    assert main(["db", "show", "1024x1024", "--db", str(path)]) == 2
    assert "MxNxK" in capsys.readouterr().err


def test_db_merge_refuses_the_shipped_records_and_says_merged_ones_are_unverified(tmp_path, capsys):
    source = _filled(tmp_path / "a.sqlite")
    export(source, tmp_path / "a.jsonl")
    assert main(["db", "--shipped", "merge", str(tmp_path / "a.jsonl"), "--db", str(tmp_path / "b.sqlite")]) == 2
    assert "cannot be changed" in capsys.readouterr().err
    assert main(["db", "merge", str(tmp_path / "a.jsonl"), "--db", str(tmp_path / "b.sqlite")]) == 0
    assert "unverified" in capsys.readouterr().out
    assert main(["db", "show", "1024x1024x1024", "--db", str(tmp_path / "b.sqlite")]) == 0
    assert "merged: unverified" in capsys.readouterr().out


def test_db_list_shows_what_serves_each_tuned_problem_with_filters(tmp_path, capsys):
    path = tmp_path / "t.sqlite"
    with Database(path) as db:
        db.record(trial(P, device_ms=0.8, baseline_ms=1.0))                          # triton wins
        db.record(trial(SMALL, device_ms=1.5, baseline_ms=1.0))                       # nothing wins
        db.record_library(library_choice(Problem(8192, 1024, 512), device_ms=0.8, torch_ms=1.0))
        db.record(trial(Problem(64, 64, 64, "row", "col"), status="check_failed", check_passed=False))

    def listed(*options):
        assert main(["db", "list", "--db", str(path), *options]) == 0
        return capsys.readouterr().out.splitlines()

    rows = listed()
    assert rows[0].split() == ["shape", "majors", "epilogue", "gpu", "serves", "trials"]
    body = {line.split()[0]: line for line in rows[1:-1]}
    assert list(body) == ["64x64x64", "256x256x512", "1024x1024x1024", "8192x1024x512"]    # by shape
    assert "triton 1.250x" in body["1024x1024x1024"] and " rr " in body["1024x1024x1024"]
    assert "baseline" in body["256x256x512"] and "library 1.250x" in body["8192x1024x512"]
    assert "nothing passed" in body["64x64x64"] and " rc " in body["64x64x64"]
    assert rows[-1] == "4 problems"
    assert [r.split()[0] for r in listed("--winners-only")[1:-1]] == ["1024x1024x1024", "8192x1024x512"]
    assert [r.split()[0] for r in listed("--backend", "triton")[1:-1]] == ["1024x1024x1024"]
    assert [r.split()[0] for r in listed("--m", "256-1024")[1:-1]] == ["256x256x512", "1024x1024x1024"]
    assert [r.split()[0] for r in listed("--k", "-512")[1:-1]] == ["64x64x64", "256x256x512", "8192x1024x512"]
    assert [r.split()[0] for r in listed("--shape", "*x1024x512-")[1:-1]] == ["1024x1024x1024", "8192x1024x512"]
    limited = listed("--limit", "1")
    assert len(limited) == 3 and "3 more not shown" in limited[-1]
    assert main(["db", "list", "--db", str(path), "--m", "1024-64"]) == 2
    assert "runs backwards" in capsys.readouterr().err
    assert main(["db", "list", "--db", str(path), "--shape", "4096x4096"]) == 2
    assert "MxNxK" in capsys.readouterr().err


def test_db_list_names_what_serves_where_a_program_and_a_library_choice_both_won(tmp_path, capsys):
    path = tmp_path / "t.sqlite"
    faster_library, faster_program = Problem(8, 512, 3584, "row", "col"), Problem(16, 512, 3584, "row", "col")
    with Database(path) as db:
        db.record(trial(faster_library, device_ms=0.9, baseline_ms=1.0))                # 1.111x
        db.record_library(library_choice(faster_library, device_ms=0.8, torch_ms=1.0))   # 1.250x
        db.record(trial(faster_program, device_ms=0.7, baseline_ms=1.0))                # 1.429x
        db.record_library(library_choice(faster_program, device_ms=0.8, torch_ms=1.0))
    assert main(["db", "list", "--db", str(path)]) == 0
    body = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert "library 1.250x" in body["8x512x3584"] and "triton 1.429x" in body["16x512x3584"]
