"""What a new user meets first: shapes, alpha and beta, call arguments, `propose`, the test
cache, provenance in words, `tune` without a GPU, and where the tuned shapes are listed."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gemmgen
from gemmgen.backends.base import INT32_LIMIT
from gemmgen.cache import cache_root
from gemmgen.cli import build_parser, main
from gemmgen.compile import INDEX_LIMIT, CompileError, ShapeError, check_shape, clear_cache
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.tuning_db import Database, default_db_path
from tuning_fakes import TEST_GPU, library_choice, program_text, trial, triton_program

GPU = TEST_GPU.name
ALLOWED = "M, N and K must each be a whole number from 1 to 2,147,483,647 (the kernels index with 32-bit integers)"
HOME_CACHE = Path.home() / ".cache" / "gemmgen"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(autouse=True)
def fresh():
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a command loads the policy's model."""
    from gemmgen.policy import model

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(model, "load_policy", refuse)
    monkeypatch.setattr(model, "load_base_model", refuse)


# -- 1. one check of a shape, with one form of message -----------------------------------


@pytest.mark.parametrize("shape,shown", [
    ((4096.5, 1, 1), "M = 4096.5"), ((1, True, 1), "N = True"), ((64, 64, "64"), "K = '64'"),
    ((10**20, 1, 1), f"M = {10**20}"), ((2**31 + 64, 64, 64), f"M = {2**31 + 64}"),
    ((-5, 10, 10), "M = -5"), ((0, 10, 10), "M = 0"), ((4096.0, 4096, 4096), "M = 4096.0"),
])
def test_compile_takes_whole_dimensions_within_the_kernels_limits(shape, shown):
    with pytest.raises(ShapeError) as info:
        gemmgen.compile(shape, device=GPU)
    assert f"{shown} is not allowed; {ALLOWED}" in str(info.value)
    with pytest.raises(ShapeError, match=re.escape(shown)):          # a Problem is checked alike
        gemmgen.compile(Problem(*shape), device=GPU)


def test_every_operand_stays_within_32_bit_indexing():
    assert INDEX_LIMIT == INT32_LIMIT == 2**31           # the backends' limit, not a second copy
    assert check_shape((2**31 - 1, 1, 1)) == (2**31 - 1, 1, 1)
    assert check_shape((2**16, 1, 2**15 - 1)) == (65536, 1, 32767)
    with pytest.raises(ShapeError, match=r"A \(M x K\) would have 2,147,483,648 elements"):
        check_shape((2**16, 1, 2**15))
    with pytest.raises(ShapeError, match=r"C \(M x N\) would have 4,294,967,296 elements"):
        gemmgen.compile((65536, 65536, 1), device=GPU)


def test_the_warm_path_does_not_let_lookalike_numbers_through():
    """True == 1 and 4096.0 == 4096 hash alike: a cached kernel must not answer for them."""
    assert gemmgen.compile((1, 4, 4), device=GPU).problem.m == 1
    with pytest.raises(ShapeError, match="M = True"):
        gemmgen.compile((True, 4, 4), device=GPU)
    gemmgen.compile((64, 64, 64), device=GPU)
    with pytest.raises(ShapeError, match="K = 64.0"):
        gemmgen.compile((64, 64, 64.0), device=GPU)


def test_numpy_integers_are_whole_numbers():
    np = pytest.importorskip("numpy")
    kernel = gemmgen.compile((np.int64(64), np.int32(32), 16), device=GPU)
    assert (kernel.problem.m, kernel.problem.n) == (64, 32) and type(kernel.problem.m) is int


