"""gemmgen.compile on a machine without a GPU: lookup (exact, library, baseline), inspection,
the never-slower rule at compile time, call errors, and the cost of a warm lookup."""
import subprocess
import sys
import time
from dataclasses import replace

import pytest

import gemmgen
from gemmgen.compile import CompileError, clear_cache, parse_epilogue
from gemmgen.dsl import parse
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.errors import GemmgenError, NoGPUError
from gemmgen.tuning_db import Database
from tuning_fakes import TEST_GPU, program_text, trial, triton_program

GPU = TEST_GPU.name
TUNED = Problem(4096, 4096, 4096)
SMALL = Problem(256, 128, 2048)
SMALL_NT = Problem(256, 1024, 512, "row", "col", epilogue=Epilogue(bias="n", activation="gelu"))


@pytest.fixture
def db(tmp_path):
    clear_cache()
    db = Database(tmp_path / "user.sqlite")
    db.record(trial(TUNED, device_ms=0.18, baseline_ms=0.20, program=program_text(
        replace(triton_program(TUNED, (128, 256, 64), 3), scheduler="persistent"))))
    db.record(trial(SMALL, device_ms=0.010, baseline_ms=0.012, program=program_text(
        replace(triton_program(SMALL, (64, 128, 64), 3), scheduler="persistent"))))
    db.record(trial(SMALL_NT, device_ms=0.010, baseline_ms=0.012,
                    program=program_text(triton_program(SMALL_NT, (64, 128, 64), 4))))
    yield db
    clear_cache()


def test_exact_winner(db):
    k = gemmgen.compile((4096, 4096, 4096), device=GPU, db=db)
    assert k.provenance.how == "exact" and k.backend == "triton"
    assert "tile 128x256x64" in k.program and "persistent" in k.program and parse(k.program) == k.ir
    assert k.provenance.speedups["cublaslt_auto"] == pytest.approx(0.20 / 0.18)
    assert k.provenance.gpu == GPU and k.provenance.date
    assert "def " in k.source or "__global__" in k.source  # generated source, lowered without a GPU
    text = k.describe()
    assert "measured fastest for this shape on Test GPU: Triton program, 1.17x torch.matmul" in text
    assert "cublaslt_auto" in text and "tile 128x256x64" in text


def test_a_neighbours_program_is_never_served(db):
    """Re-bound neighbours measured 0.75x torch.matmul at off-grid shapes on the H200: a program
    serves only where it was measured. Near winners of the same family, far ones, large and
    small problems all get the baseline, saying no kernel was tuned for the shape."""
    for shape, kw in (((300, 128, 1600), {}), ((256, 512, 384), dict(b_major="col", epilogue="bias=n gelu")),
                      ((3000, 4096, 5000), {}), ((64, 64, 64), {})):
        k = gemmgen.compile(shape, device=GPU, db=db, **kw)
        assert k.provenance.how == "baseline" and k.program is None and k.backend == "torch", shape
        assert k.provenance.summary == "no tuned kernel for this shape on Test GPU; serving torch.matmul (cuBLAS)"
        assert ("torch.addmm(bias" if "bias" in kw.get("epilogue", "") else "torch.matmul") in k.source


def test_a_neighbours_program_is_a_candidate_for_tuning(db):
    """`gemmgen tune` measures the nearest winners' programs first, re-bound and validated; a far,
    unlike or invalid neighbour is not proposed."""
    from gemmgen.policy.proposers import get_proposer
    from gemmgen.tune.neighbours import WithNeighbours, neighbour_programs
    from gemmgen.tuning_db import WinnerIndex

    index = WinnerIndex([("user", db)], GPU)
    (near,) = neighbour_programs(index, Problem(300, 128, 1600), 1)
    assert near.problem == Problem(300, 128, 1600) and (near.tile.m, near.tile.n, near.tile.k) == (64, 128, 64)
    assert neighbour_programs(index, Problem(64, 64, 64)) == []                  # log distance ~3.7
    assert neighbour_programs(index, Problem(256, 128, 2047)) == []              # TMA needs 16-byte rows
    nt = neighbour_programs(index, Problem(256, 768, 512, "row", "col", epilogue=Epilogue(bias="n", activation="gelu")))
    assert [p.problem.epilogue for p in nt] == [Epilogue(bias="n", activation="gelu")]
    proposer = WithNeighbours(get_proposer("heuristic", backends=("triton",)), index, 2)
    programs = proposer.propose(Problem(300, 128, 1600), 6, seed=0)
    assert programs[0] == near and len(programs) == 6
    assert len({program_text(p) for p in programs}) == 6 and proposer.name == "heuristic+neighbours"


