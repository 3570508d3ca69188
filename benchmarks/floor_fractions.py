"""How close each library call and gemmgen's best program came to the bandwidth floor, per M,
read from tuning trials (CPU: no timing here, only the device times the trials recorded).

Every trial of `gemmgen tune` / `benchmarks/tune_h200.py` carries the device times of the
baselines timed in its run (torch.matmul, cuBLAS, cuBLASLt heuristic and autotuned) beside its
program's. For each problem this takes torch.matmul's time, the fastest library call's and the
fastest checked program's, and reports per M the median fraction of the floor each reached
(the floor: the problem's fewest bytes at the datasheet's 4.8 TB/s, or its flops at peak) and
the geomean speedup of the best program over torch.matmul and over the fastest library call;
then how many problems a program or a cuBLASLt choice won by the database's rules (a program
confirmed in a fresh worker), and the geomean speedup over torch.matmul of what serves them
(the larger of the two, as `gemmgen.compile` serves it, or 1.0 where torch.matmul serves): a
tuning figure, not a `gemmgen bench` run.

    python3 benchmarks/floor_fractions.py benchmarks/results/tune_llm_direct/trials.jsonl.gz \\
        benchmarks/results/tune_llm_small_m/trials.jsonl.gz --out benchmarks/results/tune_llm_direct/floor.txt
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

LIBRARY = ("torch", "cublas_nn", "cublas_tn", "lt_heuristic", "lt_autotune")


def read_trials(paths: list[str]) -> list[dict]:
    out = []
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rt") as f:
                out += [json.loads(line) for line in f if line.strip()]
        except (json.JSONDecodeError, UnicodeDecodeError, EOFError, OSError) as exc:
            raise SystemExit(f"floor_fractions: {path} is not a readable trials export "
                             f"({exc.__class__.__name__}: {exc})") from None
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


def served_speedups(paths: list[str]) -> dict[str, float]:
    """problem key -> torch.matmul's time over the served kernel's, for every problem where a
    program (as its confirmation measured it) or a cuBLASLt choice (beside torch.matmul in its
    search) won by the database's own rules; the larger where both did (the files merged into a
    temporary database; what `gemmgen.compile` serves from them)."""
    import tempfile

    from gemmgen.tuning_db import Database
    from gemmgen.tuning_db.exchange import merge

    with tempfile.TemporaryDirectory() as tmp:
        db = Database(Path(tmp) / "winners.sqlite")
        for path in paths:
            merge(db, path, verified=True)
        out = {}
        for device in {tuned.device_name for tuned in db.tuned_summary()}:
            for won in db.winners(device):
                torch = won.baselines.get("torch")
                if torch is not None and won.device_ms:
                    out[won.problem.key] = torch.device_ms / won.device_ms
            for choice in db.library_winners(device):
                key = choice.problem.key
                out[key] = max(out.get(key, 0.0), choice.torch_ms / choice.device_ms)
        db.close()
    return out


def table(best: dict[str, dict], served: dict[str, float]) -> str:
    """Per M: medians of fraction of the floor; geomeans of the best program's speedup (losers
    included) and of what serves (a winner's speedup, 1.0 where torch.matmul serves)."""
    from gemmgen.measure.numerics import geomean
    by_m: dict[int, list[tuple[str, dict]]] = defaultdict(list)
    for key, row in best.items():
        by_m[row["m"]].append((key, row))
    lines = [f"{'M':>5} {'problems':>8} {'torch/floor':>11} {'library/floor':>13} {'program/floor':>13} "
             f"{'program x torch':>15} {'program x library':>17} {'won':>5} {'served x torch':>14}"]
    for m, keyed in sorted(by_m.items()):
        rows = [row for _, row in keyed]
        frac = {k: statistics.median(r["floor_ms"] / r[k] for r in rows) for k in ("torch_ms", "library_ms", "program_ms")}
        vs_torch = geomean(r["torch_ms"] / r["program_ms"] for r in rows)
        vs_lib = geomean(r["library_ms"] / r["program_ms"] for r in rows)
        won = [served[key] for key, _ in keyed if key in served]
        vs_served = geomean(won + [1.0] * (len(keyed) - len(won)))
        lines.append(f"{m:>5} {len(rows):>8} {frac['torch_ms']:>11.3f} {frac['library_ms']:>13.3f} "
                     f"{frac['program_ms']:>13.3f} {vs_torch:>15.3f} {vs_lib:>17.3f} {len(won):>5} {vs_served:>14.3f}")
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
    text = table(best, served_speedups(args.trials)) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
