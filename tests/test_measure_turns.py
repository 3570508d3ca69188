"""gemmgen.measure.turns on CPU: its loops and bookkeeping, with the timers stood in for (the
timings themselves run on the GPU)."""
from collections import Counter

import pytest
import torch

from gemmgen import dsl
from gemmgen.measure import turns

#: A CUTLASS ping-pong program at 4096^3: the problem the loops below are given.
PROGRAM = """gemm 4096x4096x4096 a=row b=row c=row in=f16 acc=f32
epilogue out=f16
backend cutlass
tile 128x128x64
warps 4x1
instr auto
cluster 1x2
stages auto
mainloop ws_pingpong
scheduler persistent
raster m swizzle=8
smem_swizzle auto
split_k 1
"""


def test_loop_ms_makes_every_call_between_its_events_and_samples_the_clock_before_waiting(monkeypatch):
    order = []
    event = type("Event", (), {"record": lambda self: order.append("record"),
                               "synchronize": lambda self: order.append("synchronize"),
                               "elapsed_time": lambda self, other: 3.0})
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: event())
    sampler = type("Sampler", (), {"sample": lambda self: order.append("sample")})()
    ms = turns.loop_ms(lambda i: order.append(i), 7, sampler)
    assert order == ["record", *range(7), "record", "sample", "synchronize"]
    assert ms == pytest.approx(3.0 / 7)
    order.clear()
    turns.loop_ms(lambda i: order.append(i), 2)                 # no sampler: nothing sampled
    assert order == ["record", 0, 1, "record", "synchronize"]


def test_in_pairs_takes_the_balanced_orders_and_keeps_a_failed_variant_as_its_row(monkeypatch):
    seen = []

    def pair_ms(fn, torch_fn, problem, seed):
        seen.append((fn, seed))
        assert torch_fn == "t"
        if fn == "broken":
            raise RuntimeError("floor violation")
        return (0.9, 1.0) if fn == "fast" else (1.0, 1.0)

    monkeypatch.setattr(turns, "pair_ms", pair_ms)
    problem = dsl.parse(PROGRAM).problem
    variants = {"torch": "t", "torch (control)": "t", "fast": "fast", "broken": "broken"}
    result = turns.in_pairs(problem, variants, {}, repeats=4, seed=10)
    rows = result["variants"]
    assert result["shape"] == "4096x4096x4096" and result["key"] == problem.key
    assert rows["fast"]["vs_torch_median_ratio"][1] == pytest.approx(1 / 0.9, rel=1e-3)
    assert rows["fast"]["median_ms"] == pytest.approx(0.9) and len(rows["fast"]["times_ms"]) == 4
    assert rows["fast"]["tflops"] == pytest.approx(2 * 4096 ** 3 / 0.9e-3 / 1e12)
    assert rows["torch (control)"]["vs_torch_median_ratio"][1] == pytest.approx(1.0)
    assert "median_ms" not in rows["broken"] and rows["broken"]["failures"] == ["timing: floor violation"]
    assert [f for f, _ in seen].count("broken") == 1           # timed no more once it failed
    # repeat r takes turn_orders(3)[r] ([0, 1, 2], then [1, 2, 0]: the failed one skipped), its own seed
    assert seen[:5] == [("t", 10), ("fast", 10), ("broken", 10), ("fast", 11), ("t", 11)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_turn_orders_give_every_variant_every_predecessor_equally_often(n):
    orders = turns.turn_orders(n)
    assert len(orders) == (n if n % 2 == 0 else 2 * n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    follows = Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) <= 1              # each ordered pair equally often
    walked = list(turns.in_turns(list("abcdef"[:n]), 2 * len(orders)))
    assert walked == [(r, "abcdef"[i]) for r in range(2 * len(orders)) for i in orders[r % len(orders)]]
    # the rotation it replaced fails this from 3 variants on: each variant had one predecessor
    rotated = {(o[j], o[j + 1]) for r in range(n) for o in [[(j + r) % n for j in range(n)]] for j in range(n - 1)}
    assert n < 3 or rotated == {(a, (a + 1) % n) for a in range(n)}


def test_checked_variants_keeps_torch_and_its_control_and_only_the_variants_that_pass(monkeypatch):
    from gemmgen.measure import baselines, cases, checking

    problem = dsl.parse(PROGRAM).problem
    monkeypatch.setattr(baselines, "make", lambda name, problem: type("B", (), {"fn": "torch_fn"})())
    monkeypatch.setattr(cases, "make_cases", lambda problem, seed, device: ["case"])

    def check(fn, problem, cases):
        assert cases == ["case"]
        return type("V", (), {"passed": fn == "good", "failures": [] if fn == "good" else ["NaN in output"]})()

    monkeypatch.setattr(checking, "check", check)
    rows = {}
    variants = turns.checked_variants(problem, [("a", "good", {"stages": 4}), ("b", "bad", {})], 1, rows)
    assert variants == {"torch": "torch_fn", "torch (control)": "torch_fn", "a": "good"}
    assert rows["a"] == {"stages": 4, "passed": True, "failures": []}
    assert rows["b"] == {"passed": False, "failures": ["NaN in output"]}