def test_a_problem_tuned_without_winner_gets_the_baseline_not_a_neighbour(db):
    # 300x128x1600 is near the SMALL winner; measured there and lost, the baseline serves,
    # carrying the least best-baseline time its runs measured
    near = Problem(300, 128, 1600)
    assert gemmgen.compile(near, device=GPU, db=db).provenance.baseline_ms_here is None
    db.record(trial(near, device_ms=0.015, spread=0.01, baseline_ms=0.011))
    db.record(trial(near, device_ms=0.016, spread=0.01, baseline_ms=0.010))
    clear_cache()
    k = gemmgen.compile(near, device=GPU, db=db)
    assert k.provenance.how == "baseline" and k.program is None
    assert k.provenance.summary == ("no program beat cuBLAS when this shape was tuned on Test GPU; "
                                    "serving torch.matmul (cuBLAS)")
    assert k.provenance.baseline_ms_here == pytest.approx(0.010)


def test_a_library_search_that_lost_is_said_so(db):
    """A cuBLASLt search that found nothing faster than torch.matmul is a tuning too: the
    baseline serves, and its provenance says what was tried, not 'no tuned kernel'."""
    from tuning_fakes import library_choice

    searched, both = Problem(64, 5120, 5120, "row", "col"), Problem(300, 128, 1600)
    db.record_library(library_choice(searched, device_ms=1.0, torch_ms=0.99))
    db.record_library(library_choice(both, device_ms=0.02, torch_ms=0.019))
    db.record(trial(both, device_ms=0.015, spread=0.01, baseline_ms=0.011))
    clear_cache()
    k = gemmgen.compile(searched, device=GPU, db=db)
    assert k.provenance.how == "baseline" and k.backend == "torch"
    assert k.provenance.summary == ("no cuBLASLt algorithm beat torch.matmul when this shape was searched on "
                                    "Test GPU; serving torch.matmul (cuBLAS)")
    # torch.matmul's time beside the search is the baseline measured here (what the torch pass
    # weighs joins and gated products against); the least of every run's where several measured it
    assert k.provenance.baseline_ms_here == pytest.approx(0.99)
    k = gemmgen.compile(both, device=GPU, db=db)
    assert k.provenance.how == "baseline"
    assert k.provenance.summary == ("neither a program nor a cuBLASLt algorithm beat cuBLAS when this shape was "
                                    "tuned on Test GPU; serving torch.matmul (cuBLAS)")
    assert k.provenance.baseline_ms_here == pytest.approx(0.011)


def test_determinism_passes_over_arrival_order_split_k(db, monkeypatch):
    """`split_k N unordered` sums fp32 partials as they arrive: not bit-reproducible. With
    deterministic=True, or torch's deterministic mode, compile serves what is next in line."""
    import torch

    skinny = Problem(256, 128, 8192)
    unordered = replace(triton_program(skinny, (64, 64, 64), 4), split_k=16, split_k_reduce="unordered")
    db.record(trial(skinny, device_ms=0.0075, baseline_ms=0.0084, program=program_text(unordered)))
    assert "split_k 16 unordered" in gemmgen.compile(skinny, device=GPU, db=db).program
    served = gemmgen.compile(skinny, device=GPU, db=db, deterministic=True)
    assert served.provenance.how == "baseline" and served.ir is None
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert gemmgen.compile(skinny, device=GPU, db=db).provenance.how == "baseline"
    # a neighbour's unordered program is never re-bound: it is served only where it was checked
    near = Problem(256, 128, 6144)
    assert gemmgen.compile(near, device=GPU, db=db, deterministic=False).provenance.how == "baseline"


