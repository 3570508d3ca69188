"""On-demand tuning on layers no tuning saw, against cuBLASLt's search and the Triton space.

For each problem (`x @ W.T` layers of the layer set's held-out families, at the given Ms), in a
fresh database laid over the shipped records:
  1. `gemmgen.compile(shape, b_major="col", tune=SECONDS)`: what a user gets (wall time kept);
  2. the exhaustive run: cuBLASLt's search (skipped where step 1 ran it) and every program of
     the Triton search space (`--space` of them; `--exhaustive-backends` may add raw CUDA's),
     measured into the same database
     (`gemmgen.tune.on_demand.tune_now`);
  3. the kernel served before step 2, the one served after it (the best measured) and
     torch.matmul, timed side by side in one session (gemmgen.measure.time_many: offline,
     CUPTI device time, L2 flushed).
Writes OUT/on_demand.json and prints one line a problem and the geomeans.

    python benchmarks/on_demand.py --out benchmarks/results/on_demand --tune 10 --time-budget 200

`--fast-backends triton,cuda` lets the short budget propose raw CUDA's programs too (they build
through NVRTC in under a second), to measure against the default.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gemmgen.compile import gpu_present

REPO = Path(__file__).resolve().parent.parent
# (model, layer, M): the held-out families' layers at decode and small batch
PROBLEMS = (("gemma2_9b", "gate", 16), ("granite3_8b", "down", 64), ("phi3_medium", "qkv", 1),
            ("granite3_8b", "gate", 4), ("gemma2_9b", "down", 32), ("phi3_medium", "o", 16))


def layer_shapes(models_layers_ms) -> list[tuple[str, tuple[int, int, int]]]:
    """(name, (M, N, K)) of each (model, layer, M), read from the layer set."""
    import csv

    rows = [r for r in csv.reader(line for line in (REPO / "benchmarks/shapes/llm_layers.csv").open()
                                  if not line.startswith("#"))][1:]
    found = {(r[4], r[5], int(r[0])): (int(r[0]), int(r[1]), int(r[2])) for r in rows}
    missing = [f"{model}.{layer}.{m}" for model, layer, m in models_layers_ms if (model, layer, m) not in found]
    if missing:
        raise SystemExit(f"not rows of benchmarks/shapes/llm_layers.csv: {', '.join(missing)}")
    return [(f"{model}.{layer}", found[(model, layer, m)]) for model, layer, m in models_layers_ms]


def parse_problems(text: str) -> list[tuple[str, str, int]]:
    """'gemma2_9b.q.1,granite3_8b.down.1' -> [(model, layer, M), ...]."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = item.rsplit(".", 2)
        if len(parts) != 3 or not parts[2].isdigit():
            raise SystemExit(f"--problems: {item!r} is not MODEL.LAYER.M (e.g. gemma2_9b.q.1)")
        out.append((parts[0], parts[1], int(parts[2])))
    return out


def scratch_db(prefix: str) -> Path:
    """A fresh tuning database in a temporary folder that goes when the process ends: a run's
    figures live on in its results file, and a working database would only fill the disk."""
    work = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, work, True)
    return Path(work) / "tuning.sqlite"


def side_by_side(kernels: dict, problem) -> tuple[dict, dict]:
    """`kernels` (name -> fn) and torch.matmul timed in one session (gemmgen.measure.time_many):
    (name -> device ms, None where it was not timed; name -> Timing or its error)."""
    from gemmgen.measure.baselines import make
    from gemmgen.measure.timing import time_many

    timed = time_many([(name, fn, problem) for name, fn in kernels.items()]
                      + [("torch", make("torch", problem).fn, problem)])
    return {k: (None if isinstance(t, Exception) else t.device_ms) for k, t in timed.items()}, timed


