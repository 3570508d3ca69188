"""Variants of one problem against torch.matmul in one process: checked, then timed in turns.

The bench times each candidate in its own worker, beside its own torch.matmul. Probing what
limits a shape needs the other contest too: many variants in one process, taking turns, so
that every variant meets the same clocks (the H200's power cap moves them by what ran just
before). Benchmark scripts that ask such questions (`benchmarks/llama_compile.py` among them)
share these pieces:

- `checked_variants`: torch.matmul, its control (torch.matmul again, whose ratio to the first
  says how large the noise is), then every variant that passes the harness's check;
- `in_pairs`: the bench's own protocol for each variant in turn, an offline session
  (cold L2, CUPTI device time) of the variant and torch.matmul alone;
- `loop_ms`: one loop of back-to-back calls between two CUDA events;
- `turn_orders`, `in_turns`: the order of the variants in each repeat.

GPU only, apart from the bookkeeping (the tests stand in for the timers).
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable, Iterator, Sequence

from gemmgen.measure.comparison import median_interval
from gemmgen.measure.timing import TimingOptions, time_many


def loop_ms(call: Callable[[int], object], iters: int, sampler=None) -> float:
    """Mean ms a call over `iters` back-to-back calls `call(0)`, `call(1)`, ...; `sampler.sample()`
    (a `gemmgen.measure.clocks.ClockSampler`) runs while the GPU still runs the loop's tail."""
    # Deferred: torch (optional, heavy to import).
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        call(i)
    end.record()
    if sampler is not None:
        sampler.sample()
    end.synchronize()
    return start.elapsed_time(end) / iters


def turn_orders(n: int) -> list[list[int]]:
    """Orders of n variants, one per repeat in cycle, in which each variant follows every other
    equally often (a Williams square: n orders for even n, 2n for odd n).

    What ran just before a loop moves its clocks: under the power cap a loop that follows a
    light one starts cool. Rotating one order (`(j + r) % n`) keeps each variant's predecessor
    fixed, so the variant after the lightest always gains: in the Llama benchmark with one
    rotated order the default followed eager in 3 of 4 repeats, and a loop after eager ran about 4 % faster
    than one after a compiled variant."""
    if n < 1:
        return []
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(v + i) % n for v in first] for i in range(n)]
    return orders if n % 2 == 0 else orders + [order[::-1] for order in orders]


def in_turns(items: Sequence, repeats: int) -> Iterator[tuple[int, object]]:
    """(repeat, item) for every item in every repeat, each repeat in the next of `turn_orders`."""
    orders = turn_orders(len(items))
    for r in range(repeats):
        for i in orders[r % len(orders)]:
            yield r, items[i]


def pair_ms(fn, torch_fn, problem, seed: int) -> tuple[float, float]:
    """(variant, torch.matmul) device ms from one offline session of the two: the bench's protocol."""

    options = replace(TimingOptions(), host_reps=0, seed=seed)
    timed = time_many([("variant", fn, problem), ("torch", torch_fn, problem)], "offline", options=options)
    for t in timed.values():
        if isinstance(t, Exception):
            raise t
    return timed["variant"].device_ms, timed["torch"].device_ms


def checked_variants(problem, named: list[tuple[str, object, dict]], seed: int, rows: dict) -> dict:
    """{name: fn}: torch.matmul (the benches' own call) and its control, then every (name, fn, row)
    whose fn passes the harness's check on random inputs; each row gets the verdict and goes
    into `rows`."""
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.baselines import make
    from gemmgen.measure.cases import make_cases
    from gemmgen.measure.checking import check

    torch_fn = make("torch", problem).fn
    variants = {"torch": torch_fn, "torch (control)": torch_fn}
    cases = make_cases(problem, seed, "cuda")
    for name, fn, row in named:
        verdict = check(fn, problem, cases=cases)
        rows[name] = {**row, "passed": verdict.passed, "failures": list(verdict.failures)}
        if verdict.passed:
            variants[name] = fn
        print(f"{problem.m}x{problem.n}x{problem.k} {name}: check {'passed' if verdict.passed else 'FAILED'}",
              flush=True)
    return variants


def in_pairs(problem, variants: dict, rows: dict, repeats: int, seed: int) -> dict:
    """Each variant but "torch" (the control included) in its own offline session with
    variants["torch"], in the orders of `turn_orders`. A variant whose timing fails keeps
    its row with the failure and is timed no more. Rows gain the median ms, TFLOP/s, the
    per-repeat times and the per-repeat speedup over torch.matmul (median and 95 % interval)."""

    names = [n for n in variants if n != "torch"]
    times: dict = {n: [] for n in names}
    for r, n in in_turns(names, repeats):
        if n not in times:
            continue
        try:
            times[n].append(pair_ms(variants[n], variants["torch"], problem, seed + r))
        except Exception as exc:  # noqa: BLE001 - one variant's failed timing is its row, not the run's
            rows.setdefault(n, {"program": None}).setdefault("failures", []).append(f"timing: {exc}")
            del times[n]
    flop = 2 * problem.m * problem.n * problem.k
    for n, pairs in times.items():
        med = statistics.median(t for t, _ in pairs)
        rows.setdefault(n, {"program": None}).update(
            median_ms=med, tflops=flop / (med * 1e-3) / 1e12, times_ms=pairs, clocks={},
            vs_torch_median_ratio=[round(v, 4) for v in median_interval([ref / t for t, ref in pairs])])
    return {"shape": f"{problem.m}x{problem.n}x{problem.k}", "key": problem.key, "variants": rows}