@pytest.mark.parametrize("text,shown", [
    ("-5x10x10", "M = -5"), ("0x10x10", "M = 0"), ("4096.5x1x1", "M = 4096.5"), ("1e20x1x1", "M = 1e20"),
    ("64x2147483648x64", "N = 2147483648"),
])
@pytest.mark.parametrize("command", ["compile", "propose", "check", "inspect", "db"])
def test_every_command_says_the_same_about_a_bad_shape(capsys, tmp_path, no_model, command, text, shown):
    program = tmp_path / "p.gemm"
    program.write_text(program_text(triton_program(Problem(1024, 1024, 1024))))
    argv = {"compile": ["compile", text, "--no-run"], "propose": ["propose", "--shape", text],
            "check": ["check", str(program), "--shape", text],
            "inspect": ["inspect", str(program), "--shape", text], "db": ["db", "show", text]}[command]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err == f"gemmgen: error: shape '{text}': {shown} is not allowed; {ALLOWED}\n"


# -- 2. finite alpha and beta; call arguments ---------------------------------------------


def test_compile_refuses_non_finite_alpha_and_beta(capsys):
    with pytest.raises(CompileError, match="'alpha=nan': in `epilogue`: expected a number, found 'nan'"):
        gemmgen.compile((64, 64, 64), epilogue="alpha=nan", device=GPU)
    with pytest.raises(CompileError, match="beta=inf: beta must be a finite number"):
        gemmgen.compile((64, 64, 64), epilogue=Epilogue(beta=math.inf), device=GPU)
    with pytest.raises(CompileError, match="alpha=-inf"):
        gemmgen.compile(Problem(64, 64, 64, epilogue=Epilogue(alpha=-math.inf)), device=GPU)
    code, _, err = run(capsys, "compile", "64x64x64", "--epilogue", "alpha=inf", "--no-run")
    assert code == 2 and "expected a number, found 'inf'" in err


def test_a_call_refuses_non_finite_alpha_and_beta():
    from gemmgen.kernel import KernelCallError, _scalar

    assert _scalar("alpha", 0.5, 1.0, True) == 0.5
    for name, value in (("alpha", math.nan), ("beta", math.inf), ("alpha", -math.inf)):
        with pytest.raises(KernelCallError, match=f"{name} must be a finite number"):
            _scalar(name, value, 1.0, True)
    with pytest.raises(KernelCallError, match="not a number"):
        _scalar("beta", "half", 0.0, True)


def test_out_may_not_overlap_an_input():
    torch = pytest.importorskip("torch")
    from gemmgen.kernel import KernelCallError, check_no_alias

    buf = torch.empty(3 * 64 * 64, dtype=torch.float16)
    a, b = buf[:4096].view(64, 64), buf[8192:].view(64, 64)
    check_no_alias(buf[4096:8192].view(64, 64), {"a": a, "b": b, "c": None})    # side by side: fine
    with pytest.raises(KernelCallError, match="out overlaps a in memory"):
        check_no_alias(buf[2048:6144].view(64, 64), {"a": a, "b": b})
    c = torch.empty(64, 64, dtype=torch.float16)
    with pytest.raises(KernelCallError, match="out overlaps c"):
        check_no_alias(c, {"a": a, "b": b, "c": c})                              # BLAS's in-place C
    with pytest.raises(KernelCallError, match="out overlaps bias"):
        check_no_alias(c, {"bias": c[3]})


def test_misaligned_operands_are_named():
    """A tuned kernel moves 16-byte vectors; an offset view is named, and the call then runs
    torch.matmul instead (with a warning) rather than failing (the GPU test below)."""
    torch = pytest.importorskip("torch")
    from gemmgen.kernel import misaligned

    aligned = torch.empty(64, 64, dtype=torch.float16)
    assert misaligned({"a": aligned, "out": aligned, "bias": None}) == []
    shifted = torch.empty(64 * 64 + 1, dtype=torch.float16)[1:].view(64, 64)     # 2 bytes off
    assert misaligned({"a": aligned, "out": shifted}) == ["out"]


