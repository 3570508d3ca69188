"""benchmarks/tune_h200.py on CPU with the fake builder and runner: resume from its own
record, ship every trial (winners are a query), summarise per FLOP bucket."""
import json
import sys
from pathlib import Path

import pytest

from gemmgen.compile import clear_cache
from gemmgen.tuning_db import Database
from gemmgen.tuning_db.exchange import read_jsonl
from benchmark_scripts import load_script
from tuning_fakes import FakeBuilder, FakeRunner


def test_tune_h200_script_resumes_and_ships(tmp_path, capsys):
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n1024,1024,1024\n2048,4096,512\n64,64,64\n")
    out, ship = tmp_path / "out", tmp_path / "h200.jsonl"
    args = ["--shapes", str(shapes), "--out", str(out), "--ship", str(ship), "--db", str(tmp_path / "w1.sqlite"),
            "--budget", "2", "--backends", "triton", "--time-budget", "600"]
    runner = lambda **kw: FakeRunner()  # noqa: E731
    script = load_script("tune_h200")
    assert script.main(args, make_runner=runner, builder=FakeBuilder()) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[-1].split()[:2] == ["all", "3"]
    trials = list(read_jsonl(out / script.TRIALS))
    shipped = list(read_jsonl(ship))
    assert len(trials) == 6 and len(shipped) == 6
    winners = [t for t in shipped if t.beats_baseline()]
    assert 0 < len({t.problem.key for t in winners}) <= 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials_exported"] == 6 and set(summary["by_bucket"]) <= {r["bucket"] for r in summary["rows"]}
    assert summary["gpu_memory_gib"] is None                            # no GPU here
    assert script._memory_summary([(0.5, 9.0), None, (0.25, 12.5)]) == {
        "held_after_a_problem_max": 0.5, "held_after_the_last": 0.25, "peak_in_a_problem_max": 12.5}
    # a fresh machine: a new working database resumes from OUT/trials.jsonl.gz, measures nothing again
    fresh = FakeRunner()
    assert script.main(args + ["--db", str(tmp_path / "w2.sqlite")],   # the last --db counts
                       make_runner=lambda **kw: fresh, builder=FakeBuilder()) == 0
    assert fresh.measured == []
    assert len(list(read_jsonl(out / script.TRIALS))) == 6
    assert len(list(Database(tmp_path / "w2.sqlite").trials())) == 6
    clear_cache()


def test_tune_h200_ships_only_this_gpu_s_records_into_its_model_s_file(tmp_path, capsys, monkeypatch):
    """A run on one GPU model whose working database also holds another model's records (a
    resumed export) writes only its own model's records to the shipped file, and picks that
    file by the GPU's name; a model without a shipped file is said, and nothing is shipped."""
    from dataclasses import replace as dc_replace

    from gemmgen.dsl.ir import Problem
    from gemmgen.tuning_db.exchange import export
    from tuning_fakes import TEST_GPU, trial

    script = load_script("tune_h200")
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n1024,1024,1024\n")
    out = tmp_path / "out"
    other = Database(tmp_path / "other.sqlite")
    other.record(trial(Problem(1024, 1024, 1024), device=dc_replace(TEST_GPU, name="Other GPU")))
    out.mkdir()
    export(other, out / script.TRIALS)
    ship = tmp_path / "test.jsonl"
    monkeypatch.setattr("gemmgen.tuning_db.store.SHIPPED_FILE_OF_GPU", {TEST_GPU.name: "test.jsonl"})
    monkeypatch.setattr(script, "REPO", tmp_path / "repo")
    (tmp_path / "repo" / "tuning_db" / "shipped").mkdir(parents=True)
    args = ["--shapes", str(shapes), "--out", str(out), "--db", str(tmp_path / "w.sqlite"),
            "--budget", "2", "--backends", "triton", "--time-budget", "600"]
    assert script.main(args, make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder()) == 0
    shipped = list(read_jsonl(tmp_path / "repo" / "tuning_db" / "shipped" / "test.jsonl"))
    assert len(shipped) == 2 and {t.device.name for t in shipped} == {TEST_GPU.name}
    assert {t.device.name for t in read_jsonl(out / script.TRIALS)} == {TEST_GPU.name, "Other GPU"}
    monkeypatch.setattr("gemmgen.tuning_db.store.SHIPPED_FILE_OF_GPU", {})
    assert script.main(args, make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder()) == 0
    assert "no shipped records file for Test GPU" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["shipped_trials"] is None
    assert not ship.exists()
    clear_cache()


