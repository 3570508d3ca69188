"""The best Triton program per shape, chosen and reported with the harness's own timer, against torch.matmul.

Per shape of the CSV (plus 4096^3 and 8192^3 unless --no-anchors; anchors first, the
rest ordered so a run cut short by --time-budget still spans every FLOP bucket):

1. space    gemmgen.backends.triton.search_space(problem): the first --top candidates that validate.
2. build    every candidate of every shape with backends/build.py's process pool on all
            cores, BEFORE any timing; artifacts land in the disk cache (GEMMGEN_CACHE_DIR),
            so a second run builds nothing.
3. measure  one isolated worker job per shape (gemmgen.measure.Runner: a hang or crash costs
            that shape, not the run): every candidate is checked (gemmgen.measure.check on
            shared cases: random normal inputs, NaN poison, guard bands, fp64 reference,
            fp16-accumulation probe); then torch.matmul and every candidate that passed are
            timed together in one session (gemmgen.measure.time_many, offline: back to back,
            L2 flushed, CUPTI device time). The fastest passing candidate is the shape's best.

Writes --out/triton_search.json (every candidate's check and timing, the best per shape),
--out/triton_search.png (best speedup over torch.matmul against GFLOP); prints the
per-FLOP-bucket table last.

    python benchmarks/triton_search.py --out benchmarks/results/triton_search -j 16 --top 8 --time-budget 420
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import search_common as common  # noqa: E402 - from this script's folder


# ---- the driver ------------------------------------------------------------------------------

def spread_order(shapes: list) -> list:
    """Sort by size, then interleave strides through it, so any prefix covers small to large."""
    by_size = sorted(shapes, key=lambda s: s.gflop)
    stride = 7
    return [by_size[i] for start in range(stride) for i in range(start, len(by_size), stride)]


def anchors_first(shapes: list, args) -> list:
    """The anchors (in --layout or nn), then the other shapes in spread order."""
    from gemmgen.measure.shapes import Shape

    layout = args.layout or "nn"
    anchors = [] if args.no_anchors else [Shape(m, n, k, layout) for m, n, k in common.ANCHORS]
    rest = [s for s in shapes if (s.m, s.n, s.k) not in common.ANCHORS or args.no_anchors]
    return anchors + spread_order(rest)


def candidates_for(problem, top: int) -> list:
    from gemmgen.backends import triton as tb
    from gemmgen.backends import diagnose

    return [p for p in tb.space(problem) if not diagnose(p)][:top]


def build_all(plans, jobs: int) -> list:
    from gemmgen.backends import lower
    from gemmgen.backends.build import build_many

    sources = [lower(p) for _, _, programs in plans for p in programs]
    bar = None
    try:
        from tqdm import tqdm
        bar = tqdm(total=len(sources), unit="build", desc="build")
    except ImportError:
        pass
    start = time.monotonic()
    results = build_many(sources, jobs=jobs, progress=(lambda i, r: bar.update(1)) if bar else None)
    if bar:
        bar.close()
    elapsed = time.monotonic() - start
    failed = sum(isinstance(r, Exception) for r in results)
    print(f"built {len(results) - failed} ({failed} failed) in {elapsed:.0f} s "
          f"({len(results) / max(elapsed, 1e-9) * 60:.0f} builds/minute, cache hits included)", flush=True)
    out, i = [], 0
    for _, _, programs in plans:
        out.append(results[i:i + len(programs)])
        i += len(programs)
    return out


def shape_rows(shape, problem, programs, builds, report) -> list[dict]:
    from gemmgen.dsl import to_text

    torch_ms = ((report.get("torch") or {}).get("timing") or {}).get("device_ms")
    base = common.shape_fields(shape, problem, torch_ms)
    rows = []
    for i, (program, built) in enumerate(zip(programs, builds)):
        entry = report.get(f"p{i}", {})
        ms = (entry.get("timing") or {}).get("device_ms")
        check = entry.get("check") or {}
        status, message = common.entry_outcome(entry, built)
        rows.append({**base, "rank": i, "program": to_text(program), "status": status, "message": message,
                     "max_rel_err": check.get("max_rel_err"), "device_ms": ms,
                     "tflops": problem.flops / (ms * 1e-3) / 1e12 if ms else None,
                     "fraction_of_floor": problem.floor_s * 1e3 / ms if ms else None,
                     "speedup_vs_torch": torch_ms / ms if ms and torch_ms else None,
                     "kernels": (entry.get("timing") or {}).get("kernels")})
    return rows


def best_per_shape(rows: list[dict]) -> list[dict]:
    best = common.fastest((r for r in rows if r["status"] == "ok" and r["speedup_vs_torch"]), common.shape_key)
    return sorted(best, key=lambda r: r["gflop"])


def geomean(xs) -> float:
    """common.geomean, NaN when there is nothing to average (so the table prints nan)."""
    g = common.geomean(xs)
    return float("nan") if g is None else g


def bucket_table(best: list[dict], shapes_measured: int) -> str:
    from gemmgen.measure.numerics import bucket_names

    lines = [f"{'bucket':>10} {'shapes':>6} {'geomean x torch':>15} {'min':>6} {'max':>6} "
             f"{'median floor frac':>17} {'best TFLOP/s':>12}"]
    for bucket in bucket_names():
        rs = [r for r in best if r["bucket"] == bucket]
        if not rs:
            continue
        sp = [r["speedup_vs_torch"] for r in rs]
        fr = sorted(r["fraction_of_floor"] for r in rs)
        lines.append(f"{bucket:>10} {len(rs):>6} {geomean(sp):>15.3f} {min(sp):>6.2f} {max(sp):>6.2f} "
                     f"{fr[len(fr) // 2]:>17.3f} {max(r['tflops'] for r in rs):>12.1f}")
    sample = [r for r in best if (r["m"], r["n"], r["k"]) not in common.ANCHORS]
    lines.append(f"{'all':>10} {len(best):>6} {geomean(r['speedup_vs_torch'] for r in best):>15.3f}   "
                 f"(sample without anchors: {geomean(r['speedup_vs_torch'] for r in sample):.3f} over "
                 f"{len(sample)} shapes; target >= 0.97; {shapes_measured} shapes measured)")
    for m, n, k in common.ANCHORS:
        for r in best:
            if (r["m"], r["n"], r["k"]) == (m, n, k):
                first = r["program"].splitlines()
                lines.append(f"{m}x{n}x{k} ({r['layout']}): {r['speedup_vs_torch']:.3f}x torch, "
                             f"{r['tflops']:.0f} TFLOP/s (target >= 0.95x) with "
                             + ", ".join(x for x in first if x.split()[0] in ("tile", "stages", "scheduler", "split_k")))
    return "\n".join(lines)


def plot(best: list[dict], path: Path) -> None:
    series = [(f"best is scheduler {sched}", marker, [r for r in best if f"scheduler {sched}" in r["program"]])
              for sched, marker in (("tile", "o"), ("persistent", "^"))]
    common.plot_speedups(path, series, ylabel="speedup over torch.matmul (device time, L2 flushed)", alpha=0.75,
                         title=f"gemmgen Triton backend: best of searched programs per shape (H200), "
                               f"geomean {geomean(r['speedup_vs_torch'] for r in best):.3f}",
                         target=(0.97, "target geomean 0.97"))


def measured_shapes(runner, plans, builds, out: Path, seed: int, start: float, time_budget: Optional[float]):
    """Each planned shape's built candidates checked and timed in one worker job, in order, until
    `time_budget` seconds from `start` are spent: (index, shape, the job's trial, its rows)."""
    for i, ((shape, problem, programs), built) in enumerate(zip(plans, builds)):
        if time_budget and time.monotonic() - start > time_budget:
            print(f"time budget spent after {i} of {len(plans)} shapes", flush=True)
            return
        entries = common.entries_for(programs, built)
        trial, report = common.run_shape_job(runner, f"shape{i}", entries, problem, seed + i,
                                             out / f".shape_{i}.json")
        yield i, shape, trial, shape_rows(shape, problem, programs, built, report)


def main(argv=None) -> int:
    ap = common.parser(
        __doc__.splitlines()[0],
        lambda ap: ap.add_argument("--top", type=int, default=8,
                                   help="candidates measured per shape (best-first from space())"),
        time_budget_help="seconds of wall time (building included); no new shape starts after",
        trial_timeout=120.0, trial_timeout_help="seconds per worker job (one shape)",
        limit_help="first N shapes (after ordering) only",
        build_only_help="build every candidate and stop (no GPU needed)")
    args = ap.parse_args(argv)

    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = common.shapes_from(args, anchors_first)
    plans = [(s, s.problem(), candidates_for(s.problem(), args.top)) for s in shapes]
    builds = build_all(plans, args.jobs)
    if args.build_only:
        return 0

    from gemmgen.measure.worker import Runner

    rows: list[dict] = []
    trials: dict[str, str] = {}
    doc_path = out / "triton_search.json"

    def save() -> list[dict]:
        best = best_per_shape(rows)
        common.write_doc(doc_path, start, top=args.top, trials=trials, best=best, rows=rows)
        return best

    measured = 0
    with Runner(timeout_s=args.trial_timeout) as runner:
        for i, shape, trial, srows in measured_shapes(runner, plans, builds, out, args.seed, start, args.time_budget):
            trials[shape.key] = f"{trial.status}: {trial.message}"[:300]
            rows.extend(srows)
            measured += 1
            ok = [r for r in srows if r["status"] == "ok"]
            top = min(ok, key=lambda r: r["device_ms"]) if ok else None
            print(f"[{i + 1}/{len(plans)}] {shape.key:>22} {trial.status:>8} "
                  + (f"best p{top['rank']} {top['device_ms'] * 1e3:8.1f} us  {top['speedup_vs_torch']:.3f}x torch  "
                     f"({len(ok)}/{len(srows)} passed)" if top else f"no passing candidate: {trial.message[:120]}"),
                  flush=True)
            save()
    best = save()
    plot(best, out / "triton_search.png")
    print(bucket_table(best, measured))
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
