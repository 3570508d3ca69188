"""Dynamic M (gemmgen.dispatch) without a GPU: the table's rows and boundaries, what
gemmgen.compile((None, N, K)) serves at each M, the warm path, and `gemmgen db show *xNxK`."""
from dataclasses import replace

import pytest

import gemmgen
from gemmgen.cli import main as cli_main
from gemmgen.compile import CompileError, clear_cache
from gemmgen.dispatch import M_LIMIT, DispatchKernel, Row, table
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.kernel import Kernel, Provenance
from gemmgen.tuning_db import Database
from tuning_fakes import TEST_GPU, library_choice, program_text, trial, triton_program

GPU = TEST_GPU.name
N, K = 4096, 1024


def layer(m) -> Problem:
    return Problem(m, N, K, "row", "col", epilogue=Epilogue(bias="n"))


SMALL_TILE = (64, 128, 64)
OTHER_TILE = (128, 128, 64)


@pytest.fixture
def db(tmp_path):
    """Winners at M = 8 and 16 (the same program), 32 (another one); a library choice at 64;
    tuned without a winner at 128; nothing at other Ms."""
    clear_cache()
    db = Database(tmp_path / "user.sqlite")
    for m, tile in ((8, SMALL_TILE), (16, SMALL_TILE), (32, OTHER_TILE)):
        db.record(trial(layer(m), device_ms=0.010, baseline_ms=0.012,
                        program=program_text(triton_program(layer(m), tile, 4))))
    db.record_library(library_choice(layer(64), created=""))   # now: timed against today's baselines
    db.record(trial(layer(128), device_ms=0.020, baseline_ms=0.012))   # slower: tuned, nothing won
    yield db
    clear_cache()


def _kernel(how: str, program=None) -> Kernel:
    return Kernel(layer(1), program, Provenance(how, GPU))


def test_table_rows_cover_every_m_once():
    p = triton_program(layer(4), SMALL_TILE, 4)
    points = {4: _kernel("exact", p), 8: _kernel("exact", p.bind(layer(8))),
              16: _kernel("exact", triton_program(layer(16), OTHER_TILE, 4)), 32: _kernel("baseline")}
    rows = table(points)
    assert [(r.lo, r.hi, r.how) for r in rows] == [
        (1, 3, "baseline"), (4, 4, "point"), (5, 7, "range"), (8, 8, "point"), (9, 15, "baseline"),
        (16, 16, "point"), (17, 31, "baseline"), (32, 32, "point"), (33, M_LIMIT, "baseline")]
    assert rows[2].ends == (4, 8) and rows[2].program.problem.m is None and rows[2].program.tile == p.tile
    assert table({}) == (Row(1, M_LIMIT, "baseline"),)
    assert [(r.lo, r.hi, r.how) for r in table({1: _kernel("exact", p)})] == [(1, 1, "point"), (2, M_LIMIT, "baseline")]


def test_compile_with_no_m_serves_each_m_from_the_table(db):
    k = gemmgen.compile((None, N, K), b_major="col", epilogue="bias=n", device=GPU, db=db)
    assert isinstance(k, DispatchKernel) and k.problem.key == layer(None).key
    assert [r.how for r in k.rows if r.lo in (8, 9, 16, 17, 32, 64, 128)] == ["point", "range", "point",
                                                                            "baseline", "point", "point", "point"]
    # points: exactly what compile((M, N, K)) serves
    for m, how in ((8, "exact"), (16, "exact"), (32, "exact"), (64, "library"), (128, "baseline")):
        assert k.kernel_for(m).provenance.how == how, m
        assert k.kernel_for(m) is gemmgen.compile((m, N, K), b_major="col", epilogue="bias=n", device=GPU, db=db)
    # between two Ms where one program won: that program, re-bound to the call's M
    mid = k.kernel_for(12)
    assert mid.provenance.how == "range" and mid.ir.problem == layer(12) and mid.ir.tile.m == SMALL_TILE[0]
    assert "won at M = 8 and M = 16" in mid.provenance.summary
    # between different winners, before the first point, after the last: cuBLAS
    for m in (3, 20, 48, 100, 4096):
        kernel = k.kernel_for(m)
        assert kernel.provenance.how == "baseline" and kernel.program is None and kernel.problem == layer(m), m
    text = k.describe()
    assert "M = 9..15: the Triton program that won at M = 8 and M = 16" in text and "M >= 129" in text
    assert gemmgen.compile((None, N, K), b_major="col", epilogue="bias=n", device=GPU, db=db) is k


def test_a_call_reads_m_from_its_operand_and_the_warm_path_is_a_lookup():
    made = []

    class Fake:
        def __init__(self, m):
            self.m = m

        def __call__(self, a, b, **kw):
            return self.m

    def make(m, row):
        made.append(m)
        return Fake(m)

    k = DispatchKernel(layer(None), table({}), make, {})
    operand = type("A", (), {"shape": (7, K)})()
    assert k(operand, None) == 7 and k(operand, None) == 7 and made == [7]
    operand.shape = (300, K)
    assert k(operand, None) == 300 and made == [7, 300]


def test_only_m_may_be_left_to_the_call(db):
    with pytest.raises(CompileError, match="only M"):
        gemmgen.compile((None, None, K), device=GPU, db=db)
    with pytest.raises(CompileError, match="tune="):
        gemmgen.compile((None, N, K), device=GPU, db=db, tune=5)
    k = gemmgen.compile(replace(layer(None), m=None), device=GPU, db=db)      # a Problem works too
    assert isinstance(k, DispatchKernel) and k.kernel_for(8).provenance.how == "exact"


def test_db_show_prints_the_table(db, capsys):
    assert cli_main(["db", "--db", str(db.path), "show", f"*x{N}x{K}", "--b-major", "col",
                     "--epilogue", "bias=n", "--device", GPU]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dynamic-M kernel for *x{N}x{K}:rcr") and "M = 1..7: torch.matmul (cuBLAS)" in out and "M = 9..15: the Triton" in out
    assert cli_main(["db", "--db", str(db.path), "show", "*x4096"]) == 2
    assert "write *xNxK" in capsys.readouterr().err


def test_prebuild_builds_the_programs_of_the_ms_asked_for(db, monkeypatch):
    """Re-bound programs are compiled per M: prebuild builds those of the given Ms in one pool."""
    import gemmgen.kernel as kernel_module

    built = []
    monkeypatch.setattr(kernel_module, "build_many", lambda sources, jobs=None: built.extend(sources) or
                        [object()] * len(sources))
    k = gemmgen.compile((None, N, K), b_major="col", epilogue="bias=n", device=GPU, db=db)
    counts = k.prebuild([8, 12, 20, 32])
    assert counts == {"kernels": 4, "baselines": 1, "built": 3, "failed": []}   # 20: torch.matmul
    assert len(built) == 3 and all(s.backend == "triton" for s in built)
