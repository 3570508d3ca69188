"""check() on CPU tensors: every rule except the stream probe, against planted cheats."""
import pytest
import torch

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.measure import check
from gemmgen.runtime.epilogue import reference as apply_epilogue

P = Problem(48, 40, 256)


def honest(problem):
    """fp32 accumulation, epilogue in fp32, one rounding: what a correct kernel does."""
    def fn(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        acc = a.float() @ b.float()
        out.copy_(apply_epilogue(acc, problem.epilogue, bias=bias, residual=residual, c=c).to(out.dtype))
    return fn


def run(fn, problem=P):
    return check(fn, problem, seed=1234, device="cpu")


def test_correct_kernel_passes_and_records_its_seed():
    r = run(honest(P))
    assert r.passed, r.failures
    assert r.seed == 1234 and 0 < r.max_rel_err < r.bound
    assert [c.name for c in r.cases] == ["main", "precision", "mantissa", "second"]


@pytest.mark.parametrize("problem", [
    Problem(33, 17, 96, a_major="col", b_major="col", c_major="col"),
    Problem(32, 24, 64, b_major="col", epilogue=Epilogue(alpha=0.5, beta=1.5, bias="n", activation="gelu", residual=True)),
    Problem(16, 48, 40, epilogue=Epilogue(bias="m", activation="silu")),
])
def test_correct_kernel_passes_any_layout_and_epilogue(problem):
    r = check(honest(problem), problem, device="cpu")
    assert r.passed, r.failures


def test_fresh_seed_when_none_given():
    assert check(honest(P), P, device="cpu").seed != check(honest(P), P, device="cpu").seed


def test_fp16_accumulation_fails_on_the_precision_probe():
    def fn(a, b, out, **_):
        acc = torch.zeros(out.shape, dtype=torch.float16)
        for k0 in range(0, a.shape[1], 16):
            acc = (acc.float() + a[:, k0:k0 + 16].float() @ b[k0:k0 + 16].float()).half()
        out.copy_(acc)
    r = run(fn)
    assert not r.passed
    assert any("precision" in f and "above the bound" in f for f in r.failures)


def test_unwritten_output_fails():
    def fn(a, b, out, **kw):
        honest(P)(a, b, out, **kw)
        out[-3:, :].fill_(float("nan"))   # a tile skipped (left as the poison)
    r = run(fn)
    assert any("not written" in f for f in r.failures)


def test_partial_write_without_nan_reset_fails():
    def fn(a, b, out, **kw):
        full = torch.empty_like(out)
        honest(P)(a, b, full, **kw)
        out[:-1].copy_(full[:-1])          # last row never stored
    r = run(fn)
    assert not r.passed and any("not written" in f for f in r.failures)


def test_out_of_bounds_write_fails():
    def fn(a, b, out, **kw):
        honest(P)(a, b, out, **kw)
        storage = out.as_strided((out.numel() + 8,), (1,), out.storage_offset())
        storage[-8:].fill_(1.0)            # runs 8 elements past the end of out
    r = run(fn)
    assert any("out-of-bounds" in f for f in r.failures)


def test_write_before_out_fails():
    def fn(a, b, out, **kw):
        honest(P)(a, b, out, **kw)
        out.as_strided((4,), (1,), out.storage_offset() - 4).fill_(0.0)
    assert any("out-of-bounds" in f for f in run(fn).failures)


def test_modified_input_fails():
    def fn(a, b, out, **kw):
        honest(P)(a, b, out, **kw)
        a.mul_(0.5)                        # scratch space taken from an input
    r = run(fn)
    assert any("input A modified" in f for f in r.failures)


def test_constant_output_fails():
    r = run(lambda a, b, out, **_: out.fill_(1.0))
    assert any("same for two different input sets" in f for f in r.failures)


def test_input_independent_output_fails():
    memo = {}

    def fn(a, b, out, **kw):              # right once, then replays the first real answer
        if "out" not in memo and not torch.equal(a, torch.zeros_like(a)):
            honest(P)(a, b, out, **kw)
            if not torch.isnan(out).any():
                memo["out"] = out.clone()
        if "out" in memo:
            out.copy_(memo["out"])
        else:
            honest(P)(a, b, out, **kw)
    r = run(fn)
    assert not r.passed
    assert any("same for two different input sets" in f or "above the bound" in f for f in r.failures)


def test_kernel_that_raises_fails_with_the_reason():
    def fn(a, b, out, **_):
        raise ValueError("no kernel for this shape")
    r = run(fn)
    assert not r.passed and "ValueError: no kernel for this shape" in r.failures[0]


def test_returning_instead_of_writing_out_fails():
    r = run(lambda a, b, out, **_: (a.float() @ b.float()).half())
    assert any("not written" in f for f in r.failures)


def test_generic_problem_is_refused():
    from gemmgen.measure.errors import MeasureError
    with pytest.raises(MeasureError, match="shape-generic"):
        check(honest(P), Problem(None, 64, 64), device="cpu")


def test_short_k_skips_the_probe_and_says_so():
    p = Problem(16, 16, 16)
    r = check(honest(p), p, device="cpu")
    assert r.passed and any("precision probe skipped" in n for n in r.notes)


def test_result_serialises():
    import json
    d = run(honest(P)).to_dict()
    assert json.loads(json.dumps(d))["cases"][0]["name"] == "main"


def test_check_is_callable_however_imported():
    import gemmgen.measure as measure
    from gemmgen.measure.check import check as by_module
    fn = honest(P)
    assert by_module(fn, P, device="cpu").passed
    assert measure.check(fn, P, device="cpu").passed


# A gated epilogue: out = gate(A B_gate) * (A B_up) over the joined B (K x 2N).
GATED = [Problem(17, 300, 257, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked")),
         Problem(5, 64, 4096, b_major="row", epilogue=Epilogue(gate="gelu", halves="stacked", out_dtype="bf16")),
         Problem(9, 40, 96, b_major="col", epilogue=Epilogue(gate="relu", halves="stacked", out_dtype="f32"))]


def gated_kernel(epilogue, operand_dtype=torch.float32, swap_halves=False, fp16_accumulation=False):
    def fn(a, b, out, **_):
        n = out.shape[1]
        if fp16_accumulation:
            acc = torch.zeros((a.shape[0], 2 * n), dtype=torch.float16)
            for k0 in range(0, a.shape[1], 16):
                acc = (acc.float() + a[:, k0:k0 + 16].float() @ b[k0:k0 + 16].float()).half()
            acc = acc.float()
        else:
            acc = a.to(operand_dtype).float() @ b.to(operand_dtype).float()
        if swap_halves:
            acc = torch.cat([acc[:, n:], acc[:, :n]], dim=1)
        out.copy_(apply_epilogue(acc, epilogue).to(out.dtype))
    return fn


@pytest.mark.parametrize("problem", GATED)
def test_gated_checks_pass_a_correct_kernel_and_the_unfused_baseline(problem):
    from gemmgen.measure.baselines import make

    fn = gated_kernel(problem.epilogue)
    r = check(fn, problem, seed=7, device="cpu")
    assert r.passed, r.failures
    assert 0 < r.max_rel_err < r.bound
    if problem.epilogue.out_dtype == "f16":     # torch.matmul writes only the operands' dtype
        baseline = make("torch", problem)
        assert check(baseline.fn, baseline.problem, seed=7, device="cpu").passed


@pytest.mark.parametrize("problem", GATED)
@pytest.mark.parametrize("cheat", ["bf16 operands", "halves swapped", "fp16 accumulation"])
def test_gated_checks_catch_cheats(problem, cheat):
    fn = gated_kernel(problem.epilogue, operand_dtype=torch.bfloat16 if cheat == "bf16 operands" else torch.float32,
                      swap_halves=cheat == "halves swapped", fp16_accumulation=cheat == "fp16 accumulation")
    r = check(fn, problem, seed=7, device="cpu")
    assert not r.passed, (cheat, r.max_rel_err, r.bound)
