"""How long the tuning loop waits to start measurement workers side by side.

A would-be winner's confirmation runs in a worker that has run nothing (`Runner.run(...,
fresh=True)`); the runner keeps `standby` such workers started and starts them again together
once the last is taken, and the loop waits for that start (`Runner.ready(standby=True)`) so that
no start overlaps a timing. This times that wait: N workers started side by side, each to its
CUDA context, for each N given, `--repeats` times. Writes OUT/worker_starts.json.

    python benchmarks/worker_starts.py --out benchmarks/results/worker_starts --counts 1,3,6,8
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def time_starts(count: int, gpu: bool = True) -> float:
    """Seconds from starting `count` workers side by side until every one is ready."""
    from gemmgen.measure.worker import Runner

    runner = Runner(gpu=gpu, standby=count - 1)      # the active worker and count - 1 standbys
    start = time.perf_counter()
    runner.start_soon()
    runner.ready(standby=True)
    took = time.perf_counter() - start
    runner.close()
    return took


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--counts", default="1,3,6,8", help="numbers of workers started together")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        counts = [int(c) for c in args.counts.split(",") if c]
    except ValueError:
        ap.error(f"--counts {args.counts!r}: give whole numbers, e.g. 1,3,6,8")
    if not counts or min(counts) < 1:
        ap.error("--counts: each count is at least 1")

    from gemmgen.compile import gpu_present

    if not gpu_present():
        print("worker_starts: error: the workers open a CUDA context, and no GPU is visible here", file=sys.stderr)
        return 2
    from gemmgen.measure.env import environment

    rows = []
    for repeat in range(args.repeats):
        for count in counts:                 # interleaved, so drift falls on every count alike
            took = time_starts(count)
            rows.append({"count": count, "repeat": repeat, "seconds": took})
            print(f"{count} workers: {took:5.2f} s ({took / count:4.2f} s a worker)", flush=True)
    summary = {}
    for count in counts:
        median = statistics.median(r["seconds"] for r in rows if r["count"] == count)
        summary[str(count)] = {"median_s": median, "per_worker_s": median / count}
    print(json.dumps(summary, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "worker_starts.json").write_text(json.dumps(
        {"command": " ".join(sys.argv), "environment": environment(), "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
