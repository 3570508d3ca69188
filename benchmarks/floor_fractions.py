"""How close each library call and gemmgen's best program came to the bandwidth floor, per M,
read from tuning trials (CPU: no timing here, only the device times the trials recorded).

Every trial of `gemmgen tune` / `benchmarks/tune_h200.py` carries the device times of the
baselines timed in its run (torch.matmul, cuBLAS, cuBLASLt heuristic and autotuned) beside its
program's. For each problem this takes torch.matmul's time, the fastest library call's and the
fastest checked program's, and reports per M the median fraction of the floor each reached
(the floor: the problem's fewest bytes at the datasheet's 4.8 TB/s, or its flops at peak) and
the geomean speedup of the best program over torch.matmul and over the fastest library call.

    python3 benchmarks/floor_fractions.py benchmarks/results/tune_llm_direct/trials.jsonl.gz \\
        benchmarks/results/tune_llm_small_m/trials.jsonl.gz --out benchmarks/results/tune_llm_direct/floor.txt
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

LIBRARY = ("torch", "cublas_nn", "cublas_tn", "lt_heuristic", "lt_autotune")


def read_trials(paths: list[str]) -> list[dict]:
    out = []
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def per_problem(trials: list[dict], mainloop: str | None) -> dict[str, dict]:
    """problem key -> torch's, the fastest library call's and the fastest checked program's ms
    (of programs with `mainloop`, when given), from the run of that fastest program."""
    from gemmgen.tuning_db.records import problem_from_key

    best: dict[str, dict] = {}
    for t in trials:
        if t.get("status") != "ok" or not t.get("device_ms") or not t.get("baselines"):
            continue
        if mainloop and f"mainloop {mainloop}" not in (t.get("program") or ""):
            continue
        if t["problem"] in best and best[t["problem"]]["program_ms"] <= t["device_ms"]:
            continue
        times = {name: (t["baselines"].get(name) or {}).get("device_ms") for name in LIBRARY}
        if not times["torch"]:
            continue
        problem = problem_from_key(t["problem"])
        best[t["problem"]] = {"m": problem.m, "floor_ms": problem.floor_s * 1e3, "torch_ms": times["torch"],
                              "library_ms": min(v for v in times.values() if v), "program_ms": t["device_ms"]}
    return best


def table(best: dict[str, dict]) -> str:
    by_m: dict[int, list[dict]] = defaultdict(list)
    for row in best.values():
        by_m[row["m"]].append(row)
    lines = [f"{'M':>5} {'problems':>8} {'torch/floor':>11} {'library/floor':>13} {'program/floor':>13} "
             f"{'program x torch':>15} {'program x library':>17}"]
    for m, rows in sorted(by_m.items()):
        frac = {k: statistics.median(r["floor_ms"] / r[k] for r in rows) for k in ("torch_ms", "library_ms", "program_ms")}
        vs_torch = math.exp(statistics.fmean(math.log(r["torch_ms"] / r["program_ms"]) for r in rows))
        vs_lib = math.exp(statistics.fmean(math.log(r["library_ms"] / r["program_ms"]) for r in rows))
        lines.append(f"{m:>5} {len(rows):>8} {frac['torch_ms']:>11.3f} {frac['library_ms']:>13.3f} "
                     f"{frac['program_ms']:>13.3f} {vs_torch:>15.3f} {vs_lib:>17.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trials", nargs="+", help="trials.jsonl(.gz) files of tuning runs")
    ap.add_argument("--mainloop", default=None, help="only programs of this mainloop (e.g. direct)")
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args(argv)
    missing = [p for p in args.trials if not Path(p).is_file()]
    if missing:
        ap.error(f"no such trials file: {', '.join(missing)}")
    best = per_problem(read_trials(args.trials), args.mainloop)
    if not best:
        print("no checked trial with baselines in these files", file=sys.stderr)
        return 1
    text = table(best) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
