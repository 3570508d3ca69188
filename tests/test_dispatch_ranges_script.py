"""benchmarks/dispatch_ranges.py on CPU, over a stand-in dispatch table: every M a program serves
is checked before it is timed, a failed check is recorded and never timed, and it makes the
exit status 1; the Ms torch.matmul serves are timed as controls, unchecked."""
import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

import gemmgen
import gemmgen.measure
from benchmark_scripts import load_script

HOW = {1: "exact", 2: "exact", 3: "range", 4: "baseline", 5: "baseline", 6: "baseline"}


@dataclass
class StandIn:
    m: int

    @property
    def provenance(self):
        return SimpleNamespace(how=HOW[self.m])

    @property
    def problem(self):
        return SimpleNamespace(m=self.m)

    def fn(self, *args, **kwargs):
        raise AssertionError("a stand-in kernel is never run here")


def run(tmp_path, monkeypatch, failing_ms):
    script = load_script("dispatch_ranges")
    monkeypatch.setattr(script, "WIDTHS", ((64, 32),))
    monkeypatch.setattr(gemmgen, "compile", lambda *a, **kw: SimpleNamespace(kernel_for=StandIn, rows=()))
    checked = []

    def check(fn, problem):
        checked.append(problem.m)
        bad = problem.m in failing_ms
        return SimpleNamespace(passed=not bad, max_rel_err=1e-4, failures=("main: wrong",) if bad else ())

    monkeypatch.setattr(gemmgen.measure, "check", check)
    timed = []
    monkeypatch.setattr(script, "side_by_side",
                        lambda kernels, problem: (timed.append(problem.m) or {"gemmgen": 1.0, "torch": 1.1}, {}))
    rc = script.main(["--out", str(tmp_path), "--dense", "6", "--control-every", "2"])
    return rc, checked, timed, json.loads((tmp_path / "dispatch_ranges.json").read_text())


def test_program_served_ms_are_checked_then_timed(tmp_path, monkeypatch):
    rc, checked, timed, result = run(tmp_path, monkeypatch, failing_ms=())
    assert rc == 0 and checked == [1, 2, 3] and timed == [1, 2, 3, 4, 6]
    assert result["summary"]["range"] == {"checked": 1, "failed_check": 0, "timed": 1,
                                          "geomean": pytest.approx(1.1), "min": 1.1, "max": 1.1}
    assert result["summary"]["baseline"]["checked"] == 0
    assert all(r["passed"] for r in result["rows"] if r["how"] != "baseline")


def test_a_failed_check_is_recorded_untimed_and_fails_the_run(tmp_path, monkeypatch, capsys):
    rc, checked, timed, result = run(tmp_path, monkeypatch, failing_ms=(3,))
    assert rc == 1 and 3 in checked and 3 not in timed
    [row] = [r for r in result["rows"] if r["m"] == 3]
    assert row["passed"] is False and row["failures"] == ["main: wrong"] and "speedup" not in row
    assert result["summary"]["range"] == {"checked": 1, "failed_check": 1, "timed": 0}
    assert "FAILED its check: main: wrong" in capsys.readouterr().out
