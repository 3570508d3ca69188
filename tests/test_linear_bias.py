"""nn.Linear's bias inside the baseline's product, and the records timed before it (migration 009)."""
import re

import pytest
import torch

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.runtime.epilogue import reference
from gemmgen.runtime.tensors import operands
from gemmgen.runtime.torch_call import bias_in_product, torch_call, torch_call_source
from gemmgen.tune import searched
from gemmgen.tuning_db import Database
from gemmgen.tuning_db.database import MIGRATIONS, migration_sql
from gemmgen.tuning_db.records import BIAS_IN_PRODUCT_SINCE, baseline_superseded
from tuning_fakes import TEST_GPU, library_choice, trial

LINEAR = Problem(2048, 4608, 3584, b_major="col", epilogue=Epilogue(bias="n"))
BEFORE = "2026-12-05T12:17:01.761437+00:00"
AFTER = "2026-12-05T18:00:00.000000+00:00"


@pytest.mark.parametrize("epilogue, linear", [
    (Epilogue(bias="n"), True),
    (Epilogue(bias="n", activation="silu", residual=True), True),
    (Epilogue(alpha=0.5, bias="n"), True),
    (Epilogue(bias="m"), False),                      # one value a row: no library adds it in the product
    (Epilogue(beta=1.0, bias="n"), False),            # addmm's input is C there
    (Epilogue(bias="n", out_dtype="f32"), False),     # addmm wants one dtype
    (Epilogue(), False),
])
def test_linear_bias_is_nn_linears_bias(epilogue, linear):
    assert Problem(8, 16, 32, epilogue=epilogue).linear_bias is linear


def _addmm_inputs(monkeypatch):
    seen = []
    real = torch.addmm

    def spy(inp, *args, **kwargs):
        seen.append(inp)
        return real(inp, *args, **kwargs)

    monkeypatch.setattr(torch, "addmm", spy)
    return seen


@pytest.mark.parametrize("epilogue", [Epilogue(bias="n"), Epilogue(bias="n", activation="silu", residual=True),
                                      Epilogue(alpha=0.5, bias="n")])
def test_the_baseline_adds_a_linear_bias_inside_the_product(monkeypatch, epilogue):
    problem = Problem(33, 40, 48, b_major="col", epilogue=epilogue)
    (a, b, out), kwargs = operands(problem, seed=1, device="cpu")
    seen = _addmm_inputs(monkeypatch)
    torch_call(problem)(a, b, out, **kwargs)
    assert len(seen) == 1 and seen[0] is kwargs["bias"]   # the bias is addmm's input, added once
    want = reference(a.float() @ b.float(), epilogue, bias=kwargs["bias"], residual=kwargs.get("residual"))
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-3)
    source = torch_call_source(problem)
    assert "torch.addmm(bias, a, b" in source and "out.add_(bias)" not in source


@pytest.mark.parametrize("problem, inside", [
    (Problem(33, 40, 48, b_major="col", epilogue=Epilogue(bias="n")), True),
    (Problem(None, 40, 48, b_major="col", epilogue=Epilogue(bias="n")), True),    # M open: no row runs along it
    (Problem(33, 41, 48, b_major="col", epilogue=Epilogue(bias="n")), False),     # the output's rows
    (Problem(33, 40, 47, b_major="col", epilogue=Epilogue(bias="n")), False),     # A's and B's rows
    (Problem(33, 40, 48, "col", "col", epilogue=Epilogue(bias="n")), False),      # A's rows run along M = 33
    (Problem(None, 40, 48, "col", "col", epilogue=Epilogue(bias="n")), False),    # ... along an open M
    (Problem(33, 40, 48, b_major="col", epilogue=Epilogue(bias="m")), False),
])
def test_the_bias_goes_inside_the_product_only_on_16_byte_rows(problem, inside):
    """At 17x4611x3583 on the H100 addmm with the bias took 1.045 ms summing in fp32, the product
    and an add after it 0.035 ms: unaligned rows get the add after."""
    assert bias_in_product(problem) is inside


def test_on_unaligned_rows_the_baseline_adds_the_linear_bias_after(monkeypatch):
    problem = Problem(33, 41, 47, b_major="col", epilogue=Epilogue(bias="n"))
    (a, b, out), kwargs = operands(problem, seed=3, device="cpu")
    seen = _addmm_inputs(monkeypatch)
    torch_call(problem)(a, b, out, **kwargs)
    assert all(inp is not kwargs["bias"] for inp in seen)
    want = reference(a.float() @ b.float(), problem.epilogue, bias=kwargs["bias"])
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-3)
    source = torch_call_source(problem)
    assert "out.add_(bias" in source and "torch.addmm" not in source


