"""Tune a CSV of shapes on this GPU within a time budget, and ship the trials.

    python benchmarks/tune_h200.py --shapes benchmarks/shapes/cudal2_sample100.csv \
        --time-budget 420 --out benchmarks/results/tune_h200

Resumable across GPU sessions: OUT/trials.jsonl.gz (every trial of the run's shapes, the export
format) is merged into the working database first, tuning skips every (problem, program) pair
already measured on this GPU, and the script ends by writing OUT/trials.jsonl.gz again and
every trial into the shipped file of this GPU model (tuning_db/shipped/h200.jsonl.gz on the H200,
h100.jsonl.gz on an H100 80GB HBM3; merged with what is there): winners are a
query, and a problem tuned without a winner must be known as such, so that gemmgen.compile
serves the baseline there rather than a neighbour's program. A probe (`--ship ''`) works in a
database of its own, so its trials reach no shipped file. `--backends` may name `cublaslt`:
cuBLASLt's algorithms are searched first (`gemmgen.tune.tune_library`) and the choices travel
in the same files. Writes OUT/summary.json and prints a per-FLOP-bucket table last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gemmgen.measure.numerics import geomean

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from on_demand import scratch_db  # noqa: E402 - this folder's helpers

REPO = HERE.parent
TRIALS = "trials.jsonl.gz"      # the run's record, in the export format (gzip: results stay small)
EXPORT_EVERY_S = 30.0           # an export reads the whole working database (0.7 s at 10,000 trials)


def _shown(path: Path) -> str:
    """A path as the results record it: relative to the repository, never a machine's own."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def _ship_file(ship: str | None, gpu: str) -> Path | None:
    """The records file this run merges and rewrites: the one given, else this GPU model's
    shipped file; None for '' or a model gemmgen ships no records for (said, not guessed)."""
    from gemmgen.tuning_db.store import SHIPPED_FILE_OF_GPU

    if ship is not None:
        return Path(ship) if ship else None
    name = SHIPPED_FILE_OF_GPU.get(gpu)
    if name is None:
        print(f"no shipped records file for {gpu}: the trials stay in the run's export "
              f"(give --ship PATH to keep them elsewhere)")
        return None
    return REPO / "tuning_db" / "shipped" / name


