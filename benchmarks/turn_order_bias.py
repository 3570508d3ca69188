"""What the loop before a loop did to it: each variant's median loop time by the variant timed
just before it, from a `llama_compile.py` results.json timed in the rotated order of sessions
10-22 (repeat r ran the variants in the order `(j + r) % n`, without warm loops).

Under the power cap a loop that follows a light one (eager, host-bound at 1,965 MHz) starts
cool and runs faster. The rotation kept each variant's predecessor fixed, except for the
first loop of a repeat, which followed the previous repeat's last. This script makes that
visible; `gemmgen.measure.turns.turn_orders` and the warm loops of `llama_compile.py` are the
fix. CPU only (it reads the file).

    python benchmarks/turn_order_bias.py benchmarks/results/llama_compile/session23/biased/results.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def by_predecessor(case_rows: list[dict]) -> dict:
    """{variant: {predecessor: [ms, ...]}} for one case's rows (in the order they were timed)."""
    names = [row["variant"] for row in case_rows]
    times = {row["variant"]: row["times_ms"] for row in case_rows}
    n, repeats = len(names), len(case_rows[0]["times_ms"])
    sequence = [names[(j + r) % n] for r in range(repeats) for j in range(n)]
    seen: dict = {name: 0 for name in names}
    out: dict = defaultdict(lambda: defaultdict(list))
    for pos, name in enumerate(sequence):
        before = sequence[pos - 1] if pos else "(none)"
        out[name][before].append(times[name][seen[name]])
        seen[name] += 1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="a llama_compile.py results.json timed in the rotated order")
    args = p.parse_args(argv)
    result = json.loads(args.results.read_text())
    if "no_warm" in result.get("args", {}):
        print(f"{args.results}: timed in balanced orders (session 23 on), not in the rotation this "
              "script reads", file=sys.stderr)
        return 2
    cases = list(dict.fromkeys(row["case"] for row in result["rows"]))
    print(f"{'case':18s} {'variant':13s} {'after':13s} {'loops':>5s} {'median ms':>9s}")
    for case in cases:
        table = by_predecessor([row for row in result["rows"] if row["case"] == case])
        for name, befores in table.items():
            for before, ms in sorted(befores.items()):
                print(f"{case:18s} {name:13s} {before:13s} {len(ms):5d} {statistics.median(ms):9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
