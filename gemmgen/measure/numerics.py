"""The arithmetic of honest measurement, with no GPU: error bounds, floors, buckets, means.

Error bound (relative Frobenius norm, one check case):

    rel_err = ||out - ref||_F / ||ref||_F
    bound   = C_OUT * u_out + LAMBDA * sqrt(K) * u_acc * |alpha| * ||A||_F * ||B||_F / ||ref||_F

`u_out` is the unit roundoff of the output type (2^-11 for f16), `u_acc` that of the
declared accumulator (2^-24 for f32). The first term pays for rounding the result to
the output type, up to C_OUT = 4 roundings (an unfused epilogue rounds after the product,
the bias, the activation and the residual). The second is the probabilistic bound of a
length-K dot product (error ~ sqrt(K) u sum|a||b|, Higham and Mary 2019) with
||A||_F ||B||_F standing in for || |A||B| ||_F (never smaller); LAMBDA = 4 leaves room for
tensor-core rounding that truncates. It grows with K, and it grows with how far partial
sums rise above the result, which is what the precision probe exploits: there the
partial sums reach 2^14, where an fp16 accumulator keeps steps of 16, while the result
stays near sqrt(K); fp32 accumulation passes with a margin of 10x, fp16 accumulation
(rounded every 1 to 256 products) fails by 5x-100x (tests/test_measure_numerics.py).

Elementwise bound (beside the normwise one, so a few wrong elements cannot hide in a norm):

    |out - ref|_ij <= ELEMENT_C * (u_out * S_ij + sqrt(K) * u_acc * |alpha| * (|A||B|)_ij) + TINY

S_ij = |ref| + |alpha * AB| + |beta * C| + |bias| + |residual| at (i, j): every value an
unfused epilogue can round (each rounding to the output type errs by at most u_out times the
value rounded, and the values rounded are sums of these terms; an activation's slope is at
most 1.13, GELU's). (|A||B|)_ij = sum_k |a_ik||b_kj| is the scale of one dot product's
accumulation error (Higham and Mary 2019, as above). ELEMENT_C = 4 pays for up to four
output roundings (as C_OUT) and, for K <= 16, covers the deterministic worst case K*u_acc of
the accumulation; above that the sqrt(K) term is the probabilistic one, and a random-sign
dot product's real error (about u_acc * K / sqrt(2) * rms) stays near sqrt(K) times under it.
TINY is the output type's smallest subnormal: a result that rounds to zero errs by half that.

A gated epilogue, out = g(x) * y with x = A B_gate and y = A B_up (both accumulated in fp32), has
the same two terms by the product rule, with |g'| <= GATE_SLOPE and |g(x)| <= |x| for relu, silu
and GELU:

    S_ij = |ref| + (2 + GATE_SLOPE) |x||y|
    P_ij = GATE_SLOPE (|A||B_gate|)_ij |y| + |x| (|A||B_up|)_ij      (in place of (|A||B|)_ij)

S counts the unfused baseline's roundings (x and y rounded to the output type by the product,
g(x) rounded by the activation, the multiply rounded once more); P carries each half's
accumulation error through the product. The normwise bound of a gated case is
C_OUT u_out ||S||_F / ||ref||_F + LAMBDA sqrt(K) u_acc ||P||_F / ||ref||_F, from the same
elementwise scales (cases.py). Its output is a product of two accumulators, so random normal
inputs (|x| ~ sqrt(K)) would put it near K, and the precision probe's sums past fp16's range: A is
scaled by a power of two (`gated_input_scale`: ~K^-1/4 for random inputs, exact in fp16, the
probes' relative errors unchanged), which keeps |out| near sqrt(K).

The mantissa probe (`mantissa` case) makes input rounding visible at any K: every nonzero
value is +-2^e * (1 + 2^-7 + 2^-8), exact in fp16 (10 fraction bits) but halfway between two
bf16 values (7 fraction bits), so bf16 rounding (to nearest even: up to 1 + 2^-6; or
truncation: down to 1 + 2^-7) scales every input by the same 1 +- 2^-8 and the product by
about 1 +- 2^-7. The signs of A and B are chosen so every product is positive, and only
MANTISSA_TERMS positions of K are nonzero: tensor cores truncate as they accumulate, and on
the H200 a same-sign fp32 sum of 4,096 terms drifted by 2.3e-4 of the result (K times u_acc,
not sqrt(K)), which the elementwise bound would refuse; over 16 terms the drift is under
2^-20 while the bound is about 2^-9 |ref| (f16 out) and a bf16-rounded kernel errs by
2^-7 |ref| on every element, 4x over, at any K.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

UNIT_ROUNDOFF = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24, "f64": 2.0 ** -53}
C_OUT = 4.0
LAMBDA = 4.0
ELEMENT_C = 4.0
#: the largest slope of a gate activation (GELU's; relu's and silu's are at most 1.1)
GATE_SLOPE = 1.13
#: smallest positive subnormal of each output type
TINY = {"f16": 2.0 ** -24, "bf16": 2.0 ** -133, "f32": 2.0 ** -149, "f64": 2.0 ** -1074}

# Mantissa probe: |values| = 2^e * MANTISSA_SIGNIFICAND, halfway between two bf16 values.
MANTISSA_SIGNIFICAND = 1.0 + 2.0 ** -7 + 2.0 ** -8
MANTISSA_RESULT = 16.0       # the typical |ref| the probe's scale aims at (well inside fp16)
MANTISSA_MIN_EXPONENT = -12  # fp16 normals start at 2^-14; exponents spread +-1 around the scale
MANTISSA_TERMS = 16          # nonzero positions of K: the accumulation adds exact zeros elsewhere

# Precision probe: partial sums rise to PROBE_PEAK (fp16 spacing 16 there) and fall back.
PROBE_PEAK = 2.0 ** 14
PROBE_MIN_K = 32

BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("<1", 0.0, 1.0),
    ("1-16", 1.0, 16.0),
    ("16-256", 16.0, 256.0),
    (">256", 256.0, math.inf),
)


def error_bound(k: int, *, out_dtype: str = "f16", acc_dtype: str = "f32", alpha: float = 1.0,
                norm_a: float, norm_b: float, norm_ref: float) -> float:
    """The relative Frobenius error a correct kernel stays under (module docstring)."""
    if norm_ref <= 0.0:
        return math.inf
    u_out = UNIT_ROUNDOFF[out_dtype]
    u_acc = UNIT_ROUNDOFF[acc_dtype]
    growth = LAMBDA * math.sqrt(max(k, 1)) * u_acc * abs(alpha) * norm_a * norm_b / norm_ref
    return C_OUT * u_out + growth


def gated_error_bound(k: int, *, out_dtype: str, acc_dtype: str, norm_scale: float, norm_product: float,
                      norm_ref: float) -> float:
    """The relative Frobenius bound of a gated case, from ||S||_F and ||P||_F (module docstring)."""
    if norm_ref <= 0.0:
        return math.inf
    return (C_OUT * UNIT_ROUNDOFF[out_dtype] * norm_scale
            + LAMBDA * math.sqrt(max(k, 1)) * UNIT_ROUNDOFF[acc_dtype] * norm_product) / norm_ref


def gated_input_scale(k: int, case: str) -> float:
    """The power of two A is scaled by in a gated problem's cases (module docstring). The precision
    probe's results do not shrink with K (its partial sums peak at PROBE_PEAK whatever K is: |x|
    reaches ~2^10 at K = 33), so it takes 2^-5; the mantissa probe's results are small already."""
    if case == "mantissa":
        return 1.0
    if case == "precision":
        return 2.0 ** -5
    return 2.0 ** -(max(k, 1).bit_length() // 4)


def mantissa_exponent(k: int) -> int:
    """The exponent e0 of the mantissa probe's values (2^(e0 + {-1, 0, 1}) * significand) that
    puts a length-K dot product of them near MANTISSA_RESULT (mean |a b| is about 1.4 * 4^e0)."""
    e0 = round(0.5 * math.log2(MANTISSA_RESULT / (1.4 * max(k, 1))))
    return max(MANTISSA_MIN_EXPONENT, min(e0, 4))


def probe_offset(k: int) -> float:
    """Offset alpha = beta put on A and B so the running sum peaks at PROBE_PEAK at K/2."""
    half = max(k // 2, 1)
    return math.sqrt(PROBE_PEAK / half)


def bucket_of(gflop: float) -> str:
    """The size bucket (GFLOP = 2MNK/1e9) of anchors/README.md."""
    for name, lo, hi in BUCKETS:
        if lo <= gflop < hi:
            return name
    raise ValueError(f"no bucket for {gflop} GFLOP")


def bucket_names() -> tuple[str, ...]:
    return tuple(name for name, _, _ in BUCKETS)


def geomean(values: Iterable[float]) -> Optional[float]:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def median(values: Iterable[float]) -> Optional[float]:
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])


def quantile(sorted_vals: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty list."""
    if not sorted_vals:
        raise ValueError("quantile of nothing")
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def tflops(flops: int, seconds: float) -> float:
    return flops / seconds / 1e12
