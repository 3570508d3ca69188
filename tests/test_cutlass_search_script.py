"""benchmarks/cutlass_search.py's per-bucket table, on CPU: both speedups, per bucket and anchor."""
import json
import math

import pytest

from benchmark_scripts import BENCHMARKS, load_script


def _row(name, kind, m, n, k, bucket, ms, reference_ms=None):
    notes = {"reference_device_ms": reference_ms} if reference_ms else {}
    return {"name": name, "kind": kind, "m": m, "n": n, "k": k, "bucket": bucket, "passed": True,
            "device_ms": ms, "notes": notes}


def test_bucket_table_gives_the_cross_session_and_the_same_session_speedups():
    script = load_script("cutlass_search")
    rows = [_row("torch", "baseline", 4096, 4096, 4096, "16-256", 0.18),
            _row("cutlass", "candidate", 4096, 4096, 4096, "16-256", 0.20, reference_ms=0.21),
            _row("torch", "baseline", 64, 64, 64, "<1", 0.004),
            _row("cutlass", "candidate", 64, 64, 64, "<1", 0.002)]      # no same-session time
    lines = script.bucket_table({"offline": {"rows": rows}}).splitlines()
    cells = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert lines[0].split() == ["bucket", "offline", "n", "offline", "x", "torch", "same", "sess."]
    assert cells["4096^3"] == ["1", "0.900", "1.050"]
    assert cells["<1"] == ["1", "2.000", "-"]
    assert cells["all"][0] == "2" and float(cells["all"][1]) == pytest.approx(math.sqrt(0.9 * 2.0), abs=1e-3)
    assert cells["all"][2] == "1.050"            # the one shape timed beside torch.matmul
    assert cells["8192^3"] == ["0", "-", "-"]


def test_the_committed_session_15_table_is_what_the_rows_give():
    script = load_script("cutlass_search")
    folder = BENCHMARKS / "results" / "cutlass_search" / "s15"
    docs = {mode: json.loads((folder / mode / "results.json").read_text()) for mode in ("offline", "server")}
    summary = json.loads((folder / "summary.json").read_text())
    assert script.bucket_table(docs).splitlines() == summary["table"]
