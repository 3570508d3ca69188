"""benchmarks/cutlass_search.py's per-bucket table, on CPU: both speedups, per bucket and anchor."""
import gzip
import json
import math

import pytest

from benchmark_scripts import BENCHMARKS, load_script
from gemmgen.measure import results


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


RESULT = BENCHMARKS / "results" / "cutlass_search"      # the committed search, offline and server


def committed_selection() -> dict:
    """The committed search's program per shape (gzipped, as large results are committed)."""
    return json.loads(gzip.decompress((RESULT / "selection.json.gz").read_bytes()))


def test_the_committed_table_is_what_the_rows_give():
    script = load_script("cutlass_search")
    folder = RESULT
    docs = {mode: results.load(folder / mode) for mode in ("offline", "server")}
    summary = json.loads((folder / "summary.json").read_text())
    assert script.bucket_table(docs).splitlines() == summary["table"]


def test_finalists_are_the_ties_of_a_long_group_session():
    script = load_script("cutlass_search")
    at_8192 = {"c8": 1.654, "c3": 1.660, "c0": 1.683, "c5": 2.069}          # 8192^3, timed together
    assert script.finalists(at_8192) == ["c8", "c3", "c0"]                  # within 5 % of the best
    assert script.finalists({"c0": 0.1219, "c1": 0.1224}) == []             # short: ranked together
    assert script.finalists({"c0": 0.1948, "c1": 0.1936}) == ["c0", "c1"]   # 4096^3
    assert script.finalists({"c0": 1.654, "c5": 2.069}) == []               # one within the gap
    assert script.finalists({}) == []


class _Result:
    def __init__(self, ms, torch_ms, status="ok"):
        self.status, self.timing, self.reference_timing = status, {"device_ms": ms}, {"device_ms": torch_ms}

    @property
    def ok(self):
        return self.status == "ok"


class _Runner:
    """Answers each alone job from a table keyed by (mode, name); records the jobs."""

    def __init__(self, table):
        self.table, self.jobs = table, []

    def run(self, job):
        self.jobs.append(job)
        mode, name = job.name.split(" ")[-2:]
        return self.table[(mode, name)]


def test_time_alone_runs_each_finalist_beside_torch_in_its_own_job_per_mode():
    from gemmgen.dsl.ir import Problem

    script = load_script("cutlass_search")
    problem = Problem(8192, 8192, 8192)
    entries = [(n, f"artifact-{n}", f"program-{n}") for n in ("c0", "c8", "c9")]
    runner = _Runner({("offline", "c0"): _Result(1.60, 1.62), ("server", "c0"): _Result(1.42, 1.42),
                      ("offline", "c8"): _Result(1.66, 1.73), ("server", "c8"): _Result(1.56, 1.42),
                      ("offline", "c9"): _Result(1.50, 1.44), ("server", "c9"): _Result(1.5, 1.4, "error")})
    alone = script.time_alone(runner, ["c0", "c8", "c9"], entries, problem, seed=7)
    assert set(alone) == {"c0", "c8"}                                        # c9 lacks a server time
    assert alone["c8"]["offline"] == pytest.approx(1.73 / 1.66) and alone["c8"]["server"] == pytest.approx(1.42 / 1.56)
    assert max(alone, key=lambda n: min(alone[n].values())) == "c0"         # the better worse mode
    assert len(runner.jobs) == 6 and {j.mode for j in runner.jobs} == {"offline", "server"}
    assert all(j.reference == "torch" and not j.check for j in runner.jobs)
    assert {j.args for j in runner.jobs} == {(f"artifact-{n}", f"program-{n}") for n in ("c0", "c8", "c9")}
    again = _Runner(runner.table)
    script.time_alone(again, ["c0", "c8", "c9"], entries, problem, seed=7)
    assert [j.name for j in again.jobs] == [j.name for j in runner.jobs]     # seeded order


def test_the_committed_search_chose_the_balanced_grid_at_both_anchors_in_the_finalist_round():
    selection = committed_selection()
    anchors = [e for e in selection.values() if e["shape"].split(":")[0] in ("4096x4096x4096", "8192x8192x8192")]
    assert len(anchors) == 2
    for entry in anchors:
        assert "scheduler persistent 128" in entry["program"] and "worse-mode" in entry["why"]
    finalists = [e for e in selection.values() if "worse-mode" in e.get("why", "")]
    assert len(finalists) == 19
    assert sum("scheduler persistent 128" in e["program"] for e in finalists) == 10


def test_the_committed_search_gives_the_wide_epilogue_only_to_store_bound_shapes():
    """The wide epilogue sub-tile is offered on store-bound shapes only (docs/design/cutlass.md);
    in the committed search it was chosen at 7 of the 11 store-bound sample shapes, and 7 of
    the 11 measured at least level with torch.matmul timed in the same session."""
    from gemmgen import dsl
    from gemmgen.backends.cutlass.search_space import _store_bound

    selection = committed_selection()
    programs = {key.split(":")[0]: dsl.parse(e["program"]) for key, e in selection.items()}
    store_bound = {s for s, p in programs.items() if _store_bound(p.problem)}
    assert len(store_bound) == 11
    assert sum(bool(programs[s].epilogue_tile) for s in store_bound) == 7
    assert not any(p.epilogue_tile for s, p in programs.items() if s not in store_bound)
    rows = results.load(RESULT / "offline")["rows"]
    same = {f"{r['m']}x{r['n']}x{r['k']}": r["notes"]["reference_device_ms"] / r["device_ms"]
            for r in rows if r["name"] != "torch"}
    assert sum(same[s] >= 0.985 for s in store_bound) == 7
    summary = json.loads((RESULT / "summary.json").read_text())["summaries"]
    for mode in ("offline", "server"):
        assert summary[mode]["same_session"]["cutlass_search:selected_kernel"]["geomean"] > 1.0


def test_the_anchors_come_first_so_a_time_budget_cannot_drop_them(tmp_path):
    """A sample run once selected 109 of 111 shapes before its budget ran out: the two anchors,
    which came last. They now come first, and a CSV that has one is not given it twice."""
    from gemmgen.measure.shapes import Shape

    script = load_script("cutlass_search")
    csv = [Shape(64, 64, 64, "nn"), Shape(8192, 8192, 8192, "nn")]
    shapes = script.with_anchors(csv, tmp_path / "shapes.csv", skip=False)
    assert [(s.m, s.n, s.k) for s in shapes] == [(4096, 4096, 4096), (64, 64, 64), (8192, 8192, 8192)]
    assert (tmp_path / "shapes.csv").read_text().splitlines()[1] == "4096,4096,4096,nn"
    assert script.with_anchors(csv, tmp_path / "shapes.csv", skip=True) == csv
