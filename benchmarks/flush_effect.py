"""What the L2 flush between timed calls costs a memory-bound kernel: a flush that writes its
buffer against one that reads it.

A flush that fills a buffer of 4 x L2 leaves the L2 full of dirty lines; the timed kernel's
own reads then evict them, and their write-back to HBM lands inside its time. A flush that
reads the buffer leaves clean lines, whose eviction costs nothing. This times torch.matmul
(`x @ W.T`, as the user calls it) and cuBLASLt autotuning's pick at decode and small-batch
shapes, where the weight's bytes are the time, and at 4096^3, where they are not, under both
flushes in one session (gemmgen.measure.time_many, offline, CUPTI device time). Reports each
time and its fraction of the bandwidth floor (bytes / 4.8 TB/s).

    python benchmarks/flush_effect.py --out benchmarks/results/flush_effect
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHAPES = ((1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (1, 14336, 4096), (16, 4096, 14336),
          (128, 14336, 4096), (4096, 4096, 4096))
BASELINES = ("torch", "lt_autotune")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from gemmgen.dsl.ir import Problem
    from gemmgen.measure.baselines import make
    from gemmgen.measure.timing import TimingOptions, time_many

    rows = []
    for m, n, k in SHAPES:
        problem = Problem(m, n, k, b_major="col")
        kernels = [(name, make(name, problem).fn, problem) for name in BASELINES]
        for flush in ("write", "read"):
            timed = time_many(kernels, "offline", options=TimingOptions(flush=flush, check_floor=False))
            for name, t in timed.items():
                ms = None if isinstance(t, Exception) else t.device_ms
                rows.append({"m": m, "n": n, "k": k, "baseline": name, "flush": flush, "device_ms": ms,
                             "fraction_of_floor": problem.floor_s * 1e3 / ms if ms else None,
                             "error": str(t) if isinstance(t, Exception) else None})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "flush_effect.json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    lines = [f"{'shape':>16} {'baseline':>12} {'write-flush us':>14} {'floor':>6} {'read-flush us':>14} {'floor':>6}"]
    for m, n, k in SHAPES:
        for name in BASELINES:
            pair = {r["flush"]: r for r in rows if (r["m"], r["n"], r["k"], r["baseline"]) == (m, n, k, name)}
            w, r = pair["write"], pair["read"]
            if w["device_ms"] and r["device_ms"]:
                lines.append(f"{m:>4}x{n:>5}x{k:>5} {name:>12} {w['device_ms'] * 1e3:>14.1f} "
                             f"{w['fraction_of_floor']:>6.3f} {r['device_ms'] * 1e3:>14.1f} {r['fraction_of_floor']:>6.3f}")
    text = "\n".join(lines)
    (out / "table.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