def main(argv=None, *, make_runner=None, builder=None) -> int:
    """`make_runner(mode=, timeout_s=, baselines=)` and `builder` default to the GPU worker and
    the build pool; the tests pass fakes."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=str(REPO / "benchmarks/shapes/cudal2_sample100.csv"),
                    help="CSV of M,N,K[,layout] (its tuning part), or a file of problem keys, one a line "
                         "(benchmarks/shapes/model_e2e_missing.keys)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/tune_h200"))
    ap.add_argument("--db", default=None,
                    help="working database (default: tune_h200.sqlite in GEMMGEN_CACHE_DIR or ~/.cache/gemmgen, "
                         "or a new one in a temporary folder with --ship ''; OUT/trials.jsonl.gz is the record "
                         "that travels)")
    ap.add_argument("--ship", default=None,
                    help="records file to merge into and rewrite with this GPU's records ('' to skip; "
                         "default: this GPU model's file in tuning_db/shipped/)")
    ap.add_argument("--time-budget", type=float, default=420.0, metavar="S",
                    help="seconds for the tuning loop (export and summary come after)")
    ap.add_argument("--budget", type=int, default=6, help="trials per shape")
    ap.add_argument("--proposer", default="heuristic")
    ap.add_argument("--programs", metavar="PATH", default=None,
                    help="a .gemm file or a folder of them, re-bound to every shape they fit (implies "
                         "--proposer programs): the programs of an experiment, benchmarks/programs/")
    ap.add_argument("--backends", default="triton,cutlass,cuda",
                    help="program backends, and `cublaslt` for the library's own algorithms (searched first); "
                         "`auto`: that search where it wins on the records, and every backend (gemmgen tune's default)")
    ap.add_argument("--baselines", default="torch,cublas_nn,cublas_tn,lt_heuristic,lt_autotune")
    ap.add_argument("--mode", choices=("offline", "both"), default="offline")
    ap.add_argument("--shard", default=None, metavar="I/N")
    ap.add_argument("--epilogue", default=None,
                    help="epilogue for every shape, e.g. 'gate=silu halves=stacked' (N: the gate's columns)")
    ap.add_argument("--min-m", type=int, default=None, metavar="M",
                    help="only the shapes with M at least this (with --max-m: a band of batch sizes)")
    ap.add_argument("--max-m", type=int, default=None, metavar="M",
                    help="only the shapes with M at most this (a layer set's decode and small-batch rows)")
    ap.add_argument("--unwon", action="store_true",
                    help="only the shapes this GPU's records serve with torch.matmul (none tuned yet, or "
                         "nothing won): a wider --budget where the first programs found nothing")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--worker-timeout", type=float, default=60.0)
    ap.add_argument("--prebuild", action="store_true",
                    help="afterwards, build every compiled kernel of the shapes into the disk cache")
    args = ap.parse_args(argv)

    from gemmgen.compile import clear_cache, compile, prebuild
    from gemmgen.errors import GemmgenError
    from gemmgen.measure.numerics import bucket_names, bucket_of
    from gemmgen.measure.shapes import in_m_band
    from gemmgen.policy.proposers import proposer_for
    from gemmgen.tune import parse_backends, reports_summary, tune_backends
    from gemmgen.tune.adapters import PoolBuilder, WorkerRunner
    from gemmgen.cli.tune import tune_problems
    from gemmgen.tuning_db import Database, default_db_path
    from gemmgen.tuning_db.exchange import export, merge

    # the shapes, backends and proposer first: bad ones are refused before any database is made or merged
    try:
        problems = in_m_band(tune_problems(args.shapes, args.shard, args.epilogue), args.min_m, args.max_m,
                             args.shapes)
        library, program_backends = parse_backends(args.backends)
        proposer = (proposer_for(args.proposer, programs=args.programs, backends=program_backends)
                    if program_backends else None)
    except GemmgenError as exc:
        ap.error(str(exc))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.db:
        db_path = Path(args.db)
    elif args.ship == "":
        # A run that ships nothing (a probe) works in a database of its own: in the shared one its
        # trials would reach the shipped file with the next run on this machine that ships. Its
        # trials live on in OUT's export.
        db_path = scratch_db("gemmgen-probe-")
    else:
        db_path = default_db_path().with_name("tune_h200.sqlite")
    start = time.monotonic()
    db = Database(db_path)
    backends = tuple(b for b in args.backends.split(",") if b)
    make_runner = make_runner or WorkerRunner
    runner = make_runner(mode=args.mode, timeout_s=args.worker_timeout,
                         baselines=tuple(b for b in args.baselines.split(",") if b))
    ship = _ship_file(args.ship, runner.device.name)
    resumed = {}
    for source in (out / TRIALS, ship):
        if source is not None and source.is_file():
            # The run's own export and the project's shipped records: measured by this script.
            resumed[_shown(source)] = merge(db, source, verified=True)[0]
    if args.unwon:
        # read after the merge above, so that the shipped and the run's own records count
        problems = [p for p in problems if compile(p, device=runner.device.name, db=db).provenance.how == "baseline"]
        clear_cache()
        print(f"--unwon: {len(problems)} shapes served by torch.matmul on {runner.device.name}")
    keys = {p.key for p in problems}
    last_export = time.monotonic()
    memory_gib = []       # per problem: (held after it, peak during it), GiB

    def after_problem(_problem) -> None:
        """Note the GPU memory this process held at most during the problem and still holds
        after it (that should not grow from problem to problem), and export the run's trials
        every EXPORT_EVERY_S, so that a run killed from outside (a machine's time limit) still
        leaves what it measured."""
        nonlocal last_export
        memory_gib.append(_gpu_memory_gib())
        if time.monotonic() - last_export >= EXPORT_EVERY_S:
            export(db, out / TRIALS, problems=keys)
            last_export = time.monotonic()

    try:
        device = runner.device
        reports = tune_backends(problems, library=library, proposer=proposer,
                                builder=builder or PoolBuilder(jobs=args.jobs), runner=runner, db=db,
                                budget=args.budget, time_budget_s=args.time_budget, on_shape=after_problem,
                                announce=print)
    finally:
        getattr(runner, "close", lambda: None)()
        # this run's problems only (the working database also holds every shipped record);
        # exported even when the loop failed, so that nothing it measured is lost
        written = export(db, out / TRIALS, problems=keys)
    if ship is not None:
        # this GPU model's own file holds its records only; a file named by --ship keeps them all
        shipped = export(db, ship, devices=None if args.ship else {device.name})
    clear_cache()

    rows = []
    for p in problems:
        kernel = compile(p, device=device.name, db=db)
        prov = kernel.provenance
        measured = [t for t in db.trials(p.key, device.name) if t.status == "ok"]
        best_baseline = min((t.best_baseline[1].device_ms for t in measured if t.best_baseline), default=None)
        speedup = (prov.best_baseline_ms / prov.device_ms) if prov.measured_here else 1.0
        rows.append({"problem": p.key, "gflop": p.gflop, "bucket": bucket_of(p.gflop), "how": prov.how,
                     "measured_here": prov.measured_here,
                     "backend": kernel.backend, "trial": prov.trial_id, "device_ms": prov.device_ms,
                     "best_baseline": prov.best_baseline, "best_baseline_ms": prov.best_baseline_ms or best_baseline,
                     "speedup_over_best_baseline": speedup, "speedups": dict(prov.speedups),
                     "trials_ok": len(measured)})
    by_bucket = {}
    for name in bucket_names():
        sel = [r for r in rows if r["bucket"] == name]
        if sel:
            by_bucket[name] = {"shapes": len(sel), "won": sum(r["measured_here"] for r in sel),
                               "geomean_speedup": _geomean(r["speedup_over_best_baseline"] for r in sel)}
    summary = {
        "command": " ".join([Path(sys.executable).name] + sys.argv), "device": vars(device) | {},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "shapes_file": args.shapes,
        "shard": args.shard, "budget": args.budget, "proposer": f"{proposer.name} {proposer.version}" if proposer else None,
        "backends": backends, "resumed_trials": resumed,
        "report": reports_summary(reports, empty=""),
        "trials_exported": written, "shipped_trials": shipped if ship is not None else None,
        "elapsed_s": round(time.monotonic() - start, 1), "by_bucket": by_bucket,
        "gpu_memory_gib": _memory_summary(memory_gib),
        "geomean_speedup_over_best_baseline": _geomean(r["speedup_over_best_baseline"] for r in rows),
        "note": "speedup_over_best_baseline is what serves, as measured: a program winner over its run's best "
                "baseline, a cuBLASLt choice over torch.matmul in its session; other shapes count as 1.0 "
                "(compile() serves them a range's program or the baseline, not measured here: gemmgen bench "
                "measures those)",
        "rows": rows,
    }
    if args.prebuild:
        summary["prebuild"] = prebuild(problems, device=device.name, db=db, jobs=args.jobs)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"{'bucket':>14} {'shapes':>6} {'won':>5} {'geomean vs best baseline':>25}")
    for name, b in by_bucket.items():
        print(f"{name:>14} {b['shapes']:6d} {b['won']:5d} {b['geomean_speedup']:25.3f}")
    print(f"{'all':>14} {len(rows):6d} {sum(r['measured_here'] for r in rows):5d} "
          f"{summary['geomean_speedup_over_best_baseline']:25.3f}")
    return 0


def _gpu_memory_gib() -> tuple[float, float] | None:
    """GiB of live torch tensors in this process now, and at most since the last call (None
    without a GPU); the measuring workers are processes of their own."""
    # Deferred: torch (optional, heavy to import).
    import torch

    if not torch.cuda.is_available():
        return None
    now, peak = torch.cuda.memory_allocated() / 2**30, torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return round(now, 3), round(peak, 3)


def _memory_summary(per_problem: list) -> dict | None:
    measured = [m for m in per_problem if m is not None]
    if not measured:
        return None
    return {"held_after_a_problem_max": max(now for now, _ in measured),
            "held_after_the_last": measured[-1][0],
            "peak_in_a_problem_max": max(peak for _, peak in measured)}


def _geomean(values) -> float:
    """numerics.geomean, NaN when there is nothing to average (so the table prints nan)."""
    g = geomean(values)
    return float("nan") if g is None else g


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
