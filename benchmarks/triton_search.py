"""The best Triton program per shape, chosen and reported with the harness's own timer, against torch.matmul.

Per shape of the CSV (plus 4096^3 and 8192^3 unless --no-anchors; anchors first, the
rest ordered so a run cut short by --time-budget still spans every FLOP bucket):

1. space    gemmgen.backends.triton.space(problem): the first --top candidates that validate.
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

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ANCHORS = ((4096, 4096, 4096), (8192, 8192, 8192))


# ---- run in the worker (module level, so the job pickles by reference) ---------------------

def measure_shape(entries, problem, seed: int, result_path: str):
    """A no-argument job: check each (name, artifact, program text); time torch and the passing ones."""
    def run():
        from gemmgen import dsl
        from gemmgen.backends import triton as tb
        from gemmgen.measure.baselines import make as make_baseline
        from gemmgen.measure.cases import make_cases
        from gemmgen.measure.checking import check
        from gemmgen.measure.timing import TimingOptions, time_many

        cases = make_cases(problem, seed, "cuda")
        report = {}
        timed = [("torch", make_baseline("torch", problem).fn, problem)]
        for name, artifact, text in entries:
            try:
                fn = tb.load(artifact, dsl.parse(text))
                verdict = check(fn, problem, cases=cases).to_dict()
            except Exception as exc:  # noqa: BLE001 - a failed candidate is a row, not the end
                verdict = {"passed": False, "failures": [f"{type(exc).__name__}: {exc}"]}
            report[name] = {"check": verdict}
            if verdict["passed"]:
                timed.append((name, fn, problem))
        for name, result in time_many(timed, "offline", options=TimingOptions()).items():
            entry = report.setdefault(name, {})
            entry["timing"] = {"error": str(result)} if isinstance(result, Exception) else result.to_dict()
        Path(result_path).write_text(json.dumps(report, default=str))
    return run


# ---- the driver ------------------------------------------------------------------------------

def spread_order(shapes: list) -> list:
    """Sort by size, then interleave strides through it, so any prefix covers small to large."""
    by_size = sorted(shapes, key=lambda s: s.gflop)
    stride = 7
    return [by_size[i] for start in range(stride) for i in range(start, len(by_size), stride)]


def shapes_from(args) -> list:
    from gemmgen.measure.shapes import Shape, read_shapes

    shapes = read_shapes(args.shapes)
    if args.layout:
        shapes = [Shape(s.m, s.n, s.k, args.layout) for s in shapes]
    layout = args.layout or "nn"
    anchors = [] if args.no_anchors else [Shape(m, n, k, layout) for m, n, k in ANCHORS]
    rest = [s for s in shapes if (s.m, s.n, s.k) not in ANCHORS or args.no_anchors]
    ordered = anchors + spread_order(rest)
    return ordered[: args.limit] if args.limit else ordered


def candidates_for(problem, top: int) -> list:
    from gemmgen.backends import triton as tb
    from gemmgen.dsl import diagnose

    return [p for p in tb.space(problem) if not diagnose(p)][:top]


def build_all(plans, jobs: int) -> list:
    from gemmgen.backends import triton as tb
    from gemmgen.backends.build import build_many

    sources = [tb.lower(p) for _, _, programs in plans for p in programs]
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
    from gemmgen.measure.numerics import bucket_of

    torch_ms = ((report.get("torch") or {}).get("timing") or {}).get("device_ms")
    base = {"m": shape.m, "n": shape.n, "k": shape.k, "layout": shape.layout, "gflop": shape.gflop,
            "bucket": bucket_of(shape.gflop), "floor_ms": problem.floor_s * 1e3, "torch_ms": torch_ms}
    rows = []
    for i, (program, built) in enumerate(zip(programs, builds)):
        entry = report.get(f"p{i}", {})
        ms = (entry.get("timing") or {}).get("device_ms")
        check = entry.get("check") or {}
        status = ("build_failed" if isinstance(built, Exception) else "ok" if ms else
                  "failed_check" if check and not check.get("passed") else "not_run")
        rows.append({**base, "rank": i, "program": to_text(program), "status": status,
                     "message": str(built) if isinstance(built, Exception) else "; ".join(check.get("failures", []))[:400],
                     "max_rel_err": check.get("max_rel_err"), "device_ms": ms,
                     "tflops": problem.flops / (ms * 1e-3) / 1e12 if ms else None,
                     "fraction_of_floor": problem.floor_s * 1e3 / ms if ms else None,
                     "speedup_vs_torch": torch_ms / ms if ms and torch_ms else None,
                     "kernels": (entry.get("timing") or {}).get("kernels")})
    return rows


def best_per_shape(rows: list[dict]) -> list[dict]:
    best: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] == "ok" and r["speedup_vs_torch"]:
            key = (r["m"], r["n"], r["k"], r["layout"])
            if key not in best or r["device_ms"] < best[key]["device_ms"]:
                best[key] = r
    return sorted(best.values(), key=lambda r: r["gflop"])


def geomean(xs) -> float:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


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
    sample = [r for r in best if (r["m"], r["n"], r["k"]) not in ANCHORS]
    lines.append(f"{'all':>10} {len(best):>6} {geomean(r['speedup_vs_torch'] for r in best):>15.3f}   "
                 f"(sample without anchors: {geomean(r['speedup_vs_torch'] for r in sample):.3f} over "
                 f"{len(sample)} shapes; target >= 0.97; {shapes_measured} shapes measured)")
    for m, n, k in ANCHORS:
        for r in best:
            if (r["m"], r["n"], r["k"]) == (m, n, k):
                first = r["program"].splitlines()
                lines.append(f"{m}x{n}x{k} ({r['layout']}): {r['speedup_vs_torch']:.3f}x torch, "
                             f"{r['tflops']:.0f} TFLOP/s (target >= 0.95x) with "
                             + ", ".join(x for x in first if x.split()[0] in ("tile", "stages", "scheduler", "split_k")))
    return "\n".join(lines)


def plot(best: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for sched, marker in (("tile", "o"), ("persistent", "^")):
        rs = [r for r in best if f"scheduler {sched}" in r["program"]]
        ax.scatter([r["gflop"] for r in rs], [r["speedup_vs_torch"] for r in rs], marker=marker,
                   label=f"best is scheduler {sched}", alpha=0.75)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.97, color="red", lw=0.6, ls="--", label="target geomean 0.97")
    ax.set_xscale("log")
    ax.set_xlabel("GFLOP (2MNK / 1e9)")
    ax.set_ylabel("speedup over torch.matmul (device time, L2 flushed)")
    ax.set_title(f"gemmgen Triton backend: best of searched programs per shape (H200), "
                 f"geomean {geomean(r['speedup_vs_torch'] for r in best):.3f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=str(HERE / "shapes" / "cudal2_sample100.csv"))
    ap.add_argument("--out", required=True)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--top", type=int, default=8, help="candidates measured per shape (best-first from space())")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds of wall time (building included); no new shape starts after")
    ap.add_argument("--trial-timeout", type=float, default=120.0, help="seconds per worker job (one shape)")
    ap.add_argument("--layout", default=None, help="override every shape's layout (nn, nt, tn, tt)")
    ap.add_argument("--no-anchors", action="store_true", help="skip the added 4096^3 and 8192^3")
    ap.add_argument("--limit", type=int, default=None, help="first N shapes (after ordering) only")
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--build-only", action="store_true", help="build every candidate and stop (no GPU needed)")
    args = ap.parse_args(argv)

    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = shapes_from(args)
    plans = [(s, s.problem(), candidates_for(s.problem(), args.top)) for s in shapes]
    builds = build_all(plans, args.jobs)
    if args.build_only:
        return 0

    from gemmgen.measure.worker import Job, Runner

    rows: list[dict] = []
    trials: dict[str, str] = {}
    doc_path = out / "triton_search.json"

    def save() -> list[dict]:
        best = best_per_shape(rows)
        doc_path.write_text(json.dumps({"command": " ".join(sys.argv), "elapsed_s": time.monotonic() - start,
                                        "top": args.top, "trials": trials, "best": best, "rows": rows},
                                       indent=1, default=str))
        return best

    measured = 0
    with Runner(timeout_s=args.trial_timeout) as runner:
        for i, ((shape, problem, programs), built) in enumerate(zip(plans, builds)):
            if args.time_budget and time.monotonic() - start > args.time_budget:
                print(f"time budget spent after {i} of {len(plans)} shapes", flush=True)
                break
            from gemmgen.dsl import to_text

            entries = [(f"p{j}", b, to_text(p)) for j, (p, b) in enumerate(zip(programs, built))
                       if not isinstance(b, Exception)]
            result_path = out / f".shape_{i}.json"
            result_path.unlink(missing_ok=True)
            trial = runner.run(Job(f"shape{i}", measure_shape, (entries, problem, args.seed + i, str(result_path))))
            report = json.loads(result_path.read_text()) if result_path.exists() else {}
            result_path.unlink(missing_ok=True)
            trials[shape.key] = f"{trial.status}: {trial.message}"[:300]
            srows = shape_rows(shape, problem, programs, built, report)
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
    sys.exit(main())
