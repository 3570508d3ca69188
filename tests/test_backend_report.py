"""benchmarks/backend_report.py: the best checked trial per backend and shape, in the bench format."""
import json

import pytest

from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db.records import trial_to_json
from benchmark_scripts import load_script
from tuning_fakes import trial


def test_best_checked_trial_per_backend_against_its_runs_torch(tmp_path, capsys):
    p, q = Problem(1024, 1024, 1024), Problem(64, 64, 64)
    trials = [
        trial(p, device_ms=2.0, baseline_ms=1.0),
        trial(p, device_ms=0.5, baseline_ms=1.0),                                   # the best triton at p
        trial(p, device_ms=0.1, baseline_ms=1.0, status="check_failed", check_passed=False),  # wrong: ignored
        trial(q, device_ms=0.01, baseline_ms=0.02),
    ]
    src = tmp_path / "trials.jsonl"
    src.write_text("".join(trial_to_json(t) + "\n" for t in trials))
    assert load_script("backend_report").main([str(src), "--out", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    best = {(r["m"], r["name"]): r["device_ms"] for r in doc["rows"]}
    assert best[(1024, "triton")] == 0.5 and best[(1024, "torch")] == pytest.approx(1.05)
    # torch ran 1.05x the best baseline in the fake: speedups 2.1 at p and 2.1 at q
    assert doc["summary"]["geomean"]["triton/torch"] == pytest.approx(2.1)
    assert (tmp_path / "out" / "speedup.png").is_file()
    assert capsys.readouterr().out.splitlines()[-1].split()[0] == "all"
