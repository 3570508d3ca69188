"""Export is sorted JSON lines; merge reads an export or a database file; the round trip is exact."""
import json

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.tuning_db import Database, Device
from gemmgen.tuning_db.exchange import export, merge
from tuning_fakes import trial

PROBLEMS = [Problem(4096, 4096, 4096), Problem(64, 128, 256, "col", "col"),
            Problem(1000, 11008, 4096, "row", "col", epilogue=Epilogue(bias="n", activation="gelu"))]


def _fill(db, device=None, offset=0.0):
    kwargs = {"device": device} if device else {}
    for i, p in enumerate(PROBLEMS):
        db.record(trial(p, device_ms=1.0 + offset, program=f"program z {i}\n", **kwargs))
        db.record(trial(p, device_ms=0.9 + offset, program=f"program a {i}\n", status="check_failed",
                        check_passed=False, **kwargs))


def test_export_is_sorted_json_lines(tmp_path):
    db = Database(tmp_path / "a.sqlite")
    _fill(db)
    assert export(db, tmp_path / "a.jsonl") == 6
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["problem"], r["program"]) for r in records] == sorted((r["problem"], r["program"]) for r in records)
    assert all(list(r) == sorted(r) for r in records)   # keys sorted: stable diffs
    assert all("id" not in r for r in records)          # ids are local to a file


def test_an_export_of_some_problems_holds_only_their_records(tmp_path):
    db = Database(tmp_path / "a.sqlite")
    _fill(db)
    keys = sorted({json.loads(line)["problem"] for line in _lines_of(db, tmp_path)})
    assert len(keys) > 1
    assert 0 < export(db, tmp_path / "some.jsonl", problems={keys[0]}) < 6
    assert {json.loads(line)["problem"] for line in (tmp_path / "some.jsonl").read_text().splitlines()} == {keys[0]}


def _lines_of(db, tmp_path):
    export(db, tmp_path / "all.jsonl")
    return (tmp_path / "all.jsonl").read_text().splitlines()


def _marked(path):
    """An export's records, each as merging marks it: unverified."""
    return [dict(json.loads(line), unverified=True) for line in path.read_text().splitlines()]


def test_round_trip_jsonl_and_sqlite(tmp_path):
    a = Database(tmp_path / "a.sqlite")
    _fill(a)
    export(a, tmp_path / "a.jsonl")
    b = Database(tmp_path / "b.sqlite")
    assert merge(b, tmp_path / "a.jsonl") == (6, 0)
    export(b, tmp_path / "b.jsonl")
    assert _records(tmp_path / "b.jsonl") == _marked(tmp_path / "a.jsonl")   # the same records, marked
    assert merge(b, tmp_path / "a.jsonl") == (0, 6)       # idempotent
    b.close()
    c = Database(tmp_path / "c.sqlite")
    assert merge(c, tmp_path / "b.jsonl") == (6, 0)       # the mark travels with the records
    export(c, tmp_path / "c.jsonl")
    assert (tmp_path / "c.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    a.close()
    d = Database(tmp_path / "d.sqlite")
    assert merge(d, tmp_path / "a.sqlite") == (6, 0)      # straight from another database file
    export(d, tmp_path / "d.jsonl")
    assert (tmp_path / "d.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_gz_export_is_the_same_lines_compressed_and_byte_stable(tmp_path):
    import gzip

    a = Database(tmp_path / "a.sqlite")
    _fill(a)
    export(a, tmp_path / "a.jsonl")
    assert export(a, tmp_path / "a.jsonl.gz") == 6
    packed = (tmp_path / "a.jsonl.gz").read_bytes()
    assert packed[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed).decode() == (tmp_path / "a.jsonl").read_text()
    export(a, tmp_path / "again.jsonl.gz")
    assert (tmp_path / "again.jsonl.gz").read_bytes() == packed          # no timestamp inside
    b = Database(tmp_path / "b.sqlite")
    assert merge(b, tmp_path / "a.jsonl.gz") == (6, 0)
    export(b, tmp_path / "b.jsonl")
    assert _records(tmp_path / "b.jsonl") == _marked(tmp_path / "a.jsonl")


def test_the_shipped_records_are_kept_compressed_and_under_the_size_limit():
    from pathlib import Path

    from gemmgen.tuning_db.store import SHIPPED_FILES

    folder = Path(__file__).resolve().parent.parent / "tuning_db" / "shipped"
    for name in SHIPPED_FILES:
        path = folder / name
        assert name.endswith(".gz") and path.read_bytes()[:2] == b"\x1f\x8b"
        assert path.stat().st_size < 5 * 2**20        # the repository's limit for a tracked file


def test_merge_combines_machines_but_trusts_none_of_their_times(tmp_path):
    """Merged records are kept, unverified: they never win, and resume measures their programs
    again; a trial measured here afterwards wins on its own times."""
    one, two = Database(tmp_path / "1.sqlite"), Database(tmp_path / "2.sqlite")
    _fill(one)
    _fill(two, device=Device("Another GPU", "9.0", 132), offset=-0.2)
    _fill(two, offset=-0.5)                           # claims far faster times on this GPU model
    export(two, tmp_path / "2.jsonl")
    before = {w.problem.key: w.device_ms for w in one.winners("Test GPU")}
    assert merge(one, tmp_path / "2.jsonl") == (12, 0)
    assert one.stats()["devices"] == ["Another GPU", "Test GPU"]
    assert sum(t.unverified for t in one.trials()) == 12
    assert one.winners("Another GPU") == [] and len(one.winners("Test GPU")) == 3
    assert {w.problem.key: w.device_ms for w in one.winners("Test GPU")} == before
    fresh = Database(tmp_path / "3.sqlite")
    merge(fresh, tmp_path / "2.jsonl")
    assert fresh.winners("Test GPU") == [] and fresh.tuned_problems("Test GPU") == {}
    assert fresh.measured_programs(PROBLEMS[0], "Test GPU") == set()    # tuning measures them again
    fresh.record(trial(PROBLEMS[0], device_ms=0.9, program="program z 0\n"))
    (won,) = fresh.winners("Test GPU")
    assert won.device_ms == 0.9 and not won.unverified


def test_winners_only_export_keeps_the_lookups(tmp_path):
    from gemmgen.tuning_db.exchange import read_jsonl

    db = Database(tmp_path / "a.sqlite")
    _fill(db)
    assert export(db, tmp_path / "w.jsonl", winners_only=True) == 3
    small = Database(":memory:")
    small.record_many(read_jsonl(tmp_path / "w.jsonl"))       # recorded as the shipped records are
    assert [w.program for w in small.winners("Test GPU")] == [w.program for w in db.winners("Test GPU")]
