"""The best program of each backend (and of each family) per shape, from the tuning trials.

    python benchmarks/backend_report.py benchmarks/results/tune_h200/trials.jsonl.gz \
        --out benchmarks/results/backends_sample100_offline

A tuning run measures every candidate (checked, then timed in the isolated worker) and the
baselines of the same run, so its trials already answer "how fast is the best Triton (or
CUTLASS, or raw CUDA) program per shape": this script reads them, no GPU needed, and writes
the `gemmgen bench` format (results.json, speedup.png, buckets.png). Names: the backend
(`triton`, `cutlass`, `cuda`) and, for raw CUDA, each family (`cuda_multistage`,
`cuda_hopper` = ws_cooperative or ws_pingpong); the baselines are those of the trial's run.

Caveat, kept in the output's meta: the baselines were timed in the tuning process, the
candidate in its worker, one after the other, not interleaved as `gemmgen bench` does.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gemmgen.errors import GemmgenError
from gemmgen.measure import plots, results
from gemmgen.measure.bench import layout_letters
from gemmgen.measure.numerics import bucket_of, tflops
from gemmgen.tuning_db import Trial
from gemmgen.tuning_db.exchange import read_jsonl



def series(trial) -> list[str]:
    """The result names one trial counts towards."""
    names = [trial.backend]
    if trial.backend == "cuda":
        names.append("cuda_multistage" if "mainloop multistage" in trial.program else "cuda_hopper")
    return names


def row(name: str, kind: str, problem, device_ms: float, spread, **extra) -> dict:
    m, n, k = problem.m, problem.n, problem.k
    gflop = 2.0 * m * n * k / 1e9
    layout = layout_letters(problem)
    return {"name": name, "kind": kind, "m": m, "n": n, "k": k, "layout": layout, "shape_layout": layout,
            "gflop": gflop, "bucket": bucket_of(gflop), "device_ms": device_ms, "spread": spread,
            "tflops": tflops(problem.flops, device_ms * 1e-3), "floor_ms": problem.floor_s * 1e3,
            "fraction_of_floor": problem.floor_s * 1e3 / device_ms, "passed": True, "status": "ok", **extra}


def best_rows(trials) -> list[dict]:
    best: dict[tuple, object] = {}
    baselines: dict[str, object] = {}
    for t in trials:
        if t.status != "ok" or not t.check_passed or not t.device_ms or not t.problem.is_bound:
            continue
        for name in series(t):
            key = (t.problem.key, name)
            if key not in best or t.device_ms < best[key].device_ms:
                best[key] = t
        baselines.setdefault(t.problem.key, t)
    rows = []
    for (_, name), t in sorted(best.items()):
        rows.append(row(name, "candidate", t.problem, t.device_ms, t.spread, max_rel_err=t.max_rel_err,
                        program=t.program, trial_created=t.created))
    for t in baselines.values():
        for name, b in sorted(t.baselines.items()):
            if b.device_ms:
                rows.append(row(name, "baseline", t.problem, b.device_ms, b.spread))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trials", help="a tuning export (JSON lines), e.g. benchmarks/results/tune_h200/trials.jsonl.gz")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not Path(args.trials).is_file():
        ap.error(f"{args.trials}: no such file (give a tuning export, e.g. `gemmgen db export FILE`)")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        ap.error(f"--out {args.out} is a file; give a folder for the report")
    try:
        trials = [t for t in read_jsonl(args.trials) if isinstance(t, Trial)]   # library lines aside
    except GemmgenError as exc:
        ap.error(str(exc))
    rows = best_rows(trials)
    meta = {"command": " ".join(["python", "benchmarks/backend_report.py"] + (argv or sys.argv[1:])),
            "source": str(args.trials), "mode": "offline", "gpu": trials[0].device.name if trials else None,
            "note": "best checked trial per backend and shape from a tuning run; baselines timed in the same "
                    "run by the tuning process, candidates in its worker, one after the other"}
    doc = results.save(args.out, meta, rows)
    plots.plot_all(doc, args.out)
    s = doc["summary"]
    names = [n for n in s["names"] if n not in s["baselines"]]
    print(f"{s['n_shapes']} shapes; speedup over torch (geomean of torch time / best program time)")
    print(f"{'bucket':>8} " + " ".join(f"{n:>16}" for n in names))
    for bucket, entry in list(s["by_bucket"].items()) + [("all", s)]:
        cells = []
        for n in names:
            g, c = entry["geomean"].get(f"{n}/torch"), entry["geomean_n"].get(f"{n}/torch")
            cells.append(f"{g:10.3f} (n={c:3d})" if g else f"{'-':>16}")
        print(f"{bucket:>8} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
