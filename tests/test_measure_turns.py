"""gemmgen.measure.turns on CPU: its loops and bookkeeping, with the timers stood in for (the
timings themselves ran on the H200, `benchmarks/results/epilogue_probe/` and `streamk_probe/`)."""
import json
from collections import Counter

import pytest
import torch

from gemmgen import dsl
from gemmgen.measure import turns

from benchmark_scripts import BENCHMARKS

PROGRAM = BENCHMARKS / "results" / "anchor_pairs" / "programs" / "cutlass_pingpong_4096.gemm"


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
    problem = dsl.parse(PROGRAM.read_text()).problem
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
    recorded = json.loads((BENCHMARKS / "results" / "anchor_pairs" / "pairs" / "results.json").read_text())
    assert recorded["shapes"][0]["variants"]["torch (control)"]["vs_torch_median_ratio"][0] <= 1.0


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

    problem = dsl.parse(PROGRAM.read_text()).problem
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


def test_turn_order_bias_groups_each_loop_by_the_loop_before_it():
    from benchmark_scripts import load_script

    by_predecessor = load_script("turn_order_bias").by_predecessor
    # rotated order over 3 repeats: a b c | b c a | c a b; each loop's time names its predecessor
    rows = [{"variant": "a", "times_ms": [1.0, 2.0, 3.0]}, {"variant": "b", "times_ms": [4.0, 5.0, 6.0]},
            {"variant": "c", "times_ms": [7.0, 8.0, 9.0]}]
    table = by_predecessor(rows)
    assert table["a"] == {"(none)": [1.0], "c": [2.0, 3.0]}     # a b c, b c [a], c [a] b
    assert table["b"] == {"a": [4.0, 6.0], "c": [5.0]}          # a [b] c, [b] after c, c a [b]
    assert table["c"] == {"b": [7.0, 8.0], "a": [9.0]}


def test_turn_order_bias_refuses_a_run_timed_in_the_balanced_orders(tmp_path, capsys):
    from benchmark_scripts import load_script

    results = tmp_path / "results.json"
    for no_warm in (False, True):                   # --no-warm drops the warm loops, not the balance
        results.write_text(json.dumps({"args": {"no_warm": no_warm}, "rows": []}))
        assert load_script("turn_order_bias").main([str(results)]) == 2
        assert "balanced orders" in capsys.readouterr().err
