"""The bench's CPU side: shapes files, shards, resume, the results schema, merging, plots, CLI."""
import json
from pathlib import Path

import pytest

from gemmgen.cli import main
from gemmgen.measure import baselines, candidates, results
from gemmgen.measure.bench import make_row, table
from gemmgen.measure.errors import ShapesError, UnknownName
from gemmgen.measure.shapes import Shape, in_m_band, majors, parse_shapes, read_shapes, shard

ROOT = Path(__file__).resolve().parents[1]


# ---- shapes -------------------------------------------------------------------------------

def test_shipped_shape_sets_parse():
    full = read_shapes(ROOT / "benchmarks/shapes/cudal2_1000.csv")
    sample = read_shapes(ROOT / "benchmarks/shapes/cudal2_sample100.csv")
    assert len(full) == 1000 and all(s.layout == "nn" for s in full)
    assert {s.key for s in sample} <= {s.key for s in full} and len(sample) >= 100


def test_layouts_and_header_variants():
    shapes = parse_shapes(["m,n,k,layout", "64,128,256,nt", "", "# comment", "8,16,32", "1,2,3,TN"])
    assert [s.layout for s in shapes] == ["nt", "nn", "tn"]
    p = shapes[0].problem()
    assert (p.a_major, p.b_major, p.c_major) == ("row", "col", "row")
    assert majors("ttt") == ("col", "col", "col")
    assert parse_shapes(["5,6,7"])[0] == Shape(5, 6, 7, "nn")   # no header


@pytest.mark.parametrize("line,message", [
    ("64,x,64", "N = 'x' is not an integer"),
    ("64,0,64", "must be positive"),
    ("64,64", "expected M,N,K"),
    ("64,64,64,nx", "layout 'nx'"),
    ("1,2,3,4,5", "expected M,N,K"),
])
def test_bad_rows_name_the_line_and_the_fix(line, message):
    with pytest.raises(ShapesError, match=message) as info:
        parse_shapes(["M,N,K", "1,1,1", line], "f.csv")
    assert "f.csv:3" in str(info.value)


def test_bad_header_and_empty_and_missing_files(tmp_path):
    with pytest.raises(ShapesError, match="header"):
        parse_shapes(["M,N,K,extra", "1,2,3"])
    with pytest.raises(ShapesError, match="no shapes"):
        parse_shapes(["M,N,K"])
    with pytest.raises(ShapesError, match="missing.csv: no such file"):
        read_shapes(tmp_path / "missing.csv")


def test_shards_partition_the_list():
    shapes = [Shape(i + 1, 1, 1) for i in range(10)]
    parts = [shard(shapes, f"{i}/3") for i in range(3)]
    assert sorted(s.m for p in parts for s in p) == list(range(1, 11))
    assert shard(shapes, None) == shapes
    for bad in ("3/3", "1", "a/b", "-1/2"):
        with pytest.raises(ShapesError):
            shard(shapes, bad)


def test_an_m_band_keeps_one_batch_size_or_a_band_and_names_what_it_cannot():
    shapes = [Shape(m, 64, 64) for m in (1, 2, 4, 16, 32)]
    assert [s.m for s in in_m_band(shapes, 16, 16)] == [16]
    assert [s.m for s in in_m_band(shapes, 2, 16)] == [2, 4, 16]
    assert [s.m for s in in_m_band(shapes, max_m=2)] == [1, 2] and in_m_band(shapes) == shapes
    with pytest.raises(ShapesError, match="layers.csv: no shape has M in \\[8, 8\\]; its Ms are 1, 2, 4, 16, 32"):
        in_m_band(shapes, 8, 8, "layers.csv")
    with pytest.raises(ShapesError, match="--min-m 32 is above --max-m 16"):
        in_m_band(shapes, 32, 16)
    with pytest.raises(ShapesError, match="--max-m 0: M is at least 1"):
        in_m_band(shapes, max_m=0)


# ---- rows, summary, resume, merge ---------------------------------------------------------