@pytest.mark.gpu
def test_a_kernel_call_checks_its_arguments_on_the_gpu(tmp_path):
    import torch

    p = Problem(256, 256, 256)
    db = Database(tmp_path / "t.sqlite")
    db.record(trial(p, device_ms=0.5, baseline_ms=1.0, program=program_text(triton_program(p, (64, 64, 64), 3))))
    kernel = gemmgen.compile((256, 256, 256), device=GPU, db=db)
    assert kernel.ir is not None
    from gemmgen.kernel import KernelCallError

    a = torch.randn(256, 256, dtype=torch.float16, device="cuda")
    b = torch.randn(256, 256, dtype=torch.float16, device="cuda")
    with pytest.raises(KernelCallError, match="out overlaps a"):
        kernel(a, b, out=a)
    shifted = torch.empty(256 * 256 + 1, dtype=torch.float16, device="cuda")[1:].view(256, 256)
    with pytest.warns(RuntimeWarning, match="16-byte boundary.*runs torch.matmul"):
        kernel(a, b, out=shifted)
    assert torch.allclose(shifted.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-1)
    with pytest.raises(KernelCallError, match="CUDA"):
        kernel(a, b, out=torch.empty(256, 256, dtype=torch.float16))
    with pytest.raises(KernelCallError, match="alpha"):
        kernel(a, b, alpha=float("nan"))


# -- 3. propose: the shape first, and why fewer programs came back -------------------------


def test_propose_checks_its_arguments_before_loading_the_model(capsys, no_model):
    code, _, err = run(capsys, "propose", "--shape", "0x10x10")
    assert code == 2 and "M = 0 is not allowed" in err
    code, _, err = run(capsys, "propose", "--shape", "64x64x64", "--epilogue", "beta=nan")
    assert code == 2 and "expected a number, found 'nan'" in err


def test_propose_says_why_fewer_programs_came_back(capsys, tmp_path):
    folder = tmp_path / "programs"
    folder.mkdir()
    for tile in ((64, 64, 64), (128, 128, 64)):
        (folder / f"t{tile[0]}.gemm").write_text(program_text(triton_program(Problem(512, 512, 512), tile, 3)))
    code, out, err = run(capsys, "propose", "--shape", "1024x1024x1024", "--programs", str(folder), "-k", "3")
    assert code == 0 and out.count("# program ") == 2
    assert "gemmgen: note: 2 of the 3 programs asked for: only 2 of the given programs fit" in err


def test_the_policys_shortfall_names_what_was_dropped():
    from types import SimpleNamespace

    from gemmgen.cli.policy import _shortfall

    policy = SimpleNamespace(name="policy", last_stats={"sampled": 76, "duplicate": 69, "invalid": 3,
                                                        "incomplete": 0, "unparsed": 0, "other_backend": 0})
    text = _shortfall(policy, Problem(64, 64, 64), 8, 4)
    assert text.startswith("4 of the 8 programs asked for: the policy sampled 76 answers and only 4 were "
                           "distinct valid programs (69 repeated an earlier program, 3 refused by the validator)")
    ranking = SimpleNamespace(name="policy", mode="rank", last_stats={"space": 5, "scored": 5})
    assert _shortfall(ranking, Problem(64, 64, 64), 8, 5) == ("5 of the 8 programs asked for: the backends' spaces "
                                                              "hold 5 valid programs for 64x64x64:rrr:f16:f32:f16")


# -- 4. the tests keep out of the user's cache ---------------------------------------------


def test_tests_use_a_temporary_cache_and_database():
    for path in (cache_root(), default_db_path()):
        assert not path.resolve().is_relative_to(HOME_CACHE.resolve()), path
    child = subprocess.run([sys.executable, "-c", "from gemmgen.cache import cache_root; print(cache_root())"],
                           capture_output=True, text=True, check=True, timeout=120)
    assert Path(child.stdout.strip()) == cache_root()                   # and so do the processes they start


# -- 5. provenance in words ----------------------------------------------------------------


INTERNAL = re.compile(r"\b(exact|nearest|baseline|trial|this GPU)\b")


