"""What the per-backend search scripts (cuda_search.py, triton_search.py) share.

Their common arguments, the shape list with the Hopper anchors, the isolated
check-and-time worker job, the fastest row per key, the JSON document and the
speedup plot live here once; each script keeps what differs (its candidates,
its grouping, its table). Scripts import this module from their own folder.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from gemmgen.measure.numerics import geomean  # noqa: F401 - the searches' geomean (common.geomean)
from gemmgen.measure.plots import save_png

HERE = Path(__file__).resolve().parent
DEFAULT_SHAPES = HERE / "shapes" / "cudal2_sample100.csv"
ANCHORS = ((4096, 4096, 4096), (8192, 8192, 8192))


# ---- arguments and shapes ------------------------------------------------------------------

def parser(description: str, add_candidate_count: Callable[[argparse.ArgumentParser], None], *,
           time_budget_help: str, trial_timeout: float, trial_timeout_help: str, limit_help: str,
           build_only_help: str) -> argparse.ArgumentParser:
    """The search scripts' arguments; the help strings say what each script's budget, trial and limit mean."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shapes", default=str(DEFAULT_SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    add_candidate_count(ap)
    ap.add_argument("--time-budget", type=float, default=None, help=time_budget_help)
    ap.add_argument("--trial-timeout", type=float, default=trial_timeout, help=trial_timeout_help)
    ap.add_argument("--layout", default=None, help="override every shape's layout (nn, nt, tn, tt)")
    ap.add_argument("--no-anchors", action="store_true", help="skip the added 4096^3 and 8192^3")
    ap.add_argument("--limit", type=int, default=None, help=limit_help)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--build-only", action="store_true", help=build_only_help)
    return ap


def anchors_missing(shapes: list, layouts: Iterable[str]) -> list:
    """The anchor shapes, in each layout, that `shapes` lacks (to add to them)."""
    from gemmgen.measure.shapes import Shape

    have = {(s.m, s.n, s.k, s.layout) for s in shapes}
    return [Shape(m, n, k, layout) for layout in layouts for (m, n, k) in ANCHORS if (m, n, k, layout) not in have]


def shapes_from(args, arrange: Callable[[list, argparse.Namespace], list]) -> list:
    """The CSV's shapes (layout overridden by --layout), placed among the anchors by `arrange`, cut to --limit."""
    from gemmgen.measure.shapes import Shape, read_shapes

    shapes = read_shapes(args.shapes)
    if args.layout:
        shapes = [Shape(s.m, s.n, s.k, args.layout) for s in shapes]
    ordered = arrange(shapes, args)
    return ordered[: args.limit] if args.limit else ordered


# ---- run in the worker (module level, so jobs pickle by reference) -------------------------

def measure_shape(entries, problem, seed: int, result_path: str):
    """A no-argument job: check each (name, artifact, program text) on shared cases, then time
    torch.matmul and the passing ones in one session; every entry records that session's torch time."""
    def run():
        from gemmgen import dsl
        from gemmgen.backends import load
        from gemmgen.measure.baselines import make as make_baseline
        from gemmgen.measure.cases import make_cases
        from gemmgen.measure.checking import check
        from gemmgen.measure.timing import TimingOptions, time_many

        cases = make_cases(problem, seed, "cuda")
        report, timed = {}, [("torch", make_baseline("torch", problem).fn, problem)]
        for name, artifact, text in entries:
            try:
                fn = load(artifact, dsl.parse(text))
                verdict = check(fn, problem, cases=cases).to_dict()
            except Exception as exc:  # noqa: BLE001 - a failed candidate is a row, not the end
                verdict = {"passed": False, "failures": [f"{type(exc).__name__}: {exc}"]}
            report[name] = {"check": verdict}
            if verdict["passed"]:
                timed.append((name, fn, problem))
        for name, result in time_many(timed, "offline", options=TimingOptions()).items():
            entry = report.setdefault(name, {})
            entry["timing"] = {"error": str(result)} if isinstance(result, Exception) else result.to_dict()
        torch_ms = ((report.get("torch") or {}).get("timing") or {}).get("device_ms")
        for entry in report.values():
            entry["torch_ms"] = torch_ms
        Path(result_path).write_text(json.dumps(report, default=str))
    return run


# ---- the driver's side ---------------------------------------------------------------------

def entries_for(programs, builds, keep: Optional[Callable] = None) -> list:
    """(p<index>, artifact, program text) of each program that built (and that `keep` accepts)."""
    from gemmgen.dsl import to_text

    return [(f"p{j}", b, to_text(p)) for j, (p, b) in enumerate(zip(programs, builds))
            if not isinstance(b, Exception) and (keep is None or keep(p))]


def entry_outcome(entry: dict, built) -> tuple[str, str]:
    """(status, message) of one program in a measure_shape report. A program whose check passed
    but whose timing raised is `timing_failed` with the timing's error, not a failed check."""
    if isinstance(built, Exception):
        return "build_failed", str(built)[:500]
    check, timing = entry.get("check") or {}, entry.get("timing") or {}
    if timing.get("device_ms"):
        return "ok", ""
    if check and not check.get("passed"):
        return "failed_check", "; ".join(check.get("failures", []))[:500]
    if timing.get("error"):
        return "timing_failed", str(timing["error"])[:500]
    return "not_run", ""


def run_shape_job(runner, name: str, entries, problem, seed: int, result_path: Path):
    """measure_shape in an isolated worker: (the trial, the report it wrote or {})."""
    from gemmgen.measure.worker import Job

    result_path.unlink(missing_ok=True)
    trial = runner.run(Job(name, measure_shape, (entries, problem, seed, str(result_path))))
    report = json.loads(result_path.read_text()) if result_path.exists() else {}
    result_path.unlink(missing_ok=True)
    return trial, report


def shape_fields(shape, problem, torch_ms) -> dict:
    """The columns every row of one shape starts with."""
    from gemmgen.measure.numerics import bucket_of

    return {"m": shape.m, "n": shape.n, "k": shape.k, "layout": shape.layout, "gflop": shape.gflop,
            "bucket": bucket_of(shape.gflop), "floor_ms": problem.floor_s * 1e3, "torch_ms": torch_ms}


def shape_key(row: dict) -> tuple:
    return (row["m"], row["n"], row["k"], row["layout"])


def fastest(rows: Iterable[dict], key: Callable[[dict], tuple]) -> list[dict]:
    """Per key, the row with the least device_ms (the first on ties), in order of each key's first row."""
    best: dict[tuple, dict] = {}
    for r in rows:
        k = key(r)
        if k not in best or r["device_ms"] < best[k]["device_ms"]:
            best[k] = r
    return list(best.values())


def write_doc(path: Path, start: float, **fields) -> None:
    """The run's JSON document: the command, the seconds since `start`, then `fields` in order."""
    path.write_text(json.dumps({"command": " ".join(sys.argv), "elapsed_s": time.monotonic() - start, **fields},
                               separators=(",", ":"), default=str))   # compact: it is committed


def plot_speedups(path: Path, series, *, ylabel: str, title: str, alpha: float,
                  target: Optional[tuple[float, str]] = None) -> None:
    """Speedup over torch.matmul against GFLOP, one marker per (label, marker, rows) series."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, marker, rs in series:
        ax.scatter([r["gflop"] for r in rs], [r["speedup_vs_torch"] for r in rs], marker=marker,
                   label=label, alpha=alpha)
    ax.axhline(1.0, color="grey", lw=0.8)
    if target is not None:
        ax.axhline(target[0], color="red", lw=0.6, ls="--", label=target[1])
    ax.set_xscale("log")
    ax.set_xlabel("GFLOP (2MNK / 1e9)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
