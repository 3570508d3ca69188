"""The best raw-CUDA program of each family per shape, against torch.matmul.

Per shape of the CSV (plus 4096^3 and 8192^3 in layouts nn and nt unless --no-anchors):
1. space   backends/cuda_space.py ranks both families; the top --per-family valid
           programs of each (multistage; ws_cooperative) are kept.
2. build   all of them with backends/build.py's process pool (-j, default all cores);
           the next shape builds while the current one is measured.
3. measure one isolated worker job per shape and family group (gemmgen.measure.Runner:
           a hang or crash costs that group): each program is checked (gemmgen.measure check: random
           inputs, NaN poison, guards, fp16-accumulation probe), then torch.matmul and all
           that passed are timed together (offline mode: L2 flushed, CUPTI device time).

Writes --out/cuda_search.json (every program's check and timing) and cuda_search.png
(speedup over torch.matmul per shape and family); prints the per-bucket table last.
--time-budget stops starting new shapes once spent (what was measured is kept).

    python benchmarks/cuda_search.py --out benchmarks/results/cuda_search -j 16 --time-budget 600
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import search_common as common  # noqa: E402 - from this script's folder

FAMILIES = ("multistage", "ws_cooperative", "ws_pingpong")


# ---- the driver ------------------------------------------------------------------------------

def anchors_after(shapes: list, args) -> list:
    """The CSV's order, then the anchors it lacks: as torch.matmul's nn and as x @ W.T (nt)."""
    if args.no_anchors:
        return shapes
    return shapes + common.anchors_missing(shapes, [args.layout] if args.layout else ["nn", "nt"])


def programs_for(problem, per_family: int, families=FAMILIES) -> list:
    """The space's first `per_family` valid programs of each family (the space gives each family
    half its slots, so it is asked for twice that many)."""
    from gemmgen.backends.cuda import search_space as cuda_space
    from gemmgen.backends import diagnose
    chosen, count = [], dict.fromkeys(families, 0)
    for p in cuda_space.space(problem, limit=max(40, 2 * per_family)):
        if count.get(p.mainloop, per_family) < per_family and not diagnose(p):
            chosen.append(p)
            count[p.mainloop] += 1
    return chosen


def build(programs, jobs: int) -> list:
    from gemmgen.backends import cuda
    from gemmgen.backends.build import build_many
    return build_many([cuda.lower(p) for p in programs], jobs=jobs)


def summarise_shape(shape, problem, programs, report, builds) -> list[dict]:
    from gemmgen.dsl import to_text
    rows = []
    torch_ms = (report.get("torch", {}).get("timing") or {}).get("device_ms")
    base = common.shape_fields(shape, problem, torch_ms)
    for i, (program, built) in enumerate(zip(programs, builds)):
        name = f"p{i}"
        entry = report.get(name, {})
        timing = entry.get("timing") or {}
        ms = timing.get("device_ms")
        ref_ms = entry.get("torch_ms") or torch_ms
        status, message = common.entry_outcome(entry, built)
        rows.append({**base, "family": program.mainloop, "program": to_text(program), "status": status,
                     "message": message,
                     "max_rel_err": (entry.get("check") or {}).get("max_rel_err"),
                     "device_ms": ms, "tflops": problem.flops / (ms * 1e-3) / 1e12 if ms else None,
                     "fraction_of_floor": problem.floor_s * 1e3 / ms if ms else None,
                     "torch_ms_same_session": ref_ms,
                     "clocks": timing.get("clocks"),     # the worker session's SM clock (NVML)
                     "speedup_vs_torch": ref_ms / ms if ms and ref_ms else None,
                     "resources": getattr(built, "meta", {}).get("resources") if not isinstance(built, Exception) else None})
    return rows


def best_per_shape(rows: list[dict]) -> list[dict]:
    """Per shape and family, the fastest program that passed."""
    return common.fastest((r for r in rows if r["status"] == "ok"), lambda r: (*common.shape_key(r), r["family"]))


def bucket_table(best: list[dict]) -> str:
    from gemmgen.measure.numerics import bucket_names
    lines = [f"{'bucket':>8} {'family':>15} {'shapes':>6} {'geomean x torch':>15} {'median floor frac':>17} {'best TFLOP/s':>12}"]
    for bucket in bucket_names():
        for family in FAMILIES + ("best of all",):
            if family == "best of all":
                rs = common.fastest((r for r in best if r["bucket"] == bucket), common.shape_key)
            else:
                rs = [r for r in best if r["bucket"] == bucket and r["family"] == family]
            if not rs:
                continue
            fracs = sorted(r["fraction_of_floor"] for r in rs)
            g = common.geomean(r["speedup_vs_torch"] for r in rs)
            lines.append(f"{bucket:>8} {family:>15} {len(rs):>6} {g if g else float('nan'):>15.3f} "
                         f"{fracs[len(fracs) // 2]:>17.3f} {max(r['tflops'] for r in rs):>12.1f}")
    small = [r for r in best if r["family"] == "multistage" and r["gflop"] < 16]
    lines.append(f"multistage geomean x torch on shapes < 16 GFLOP: {common.geomean(r['speedup_vs_torch'] for r in small) or float('nan'):.3f}"
                 f" ({len(small)} shapes; target >= 1.00)")
    for m, n, k in common.ANCHORS:
        for r in best:
            if (r["m"], r["n"], r["k"]) == (m, n, k) and r["family"] != "multistage":
                lines.append(f"{r['family']} at {m}x{n}x{k} ({r['layout']}): {r['speedup_vs_torch']:.3f}x torch, "
                             f"{r['tflops']:.0f} TFLOP/s (target >= 0.95x)")
    return "\n".join(lines)


def plot(best: list[dict], path: Path) -> None:
    series = [(family, marker, [r for r in best if r["family"] == family and r["speedup_vs_torch"]])
              for family, marker in zip(FAMILIES, "os^")]
    common.plot_speedups(path, series, ylabel="speedup over torch.matmul (device time)", alpha=0.7,
                         title="gemmgen raw CUDA backend, best program per shape and family (H200, offline)")


def main(argv=None) -> int:
    ap = common.parser(
        __doc__.splitlines()[0],
        lambda ap: (ap.add_argument("--per-family", type=int, default=2, help="programs measured per family and shape"),
                    ap.add_argument("--families", default=",".join(FAMILIES),
                                    help=f"comma-separated, of {', '.join(FAMILIES)}")),
        time_budget_help="seconds; no new shape starts after",
        trial_timeout=90.0, trial_timeout_help="seconds per worker job (shape x family group)",
        limit_help="first N shapes only", build_only_help="build every program and stop (no GPU)")
    args = ap.parse_args(argv)
    families = tuple(f for f in args.families.split(",") if f)
    if not families or set(families) - set(FAMILIES):
        ap.error(f"--families takes a comma-separated list of {', '.join(FAMILIES)}; got {args.families!r}")

    from gemmgen.measure.worker import Runner

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    shapes = common.shapes_from(args, anchors_after)
    plans = [(s, s.problem(), programs_for(s.problem(), args.per_family, families)) for s in shapes]
    rows: list[dict] = []
    doc_path = out / "cuda_search.json"

    def save() -> None:
        common.write_doc(doc_path, start, rows=rows, best=best_per_shape(rows))

    with ThreadPoolExecutor(max_workers=1) as builder, Runner(timeout_s=args.trial_timeout) as runner:
        pending = builder.submit(build, plans[0][2], args.jobs) if plans else None
        for i, (shape, problem, programs) in enumerate(plans):
            builds = pending.result()
            pending = builder.submit(build, plans[i + 1][2], args.jobs) if i + 1 < len(plans) else None
            if args.build_only:
                failed = sum(isinstance(b, Exception) for b in builds)
                print(f"[{i + 1}/{len(plans)}] {shape.key}: built {len(builds) - failed}, failed {failed}", flush=True)
                continue
            if args.time_budget and time.monotonic() - start > args.time_budget:
                print(f"time budget spent after {i} shapes", flush=True)
                break
            # One worker job per family group, so a hung TMA kernel costs its group, not the shape.
            report, trials = {}, {}
            for group in (("multistage",), ("ws_cooperative", "ws_pingpong")):
                entries = common.entries_for(programs, builds, keep=lambda p: p.mainloop in group)
                if not entries:
                    continue
                trial, part = common.run_shape_job(runner, f"shape{i}-{group[0]}", entries, problem,
                                                   args.seed + i, out / f".shape_{i}.json")
                if "torch" in part and "torch" in report:
                    part.pop("torch")
                report.update(part)
                for name, _, _ in entries:
                    trials[name] = trial
            shape_rows = summarise_shape(shape, problem, programs, report, builds)
            for j, r in enumerate(shape_rows):
                trial = trials.get(f"p{j}")
                if r["status"] == "not_run" and trial is not None and not trial.ok:
                    r["status"], r["message"] = trial.status, trial.message
            rows += shape_rows
            best = {r["family"]: r for r in best_per_shape(shape_rows)}
            summary = "  ".join(f"{f}: {best[f]['speedup_vs_torch']:.2f}x" if f in best and best[f]["speedup_vs_torch"]
                                else f"{f}: -" for f in FAMILIES)
            statuses = ",".join(sorted({t.status for t in trials.values()})) or "nothing to run"
            print(f"[{i + 1}/{len(plans)}] {shape.key} {shape.gflop:.2f} GFLOP  {summary}  ({statuses})", flush=True)
            save()
    if args.build_only:
        return 0
    save()
    best = best_per_shape(rows)
    plot(best, out / "cuda_search.png")
    print(bucket_table(best))
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
