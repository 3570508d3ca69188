"""A user's bad files and arguments: each is one line that names what is wrong and what to give,
never a traceback, and nothing the user had is lost (CPU, in process)."""
import gzip
import json

import pytest

from benchmark_scripts import load_script
from gemmgen.cli import main
from gemmgen.compile import CompileError, parse_epilogue
from gemmgen.dsl.ir import Problem
from gemmgen.errors import GemmgenError
from gemmgen.files import read_text
from gemmgen.measure.errors import MeasureError
from gemmgen.measure.results import load
from gemmgen.tuning_db import Database
from gemmgen.tuning_db.exchange import export, read_jsonl
from gemmgen.tuning_db.records import RecordError, trial_to_json
from tuning_fakes import trial

P = Problem(1024, 2048, 512)
GARBAGE = bytes(range(128, 256)) * 4


def _one_line_error(capsys, code):
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err
    assert captured.err.startswith("gemmgen: error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err


def _database(path):
    with Database(path) as db:
        db.record(trial(P, device_ms=0.9, baseline_ms=1.0))
    return path


def test_read_text_names_the_file_and_what_it_should_hold(tmp_path):
    (tmp_path / "bom.gemm").write_bytes(b"\xef\xbb\xbfgemm 1x1x1\n")
    assert read_text(tmp_path / "bom.gemm", "a program") == "gemm 1x1x1\n"      # a byte-order mark is dropped
    (tmp_path / "bin").write_bytes(GARBAGE)
    with pytest.raises(GemmgenError, match=r"bin is not UTF-8 text \(byte 0 is 0x80\): it should be a program"):
        read_text(tmp_path / "bin", "a program")
    with pytest.raises(GemmgenError, match="is a folder; give a program"):
        read_text(tmp_path, "a program")
    with pytest.raises(GemmgenError, match="no such file"):
        read_text(tmp_path / "absent", "a program")


@pytest.mark.parametrize("argv", [
    ["check", "{bin}"], ["build", "--backend", "triton", "--programs", "{bin}"],
    ["tune", "--shapes", "{bin}", "--db", "{tmp}/t.sqlite"], ["db", "merge", "{bin}", "--db", "{tmp}/m.sqlite"],
])
def test_binary_files_are_refused_in_one_line(tmp_path, capsys, argv):
    (tmp_path / "bin").write_bytes(GARBAGE)
    code = main([a.format(bin=tmp_path / "bin", tmp=tmp_path) for a in argv])
    if argv[0] == "check":   # check reports each file and goes on
        out = capsys.readouterr().out
        assert code == 1 and "is not UTF-8 text" in out
        return
    assert "not UTF-8 text" in _one_line_error(capsys, code)
    assert not (tmp_path / "m.sqlite").exists()     # a refused merge makes no database


def test_a_merge_writes_nothing_when_a_line_is_bad(tmp_path, capsys):
    lines = [trial_to_json(trial(Problem(64 * (i + 1), 64, 64))) for i in range(4)]
    lines[2] = '{"not": "a record"}'
    (tmp_path / "e.jsonl").write_text("\n".join(lines) + "\n")
    db = _database(tmp_path / "d.sqlite")
    assert "e.jsonl:3" in _one_line_error(capsys, main(["db", "merge", str(tmp_path / "e.jsonl"), "--db", str(db)]))
    with Database(db, readonly=True) as opened:
        assert len(opened.trials()) == 1           # the two good lines before the bad one were not merged


def test_a_truncated_gzip_export_is_named(tmp_path):
    data = gzip.compress(("\n".join(trial_to_json(trial(Problem(64 * (i + 1), 64, 64))) for i in range(50))
                          + "\n").encode())
    (tmp_path / "e.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordError, match="damaged or truncated gzip"):
        list(read_jsonl(tmp_path / "e.jsonl.gz"))


def test_an_export_never_overwrites_its_database_or_writes_into_a_folder(tmp_path, capsys):
    db = _database(tmp_path / "d.sqlite")
    assert "is the database being exported" in _one_line_error(capsys, main(["db", "--db", str(db), "export", str(db)]))
    with Database(db, readonly=True) as opened:
        assert len(opened.trials()) == 1
    assert "is a folder" in _one_line_error(capsys, main(["db", "--db", str(db), "export", str(tmp_path)]))
    assert not list(tmp_path.glob("*.tmp"))
    with Database(db, readonly=True) as opened, pytest.raises(RecordError, match="is a folder"):
        export(opened, tmp_path)
    assert main(["db", "--db", str(db), "export", "-"]) == 0           # - is standard output
    assert json.loads(capsys.readouterr().out.splitlines()[0])["problem"] == P.key


@pytest.mark.parametrize("text, field", [("relu gelu", "an activation"), ("bias=n bias=m", "`bias=`"),
                                         ("out=f32 out=f16", "`out=`")])
def test_an_epilogue_item_given_twice_is_refused(text, field):
    with pytest.raises(CompileError, match=f"gives {field} twice .*; keep one"):
        parse_epilogue(text)


@pytest.mark.parametrize("text, said", [("bias=k", "expected 'm' or 'n', found 'k'"),
                                        ("gate=tanh", "expected one of 'relu', 'gelu', 'silu', found 'tanh'"),
                                        ("alpha=x", "expected a number, found 'x'")])
def test_an_unknown_epilogue_item_says_what_it_expected(text, said):
    with pytest.raises(CompileError, match=f"epilogue '{text}': in `epilogue`: {said}; write `epilogue "):
        parse_epilogue(text)


def test_compile_names_a_missing_database_and_an_unknown_gpu(tmp_path, capsys):
    code = main(["compile", "1024x2048x512", "--db", str(tmp_path / "typo.sqlite"), "--no-run"])
    assert "no tuning database there" in _one_line_error(capsys, code)
    db = _database(tmp_path / "d.sqlite")
    assert main(["compile", "1024x2048x512", "--db", str(db), "--device", "H200", "--no-run", "--no-source"]) == 0
    assert "no records at all name a GPU 'H200'; they name" in capsys.readouterr().out


def test_check_and_fmt_take_a_folder(tmp_path, capsys):
    from gemmgen.dsl import examples

    for name, path in list(examples().items())[:3]:
        (tmp_path / f"{name}.gemm").write_text(path.read_text())
    assert main(["check", str(tmp_path)]) == 0 and "3 file(s) OK" in capsys.readouterr().out
    assert main(["fmt", "--check", str(tmp_path)]) == 0


@pytest.mark.parametrize("extra, words", [(["--top", "0"], "--top 0"), (["-j", "0"], "-j 0")])
def test_build_refuses_counts_below_one(tmp_path, capsys, extra, words):
    (tmp_path / "s.csv").write_text("M,N,K\n64,64,64\n")
    code = main(["build", "--backend", "triton", "--space", "triton", "--shapes", str(tmp_path / "s.csv")] + extra)
    assert words in _one_line_error(capsys, code)


def test_a_results_file_that_is_not_one_is_named(tmp_path):
    (tmp_path / "results.json").write_bytes(GARBAGE)
    with pytest.raises(MeasureError, match="not UTF-8 text"):
        load(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"rows": [{"name": "torch"}, 3]}))
    with pytest.raises(MeasureError, match="row 1 is not a result row"):
        load(tmp_path)
    (tmp_path / "results.json").unlink()
    (tmp_path / "results.json.gz").write_bytes(gzip.compress(b'{"rows": []}' * 100)[:40])
    with pytest.raises(MeasureError, match="damaged or truncated gzip"):
        load(tmp_path)