def test_a_probe_s_trials_never_reach_a_later_run_s_shipped_file(tmp_path, capsys, monkeypatch):
    """A probe (--ship '') and then a shipping run on the same machine, both in the default
    working database's folder: the shipped file holds the second run's trials only."""
    monkeypatch.setenv("GEMMGEN_DB", str(tmp_path / "cache" / "tuning.sqlite"))
    script = load_script("tune_h200")
    probe_shapes, tuned_shapes = tmp_path / "probe.csv", tmp_path / "tuned.csv"
    probe_shapes.write_text("M,N,K\n1024,1024,1024\n")
    tuned_shapes.write_text("M,N,K\n2048,4096,512\n")
    common = ["--budget", "2", "--backends", "triton", "--time-budget", "600"]
    at_exit = []
    helpers = sys.modules[script.scratch_db.__module__]     # the folder's on_demand.py makes the scratch db
    monkeypatch.setattr(helpers.atexit, "register", lambda fn, *args: at_exit.append((fn, args)))
    assert script.main(["--shapes", str(probe_shapes), "--out", str(tmp_path / "probe"), "--ship", ""] + common,
                       make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder()) == 0
    assert len(list(read_jsonl(tmp_path / "probe" / script.TRIALS))) == 2
    # the probe's own working database goes when the process ends
    [(remove, (probe_dir, _))] = at_exit
    assert (Path(probe_dir) / "tuning.sqlite").is_file()
    remove(probe_dir, True)
    assert not Path(probe_dir).exists()
    ship = tmp_path / "shipped.jsonl"
    assert script.main(["--shapes", str(tuned_shapes), "--out", str(tmp_path / "tuned"), "--ship", str(ship)]
                       + common, make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder()) == 0
    assert {t.problem.m for t in read_jsonl(ship)} == {2048}
    clear_cache()


def test_tune_h200_max_m_tunes_only_the_small_rows(tmp_path, capsys):
    """--max-m keeps a layer set's decode and small-batch rows: nothing above it is measured;
    --min-m cuts the band from below."""
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n16,1024,1024\n128,2048,512\n256,1024,1024\n")
    out = tmp_path / "out"
    args = ["--shapes", str(shapes), "--out", str(out), "--ship", "", "--db", str(tmp_path / "w.sqlite"),
            "--budget", "1", "--backends", "triton", "--time-budget", "600", "--max-m", "128"]
    runner = FakeRunner()
    script = load_script("tune_h200")
    assert script.main(args, make_runner=lambda **kw: runner, builder=FakeBuilder()) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(r["problem"].split("x")[0] for r in summary["rows"]) == ["128", "16"]
    assert {t.problem.m for t in read_jsonl(out / script.TRIALS)} == {16, 128}
    band = FakeRunner()                 # --min-m with --max-m: a band of batch sizes
    assert script.main(args + ["--min-m", "17", "--out", str(tmp_path / "band")],
                       make_runner=lambda **kw: band, builder=FakeBuilder()) == 0
    assert {t.problem.m for t in read_jsonl(tmp_path / "band" / script.TRIALS)} == {128}
    clear_cache()


def test_tune_h200_leaves_what_it_measured_when_killed(tmp_path, monkeypatch):
    """A run stopped from outside (here a Ctrl-C in the second shape) has already exported the
    trials of the shapes it finished."""
    import pytest

    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n1024,1024,1024\n2048,4096,512\n")
    out = tmp_path / "out"
    args = ["--shapes", str(shapes), "--out", str(out), "--ship", "", "--db", str(tmp_path / "w.sqlite"),
            "--budget", "2", "--backends", "triton", "--time-budget", "600"]
    script = load_script("tune_h200")
    monkeypatch.setattr(script, "EXPORT_EVERY_S", 0.0)
    runner = FakeRunner(stop_after=4)     # shape 1: 2 trials and a second measurement of each
    with pytest.raises(KeyboardInterrupt):
        script.main(args, make_runner=lambda **kw: runner, builder=FakeBuilder())
    assert {t.problem.m for t in read_jsonl(out / script.TRIALS)} == {1024}
    clear_cache()


def test_tune_h200_says_what_is_wrong_with_a_shapes_file(tmp_path, capsys):
    import pytest

    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n")
    script = load_script("tune_h200")
    with pytest.raises(SystemExit):
        script.main(["--shapes", str(shapes), "--out", str(tmp_path / "out"), "--ship", "",
                     "--db", str(tmp_path / "w.sqlite")], make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder())
    assert "no shapes found" in capsys.readouterr().err
    assert not (tmp_path / "w.sqlite").exists()       # refused before a database was made
    shapes.write_text("M,N,K\n64,64,64\n")
    with pytest.raises(SystemExit):
        script.main(["--shapes", str(shapes), "--backends", "tritn", "--out", str(tmp_path / "out"), "--ship", "",
                     "--db", str(tmp_path / "w.sqlite")], make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder())
    assert "'tritn'" in capsys.readouterr().err and not (tmp_path / "w.sqlite").exists()
    with pytest.raises(SystemExit):     # a band no row is in: said, not an empty run
        script.main(["--shapes", str(shapes), "--min-m", "2", "--max-m", "2", "--out", str(tmp_path / "out"),
                     "--ship", "", "--db", str(tmp_path / "w.sqlite")],
                    make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder())
    assert "no shape has M in [2, 2]" in capsys.readouterr().err and not (tmp_path / "w.sqlite").exists()