def test_never_slower_at_compile_time(tmp_path):
    clear_cache()
    db = Database(tmp_path / "slow.sqlite")
    p = Problem(2048, 2048, 2048)
    db.record(trial(p, device_ms=0.99, spread=0.02, baseline_ms=1.0))   # faster, within its noise
    db.record(trial(p, device_ms=0.5, baseline_ms=1.0, status="check_failed", check_passed=False,
                    program="wrong\n"))
    k = gemmgen.compile(p, device=GPU, db=db)
    assert k.provenance.how == "baseline" and k.program is None
    db.record(trial(p, device_ms=0.90, spread=0.02, baseline_ms=1.0, program=program_text(
        triton_program(p, (128, 128, 64), 3))))
    clear_cache()
    assert gemmgen.compile(p, device=GPU, db=db).provenance.how == "exact"


def test_a_program_serves_beyond_its_paired_noise_and_says_so(tmp_path):
    from dataclasses import replace

    clear_cache()
    db = Database(tmp_path / "noise.sqlite")
    p = Problem(64, 256, 128)
    # 1.09x with a 10 % spread (a 2 us kernel): only its paired noise lets it serve
    db.record(replace(trial(p, device_ms=0.92, spread=0.10, baseline_ms=1.0), noise=0.019))
    k = gemmgen.compile(p, device=GPU, db=db)
    assert k.provenance.how == "exact" and k.provenance.noise == 0.019
    assert "speedup noise 1.9 %" in k.provenance.describe()


def test_without_gpu_calling_raises_no_gpu_error(db):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    k = gemmgen.compile((4096, 4096, 4096), device=GPU, db=db)
    a = torch.randn(4096, 4096, dtype=torch.float16)
    with pytest.raises(NoGPUError):
        k(a, a)
    with pytest.raises(NoGPUError):      # the harness's calling convention, as `gemmgen compile` uses
        k.fn(a, a, torch.empty_like(a))
    base = gemmgen.compile((64, 64, 64), device=GPU, db=db)
    with pytest.raises(NoGPUError):
        base(a[:64, :64], a[:64, :64])


def test_operand_checks_name_what_to_change():
    torch = pytest.importorskip("torch")
    from gemmgen.kernel import KernelCallError, _operand

    half = torch.float16
    with pytest.raises(KernelCallError, match="dtype torch.float32"):
        _operand("a", torch.zeros(8, 4), (8, 4), "row", half, torch)
    with pytest.raises(KernelCallError, match=r"shape \(4, 8\)"):
        _operand("a", torch.zeros(4, 8, dtype=half), (8, 4), "row", half, torch)
    with pytest.raises(KernelCallError, match="b_major='col'"):
        _operand("b", torch.zeros(8, 4, dtype=half).t(), (4, 8), "row", half, torch)
    _check = lambda t, major: _operand("b", t, (4, 8), major, half, torch)  # noqa: E731
    with pytest.raises(KernelCallError, match="CUDA"):      # right layout, wrong device
        _check(torch.zeros(8, 4, dtype=half).t(), "col")
    with pytest.raises(KernelCallError, match="torch.Tensor"):
        _operand("a", [[1.0]], (1, 1), "row", half, torch)


