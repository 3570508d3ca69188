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


def test_round_trip_jsonl_and_sqlite(tmp_path):
    a = Database(tmp_path / "a.sqlite")
    _fill(a)
    export(a, tmp_path / "a.jsonl")
    b = Database(tmp_path / "b.sqlite")
    assert merge(b, tmp_path / "a.jsonl") == (6, 0)
    export(b, tmp_path / "b.jsonl")
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()
    assert merge(b, tmp_path / "a.jsonl") == (0, 6)       # idempotent
    a.close()
    c = Database(tmp_path / "c.sqlite")
    assert merge(c, tmp_path / "a.sqlite") == (6, 0)      # straight from another database file
    export(c, tmp_path / "c.jsonl")
    assert (tmp_path / "c.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()


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
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()


def test_the_shipped_records_are_kept_compressed_and_under_the_size_limit():
    from pathlib import Path

    from gemmgen.tuning_db.store import SHIPPED_FILES

    folder = Path(__file__).resolve().parent.parent / "tuning_db" / "shipped"
    for name in SHIPPED_FILES:
        path = folder / name
        assert name.endswith(".gz") and path.read_bytes()[:2] == b"\x1f\x8b"
        assert path.stat().st_size < 5 * 2**20        # the repository's limit for a tracked file


def test_merge_combines_machines(tmp_path):
    one, two = Database(tmp_path / "1.sqlite"), Database(tmp_path / "2.sqlite")
    _fill(one)
    _fill(two, device=Device("Another GPU", "9.0", 132), offset=-0.2)
    export(two, tmp_path / "2.jsonl")
    assert merge(one, tmp_path / "2.jsonl") == (6, 0)
    assert one.stats()["devices"] == ["Another GPU", "Test GPU"]
    assert len(one.winners("Another GPU")) == 3 and len(one.winners("Test GPU")) == 3


def test_winners_only_export_keeps_the_lookups(tmp_path):
    db = Database(tmp_path / "a.sqlite")
    _fill(db)
    assert export(db, tmp_path / "w.jsonl", winners_only=True) == 3
    small = Database(":memory:")
    merge(small, tmp_path / "w.jsonl")
    assert [w.program for w in small.winners("Test GPU")] == [w.program for w in db.winners("Test GPU")]