def test_tune_h200_searches_cublaslt_and_ships_the_choices(tmp_path, capsys):
    """--backends cublaslt alone: the library search runs per shape, its choices are exported
    with the run and shipped, count as won where they serve, and a rerun searches nothing."""
    from dataclasses import dataclass, field
    from test_tuning_library import _found

    @dataclass
    class Library(FakeRunner):
        searched: list = field(default_factory=list)

        def library(self, problem):
            self.searched.append(problem.m)
            return _found(device_ms=0.8 if problem.m == 256 else 1.0)   # serves at M = 256 only

    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n256,1024,1024\n512,2048,512\n")
    out, ship = tmp_path / "out", tmp_path / "h200.jsonl"
    args = ["--shapes", str(shapes), "--out", str(out), "--ship", str(ship), "--db", str(tmp_path / "w.sqlite"),
            "--backends", "cublaslt", "--time-budget", "600"]
    script = load_script("tune_h200")
    runner = Library()
    assert script.main(args, make_runner=lambda **kw: runner, builder=FakeBuilder()) == 0
    assert runner.searched == [256, 512] and runner.measured == []
    assert capsys.readouterr().out.splitlines()[-1].split()[:3] == ["all", "2", "1"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["proposer"] is None and summary["report"].startswith("cublaslt: ")
    assert [r["how"] for r in summary["rows"]] == ["library", "baseline"]
    assert summary["rows"][0]["speedup_over_best_baseline"] == 1.0 / 0.8
    assert len(list(read_jsonl(out / script.TRIALS))) == 2 and len(list(read_jsonl(ship))) == 2
    again = Library()
    assert script.main(args + ["--db", str(tmp_path / "w2.sqlite")],
                       make_runner=lambda **kw: again, builder=FakeBuilder()) == 0
    assert again.searched == []                  # resumed from its own export
    clear_cache()


def test_tune_h200_tries_an_experiments_programs_at_every_shape_they_fit(tmp_path, capsys):
    """--programs: the split-K programs of benchmarks/programs/ re-bound to the narrow weights'
    batches (`x @ W.T`); a folder without programs is refused before any database is made."""
    import pytest

    from benchmark_scripts import BENCHMARKS

    folder = BENCHMARKS / "programs/split_k_narrow_weights"
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,layout\n4,1024,4096,nt\n16,1024,8192,nt\n16,512,3584,nt\n")
    out, runner = tmp_path / "out", FakeRunner()
    args = ["--shapes", str(shapes), "--out", str(out), "--ship", "", "--db", str(tmp_path / "w.sqlite"),
            "--budget", "4", "--backends", "cuda", "--time-budget", "600", "--programs", str(folder)]
    script = load_script("tune_h200")
    assert script.main(args, make_runner=lambda **kw: runner, builder=FakeBuilder()) == 0
    trials = list(read_jsonl(out / script.TRIALS))
    assert len(trials) == 3 * 4 and {t.problem.m for t in trials} == {4, 16}      # 4 programs, 3 shapes
    assert all("mainloop multistage" in t.program and ("split_k 8" in t.program or "split_k 6" in t.program)
               for t in trials)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        script.main(args[:-1] + [str(empty)] + ["--db", str(tmp_path / "never.sqlite")],
                    make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder())
    assert "no .gemm file there" in capsys.readouterr().err
    assert not (tmp_path / "never.sqlite").exists()
    clear_cache()


def test_the_gated_pingpong_programs_fit_every_prefill_size_gated_product():
    """benchmarks/programs/gated_pingpong/: each program parses, is a gated ws_pingpong program and
    validates at the gated MLP products of M = 512 to 4096 it was tried on."""
    from benchmark_scripts import BENCHMARKS
    from gemmgen.backends import diagnose
    from gemmgen.dsl import parse
    from gemmgen.dsl.ir import Epilogue, Problem

    files = sorted((BENCHMARKS / "programs/gated_pingpong").glob("*.gemm"))
    assert len(files) == 8
    epilogue = Epilogue(gate="silu", halves="stacked")
    for path in files:
        program = parse(path.read_text(), str(path))
        assert program.mainloop == "ws_pingpong" and program.problem.epilogue == epilogue, path.name
        for m, n, k in ((512, 14336, 4096), (2048, 18944, 3584), (4096, 14336, 4096)):
            bound = program.bind(Problem(m, n, k, b_major="col", epilogue=epilogue))
            assert diagnose(bound) == [], (path.name, diagnose(bound))


def test_the_tma_stream_k_programs_fit_every_probe_layer():
    """benchmarks/programs/tma_stream_k_swap/: each program parses, is a stream-K ws_cooperative
    program and validates at every layer of the split probe (M = 32, 64, 128), swapped or not."""
    import csv

    from benchmark_scripts import BENCHMARKS
    from gemmgen.backends import diagnose
    from gemmgen.dsl import parse
    from gemmgen.dsl.ir import Problem

    files = sorted((BENCHMARKS / "programs/tma_stream_k_swap").glob("*.gemm"))
    assert len(files) == 8 and sum(parse(p.read_text(), str(p)).swap_ab for p in files) == 6
    with open(BENCHMARKS / "shapes/llm_layers_split_probe.csv") as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    assert len(rows) == 18
    for path in files:
        program = parse(path.read_text(), str(path))
        assert (program.mainloop, program.scheduler) == ("ws_cooperative", "stream_k"), path.name
        for r in rows:
            bound = program.bind(Problem(int(r["M"]), int(r["N"]), int(r["K"]), b_major="col"))
            assert diagnose(bound) == [], (path.name, r, diagnose(bound))


@pytest.mark.parametrize("folder, shapes, count", [
    ("direct_ring", "llm_layers_m1_probe.csv", 10),
    ("direct_small_weights", "llm_layers_small_weights.csv", 11),
    ("direct_cluster_wide", "llm_layers_m4_16_probe.csv", 11),
])
def test_the_direct_programs_fit_every_layer_they_were_timed_on(folder, shapes, count):
    """benchmarks/programs/<folder>/: each program is a swapped `x @ W.T` program, valid at every
    layer of the shapes file at M <= 16 (a direct-ring program's `stages` is the one its file
    name says)."""
    import csv

    from benchmark_scripts import BENCHMARKS
    from gemmgen.backends import diagnose
    from gemmgen.dsl import parse
    from gemmgen.dsl.ir import Problem

    files = sorted((BENCHMARKS / "programs" / folder).glob("*.gemm"))
    with open(BENCHMARKS / "shapes" / shapes) as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#")) if int(r["M"]) <= 16]
    assert len(files) == count and rows
    if folder == "direct_ring":
        assert len(rows) == 13 and {r["M"] for r in rows} == {"1"}
    for path in files:
        program = parse(path.read_text(), str(path))
        assert program.swap_ab and program.problem.m is None, path.name
        if folder == "direct_ring":
            assert (program.backend, program.mainloop) == ("triton", "direct"), path.name
            assert path.stem.endswith(f"_s{program.stages or 'auto'}"), path.name
        for r in rows:
            bound = program.bind(Problem(int(r["M"]), int(r["N"]), int(r["K"]), b_major="col"))
            assert diagnose(bound) == [], (path.name, r, diagnose(bound))


def test_unwon_tunes_only_the_shapes_torch_matmul_still_serves(tmp_path, capsys):
    """A second run with --unwon and a wider budget measures more programs at the shapes where the
    first found no winner, and none at the shapes a program already serves."""
    from gemmgen.compile import compile
    from tuning_fakes import TEST_GPU

    script = load_script("tune_h200")
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n1024,1024,1024\n2048,4096,512\n64,64,64\n")
    db = tmp_path / "w.sqlite"
    common = ["--shapes", str(shapes), "--ship", "", "--db", str(db), "--backends", "triton", "--time-budget", "600"]
    assert script.main(common + ["--out", str(tmp_path / "first"), "--budget", "2"],
                       make_runner=lambda **kw: FakeRunner(), builder=FakeBuilder()) == 0
    clear_cache()
    served = {p: compile(p, device=TEST_GPU.name, db=Database(db)).provenance.how
              for p in ((1024, 1024, 1024), (2048, 4096, 512), (64, 64, 64))}
    clear_cache()
    unwon = {p for p, how in served.items() if how == "baseline"}
    assert unwon and len(unwon) < 3           # the fakes: some shapes won, some did not
    second = FakeRunner()
    assert script.main(common + ["--out", str(tmp_path / "second"), "--budget", "4", "--unwon"],
                       make_runner=lambda **kw: second, builder=FakeBuilder()) == 0
    assert f"--unwon: {len(unwon)} shapes served by torch.matmul" in capsys.readouterr().out
    assert second.measured and {(t.problem.m, t.problem.n, t.problem.k) for t in second.measured} == unwon
    summary = json.loads((tmp_path / "second" / "summary.json").read_text())
    assert len(summary["rows"]) == len(unwon)
    clear_cache()
