"""The `gemmgen db`, `gemmgen compile` and `gemmgen tune` commands, run in process on CPU."""
from dataclasses import replace

import pytest

from gemmgen.cli import main
from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db import Database
from tuning_fakes import program_text, trial, triton_program

P = Problem(1024, 2048, 512)


def test_db_commands(tmp_path, capsys):
    path = tmp_path / "t.sqlite"
    with Database(path) as db:
        db.record(trial(P, device_ms=0.9, baseline_ms=1.0))
        db.record(trial(P, device_ms=2.0, baseline_ms=1.0, program="slow\n"))
    assert main(["db", "stats", "--db", str(path)]) == 0
    out = capsys.readouterr().out
    assert "trials: 2" in out and "Test GPU: 1 problems" in out
    assert main(["db", "--db", str(path), "show", "1024x2048x512", "--programs"]) == 0
    out = capsys.readouterr().out
    assert "2 trials" in out and "winner on Test GPU: trial #1" in out and "slow" in out
    assert main(["db", "export", str(tmp_path / "e.jsonl"), "--db", str(path)]) == 0
    assert main(["db", "merge", str(tmp_path / "e.jsonl"), "--db", str(tmp_path / "new.sqlite")]) == 0
    assert "2 new records" in capsys.readouterr().out
    assert main(["db", "stats", "--db", str(tmp_path / "absent.sqlite")]) == 2
    assert "no tuning database here yet" in capsys.readouterr().err


def test_compile_command_prints_program_provenance_source(tmp_path, capsys):
    path = tmp_path / "t.sqlite"
    with Database(path) as db:
        db.record(trial(P, device_ms=0.9, baseline_ms=1.0))
    assert main(["compile", "1024x2048x512", "--db", str(path), "--device", "Test GPU", "--no-run"]) == 0
    out = capsys.readouterr().out
    assert "backend: triton" in out and "provenance:" in out and "tile 128x128x64" in out
    assert "source (triton):" in out
    assert main(["compile", "1024x2048", "--no-run"]) == 2
    assert "MxNxK" in capsys.readouterr().err


def test_compile_command_deterministic_passes_over_unordered_split_k(tmp_path, capsys):
    skinny = Problem(256, 128, 8192)
    unordered = replace(triton_program(skinny, (64, 64, 64), 4), split_k=16, split_k_reduce="unordered")
    path = tmp_path / "t.sqlite"
    with Database(path) as db:
        db.record(trial(skinny, device_ms=0.0075, baseline_ms=0.0084, program=program_text(unordered)))
    args = ["compile", "256x128x8192", "--db", str(path), "--device", "Test GPU", "--no-run", "--no-source"]
    assert main(args) == 0 and "split_k 16 unordered" in capsys.readouterr().out
    assert main(args + ["--deterministic"]) == 0 and "backend: torch" in capsys.readouterr().out


def test_tune_command_without_gpu_is_one_clear_line(tmp_path, capsys):
    import torch

    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n128,128,128\n")
    code = main(["tune", "--shapes", str(shapes), "--db", str(tmp_path / "t.sqlite")])
    if torch.cuda.is_available():
        return
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("gemmgen: error:") and "GPU" in err and len(err.strip().splitlines()) == 1


def test_db_and_compile_commands_show_library_choices(tmp_path, capsys):
    from tuning_fakes import library_choice

    q = Problem(8192, 16384, 512)
    path = tmp_path / "t.sqlite"
    with Database(path) as db:
        db.record_library(library_choice(q, device_ms=0.8, torch_ms=1.0))
    assert main(["db", "stats", "--db", str(path)]) == 0
    assert "library choices: 1; problems they serve: Test GPU 1" in capsys.readouterr().out
    assert main(["db", "--db", str(path), "show", "8192x16384x512"]) == 0
    out = capsys.readouterr().out
    assert "0 trials, 1 library choices" in out and "1.250x * serves it" in out and "algorithm_id=66" in out
    assert main(["compile", "8192x16384x512", "--db", str(path), "--device", "Test GPU", "--no-run"]) == 0
    out = capsys.readouterr().out
    assert "backend: cublaslt" in out and "provenance:" in out and "source (cublaslt):" in out


