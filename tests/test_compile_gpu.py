"""gemmgen.compile on the H200: the fallback and a freshly tuned kernel are right, and call errors are clear."""
import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen.compile import clear_cache  # noqa: E402
from gemmgen.dsl.ir import Problem  # noqa: E402
from gemmgen.kernel import KernelCallError  # noqa: E402
from gemmgen.tuning_db import Database  # noqa: E402

pytestmark = pytest.mark.gpu


def _reference(a, b, bias=None):
    y = a.float() @ b.float()
    return y + bias.float() if bias is not None else y


def _close(out, ref):
    return (out.float() - ref).norm() / ref.norm() < 1e-2


def test_baseline_kernel_is_right(tmp_path):
    clear_cache()
    k = gemmgen.compile((512, 384, 256), b_major="col", epilogue="bias=n", db=tmp_path / "none.sqlite")
    a = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(384, 256, device="cuda", dtype=torch.float16)
    bias = torch.randn(384, device="cuda", dtype=torch.float16)
    out = k(a, w.t(), bias=bias)
    assert _close(out, _reference(a, w.t(), bias))
    with pytest.raises(KernelCallError, match="b_major"):
        k(a, w.t().contiguous(), bias=bias)
    with pytest.raises(KernelCallError, match="dtype"):
        k(a.float(), w.t(), bias=bias)
    with pytest.raises(KernelCallError, match="CUDA"):
        k(a.cpu(), w.t(), bias=bias)
    with pytest.raises(KernelCallError, match="bias"):
        k(a, w.t())


def test_tune_then_compile_one_shape(tmp_path):
    from gemmgen.policy.proposers import get_proposer
    from gemmgen.tune import tune
    from gemmgen.tune.adapters import PoolBuilder, WorkerRunner

    clear_cache()
    problem = Problem(2048, 2048, 1024)
    db = Database(tmp_path / "t.sqlite")
    with WorkerRunner(baselines=("torch",), timeout_s=120) as runner:
        report = tune([problem], proposer=get_proposer("heuristic", backends=("triton",)),
                      builder=PoolBuilder(), runner=runner, db=db, budget=3, progress=False)
    assert report.recorded == 3
    trials = list(db.trials())
    assert all(t.baselines for t in trials if t.status == "ok")
    k = gemmgen.compile(problem, db=db)
    a = torch.randn(2048, 1024, device="cuda", dtype=torch.float16)
    b = torch.randn(1024, 2048, device="cuda", dtype=torch.float16)
    assert _close(k(a, b), _reference(a, b))
    print(k.describe())


def test_the_readme_command_checks_and_times_on_the_gpu(capsys):
    """`gemmgen compile MxNxK` with a GPU: the shipped kernel is checked, then timed against torch.matmul."""
    from gemmgen.cli import main

    clear_cache()
    assert main(["compile", "4096x128x128"]) == 0
    out = capsys.readouterr().out
    assert "check: passed" in out and "torch.matmul" in out and "vs torch" in out
