"""`FileProposer` and `gemmgen tune --programs`: programs from files, re-bound to the shapes they fit."""
import pytest

from gemmgen.cli import main
from gemmgen.dsl import parse
from gemmgen.backends import validate
from gemmgen.dsl.ir import Problem
from gemmgen.policy.proposers import FileProposer, Proposer, ProposerError, get_proposer

PINGPONG = """gemm 2048x11264x2048 a=row b=col c=row in=f16 acc=f32
epilogue out=f16
backend cutlass
tile 128x128x64
warps 4x1
cluster 1x2
mainloop ws_pingpong
scheduler persistent
raster m swizzle=4
"""
TRITON = """gemm 64x64x64 a=row b=col c=row in=f16 acc=f32
backend triton
tile 64x64x32
warps 2x2
stages 3
mainloop multistage
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "b_pingpong.gemm").write_text(PINGPONG)
    (tmp_path / "a_triton.gemm").write_text(TRITON)
    (tmp_path / "notes.txt").write_text("not a program")
    return tmp_path


def test_rebinds_each_program_to_the_problem_in_file_order(folder):
    proposer = get_proposer("programs", path=str(folder))
    assert isinstance(proposer, FileProposer) and isinstance(proposer, Proposer)
    problem = Problem(2048, 32000, 2048, b_major="col")
    programs = proposer.propose(problem, 8)
    assert [p.backend for p in programs] == ["triton", "cutlass"]      # a_triton.gemm sorts first
    for p in programs:
        assert p.problem == problem
        validate(p)
    assert programs[1].raster == "m" and programs[1].swizzle == 4 and programs[1].cluster == (1, 2)
    assert proposer.propose(problem, 1) == programs[:1]


def test_leaves_out_programs_of_other_majors_backends_or_invalid_shapes(folder):
    proposer = FileProposer(str(folder))
    assert proposer.propose(Problem(2048, 2048, 2048, b_major="row"), 8) == []
    only_cutlass = FileProposer(str(folder), backends=("cutlass",))
    assert [p.backend for p in only_cutlass.propose(Problem(512, 512, 512, b_major="col"), 8)] == ["cutlass"]
    # N = 100 breaks the 16-byte TMA alignment of the CUTLASS program; the Triton one still fits
    assert [p.backend for p in proposer.propose(Problem(512, 100, 512, b_major="col"), 8)] == ["triton"]


def test_one_file_is_a_source_too(folder):
    proposer = FileProposer(str(folder / "b_pingpong.gemm"))
    assert proposer.programs == [parse(PINGPONG)]


def test_errors_name_the_path(tmp_path):
    with pytest.raises(ProposerError, match="no .gemm file"):
        FileProposer(str(tmp_path))
    (tmp_path / "bad.gemm").write_text("gemm 64x64x64\nbackend nope\n")
    with pytest.raises(ProposerError, match="bad.gemm"):
        FileProposer(str(tmp_path))


def test_tune_command_asks_for_the_programs(tmp_path, capsys):
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n128,128,128\n")
    assert main(["tune", "--shapes", str(shapes), "--proposer", "programs", "--db", str(tmp_path / "t.sqlite")]) == 2
    err = capsys.readouterr().err
    assert "--programs" in err and len(err.strip().splitlines()) == 1
    assert main(["tune", "--shapes", str(shapes), "--programs", str(tmp_path / "none"),
                 "--db", str(tmp_path / "t.sqlite")]) == 2
    assert "no .gemm file" in capsys.readouterr().err


def test_propose_command_rebinds_files_to_the_shape(folder, capsys):
    assert main(["propose", "--shape", "2048x5632x2048", "--b-major", "col", "--programs", str(folder),
                 "--backends", "cutlass"]) == 0
    out = capsys.readouterr().out
    assert out.count("# program") == 1 and "gemm 2048x5632x2048 a=row b=col" in out and "raster m swizzle=4" in out
    assert main(["propose", "--shape", "64x64x64", "--programs", str(folder)]) == 2      # b=row: none fits
    assert "majors" in capsys.readouterr().err
    assert main(["propose", "--shape", "64x64x64", "--proposer", "programs"]) == 2
    assert "--programs" in capsys.readouterr().err