def test_provenance_says_in_words_where_each_kernel_came_from(tmp_path):
    small, tuned, served, lost = Problem(256, 128, 2048), Problem(1024, 2048, 512), Problem(8192, 16384, 512), \
        Problem(512, 512, 512)
    db = Database(tmp_path / "t.sqlite")
    db.record(trial(tuned, device_ms=0.9, baseline_ms=1.0))
    db.record(trial(small, device_ms=0.010, baseline_ms=0.012,
                    program=program_text(triton_program(small, (64, 128, 64), 3))))
    db.record_library(library_choice(served, device_ms=0.8, torch_ms=1.0))
    db.record(trial(lost, device_ms=1.5, baseline_ms=1.0))
    said = {}
    for name, shape in (("exact", (1024, 2048, 512)), ("near", (300, 128, 1600)), ("library", (8192, 16384, 512)),
                        ("lost", (512, 512, 512)), ("untuned", (77, 77, 77))):
        kernel = gemmgen.compile(shape, device=GPU, db=db)
        said[name] = str(kernel.provenance)
        first = kernel.describe().split("provenance: ", 1)[1].splitlines()[0]
        assert first == kernel.provenance.summary and not INTERNAL.search(kernel.describe().split("provenance:")[1])
    assert said["exact"] == "measured fastest for this shape on Test GPU: Triton program, 1.17x torch.matmul"
    assert said["near"] == "no tuned kernel for this shape on Test GPU; serving torch.matmul (cuBLAS)"
    assert said["library"] == "cuBLASLt algorithm measured 1.25x torch.matmul for this shape on Test GPU"
    assert said["lost"] == ("no program beat cuBLAS when this shape was tuned on Test GPU; "
                            "serving torch.matmul (cuBLAS)")
    assert said["untuned"] == "no tuned kernel for this shape on Test GPU; serving torch.matmul (cuBLAS)"


def test_compile_without_a_gpu_names_the_gpu_its_records_are_for(capsys, tmp_path, monkeypatch):
    from gemmgen.cli import tune as tune_cli

    monkeypatch.setattr(tune_cli, "has_gpu", lambda: False)
    monkeypatch.setenv("GEMMGEN_DB", str(tmp_path / "none.sqlite"))     # no database of one's own yet
    code, out, _ = run(capsys, "compile", "77x77x77", "--no-source")
    assert code == 0 and "this GPU" not in out
    assert "no tuned kernel for this shape on NVIDIA H200" in out
    assert "(no GPU here: these are the records for NVIDIA H200; --device names another GPU model)" in out
    assert "`gemmgen db list` shows the tuned shapes" in out


# -- 6. tune refuses before it creates anything -------------------------------------------


def test_tune_without_a_gpu_creates_no_database(capsys, tmp_path, monkeypatch):
    from gemmgen.cli import tune as tune_cli

    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n128,128,128\n")
    db = tmp_path / "new.sqlite"
    monkeypatch.setattr(tune_cli, "has_gpu", lambda: False)
    code, _, err = run(capsys, "tune", "--shapes", str(shapes), "--db", str(db))
    assert code == 2 and "needs an NVIDIA Hopper GPU" in err and len(err.splitlines()) == 1
    assert not db.exists()
    monkeypatch.setattr(tune_cli, "has_gpu", lambda: True)        # the shapes are checked first, GPU or not
    code, _, err = run(capsys, "tune", "--shapes", str(tmp_path / "absent.csv"), "--db", str(db))
    assert code == 2 and "absent.csv" in err and not db.exists()
    shapes.write_text("M,N,K\n3000000000,1,1\n")
    code, _, err = run(capsys, "tune", "--shapes", str(shapes), "--db", str(db))
    assert code == 2 and f"M = 3000000000 is not allowed; {ALLOWED}" in err and not db.exists()


# -- 7. where the tuned shapes are listed ---------------------------------------------------


def test_the_help_points_to_the_list_of_tuned_shapes():
    assert "`gemmgen db list` shows the tuned shapes" in " ".join(build_parser().format_help().split())
    with pytest.raises(SystemExit) as info:                       # and that command exists
        build_parser().parse_args(["db", "list", "--help"])
    assert info.value.code == 0