def test_layers_plot_with_an_unknown_candidate_keeps_the_folder_s_table(tmp_path, capsys):
    rows = [{"name": name, "m": 1, "n": 64, "k": 64, "status": "ok", "check_passed": True, "device_ms": 0.01,
             "fraction_of_floor": 0.5} for name in ("torch", "gemmgen")]
    (tmp_path / "results.json").write_text(json.dumps({"meta": {}, "rows": rows}))
    (tmp_path / "by_m.txt").write_text("the earlier table\n")
    assert load_script("layers_plot").main([str(tmp_path), "--candidate", "gemmgenn"]) == 2
    assert "--candidate is one of gemmgen" in capsys.readouterr().err
    assert (tmp_path / "by_m.txt").read_text() == "the earlier table\n"


def test_layers_plot_names_the_gpu_the_bench_ran_on():
    gpu_name = load_script("layers_plot").gpu_name
    assert gpu_name({"meta": {"environment": {"gpu": {"name": "NVIDIA H100 80GB HBM3"}}}}) == "H100"
    assert gpu_name({"meta": {"environment": {"torch": {"device_name": "NVIDIA H200"}}}}) == "H200"
    assert gpu_name({"meta": {"environment": {"gpu": {"name": "NVIDIA A100-SXM4-80GB"}}}}) == "A100"
    assert gpu_name({"meta": {}}) == "GPU"      # an old results file that names none


