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
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

UNIT_ROUNDOFF = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24, "f64": 2.0 ** -53}
C_OUT = 4.0
LAMBDA = 4.0

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