def _row(name, m, n, k, device_ms, kind="baseline", passed=True, host_ms=None):
    shape = Shape(m, n, k)
    timing = {"device_ms": device_ms, "device_p10_ms": device_ms * 0.9, "device_p90_ms": device_ms * 1.1,
              "spread": 0.2, "host_ms": host_ms or device_ms * 2, "reps": 30, "kernels": ["k"]}
    check = {"passed": passed, "max_rel_err": 1e-4, "bound": 2e-3, "seed": 9,
             "failures": [] if passed else ["main: 3 of 9 output elements not written (still NaN)"]}
    return make_row(name, kind, shape, shape.problem(), check=check, timing=timing if passed else None,
                    status="ok" if passed else "failed_check")


def _rows():
    rows = []
    for (m, n, k), t in {(64, 64, 64): 0.004, (1024, 1024, 1024): 0.01, (8192, 8192, 8192): 1.6}.items():
        rows.append(_row("torch", m, n, k, t))
        rows.append(_row("lt_autotune", m, n, k, t / 1.25))
        rows.append(_row("mine", m, n, k, t / 2.0, kind="candidate", passed=m != 64))
    return rows


def test_release_frees_each_baseline_s_plan_once_the_problem_is_timed():
    """A cuBLASLt baseline holds a plan, a workspace and its operands; tuning and the bench free
    them after every problem, not at a later garbage collection."""
    from gemmgen.dsl.ir import Problem

    freed = []
    kernels = [baselines.Kernel("lt_heuristic", print, Problem(8, 8, 8), close=lambda: freed.append("lt")),
               baselines.Kernel("torch", print, Problem(8, 8, 8))]
    baselines.release(kernels)
    assert freed == ["lt"] and kernels == []


def test_row_schema_and_floor_fraction():
    row = _row("torch", 8192, 8192, 8192, 0.2)
    for key in ("name", "m", "n", "k", "layout", "device_ms", "host_ms", "spread", "tflops", "floor_ms",
                "fraction_of_floor", "max_rel_err", "passed", "bucket", "gflop"):
        assert key in row
    assert row["tflops"] == pytest.approx(2 * 8192 ** 3 / 0.2e-3 / 1e12)
    assert row["fraction_of_floor"] == pytest.approx(row["floor_ms"] / 0.2)
    assert row["bucket"] == ">256" and row["layout"] == "nn"


def test_summary_geomeans_buckets_and_failed_rows():
    s = results.summarize(_rows())
    assert s["n_shapes"] == 3 and s["baselines"] == ["torch", "lt_autotune"]
    assert s["geomean"]["lt_autotune/torch"] == pytest.approx(1.25)
    assert s["geomean"]["torch/lt_autotune"] == pytest.approx(0.8)
    assert s["geomean"]["mine/torch"] == pytest.approx(2.0) and s["geomean_n"]["mine/torch"] == 2
    assert "mine/mine" not in s["geomean"] and "torch/mine" not in s["geomean"]
    assert s["passed"] == {"torch": 3, "lt_autotune": 3, "mine": 2}
    assert set(s["by_bucket"]) == {"<1", "1-16", ">256"}
    assert s["by_bucket"]["<1"]["geomean"]["mine/torch"] is None


def test_same_session_reference_is_summarised_apart_from_the_cross_process_pairs():
    rows = _rows()
    for r in rows:
        if r["name"] == "mine" and r["passed"]:        # the worker timed torch 1.5x slower than mine
            r["notes"] = {"isolated": True, "reference": "torch", "reference_device_ms": r["device_ms"] * 1.5}
    s = results.summarize(rows)
    assert s["geomean"]["mine/torch"] == pytest.approx(2.0)          # across processes, as before
    assert s["same_session"] == {"mine": {"reference": "torch", "geomean": pytest.approx(1.5), "n": 2, "min": 1.5,
                                          "slower_beyond_noise": 0, "slower_serving_the_reference": 0,
                                          "with_noise": 0}}
    assert s["by_bucket"][">256"]["same_session"]["mine"]["n"] == 1
    assert "mine vs torch timed in mine's own worker session: 1.500 over 2 shapes, lowest 1.500" in table({"rows": rows})


