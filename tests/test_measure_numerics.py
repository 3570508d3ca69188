"""The error bound, the precision probe, floors and buckets: arithmetic that needs no GPU."""
import math

import pytest
import torch

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.measure import numerics
from gemmgen.measure.cases import make_case, make_cases, reference


def _rel_err(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def _accumulate(a, b, chunk, acc_dtype):
    """Emulate a kernel's K loop: partial products of `chunk` in fp32, added into an
    accumulator of `acc_dtype` (rounded there after every chunk), output cast to fp16."""
    m, k = a.shape
    steps = k // chunk
    parts = torch.einsum("msc,scn->smn", a.float().reshape(m, steps, chunk), b.float().reshape(steps, chunk, -1))
    acc = torch.zeros(parts.shape[1:], dtype=acc_dtype)
    for part in parts:
        acc = (acc.float() + part).to(acc_dtype)
    return acc.to(torch.float16)


@pytest.mark.parametrize("k", [64, 512, 4096])
def test_precision_probe_fails_fp16_accumulation_and_passes_fp32(k):
    case = make_case(Problem(16, 24, k), "precision", seed=11, device="cpu")
    fp32 = _rel_err(_accumulate(case.a, case.b, 16, torch.float32), case.ref)
    assert fp32 < case.bound / 5, (fp32, case.bound)
    for chunk in (1, 16, 32):
        if chunk >= k:
            continue
        fp16 = _rel_err(_accumulate(case.a, case.b, chunk, torch.float16), case.ref)
        assert fp16 > 3 * case.bound, (chunk, fp16, case.bound)


def test_probe_partial_sums_climb_to_the_peak_and_cancel():
    k = 1024
    case = make_case(Problem(8, 8, k), "precision", seed=3, device="cpu")
    partial = case.a[:, : k // 2].double() @ case.b[: k // 2].double()
    assert partial.abs().mean() == pytest.approx(numerics.PROBE_PEAK, rel=0.1)
    assert case.ref.abs().mean() < partial.abs().mean() / 20
    assert partial.abs().max() < 65504  # fp16 would round, not overflow: the probe tests precision


def test_main_case_fp32_passes_with_room():
    case = make_case(Problem(32, 32, 2048), "main", seed=5, device="cpu")
    err = _rel_err(_accumulate(case.a, case.b, 64, torch.float32), case.ref)
    assert err < case.bound / 3


def test_bound_grows_with_k_and_with_partial_sum_size():
    b1 = numerics.error_bound(64, norm_a=8.0, norm_b=8.0, norm_ref=8.0)
    b2 = numerics.error_bound(4096, norm_a=64.0, norm_b=64.0, norm_ref=64.0)
    assert b2 > b1 > numerics.C_OUT * numerics.UNIT_ROUNDOFF["f16"]
    assert numerics.error_bound(64, norm_a=8, norm_b=8, norm_ref=0.0) == math.inf
    # the formula as documented
    expect = 4 * 2 ** -11 + 4 * math.sqrt(100) * 2 ** -24 * 2.0 * 3 * 5 / 7
    assert numerics.error_bound(100, alpha=-2.0, norm_a=3, norm_b=5, norm_ref=7) == pytest.approx(expect)


def test_bf16_output_gets_a_wider_bound():
    f16 = numerics.error_bound(256, out_dtype="f16", norm_a=1, norm_b=1, norm_ref=1)
    bf16 = numerics.error_bound(256, out_dtype="bf16", norm_a=1, norm_b=1, norm_ref=1)
    assert bf16 > 7 * f16


def test_cases_are_seeded_and_distinct():
    p = Problem(16, 24, 64)
    c1 = make_cases(p, 7, "cpu")
    c2 = make_cases(p, 7, "cpu")
    assert [c.name for c in c1] == ["main", "precision", "mantissa", "second"]
    assert all(torch.equal(x.a, y.a) for x, y in zip(c1, c2))
    assert not torch.equal(c1[0].a, c1[3].a)
    assert [c.seed for c in c1] == [7, 8, 9, 10]
    short = make_cases(Problem(16, 24, 16), 7, "cpu")
    assert [c.name for c in short] == ["main", "mantissa", "second"]


def test_reference_applies_the_epilogue_in_order():
    ep = Epilogue(alpha=0.5, beta=2.0, bias="m", activation="relu", residual=True)
    p = Problem(4, 5, 6, epilogue=ep)
    case = make_case(p, "main", 1, "cpu")
    acc = case.a.double() @ case.b.double()
    want = torch.relu(0.5 * acc.float() + 2.0 * case.c.float() + case.bias.float()[:, None]) + case.residual.float()
    assert torch.allclose(case.ref, want)
    assert torch.allclose(reference(case.a, case.b, Epilogue()), acc.float())


def test_floor_is_the_larger_of_compute_and_bytes():
    big = Problem(8192, 8192, 8192)
    assert big.floor_s == pytest.approx(2 * 8192 ** 3 / 989e12)
    thin = Problem(64, 64, 8192)
    assert thin.floor_s == pytest.approx(2 * (64 * 8192 * 2 + 64 * 64) / 4.8e12)


@pytest.mark.parametrize("gflop,bucket", [(0.0005, "<1"), (0.99, "<1"), (1.0, "1-16"), (15.9, "1-16"),
                                          (16.0, "16-256"), (255.0, "16-256"), (256.0, ">256"), (4398.0, ">256")])
def test_buckets(gflop, bucket):
    assert numerics.bucket_of(gflop) == bucket


def test_geomean_median_quantile():
    assert numerics.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert numerics.geomean([None, 0.0, float("nan")]) is None
    assert numerics.median([3.0, 1.0, 2.0, 10.0]) == 2.5
    assert numerics.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(1.4)