def test_a_damaged_policy_checkpoint_is_one_line(tmp_path):
    pytest.importorskip("transformers")
    import shutil

    from gemmgen.policy.model import CHECKPOINT_DIR, PolicyModelError, load_policy

    shutil.copytree(CHECKPOINT_DIR, tmp_path / "ck")
    weights = tmp_path / "ck" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(PolicyModelError, match="cannot load the policy checkpoint from .*a damaged or incomplete"):
        load_policy(tmp_path / "ck")


def test_db_list_names_an_unknown_backend_and_gpu(tmp_path, capsys):
    db = _database(tmp_path / "d.sqlite")
    assert "choose one of triton" in _one_line_error(capsys, main(["db", "list", "--db", str(db), "--backend", "tritn"]))
    assert main(["db", "list", "--db", str(db), "--device", "H200"]) == 0
    assert "no records name a GPU 'H200'; they name 'Test GPU'" in capsys.readouterr().out


def test_parse_says_it_takes_text():
    from gemmgen.dsl import parse

    with pytest.raises(TypeError, match="takes a program's text"):
        parse(b"gemm 1x1x1")


def test_lowering_refuses_what_the_language_refuses():
    from dataclasses import replace

    from gemmgen.backends import lower
    from gemmgen.dsl import ProgramError
    from gemmgen.dsl.ir import Tile
    from tuning_fakes import triton_program

    program = triton_program(Problem(256, 256, 256), (64, 64, 64), 3)
    assert lower(program).text
    with pytest.raises(ProgramError, match="zero size"):
        lower(replace(program, tile=Tile(0, 64, 64)))
    with pytest.raises(ProgramError, match="f16 inputs"):
        lower(replace(program, problem=replace(program.problem, in_dtype="bf16")))


def test_compile_and_the_torch_backend_name_a_bad_database(tmp_path):
    import gemmgen
    from gemmgen.torch_compile.backend import TorchBackendError, pass_options

    with pytest.raises(CompileError, match="db must be a path"):
        gemmgen.compile((64, 64, 64), db=123)
    (tmp_path / "bad.sqlite").write_bytes(GARBAGE)
    with pytest.raises(TorchBackendError, match="is not a gemmgen tuning database"):
        pass_options(db=tmp_path / "bad.sqlite")
    assert pass_options(db=tmp_path / "new.sqlite").db == str(tmp_path / "new.sqlite")   # made when tuning


@pytest.mark.parametrize("script, argv, words", [
    ("backend_report", ["{tmp}/absent.jsonl", "--out", "{tmp}/r"], "no such file"),
    ("backend_report", ["{tmp}/bin", "--out", "{tmp}/r"], "not UTF-8 text"),
    ("floor_fractions", ["{tmp}/bin"], "is not a readable trials export"),
    ("read_room", ["{tmp}", "--ceiling", "{tmp}/c.json", "--out", "{tmp}"], "is a folder"),
])
def test_the_report_scripts_name_a_bad_input(tmp_path, capsys, script, argv, words):
    (tmp_path / "bin").write_bytes(GARBAGE)
    with pytest.raises(SystemExit) as exit_:
        load_script(script).main([a.format(tmp=tmp_path) for a in argv])
    message = str(exit_.value.code) if isinstance(exit_.value.code, str) else capsys.readouterr().err
    assert words in message and "Traceback" not in message


def test_profile_programs_names_a_bad_shape_and_a_missing_gpu(capsys, monkeypatch):
    """benchmarks/profile_programs.py: a bad --shape is one argparse line; with no GPU it says so
    before any kernel is built."""
    import torch

    from benchmark_scripts import BENCHMARKS

    script = load_script("profile_programs")
    program = str(BENCHMARKS / "programs/tma_stream_k_swap/swap_128x64_s8.gemm")
    with pytest.raises(SystemExit) as exc:
        script.main(["--shape", "64x40x", program])
    assert exc.value.code == 2 and "K =  is not allowed" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script.main(["--shape", "64x4096x4096", program]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