def test_argument_errors():
    with pytest.raises(CompileError, match="M = 0 is not allowed; M, N and K must each be a whole number"):
        gemmgen.compile((0, 4, 4))
    with pytest.raises(CompileError, match="a_major"):
        gemmgen.compile((4, 4, 4), a_major="diagonal")
    with pytest.raises(CompileError, match="epilogue 'bias=k': in `epilogue`: expected 'm' or 'n'"):
        gemmgen.compile((4, 4, 4), epilogue="bias=k")
    with pytest.raises(CompileError, match="shape-generic; give N and K"):
        gemmgen.compile(Problem(None, None, 4))
    assert parse_epilogue("alpha=0.5 bias=n gelu residual out=f16") == Epilogue(
        alpha=0.5, bias="n", activation="gelu", residual=True)
    assert isinstance(CompileError("x"), GemmgenError)


def test_warm_lookup_under_50_microseconds(db):
    gemmgen.compile((4096, 4096, 4096), device=GPU, db=db)        # cold: reads the database
    gemmgen.compile((3000, 4096, 5000), b_major="row", device=GPU, db=db)
    n = 20000
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            gemmgen.compile((4096, 4096, 4096), device=GPU, db=db)
        best = min(best, (time.perf_counter() - start) / n)
    problem = Problem(3000, 4096, 5000)
    start = time.perf_counter()
    for _ in range(n):
        gemmgen.compile(problem, device=GPU, db=db)
    by_problem = (time.perf_counter() - start) / n
    print(f"\nwarm gemmgen.compile lookup: {best * 1e6:.2f} us ((M,N,K) tuple), {by_problem * 1e6:.2f} us (Problem)")
    assert best < 50e-6 and by_problem < 50e-6


def test_import_gemmgen_stays_light():
    code = "import sys, gemmgen; assert 'torch' not in sys.modules; gemmgen.compile; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_default_lookup_uses_the_shipped_records(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_DB", str(tmp_path / "absent.sqlite"))
    clear_cache()
    k = gemmgen.compile((4096, 4096, 4096))
    assert k.provenance.gpu in ("NVIDIA H200",) or k.provenance.gpu  # a GPU here names itself
    assert k.provenance.how in ("exact", "nearest", "baseline")
    assert not (tmp_path / "absent.sqlite").exists()            # a lookup never creates a database
    clear_cache()


def test_docs_example_runs_on_cpu(capsys):
    import pathlib
    import re

    text = (pathlib.Path(__file__).parent.parent / "docs" / "compile.md").read_text()
    first = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    clear_cache()
    exec(compile(first, "docs/compile.md", "exec"), {})
    assert "provenance" in capsys.readouterr().out


def test_a_stale_program_warns_and_falls_back(tmp_path):
    clear_cache()
    db = Database(tmp_path / "stale.sqlite")
    db.record(trial(Problem(256, 256, 256), program="gemm 256x256x256 with an old syntax\n"))
    with pytest.warns(RuntimeWarning, match="no longer parses"):
        k = gemmgen.compile((256, 256, 256), device=GPU, db=db)
    assert k.provenance.how == "baseline"
    clear_cache()


def test_tune_on_demand_tunes_an_unmeasured_problem_once(tmp_path, monkeypatch, capsys):
    """compile(..., tune=S): the tune loop (fake runner and builder here) records trials into the
    user's database, the winner serves, and a second compile tunes nothing."""
    import gemmgen.compile as compile_module
    from gemmgen.tune import on_demand
    from gemmgen.tune.adapters import STANDBY_WORKERS
    from tuning_fakes import FakeBuilder, FakeRunner

    runs = []
    monkeypatch.setattr(on_demand, "WorkerRunner", lambda **kw: runs.append(kw) or FakeRunner())
    monkeypatch.setattr(on_demand, "PoolBuilder", FakeBuilder)
    monkeypatch.setattr(compile_module, "gpu_present", lambda: True)
    monkeypatch.setattr(compile_module, "this_device", lambda: TEST_GPU)
    clear_cache()
    path = tmp_path / "user.sqlite"
    shape = (16, 1000, 1000)      # a batch of 16: programs lead there (library_first)
    assert gemmgen.compile(shape, device=GPU, db=path).provenance.how == "baseline"
    kernel = gemmgen.compile(shape, device=GPU, db=path, tune=30)
    assert len(runs) == 1 and kernel.provenance.how == "exact" and kernel.provenance.layer == "user"
    # beside the user's model: fewer standby workers (each a CUDA context) than a tuning run keeps
    assert runs[0]["standby"] == on_demand.ON_DEMAND_STANDBY < STANDBY_WORKERS
    assert "tuned 16x1000x1000" in capsys.readouterr().err
    trials = list(Database(path).trials())
    assert trials and {t.backend for t in trials} == {"triton"}       # 30 s: no minute-long nvcc builds
    clear_cache()
    again = gemmgen.compile(shape, device=GPU, db=path, tune=30)
    assert len(runs) == 1 and again.provenance.how == "exact"          # measured before: no tuning
    with pytest.raises(CompileError, match="tune=-1"):
        gemmgen.compile(shape, device=GPU, db=path, tune=-1)
    clear_cache()