def test_slower_beyond_noise_counts_only_rows_whose_loss_exceeds_their_own_noise():
    rows = _rows()
    mine = [r for r in rows if r["name"] == "mine" and r["passed"]]
    for r, ratio in zip(mine, (0.99, 0.9)):          # 1 % slower: noise; 10 % slower: a loss
        r["notes"] = {"isolated": True, "reference": "torch", "reference_device_ms": r["device_ms"] * ratio,
                      "speedup_noise": 0.016}
    same = results.summarize(rows)["same_session"]["mine"]
    assert same["slower_beyond_noise"] == 1 and same["with_noise"] == 2
    assert same["min"] == pytest.approx(0.9)
    assert "1 of 2 slower beyond noise" in table({"rows": rows})
    assert same["slower_serving_the_reference"] == 0 and "itself" not in table({"rows": rows})
    mine[1]["notes"] |= {"how": "baseline", "backend": "torch"}     # compile served torch.matmul: an A/A pair
    same = results.summarize(rows)["same_session"]["mine"]
    assert same["slower_beyond_noise"] == 1 and same["slower_serving_the_reference"] == 1
    assert "1 of 2 slower beyond noise (1 of them serving torch itself)" in table({"rows": rows})


def test_save_load_roundtrip_turns_nan_into_null(tmp_path):
    rows = _rows()
    rows[0]["max_rel_err"] = float("nan")
    results.save(tmp_path, {"mode": "offline"}, rows)
    text = (tmp_path / "results.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in results.json"))
    doc = results.load(tmp_path)
    assert doc["rows"][0]["max_rel_err"] is None and doc["summary"]["n_shapes"] == 3


def test_load_reads_an_archived_run_gzipped(tmp_path):
    import gzip

    results.save(tmp_path, {"mode": "offline"}, _rows())
    plain = results.load(tmp_path)
    packed = tmp_path / "results.json.gz"
    packed.write_bytes(gzip.compress((tmp_path / "results.json").read_bytes()))
    (tmp_path / "results.json").unlink()
    assert results.load(tmp_path) == plain == results.load(tmp_path / "results.json")
    assert results.refresh(tmp_path)["summary"] == plain["summary"]
    assert not (tmp_path / "results.json").exists()                 # the archive stays as it was
    with pytest.raises(results.MeasureError, match="cannot read"):
        results.load(tmp_path / "elsewhere")


def test_load_rejects_foreign_files(tmp_path):
    (tmp_path / "results.json").write_text("[1, 2]")
    with pytest.raises(results.MeasureError, match="not a gemmgen results"):
        results.load(tmp_path)


def test_resume_skips_only_complete_shapes():
    rows = _rows()[:-1]            # the last shape lacks its 'mine' row
    done = results.done_shapes(rows, ["torch", "lt_autotune", "mine"])
    assert done == {(64, 64, 64, "nn"), (1024, 1024, 1024, "nn")}
    assert len(results.done_shapes(rows, ["torch"])) == 3


def test_merge_of_shards(tmp_path):
    rows = _rows()
    a = {"meta": {"mode": "offline", "shard": "0/2"}, "rows": rows[:4]}
    b = {"meta": {"mode": "offline", "shard": "1/2"}, "rows": rows[3:]}
    meta, merged = results.merge([a, b])
    assert len(merged) == len(rows) and len(meta["merged_from"]) == 2
    with pytest.raises(results.MeasureError, match="different modes"):
        results.merge([a, {"meta": {"mode": "server"}, "rows": []}])


