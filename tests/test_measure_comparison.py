"""The noise of a same-session speedup: pure arithmetic over paired rounds, no GPU."""
import math
import random

import pytest

from gemmgen.measure.comparison import (MIN_PAIRS, REPLICATE_NOISE, median_interval, ratio_of_medians_interval,
                                         speedup_noise)


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


def test_one_kernel_against_itself_under_the_power_cap_is_within_its_noise():
    """One kernel timed against itself while the clock flips between two states (what
    measured on the H200). The two calls of a round mostly
    share a state, so the per-round ratios are 1 and their interval is tight; but where the
    clock flipped between them (2 rounds of 30), the slow state is the majority of one
    time's samples and the minority of the other's, and the medians land in different
    states. The recorded speedup, a ratio of medians, is then 0.89x: the noise must cover it."""
    rng = random.Random(3)
    slow_kernel = set(range(16))                   # rounds where each call ran at the slow clock
    slow_reference = set(range(14))                # the clock flipped within rounds 14 and 15
    kernel = [(1.12 if i in slow_kernel else 1.0) * (1 + rng.gauss(0, 1e-4)) for i in range(30)]
    reference = [(1.12 if i in slow_reference else 1.0) * (1 + rng.gauss(0, 1e-4)) for i in range(30)]
    lo, mid, hi = median_interval([r / k for k, r in zip(kernel, reference)])
    assert hi / lo < 1.001                         # the per-round interval alone: the floor
    low, recorded, high = ratio_of_medians_interval(list(zip(kernel, reference)))
    assert recorded == pytest.approx(1 / 1.12, rel=1e-3) and low < recorded < high
    noise = speedup_noise(kernel, reference)
    assert abs(math.log(recorded)) <= math.log1p(noise)     # "the same speed", within noise


def test_the_bootstrap_is_seeded():
    rng = random.Random(4)
    kernel = [1 + rng.gauss(0, 0.05) for _ in range(50)]
    reference = [1 + rng.gauss(0, 0.05) for _ in range(50)]
    assert speedup_noise(kernel, reference) == speedup_noise(kernel, reference)


def test_the_model_benchmark_judges_a_speedup_by_repeats_paired_by_turn():
    from benchmark_scripts import load_script

    versus = load_script("llama_compile").versus
    rng = random.Random(3)
    drift = [1.0 + 0.08 * rng.random() for _ in range(15)]        # 8 % turn-to-turn drift, shared
    default = [10.0 * d for d in drift]
    faster = [9.8 * d * (1 + 0.002 * rng.uniform(-1, 1)) for d in drift]
    same = [10.0 * d * (1 + 0.002 * rng.uniform(-1, 1)) for d in drift]
    won = versus(faster, default)
    assert won["repeats"] == 15 and 1.0 < won["median_ratio"][0] <= won["median_ratio"][1] <= won["median_ratio"][2]
    assert abs(won["median_ratio"][1] - 10.0 / 9.8) < 0.005              # the 2 % gain, seen through the drift
    tied = versus(same, default)
    assert tied["median_ratio"][0] < 1.0 < tied["median_ratio"][2]
    assert versus(faster[:MIN_PAIRS - 1], default) is None


def test_the_model_benchmark_times_each_loop_after_a_warm_loop_of_its_own_in_balanced_orders(monkeypatch):
    """The H200's power cap carries a loop's draw into the next one's clock, so each
    timed loop follows an untimed loop of its own variant, and the turns take turn_orders."""
    import torch

    from benchmark_scripts import load_script
    from gemmgen.measure.turns import turn_orders

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)      # the wall-clock path
    script = load_script("llama_compile")
    log = []
    calls = [((lambda name=name: log.append(name)), (lambda: None)) for name in "abc"]
    times = script.time_interleaved(calls, iters=2, repeats=4)
    assert [len(t) for t in times] == [4, 4, 4]
    turns = log[9:]                                      # after 3 first calls of each variant
    expected = [name for r in range(4) for i in turn_orders(3)[r % 6] for name in ["abc"[i]] * 4]
    assert turns == expected                             # 2 warm calls, then 2 timed, per turn
    log.clear()
    script.time_interleaved(calls, iters=2, repeats=1, warm=False)
    assert log[9:] == ["a", "a", "b", "b", "c", "c"]     # --no-warm: the timed loops alone
