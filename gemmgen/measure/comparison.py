"""How sure a same-session speedup is: the noise the never-slower rule allows for.

A kernel and torch.matmul timed interleaved in one session (`timing.time_many`) share the
GPU's clock state, so their ratio is steadier than either time. On the H200, 32 served
cuBLASLt choices, timed again by a later run of the sample benchmark, measured within 0.8 %
(one standard deviation of the log ratio) of the speedup their tuning session recorded, while
the spread (p10 to p90) of each time was 1 to 16 %. Judged by that spread, 20 of those shapes'
choices (recorded 1.02-1.06x) could not serve. The 45 served in a second run, chosen under the
noise below, replicated within 1.04 % (out of sample); pooled over both, 0.95 %.

The noise of a speedup is the largest of
- the half-width of the 95 % interval of the median of per-round ratios (reference time over
  kernel time, the two calls of one round of the interleaved loop), distribution-free
  (binomial order statistics), relative to that median;
- the half-width of the 95 % interval of the speedup as recorded, the ratio of the two
  medians, from a paired bootstrap of the rounds. Under the power cap
  the median per-round ratio stayed within 0.2 % while each time spread 11-16 %, and the ratio
  of the medians moved by up to 2 % between sessions for one and the same kernel; the first
  interval cannot see that, this one can;
- `REPLICATE_NOISE`, two of those session-to-session standard deviations: what a later
  session can add that one session cannot see.
"""
from __future__ import annotations

import math
import random
from typing import Optional, Sequence

from gemmgen.measure.numerics import median, quantile

#: 2 x 0.95 %: the standard deviation of log(speedup in a later session / recorded speedup),
#: pooled over the 77 served cuBLASLt choices of two runs of the sample benchmark (0.80 % and
#: 1.04 %); server mode 1.0 % and 1.15 %.
REPLICATE_NOISE = 0.019
#: fewer paired rounds than this give no interval (the rule then falls back to the spread)
MIN_PAIRS = 10
#: bootstrap resamples of the rounds; seeded, so a session's noise is a function of its samples
BOOTSTRAP_RESAMPLES = 400
_Z95 = 1.96


def median_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(low, median, high): a 95 % interval of the median, from order statistics."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval of no values")
    mid = (xs[(n - 1) // 2] + xs[n // 2]) / 2
    half = _Z95 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)
    hi = min(n - 1, math.ceil(n / 2 + half))
    return xs[lo], mid, xs[hi]


def speedup_noise(kernel_ms: Sequence[float], reference_ms: Sequence[float]) -> Optional[float]:
    """Relative noise of reference/kernel from samples of one interleaved session, in round
    order (sample i of each was timed in round i). None when too few rounds pair up."""
    rounds = [(k, r) for k, r in zip(kernel_ms, reference_ms) if k > 0 and r > 0]
    if len(rounds) < MIN_PAIRS:
        return None
    lo, mid, hi = median_interval([r / k for k, r in rounds])
    b_lo, recorded, b_hi = ratio_of_medians_interval(rounds)
    return max(REPLICATE_NOISE, (mid - lo) / mid, (hi - mid) / mid,
               (recorded - b_lo) / recorded, (b_hi - recorded) / recorded)


def ratio_of_medians_interval(rounds: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """(low, value, high): median(reference) / median(kernel) over (kernel, reference) rounds
    and its 95 % paired-bootstrap interval (rounds resampled whole, so what the two calls of
    a round share stays shared)."""
    rng = random.Random(0)
    n = len(rounds)

    def ratio(sample) -> float:
        return median([r for _, r in sample]) / median([k for k, _ in sample])

    resampled = sorted(ratio([rounds[rng.randrange(n)] for _ in range(n)]) for _ in range(BOOTSTRAP_RESAMPLES))
    return quantile(resampled, 0.025), ratio(rounds), quantile(resampled, 0.975)


def speedup_lower_bound(device_ms: Optional[float], reference_ms: Optional[float],
                        noise: Optional[float]) -> Optional[float]:
    """The low end of the interval of a speedup reference/kernel with relative noise `noise`:
    speedup / (1 + noise). Above 1 is exactly the winners rule device_ms * (1 + noise) <
    reference_ms. None when a number is missing (nothing is proven)."""
    if not device_ms or not reference_ms or device_ms <= 0 or reference_ms <= 0 or noise is None:
        return None
    return reference_ms / device_ms / (1.0 + noise)
