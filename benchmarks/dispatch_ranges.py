"""Dynamic M between measured batch sizes: is the re-bound program still faster?

For each (N, K) of `x @ W.T` given, `gemmgen.compile((None, N, K), b_major="col")` over the
shipped records; every M of every `range` row (Ms between two measured ones where the same
program won) and the two measured ends is timed beside torch.matmul in one session
(gemmgen.measure.time_many, offline, CUPTI device time, L2 flushed). Writes
OUT/dispatch_ranges.json and prints one line per M.

    python benchmarks/dispatch_ranges.py --out benchmarks/results/dispatch_ranges
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

WIDTHS = ((11008, 4096), (4096, 4096), (12288, 4096))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import gemmgen
    from gemmgen.measure.baselines import make
    from gemmgen.measure.timing import time_many

    rows = []
    for n, k in WIDTHS:
        dynamic = gemmgen.compile((None, n, k), b_major="col")
        for row in (r for r in dynamic.rows if r.how == "range"):
            for m in range(row.ends[0], row.ends[1] + 1):
                kernel = dynamic.kernel_for(m)
                problem = kernel.problem
                timed = time_many([("gemmgen", kernel.fn, problem), ("torch", make("torch", problem).fn, problem)])
                ms = {name: (None if isinstance(t, Exception) else t.device_ms) for name, t in timed.items()}
                speedup = ms["torch"] / ms["gemmgen"] if ms["torch"] and ms["gemmgen"] else None
                rows.append({"m": m, "n": n, "k": k, "how": kernel.provenance.how, "gemmgen_ms": ms["gemmgen"],
                             "torch_ms": ms["torch"], "speedup": speedup})
                print(f"{m:>5}x{n}x{k} {kernel.provenance.how:>6} "
                      + (f"{speedup:.3f}x torch.matmul" if speedup else str(timed)), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dispatch_ranges.json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
