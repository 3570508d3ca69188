"""`gemmgen bench`: run (default), `merge` shards, `report` from a saved results.json.

Heavy imports (torch, nvmath, matplotlib) happen inside the command functions.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from gemmgen.errors import GemmgenError
from gemmgen.measure import results as results_io
from gemmgen.measure.plots import plot_all
from gemmgen.measure.shapes import PARTS
from gemmgen.measure.timing import TimingOptions


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="check and time baselines and candidates over a shapes file",
        description="Check, then time (CUPTI device time, L2 flushed), torch/cuBLAS/cuBLASLt baselines and "
                    "candidates over a CSV of shapes; writes DIR/results.json and plots. "
                    "Subcommands: merge (shards), report (tables and plots from a saved run).",
    )
    p.add_argument("--shapes", help="CSV of M,N,K[,layout]; layout nn|nt|tn|tt (A then B; n = row-major, t = column-major)")
    p.add_argument("--mode", default="offline", choices=("offline", "server", "warm"),
                   help="offline: back to back, L2 flushed; server: seeded exponential gaps between calls; warm: no flush")
    p.add_argument("--baselines", default="torch,cublas,lt_heuristic,lt_autotune",
                   help="comma list of torch, cublas_nn, cublas_tn, cublas, lt_heuristic, lt_autotune (or 'none')")
    p.add_argument("--candidates", default="", help="comma list of candidate names (e.g. gemmgen) or module:function")
    p.add_argument("--out", help="output directory (results.json, speedup.png, buckets.png)")
    p.add_argument("--shard", help="i/n: take every n-th shape from the i-th (0-based)")
    p.add_argument("--part", choices=PARTS, default="all",
                   help="rows of a shapes file with a `# held_out:` line: all (default), the tuning part, "
                        "or the held-out families")
    p.add_argument("--min-m", type=int, default=None, metavar="M",
                   help="only the shapes with M at least this (with --max-m: a band, or one batch size)")
    p.add_argument("--max-m", type=int, default=None, metavar="M", help="only the shapes with M at most this")
    p.add_argument("--resume", action="store_true", help="skip shapes already complete in DIR/results.json")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop cleanly before the next shape once this much time has passed; results are saved")
    p.add_argument("--seed", type=int, default=None, help="check-input seed (default: fresh per shape, recorded)")
    p.add_argument("--reps", type=int, default=30, help="least timed calls per kernel (short kernels get more)")
    p.add_argument("--max-reps", type=int, default=200)
    p.add_argument("--mean-gap-ms", type=float, default=1.0, help="server mode: mean of the exponential gaps")
    p.add_argument("--timer", default="cupti", choices=("cupti", "events"),
                   help="device timer: CUPTI kernel records (default) or CUDA events on the calling stream (fallback)")
    p.add_argument("--no-isolate", action="store_true", help="run candidates in this process, not in the worker")
    p.add_argument("--same-session-reference", default="torch", metavar="BASELINE",
                   help="the baseline also timed inside each isolated candidate's worker session, interleaved "
                        "with it (default torch; lt_autotune autotunes there first)")
    p.add_argument("--trial-timeout", type=float, default=300.0, help="seconds a candidate trial may take")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_command)
    sub = p.add_subparsers(dest="bench_command", metavar="{merge,report}")
    m = sub.add_parser("merge", help="merge shard directories into one results.json")
    m.add_argument("dirs", nargs="+", help="directories (or results.json files) of the shards")
    m.add_argument("--out", required=True, dest="merge_out")
    m.set_defaults(func=merge_command)
    r = sub.add_parser("report", help="summary table and plots from a saved results.json (no GPU)")
    r.add_argument("dir", help="directory with results.json")
    r.set_defaults(func=report_command)


def run_command(args: argparse.Namespace) -> int:
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.bench import BenchConfig, run, table

    if not args.shapes or not args.out:
        raise GemmgenError("gemmgen bench needs --shapes FILE and --out DIR (or a subcommand: merge, report)")
    baselines = [] if args.baselines.strip().lower() == "none" else _names(args.baselines)
    cfg = BenchConfig(
        shapes=args.shapes, out=args.out, mode=args.mode, baselines=baselines,
        candidates=_names(args.candidates), shard=args.shard, part=args.part,
        min_m=args.min_m, max_m=args.max_m, resume=args.resume,
        time_budget_s=args.time_budget, seed=args.seed,
        timing=TimingOptions(min_reps=args.reps, max_reps=max(args.max_reps, args.reps),
                             mean_gap_s=args.mean_gap_ms * 1e-3, timer=args.timer),
        isolate=not args.no_isolate, trial_timeout_s=args.trial_timeout, progress=not args.no_progress,
        reference=args.same_session_reference,
        command="gemmgen " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    )
    doc = run(cfg)
    plot_all(doc, args.out)
    print(table(doc))
    return 0


def merge_command(args: argparse.Namespace) -> int:
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.bench import table

    meta, rows = results_io.merge([results_io.load(d) for d in args.dirs])
    doc = results_io.save(args.merge_out, meta, rows)
    plot_all(doc, args.merge_out)
    print(table(doc))
    return 0


def report_command(args: argparse.Namespace) -> int:
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.bench import table

    doc = results_io.refresh(args.dir)   # summary recomputed
    made = plot_all(doc, args.dir)
    print(table(doc))
    print("wrote " + ", ".join(str(p) for p in made))
    return 0