@pytest.mark.parametrize("epilogue", [Epilogue(bias="m"), Epilogue(beta=1.0, bias="n")])
def test_other_biases_are_still_added_after_the_product(monkeypatch, epilogue):
    problem = Problem(33, 40, 48, b_major="col", epilogue=epilogue)
    (a, b, out), kwargs = operands(problem, seed=2, device="cpu")
    seen = _addmm_inputs(monkeypatch)
    torch_call(problem)(a, b, out, **kwargs)
    assert all(inp is not kwargs["bias"] for inp in seen)
    want = reference(a.float() @ b.float(), epilogue, bias=kwargs["bias"], c=kwargs.get("c"))
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-3)
    assert "out.add_(bias" in torch_call_source(problem)


def test_records_of_linear_bias_problems_timed_before_the_change_neither_serve_nor_count():
    db = Database(":memory:")
    other = Problem(2048, 4608, 3584, b_major="col", epilogue=Epilogue(bias="m"))
    for problem in (LINEAR, other):
        db.record(trial(problem, device_ms=0.8, baseline_ms=1.0, program="old\n", created=BEFORE))
        db.record_library(library_choice(problem, device_ms=0.8, torch_ms=1.0, created=BEFORE))
    assert db.winner(LINEAR, TEST_GPU.name) is None
    assert db.measured_programs(LINEAR, TEST_GPU.name) == set()      # tuning measures it again
    assert LINEAR.key not in db.tuned_problems(TEST_GPU.name)
    assert LINEAR.key not in db.library_searched(TEST_GPU.name)
    assert [c.problem.key for c in db.library_winners(TEST_GPU.name)] == [other.key]
    assert not searched(db.library_choices(LINEAR.key, TEST_GPU.name))
    # a bias over M keeps its records: its baseline did not change
    assert db.winner(other, TEST_GPU.name).program == "old\n"
    assert db.measured_programs(other, TEST_GPU.name) == {"old\n"}

    db.record(trial(LINEAR, device_ms=0.9, baseline_ms=1.0, program="new\n", created=AFTER))
    db.record_library(library_choice(LINEAR, device_ms=0.9, torch_ms=1.0, created=AFTER, algorithm="0a"))
    assert db.winner(LINEAR, TEST_GPU.name).program == "new\n"
    assert db.measured_programs(LINEAR, TEST_GPU.name) == {"new\n"}
    assert db.tuned_problems(TEST_GPU.name)[LINEAR.key] == pytest.approx(1.0)
    assert db.library_searched(TEST_GPU.name)[LINEAR.key] == pytest.approx(1.0)
    assert {c.algorithm for c in db.library_winners(TEST_GPU.name)} == {"00ff", "0a"}


@pytest.mark.parametrize("epilogue", [Epilogue(bias="n"), Epilogue(bias="n", activation="gelu"),
                                      Epilogue(alpha=2.0, bias="n"), Epilogue(bias="m"),
                                      Epilogue(beta=1.0, bias="n"), Epilogue(bias="n", out_dtype="f32"),
                                      Epilogue(bias="n", out_dtype="bf16"), Epilogue(residual=True)])
def test_the_views_and_the_python_rule_agree(epilogue):
    problem = Problem(64, 128, 256, b_major="col", epilogue=epilogue)
    db = Database(":memory:")
    db.record(trial(problem, device_ms=0.8, baseline_ms=1.0, created=BEFORE))
    superseded = db.winner(problem, TEST_GPU.name) is None
    assert superseded is baseline_superseded(problem, BEFORE) is problem.linear_bias
    assert not baseline_superseded(problem, AFTER)


def test_the_migration_holds_the_same_instant_as_the_records():
    sql = migration_sql(MIGRATIONS.index("migration_009_bias_in_product.sql"))
    instants = re.findall(r"created < '([^']+)'\s+AND problem_id IN \(SELECT id FROM linear_bias_problems\)", sql)
    assert instants == [BIAS_IN_PRODUCT_SINCE] * 2      # trials and library choices


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 17, 100, 2048])
@pytest.mark.parametrize("n, k", [(4608, 3584), (4611, 3583)])
def test_on_a_gpu_the_served_linear_bias_passes_the_checks(m, n, k):
    """The served fallback passes the harness's checks, with the bias in addmm on aligned rows
    and added after elsewhere; where cuBLASLt can take the bias (M > 1, aligned), it is one kernel."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from gemmgen.kernel import baseline_launcher
    from gemmgen.measure.checking import check
    from gpu_programs import launched_kernels

    problem = Problem(m, n, k, b_major="col", epilogue=Epilogue(bias="n"))
    fn = baseline_launcher(problem)
    result = check(fn, problem, seed=m)
    assert result.passed, result.failures
    (a, b, out), kwargs = operands(problem, seed=0, device="cuda")
    kernels = launched_kernels(fn, a, b, out, **kwargs)
    if m > 1 and n % 8 == 0 and k % 8 == 0:
        assert len(kernels) == 1, kernels
    want = reference(a.float() @ b.float(), problem.epilogue, bias=kwargs["bias"])
    torch.testing.assert_close(out.float(), want, atol=0.05, rtol=5e-3)