def geomeans(rows: list[dict], keys) -> dict:
    """The geomean of each key over the rows that have them all."""
    from gemmgen.measure.numerics import geomean

    done = [r for r in rows if all(k in r for k in keys)]
    return {**({k: geomean([r[k] for r in done]) for k in keys} if done else {}), "problems": len(done)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tune", type=float, default=10.0, help="seconds of on-demand tuning a problem")
    ap.add_argument("--space", type=int, default=48, help="programs of the exhaustive run")
    ap.add_argument("--problems", default=None, metavar="MODEL.LAYER.M,...",
                    help="layers of the layer set to tune (default: " + ",".join(
                        f"{model}.{layer}.{m}" for model, layer, m in PROBLEMS) + ")")
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="start no new problem after S seconds; results are saved")
    ap.add_argument("--fast-backends", default=None, metavar="LIST",
                    help="the backends a budget under two minutes proposes, for this run (default: "
                         "gemmgen.tune.on_demand.FAST_BACKENDS), e.g. triton,cuda")
    ap.add_argument("--exhaustive-backends", default="cublaslt,triton", metavar="LIST",
                    help="what the exhaustive run searches (default: cublaslt,triton)")
    args = ap.parse_args(argv)

    import gemmgen
    from gemmgen.compile import clear_cache
    from gemmgen.errors import GemmgenError
    from gemmgen.measure.env import environment
    from gemmgen.tune import on_demand as on_demand_tuning, parse_backends
    from gemmgen.tune.on_demand import tune_now

    fast_backends = None
    try:
        if args.fast_backends:
            library, fast_backends = parse_backends(args.fast_backends)
            if library is not False:
                raise GemmgenError("--fast-backends names program backends only (the library search has its own "
                                   "rule, gemmgen.tune.library_first)")
        parse_backends(args.exhaustive_backends)
    except GemmgenError as exc:
        ap.error(str(exc))
    exhaustive_backends = tuple(b for b in args.exhaustive_backends.split(",") if b)
    if not gpu_present():
        print("on_demand: error: tuning on demand needs a CUDA GPU, and none is visible here", file=sys.stderr)
        return 2
    if fast_backends:
        on_demand_tuning.FAST_BACKENDS = fast_backends     # this process only: the run's experiment
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = scratch_db("gemmgen-on-demand-")

    def save(rows: list) -> dict:
        summary = geomeans(rows, ("on_demand_x_torch", "exhaustive_x_torch", "on_demand_of_exhaustive"))
        summary.update(mean_tune_s=sum(r["tune_s"] for r in rows) / max(1, len(rows)))
        (out / "on_demand.json").write_text(json.dumps({
            "command": " ".join(sys.argv), "environment": environment(), "tune_s": args.tune,
            "space": args.space, "fast_backends": list(on_demand_tuning.FAST_BACKENDS),
            "exhaustive_backends": list(exhaustive_backends), "summary": summary, "rows": rows}, indent=1))
        return summary

    rows, start = [], time.monotonic()
    for name, shape in layer_shapes(parse_problems(args.problems) if args.problems else PROBLEMS):
        if args.time_budget is not None and time.monotonic() - start > args.time_budget:
            break
        t0 = time.monotonic()
        with contextlib.redirect_stderr(io.StringIO()) as said:
            on_demand = gemmgen.compile(shape, b_major="col", tune=args.tune, db=db)
        tune_s = time.monotonic() - t0
        # compile's summary line: the loop's seconds by part; the rest of tune_s is starting up
        tuned_line = next((line for line in said.getvalue().splitlines() if line.startswith("gemmgen: tuned")), "")
        print(tuned_line, file=sys.stderr)
        t0 = time.monotonic()
        tune_now([on_demand.problem], db=db, budget=args.space, backends=exhaustive_backends)
        exhaustive_s = time.monotonic() - t0
        clear_cache()
        best = gemmgen.compile(shape, b_major="col", db=db)
        problem = best.problem
        ms, _ = side_by_side({"on_demand": on_demand.fn, "exhaustive": best.fn}, problem)
        row = {"layer": name, "problem": problem.key, "tune_s": tune_s, "tuned_line": tuned_line,
               "exhaustive_s": exhaustive_s,
               "on_demand_served": on_demand.provenance.summary, "exhaustive_served": best.provenance.summary,
               **{f"{k}_ms": v for k, v in ms.items()}}
        if all(ms.values()):
            row.update(on_demand_x_torch=ms["torch"] / ms["on_demand"], exhaustive_x_torch=ms["torch"] / ms["exhaustive"],
                       on_demand_of_exhaustive=ms["exhaustive"] / ms["on_demand"])
        rows.append(row)
        save(rows)      # after every problem: a run stopped later keeps what it measured
        print(f"{name:>18} {problem.m}x{problem.n}x{problem.k}: tuned {tune_s:5.1f} s -> "
              f"{row.get('on_demand_x_torch', 0):.3f}x torch; whole space {exhaustive_s:5.1f} s -> "
              f"{row.get('exhaustive_x_torch', 0):.3f}x; on-demand/exhaustive {row.get('on_demand_of_exhaustive', 0):.3f}",
              flush=True)
    print(json.dumps(save(rows), indent=1))
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
