"""The noise of a same-session speedup: pure arithmetic over paired rounds, no GPU."""
import random

import pytest

from gemmgen.measure.comparison import MIN_PAIRS, REPLICATE_NOISE, median_interval, speedup_noise


def test_median_interval_brackets_the_median_by_order_statistics():
    xs = list(range(1, 201))                       # 200 values: the 95 % ranks are 86 and 115
    lo, mid, hi = median_interval(xs)
    assert (lo, mid, hi) == (86, 100.5, 115)
    assert median_interval([3.0]) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        median_interval([])


def test_drift_shared_by_both_kernels_is_not_noise():
    """Clocks falling through the session widen each time's spread, not their ratio."""
    clock = [1.0 + 0.15 * i / 99 for i in range(100)]          # 15 % slower by the end
    kernel = [0.97 * c for c in clock]
    reference = [1.00 * c for c in clock]
    assert speedup_noise(kernel, reference) == REPLICATE_NOISE


def test_rounds_that_disagree_widen_the_noise_past_the_floor():
    rng = random.Random(1)
    kernel = [0.97 * (1 + rng.gauss(0, 0.10)) for _ in range(30)]
    reference = [1.0] * 30
    noise = speedup_noise(kernel, reference)
    assert noise > REPLICATE_NOISE


def test_too_few_rounds_give_no_noise():
    assert speedup_noise([1.0] * (MIN_PAIRS - 1), [1.1] * (MIN_PAIRS - 1)) is None
    assert speedup_noise([1.0] * MIN_PAIRS, [1.1] * MIN_PAIRS) == REPLICATE_NOISE


def test_rounds_pair_by_position_and_unequal_lengths_pair_the_common_rounds():
    kernel = [1.0] * 40
    reference = [1.05] * 20                        # the reference ran fewer rounds
    assert speedup_noise(kernel, reference) == REPLICATE_NOISE