def test_tune_command_searches_the_library_by_default_but_not_for_your_programs(tmp_path, monkeypatch):
    """`--backends auto` (the default) passes `library_first` to the loop; with `--programs` the
    loop measures those programs and searches no library unless `cublaslt` is named."""
    from gemmgen.cli import tune as tune_cli
    from gemmgen.tune import library_first
    from tuning_fakes import FakeBuilder, FakeRunner

    seen = []
    monkeypatch.setattr(tune_cli, "has_gpu", lambda: True)
    monkeypatch.setattr(tune_cli, "WorkerRunner", lambda **kw: FakeRunner())
    monkeypatch.setattr(tune_cli, "PoolBuilder", lambda **kw: FakeBuilder())
    monkeypatch.setattr(tune_cli, "tune_backends", lambda problems, **kw: seen.append(kw["library"]) or {})
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n64,4096,4096\n")
    program = tmp_path / "p.gemm"
    program.write_text(program_text(triton_program(Problem(64, 4096, 4096), (64, 64, 64), 4)) + "\n")
    base = ["tune", "--shapes", str(shapes), "--db", str(tmp_path / "t.sqlite"), "--no-progress"]
    assert main(base) == 0
    assert main(base + ["--programs", str(program)]) == 0
    assert main(base + ["--programs", str(program), "--backends", "triton,cublaslt"]) == 0
    assert seen == [library_first, False, True]


def test_a_file_of_problem_keys_is_tuned_as_written_with_their_epilogues(tmp_path):
    """What the model benchmark found missing travels as problem keys: each keeps its majors and
    epilogue, repeats are read once, and a bad line or an --epilogue on top is refused, located."""
    from gemmgen.cli.tune import tune_problems
    from gemmgen.measure.errors import ShapesError

    keys = tmp_path / "missing.keys"
    keys.write_text("# from a model\n8x3584x3584:rcr:f16:f32:bias_n+f16\n\n"
                    "8x3584x18944:rcr:f16:f32:residual+f16\n8x3584x3584:rcr:f16:f32:bias_n+f16\n")
    problems = tune_problems(str(keys))
    assert [p.key for p in problems] == ["8x3584x3584:rcr:f16:f32:bias_n+f16",
                                         "8x3584x18944:rcr:f16:f32:residual+f16"]
    assert problems[0].b_major == "col" and problems[0].epilogue.bias == "n"
    assert problems[1].epilogue.residual and problems[1].k == 18944
    assert [p.key for p in tune_problems(str(keys), "1/2")] == [problems[1].key]
    with pytest.raises(ShapesError, match="leave out --epilogue"):
        tune_problems(str(keys), epilogue="gelu")
    keys.write_text("8x3584x3584:rcr:f16:f32:f16\n8x3584:rcr:f16:f32:f16\n")
    with pytest.raises(ShapesError, match=r"missing.keys:2: .*one key a line"):
        tune_problems(str(keys))
    keys.write_text("8x3584x3584:rcr:f16:f32:f16\n8,3584,3584\n")
    with pytest.raises(ShapesError, match=r"missing.keys:2"):
        tune_problems(str(keys))


def test_the_tune_command_reads_a_file_of_problem_keys(tmp_path, capsys):
    """`gemmgen tune --shapes FILE.keys` refuses an unknown key before it looks for a GPU."""
    keys = tmp_path / "bad.keys"
    keys.write_text("8x3584x3584:rcr:f16:f32:gated+f16\n")
    assert main(["tune", "--shapes", str(keys), "--db", str(tmp_path / "t.sqlite")]) != 0
    err = capsys.readouterr().err
    assert "bad.keys:1" in err and "Traceback" not in err
