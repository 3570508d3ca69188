"""torch.matmul timed against itself, interleaved in one session, many sessions per shape: the
raw per-round samples, so the noise rule of `gemmgen.measure.comparison` can be judged on CPU.

Why: in `gemmgen_1000_offline_s9` two shapes served torch.matmul itself (the same cuBLAS kernel
as the reference) and measured 0.958x and 0.971x beside it, beyond their recorded noise (1.9 %).
Two identical kernels must agree within the noise in about 95 % of sessions, or the noise is
too small. Each session here is what a tuning worker does: the check of the kernel on random
inputs, then `time_many` of the pair, offline mode.

    python3 benchmarks/noise_probe.py --out benchmarks/results/noise_probe            # on the GPU
    python3 benchmarks/noise_probe.py --analyse benchmarks/results/noise_probe        # anywhere
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from gemmgen.measure.numerics import median

SHAPES = ((12288, 4096, 8192), (16384, 2048, 8192), (8192, 4096, 16384), (4096, 4096, 4096),
          (1024, 1024, 1024), (256, 128, 128), (64, 64, 64))


def measure(out: Path, sessions: int) -> None:
    from tqdm import tqdm

    from gemmgen.dsl.ir import Problem
    from gemmgen.measure import baselines
    from gemmgen.measure.checking import check
    from gemmgen.measure.timing import TimingOptions, time_many

    options = TimingOptions(host_reps=0)
    doc = {"options": {"min_reps": options.min_reps, "max_reps": options.max_reps}, "sessions": []}
    for m, n, k in tqdm(SHAPES, desc="shapes"):
        problem = Problem(m=m, n=n, k=k)
        one, two = baselines.make("torch", problem), baselines.make("torch", problem)
        for session in range(sessions):
            check(one.fn, problem, seed=session)
            got = time_many([("one", one.fn, problem), ("two", two.fn, problem)], "offline",
                            options=dataclasses.replace(options, seed=session))
            if any(isinstance(t, Exception) for t in got.values()):
                print(f"{m}x{n}x{k} session {session}: {got}")
                continue
            doc["sessions"].append({"m": m, "n": n, "k": k, "session": session,
                                    "one": list(got["one"].samples_ms), "two": list(got["two"].samples_ms),
                                    "clocks": got["one"].clocks})
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.json").write_text(json.dumps(doc))


def analyse(run: Path) -> dict:
    """Per session: the speedup as recorded (ratio of medians), the median of per-round ratios,
    and the noise of `comparison.speedup_noise`; per shape: how often two identical kernels
    were judged different beyond that noise."""
    from gemmgen.measure.comparison import REPLICATE_NOISE, median_interval, speedup_noise

    doc = json.loads((run / "samples.json").read_text())
    per_shape: dict = {}
    for s in doc["sessions"]:
        one, two = s["one"], s["two"]
        ratio = median(one) / median(two)               # "two" as the kernel, "one" the reference
        lo, rounds, hi = median_interval([a / b for a, b in zip(one, two)])
        row = per_shape.setdefault(f"{s['m']}x{s['n']}x{s['k']}",
                                   {"ratios": [], "noise": [], "per_round_noise": [], "per_round": []})
        row["ratios"].append(ratio)
        row["per_round"].append(rounds)
        row["noise"].append(speedup_noise(two, one))
        # the noise as it was before session 9: the per-round interval and the floor only
        row["per_round_noise"].append(max(REPLICATE_NOISE, (rounds - lo) / rounds, (hi - rounds) / rounds))
    summary = {}
    for shape, row in per_shape.items():
        def outside(noises: list) -> int:
            return sum(abs(math.log(r)) > math.log1p(z) for r, z in zip(row["ratios"], noises))
        summary[shape] = {"sessions": len(row["ratios"]), "outside_noise": outside(row["noise"]),
                          "outside_per_round_noise": outside(row["per_round_noise"]),
                          "ratio_min": round(min(row["ratios"]), 4), "ratio_max": round(max(row["ratios"]), 4),
                          "per_round_min": round(min(row["per_round"]), 4),
                          "per_round_max": round(max(row["per_round"]), 4),
                          "noise_median": round(median(row["noise"]), 4),
                          "noise_max": round(max(row["noise"]), 4)}
    (run / "analysis.json").write_text(json.dumps(summary, indent=1))
    print("outside: sessions whose ratio of medians lies beyond the noise (old: the per-round interval only)")
    print(f"{'shape':18} {'sessions':>8} {'outside':>7} {'old':>4} {'ratio min':>9} {'max':>6} {'rounds min':>10} "
          f"{'max':>6} {'noise med':>9} {'max':>6}")
    for shape, s in summary.items():
        print(f"{shape:18} {s['sessions']:8d} {s['outside_noise']:7d} {s['outside_per_round_noise']:4d} "
              f"{s['ratio_min']:9.3f} {s['ratio_max']:6.3f} {s['per_round_min']:10.3f} {s['per_round_max']:6.3f} "
              f"{s['noise_median']:9.3f} {s['noise_max']:6.3f}")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="measure on the GPU into this directory")
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--analyse", type=Path, help="analyse a measured directory (no GPU)")
    args = ap.parse_args(argv)
    if args.out:
        measure(args.out, args.sessions)
        analyse(args.out)
    elif args.analyse:
        analyse(args.analyse)
    else:
        ap.error("give --out (measure) or --analyse")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
