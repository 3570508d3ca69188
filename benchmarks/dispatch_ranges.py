"""Dynamic M between measured batch sizes: is what gemmgen serves ever slower than torch.matmul?

For each (N, K) of `x @ W.T` given, `gemmgen.compile((None, N, K), b_major="col")` over the
shipped records (no tuning at any M of the sweep), and the kernel it serves at each M is timed
beside torch.matmul in one session (gemmgen.measure.time_many, offline, CUPTI device time, L2
flushed). Every M a program or library algorithm serves is first checked by the harness
(gemmgen.measure.check): a range's Ms were never measured, so this is where their numbers are
proven. Writes OUT/dispatch_ranges.json and prints one line per timed M; exits 1 if a check failed.

Two sweeps:
- default: every M of every `range` row (Ms between two measured ones where the same program
  won) and the measured ends;
- `--dense 512`: every M from 1 to 512. Where the table serves torch.matmul itself, the call is
  torch.matmul, so only every `--control-every`-th such M is timed, as a noise control
  (torch.matmul against itself); every other M is timed.

    python benchmarks/dispatch_ranges.py --out benchmarks/results/dispatch_ranges
    python benchmarks/dispatch_ranges.py --dense 512 --out benchmarks/results/dispatch_dense
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemmgen.measure.numerics import geomean

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from on_demand import side_by_side  # noqa: E402 - this folder's side-by-side timing

# (N, K) of Llama-2-7B's gate/up, q/k/v/o, joined qkv and down
WIDTHS = ((11008, 4096), (4096, 4096), (12288, 4096), (4096, 11008))


def sweep_ms(dynamic, dense: int | None, control_every: int) -> list[int]:
    """The Ms to time: the range rows and their ends, or every M to `dense` (torch-served ones sampled)."""
    if dense is None:
        ms = set()
        for row in (r for r in dynamic.rows if r.how == "range"):
            ms.update(range(row.ends[0], row.ends[1] + 1))
        return sorted(ms)
    served_torch = [m for m in range(1, dense + 1) if dynamic.kernel_for(m).provenance.how == "baseline"]
    controls = set(served_torch[::control_every])
    return [m for m in range(1, dense + 1) if m in controls or m not in served_torch]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dense", type=int, default=None, metavar="M", help="sweep every M from 1 to M")
    ap.add_argument("--control-every", type=int, default=32,
                    help="dense sweep: time every n-th M that torch.matmul itself serves")
    args = ap.parse_args(argv)

    import gemmgen
    from gemmgen.measure import check

    rows, counts = [], {}
    for n, k in WIDTHS:
        dynamic = gemmgen.compile((None, n, k), b_major="col")
        if args.dense:
            hows = [dynamic.kernel_for(m).provenance.how for m in range(1, args.dense + 1)]
            counts[f"{n}x{k}"] = {how: hows.count(how) for how in sorted(set(hows))}
        for m in sweep_ms(dynamic, args.dense, args.control_every):
            kernel = dynamic.kernel_for(m)
            problem = kernel.problem
            row = {"m": m, "n": n, "k": k, "how": kernel.provenance.how}
            if kernel.provenance.how != "baseline":      # torch.matmul itself needs no check here
                checked = check(kernel.fn, problem)
                row.update(passed=checked.passed, max_rel_err=checked.max_rel_err)
                if not checked.passed:
                    rows.append({**row, "failures": list(checked.failures)})
                    print(f"{m:>5}x{n}x{k} {kernel.provenance.how:>8} FAILED its check: "
                          + "; ".join(checked.failures), flush=True)
                    continue
            ms, timed = side_by_side({"gemmgen": kernel.fn}, problem)
            speedup = ms["torch"] / ms["gemmgen"] if ms["torch"] and ms["gemmgen"] else None
            rows.append({**row, "gemmgen_ms": ms["gemmgen"], "torch_ms": ms["torch"], "speedup": speedup})
            print(f"{m:>5}x{n}x{k} {kernel.provenance.how:>8} "
                  + (f"{speedup:.3f}x torch.matmul" if speedup else str(timed)), flush=True)
    summary = {}
    for how in sorted({r["how"] for r in rows}):
        got = [r["speedup"] for r in rows if r["how"] == how and r.get("speedup")]
        mine = [r for r in rows if r["how"] == how]
        summary[how] = {"checked": sum("passed" in r for r in mine),
                        "failed_check": sum(r.get("passed") is False for r in mine), "timed": len(got)}
        if got:
            summary[how].update(geomean=geomean(got), min=min(got), max=max(got))
    print(json.dumps({"served_per_width": counts, "timed": summary}, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dispatch_ranges.json").write_text(json.dumps(
        {"command": " ".join(sys.argv), "served_per_width": counts, "summary": summary, "rows": rows}, indent=1))
    return 1 if any(r.get("passed") is False for r in rows) else 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
