"""`gemmgen check`, `fmt` and `inspect`: exit codes, `file:line:col:` lines, no tracebacks."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gemmgen.cli import main
from gemmgen.dsl import examples


GOOD = """\
gemm 1024x1024x1024 a=row b=col c=row in=f16 acc=f32
epilogue out=f16
backend triton
tile 128x128x64
warps 2x2
instr auto
cluster 1x1
stages 3
mainloop multistage
scheduler tile
raster m swizzle=8
smem_swizzle auto
split_k 1
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.gemm"
    good.write_text(GOOD)
    bad_stages = tmp_path / "stages.gemm"
    bad_stages.write_text(GOOD.replace("stages 3", "stages 9"))
    bad_syntax = tmp_path / "syntax.gemm"
    bad_syntax.write_text(GOOD.replace("tile 128x128x64", "tile 128x128"))
    messy = tmp_path / "messy.gemm"
    messy.write_text("# mine\nmainloop multistage\nwarps 2x2  # four warps\ntile 128x128x64\n"
                     "backend triton\ngemm 1024x1024x1024 b=col\nstages 3\n")
    return {"good": good, "stages": bad_stages, "syntax": bad_syntax, "messy": messy}


def test_check_ok(capsys, files):
    code, out, _ = run(capsys, "check", str(files["good"]), str(files["messy"]))
    assert code == 0
    assert out.strip() == "2 file(s) OK"


def test_check_reports_first_error_of_each_file(capsys, files):
    code, out, err = run(capsys, "check", str(files["good"]), str(files["stages"]), str(files["syntax"]))
    assert code == 1
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"{files['stages']}:8:1: tile 128x128x64 with stages 9 needs")
    assert lines[1].startswith(f"{files['syntax']}:4:13: in `tile`: expected 'x'")
    assert len(lines) == 2
    assert "2 of 3 file(s) have errors" in err


def test_check_missing_file(capsys, tmp_path):
    code, out, _ = run(capsys, "check", str(tmp_path / "absent.gemm"))
    assert code == 1
    assert "absent.gemm: no such file" in out


def test_check_binds_generic_programs(capsys, tmp_path):
    generic = tmp_path / "g.gemm"
    generic.write_text(GOOD.replace("1024x1024x1024", "*x*x*").replace("split_k 1", "split_k 8 workspace"))
    assert run(capsys, "check", str(generic))[0] == 0
    code, out, _ = run(capsys, "check", str(generic), "--shape", "64x64x256")
    assert code == 1 and "needs K >= 512" in out


def test_fmt_prints_canonical_text_keeping_comments(capsys, files):
    code, out, _ = run(capsys, "fmt", str(files["messy"]))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "# mine"
    assert lines[1] == "gemm 1024x1024x1024 a=row b=col c=row in=f16 acc=f32"
    assert "warps 2x2  # four warps" in lines
    assert len(lines) == 14


def test_fmt_check_and_write(capsys, files):
    code, out, _ = run(capsys, "fmt", "--check", str(files["good"]), str(files["messy"]))
    assert code == 1
    assert f"{files['messy']}: not in canonical form" in out
    assert str(files["good"]) not in out
    assert run(capsys, "fmt", "--write", str(files["messy"]))[0] == 0
    assert run(capsys, "fmt", "--check", str(files["messy"]))[0] == 0


def test_fmt_of_a_broken_file_is_located(capsys, files):
    code, _, err = run(capsys, "fmt", str(files["syntax"]))
    assert code == 1 and f"{files['syntax']}:4:13:" in err


@pytest.mark.parametrize("name", sorted(examples()))
def test_inspect_prints_facts_for_every_example(capsys, name):
    path = str(examples()[name])
    code, out, _ = run(capsys, "inspect", path)
    assert code == 0
    assert "valid for sm_90a" in out and "shared memory per CTA" in out
    if "generic" not in name:
        assert "wave efficiency" in out and "roofline floor" in out


def test_inspect_binds_a_shape(capsys):
    code, out, _ = run(capsys, "inspect", str(examples()["triton_generic"]), "--shape", "4096x4096x4096")
    assert code == 0
    assert "gemm 4096x4096x4096 " in out and "CTAs                          1024" in out


def test_inspect_shows_what_the_backend_realises_otherwise(capsys):
    # Triton's direct kernel keeps its stages in registers and partial sums, not mma accumulators.
    code, out, _ = run(capsys, "inspect", str(examples()["triton_direct_decode"]))
    assert code == 0
    assert "pipeline stages               1 K step of loads in flight, in registers (36 a thread)" in out
    assert "accumulators per math thread  64 fp32 partial sums" in out      # 8 x 1 x 1024 over 128 threads
    code, out, _ = run(capsys, "inspect", str(examples()["cuda_direct_decode"]))
    assert "pipeline stages               4" in out                            # raw CUDA's register ring


def test_inspect_of_an_invalid_program_lists_problems(capsys, files):
    code, out, _ = run(capsys, "inspect", str(files["stages"]))
    assert code == 1
    assert f"{files['stages']}:8:1: tile 128x128x64 with stages 9" in out


@pytest.mark.parametrize("argv,message", [
    (["inspect", "{good}", "--shape", "12x12"], "shape '12x12': give three dimensions M, N and K; write MxNxK"),
    (["inspect", "{good}", "--lower", "tvm"], "--lower tvm: unknown backend"),
    (["inspect", "{absent}"], "no such file"),
])
def test_command_line_mistakes_are_one_line(capsys, files, tmp_path, argv, message):
    argv = [a.format(good=files["good"], absent=tmp_path / "absent.gemm") for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_no_traceback_or_lark_reaches_the_user(tmp_path):
    """The installed command, end to end: broken input gives located one-liners only."""
    cases = ["tile 128x256x64!\n", "gemm 1x1\n", "\x00\x01", "backend triton\nbackend cuda\n", "tiles 1x1x1\n"]
    paths = []
    for i, source in enumerate(cases):
        path = tmp_path / f"bad{i}.gemm"
        path.write_text(source)
        paths.append(str(path))
    for argv in (["check", *paths], ["fmt", *paths], ["inspect", paths[0]]):
        proc = subprocess.run([sys.executable, "-m", "gemmgen", *argv], capture_output=True, text=True,
                              timeout=120)
        both = (proc.stdout + proc.stderr).replace(str(tmp_path), "DIR")
        assert proc.returncode == 1, both
        assert "Traceback" not in both and "lark" not in both.lower() and "__ANON" not in both
    assert f"{paths[0]}:1:16:" in proc.stdout