def test_on_demand_requests_share_the_workers_until_they_idle(tmp_path, monkeypatch):
    """Starting the measurement workers takes seconds: the process's next request reuses them, and
    they end once idle for WORKERS_IDLE_S (or when released)."""
    import time

    import gemmgen.compile as compile_module
    from gemmgen.tune import on_demand
    from tuning_fakes import FakeBuilder, FakeRunner

    made, closed = [], []

    class Runner(FakeRunner):
        def close(self):
            closed.append(self)

    monkeypatch.setattr(on_demand, "WorkerRunner", lambda **kw: made.append(Runner()) or made[-1])
    monkeypatch.setattr(on_demand, "PoolBuilder", FakeBuilder)
    monkeypatch.setattr(compile_module, "gpu_present", lambda: True)
    monkeypatch.setattr(compile_module, "this_device", lambda: TEST_GPU)
    monkeypatch.setattr(on_demand, "WORKERS_IDLE_S", 0.3)
    clear_cache()
    path = tmp_path / "user.sqlite"
    for shape in ((16, 1000, 1000), (16, 2000, 1000)):
        assert gemmgen.compile(shape, device=GPU, db=path, tune=30).provenance.how == "exact"
    assert len(made) == 1 and not closed and len(made[0].measured) > 1     # both tuned, one start
    deadline = time.monotonic() + 5
    while not closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert closed == made                                                   # idle: ended
    gemmgen.compile((16, 3000, 1000), device=GPU, db=path, tune=30)
    on_demand.release_workers()
    assert len(made) == 2 and closed == made
    clear_cache()


def test_a_short_tuning_budget_proposes_only_backends_that_build_in_seconds():
    from gemmgen.tune.on_demand import FAST_BACKENDS, SLOW_BUILD_S, backends_for

    small_batch = Problem(16, 4096, 4096)
    assert backends_for(small_batch, 10) == FAST_BACKENDS == ("triton",)
    assert backends_for(small_batch, SLOW_BUILD_S) == backends_for(small_batch, None) == ("triton", "cutlass", "cuda")
    assert backends_for(small_batch, 10, ["cutlass"]) == ("cutlass",)          # asked for: kept


def test_tuning_goes_first_where_the_records_say_it_wins():
    """cuBLASLt's search where the shipped records saw it win (M >= 32, 1 GFLOP or more), programs
    elsewhere; a long budget adds every backend's programs after the search."""
    from gemmgen.tune import library_first
    from gemmgen.tune.on_demand import backends_for

    assert library_first(Problem(32, 4096, 4096)) and library_first(Problem(4096, 4096, 4096))
    assert not library_first(Problem(16, 14336, 4096))                        # a small batch: programs
    assert not library_first(Problem(256, 512, 512))                          # under 1 GFLOP: programs
    gated = Problem(2048, 14336, 4096, epilogue=parse_epilogue("gate=silu halves=stacked"))
    assert not library_first(gated)                                           # no library fuses the gate
    assert backends_for(Problem(64, 4096, 4096), 10) == ("cublaslt",)
    assert backends_for(Problem(64, 4096, 4096), None) == ("cublaslt", "triton", "cutlass", "cuda")
    assert backends_for(Problem(64, 4096, 4096), 10, ["triton"]) == ("triton",)
    lm_head = Problem(64, 128256, 8192, b_major="col")                    # a 2.1 GB weight: a search of ~60 s
    assert library_first(lm_head) and backends_for(lm_head, 10) == ("triton",)
    assert backends_for(lm_head, 90) == ("cublaslt",) and backends_for(lm_head, None)[0] == "cublaslt"