def test_cli_merge_and_report_make_plots(tmp_path, capsys):
    rows = _rows()
    results.save(tmp_path / "s0", {"mode": "offline"}, rows[:3])
    results.save(tmp_path / "s1", {"mode": "offline"}, rows[3:])
    assert main(["bench", "merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "all")]) == 0
    merged = json.loads((tmp_path / "all/results.json").read_text())
    assert merged["summary"]["n_shapes"] == 3
    assert main(["bench", "report", str(tmp_path / "all")]) == 0
    out = capsys.readouterr().out
    assert "mine" in out and "vs torch" in out
    for png in ("speedup.png", "buckets.png"):
        data = (tmp_path / "all" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert data[25] == 3          # colour type 3: a palette of at most 256 colours (plots.save_png)


def test_table_lists_every_name():
    doc = {"meta": {"mode": "server", "stopped": "time budget of 5 s reached"}, "rows": _rows()}
    text = table(doc)
    assert "mode server" in text and "lt_autotune" in text and "stopped early" in text


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["bench"]) == 2
    assert main(["bench", "report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("gemmgen: error:") == 2 and "Traceback" not in err


# ---- registries and environment -----------------------------------------------------------

def test_baseline_names_expand_and_unknown_is_clear():
    assert baselines.expand(["torch", "cublas", "cublas_nn"]) == ["torch", "cublas_nn", "cublas_tn"]
    with pytest.raises(UnknownName, match="cublsa"):
        baselines.expand(["cublsa"])
    assert baselines.better_of({"cublas_nn": 2.0, "cublas_tn": 1.5, "torch": 1.0}, ("cublas_nn", "cublas_tn")) == "cublas_tn"


def test_cublas_layout_variants_change_only_b():
    from gemmgen.dsl.ir import Problem
    p = Problem(64, 128, 256, a_major="col")
    assert baselines.make("cublas_tn", p).problem.b_major == "col"
    nn = baselines.make("cublas_nn", p).problem
    assert (nn.a_major, nn.b_major) == ("col", "row")


def test_candidates_resolve_lazily_with_clear_errors():
    assert candidates.resolve("planted:returns") is not None
    with pytest.raises(UnknownName, match="unknown candidate 'nope'"):
        candidates.resolve("nope")
    with pytest.raises(UnknownName, match="not found"):
        candidates.resolve("no_such_module_xyz:f")
    with pytest.raises(UnknownName, match="has no"):
        candidates.resolve("planted:missing")
    candidates.register("mine", "planted:returns")
    assert candidates.spec_of("mine") == "planted:returns"
    assert candidates.notes_for("mine", None) == {}
    # gemmgen's row says what gemmgen.compile served (looked up without a GPU here)
    from gemmgen.dsl.ir import Problem

    notes = candidates.notes_for("gemmgen", Problem(64, 64, 64))
    assert notes["how"] in ("exact", "nearest", "baseline") and notes["backend"] in ("torch", "triton", "cutlass", "cuda")


def test_environment_record_without_gpu():
    from gemmgen.measure.env import environment, parse_smi_line
    env = environment()
    assert {"date", "versions", "torch", "gpu"} <= set(env) and "torch" in env["versions"]
    rec = parse_smi_line("NVIDIA H200, 580.65.06, 1980, 3201, 1980, 3201, 123.45, 700.00, 41, P0")
    assert rec["name"] == "NVIDIA H200" and rec["sm_clock_mhz"] == 1980.0 and rec["pstate"] == "P0"
    assert parse_smi_line("X, 1, [N/A], 2, 3, 4, 5, 6, 7, P8")["sm_clock_mhz"] == "[N/A]"


# ---- the bench loop on CPU: checks real, timer stubbed ---------------------------------------

TIMES = {"torch": 1.0, "cublas_nn": 0.9, "cublas_tn": 0.8, "test_measure_bench_cpu:honest_factory": 0.5}


def honest_factory(problem):
    def fn(a, b, out, **_):
        out.copy_((a.float() @ b.float()).half())
    return fn


@pytest.fixture
def stub_timer(monkeypatch):
    from gemmgen.measure import timing
    calls = []

    def fake_time_many(kernels, mode="offline", *, options=None, device="cuda"):
        calls.append([name for name, _, _ in kernels])
        return {name: timing.Timing(mode, TIMES[name], TIMES[name], TIMES[name], 0.0, 2 * TIMES[name],
                                    0, 0, 30, problem.floor_s * 1e3, ("k",)) for name, _, problem in kernels}
    from gemmgen.measure import bench
    monkeypatch.setattr(bench, "time_many", fake_time_many)
    return calls


def _cfg(tmp_path, csv, **kw):
    from gemmgen.measure.bench import BenchConfig
    shapes = tmp_path / "shapes.csv"
    shapes.write_text(csv)
    return BenchConfig(shapes=str(shapes), out=str(tmp_path / "out"), baselines=["torch", "cublas"],
                       device="cpu", progress=False, seed=5, **kw)


def test_bench_loop_rows_derived_cublas_and_candidates(tmp_path, stub_timer):
    from gemmgen.measure.bench import run
    doc = run(_cfg(tmp_path, "M,N,K\n32,48,64\n16,16,128,nt\n", candidates=["test_measure_bench_cpu:honest_factory"],
                   isolate=False))
    names = [r["name"] for r in doc["rows"]]
    assert names.count("cublas") == 2 and names.count("test_measure_bench_cpu:honest_factory") == 2
    cublas = [r for r in doc["rows"] if r["name"] == "cublas"]
    assert all(r["notes"]["chosen"] == "cublas_tn" and r["layout"] == "nt" and r["passed"] for r in cublas)
    assert all(r["passed"] and r["seed"] == 5 for r in doc["rows"])
    assert doc["summary"]["geomean"]["cublas/torch"] == pytest.approx(1.25)
    saved = results.load(tmp_path / "out")
    assert saved["meta"]["environment"]["versions"]["torch"] and saved["meta"]["mode"] == "offline"


def test_bench_resume_and_time_budget(tmp_path, stub_timer):
    from gemmgen.measure.bench import run
    stopped = run(_cfg(tmp_path, "M,N,K\n32,48,64\n", time_budget_s=0.0))
    assert stopped["rows"] == [] and "time budget" in stopped["meta"]["stopped"]
    run(_cfg(tmp_path, "M,N,K\n32,48,64\n16,16,128\n", shard="0/2"))
    assert len(stub_timer) == 1
    doc = run(_cfg(tmp_path, "M,N,K\n32,48,64\n16,16,128\n", resume=True))
    assert len(stub_timer) == 2 and doc["meta"]["skipped_done"] == 1
    assert doc["summary"]["n_shapes"] == 2


def test_bench_times_only_the_m_band_asked_for(tmp_path, stub_timer, capsys):
    from gemmgen.measure.bench import run
    doc = run(_cfg(tmp_path, "M,N,K\n16,48,64\n32,48,64\n16,16,128\n", min_m=16, max_m=16))
    assert {r["m"] for r in doc["rows"]} == {16} and len(stub_timer) == 2
    assert (doc["meta"]["min_m"], doc["meta"]["max_m"]) == (16, 16)
    shapes = tmp_path / "shapes.csv"
    assert main(["bench", "--shapes", str(shapes), "--out", str(tmp_path / "o"), "--min-m", "64"]) == 2
    err = capsys.readouterr().err
    assert "no shape has M in [64, any]; its Ms are 16, 32" in err and "Traceback" not in err


def test_bench_refuses_unknown_names_before_measuring(tmp_path, stub_timer):
    from gemmgen.measure.bench import run
    with pytest.raises(UnknownName):
        run(_cfg(tmp_path, "M,N,K\n32,48,64\n", candidates=["no_such_candidate"]))
    with pytest.raises(UnknownName, match="--same-session-reference 'cublas'"):
        run(_cfg(tmp_path, "M,N,K\n32,48,64\n", reference="cublas"))   # derived: not timeable in a worker
    assert stub_timer == []