def test_on_demand_searches_the_library_where_it_leads_and_programs_elsewhere(tmp_path, monkeypatch):
    """One request with a small-batch and a large problem: cuBLASLt's search runs for the large
    one only, programs are measured for the small one only, and each is served what won."""
    import gemmgen.compile as compile_module
    from gemmgen.tune import on_demand
    from test_tuning_library import _found
    from tuning_fakes import FakeBuilder, FakeRunner

    searched = []

    class Runner(FakeRunner):
        def library(self, problem):
            searched.append(problem)
            return _found(device_ms=0.8, torch_ms=1.0)

    runner = Runner()
    monkeypatch.setattr(on_demand, "WorkerRunner", lambda **kw: runner)
    monkeypatch.setattr(on_demand, "PoolBuilder", FakeBuilder)
    monkeypatch.setattr(compile_module, "gpu_present", lambda: True)
    monkeypatch.setattr(compile_module, "this_device", lambda: TEST_GPU)
    clear_cache()
    path = tmp_path / "user.sqlite"
    small, large = Problem(16, 1000, 1000), Problem(512, 4096, 4096)
    reports = on_demand.tune_now([small, large], db=path, time_budget_s=30)
    on_demand.release_workers()
    assert set(reports) == {"cublaslt", "programs"} and searched == [large]
    assert {t.problem.key for t in Database(path).trials()} == {small.key}
    assert gemmgen.compile(large, device=GPU, db=path).provenance.how == "library"
    assert gemmgen.compile(small, device=GPU, db=path).provenance.how == "exact"
    clear_cache()


def test_tune_on_demand_needs_a_gpu(tmp_path, monkeypatch):
    import gemmgen.compile as compile_module

    monkeypatch.setattr(compile_module, "gpu_present", lambda: False)
    clear_cache()
    with pytest.raises(NoGPUError, match="tune=5"):
        gemmgen.compile((1000, 1000, 1000), device=GPU, db=tmp_path / "u.sqlite", tune=5)
    assert not (tmp_path / "u.sqlite").exists()
    clear_cache()


def test_a_gated_epilogue_is_served_by_its_unfused_baseline_until_tuned():
    """Nothing tuned: the product over the joined B, then gate * up as torch ops (never a plain GEMM)."""
    from gemmgen.runtime.epilogue import reference

    gated = Epilogue(gate="silu", halves="stacked")
    kernel = gemmgen.compile(Problem(16, 4096, 4096, b_major="col", epilogue=gated))
    assert kernel.provenance.how == "baseline"
    assert gemmgen.compile((16, 4096, 4096), b_major="col", epilogue="gate=silu halves=stacked").problem.epilogue == gated
    assert "torch.mul(g, u, out=out)" in kernel.source and "F.silu(g, inplace=True)" in kernel.source
    with pytest.raises(CompileError, match="halves=stacked"):
        gemmgen.compile(Problem(16, 4096, 4096, b_major="col", epilogue=Epilogue(gate="silu")))
    with pytest.raises(CompileError, match="takes no bias"):
        gemmgen.compile(Problem(16, 4096, 4096, epilogue=Epilogue(gate="relu", halves="stacked", bias="n")))
    torch = pytest.importorskip("torch")
    acc = torch.tensor([[1.0, -2.0, 3.0, 4.0]])
    assert torch.allclose(reference(acc, gated), torch.nn.functional.silu(acc[:, :2]) * acc[:, 2:])
