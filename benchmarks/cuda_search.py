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

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = ("multistage", "ws_cooperative", "ws_pingpong")
ANCHORS = ((4096, 4096, 4096), (8192, 8192, 8192))


# ---- run in the worker (module level, so jobs pickle by reference) -------------------------

def measure_shape(entries, problem, seed: int, result_path: str):
    """A no-argument job: check each (name, artifact, program text), time the passing ones with torch."""
    def run():
        from gemmgen import dsl
        from gemmgen.backends import cuda
        from gemmgen.measure.baselines import make as make_baseline
        from gemmgen.measure.cases import make_cases
        from gemmgen.measure.checking import check
        from gemmgen.measure.timing import TimingOptions, time_many

        cases = make_cases(problem, seed, "cuda")
        report, timed = {}, [("torch", make_baseline("torch", problem).fn, problem)]
        for name, artifact, text in entries:
            try:
                fn = cuda.load(artifact, dsl.parse(text))
                verdict = check(fn, problem, cases=cases).to_dict()
            except Exception as exc:  # noqa: BLE001 - a failed candidate is a row, not the end
                verdict = {"passed": False, "failures": [f"{type(exc).__name__}: {exc}"]}
            report[name] = {"check": verdict}
            if verdict["passed"]:
                timed.append((name, fn, problem))
        timings = time_many(timed, "offline", options=TimingOptions())
        for name, result in timings.items():
            entry = report.setdefault(name, {})
            entry["timing"] = result.to_dict() if not isinstance(result, Exception) else {"error": str(result)}
        torch_ms = (report["torch"]["timing"] or {}).get("device_ms")
        for entry in report.values():
            entry["torch_ms"] = torch_ms     # the baseline timed in the same session
        Path(result_path).write_text(json.dumps(report, default=str))
    return run


# ---- the driver ------------------------------------------------------------------------------

def shapes_from(args) -> list:
    from gemmgen.measure.shapes import Shape, read_shapes
    shapes = read_shapes(args.shapes)
    if args.layout:
        shapes = [Shape(s.m, s.n, s.k, args.layout) for s in shapes]
    if not args.no_anchors:   # the Hopper targets, as torch.matmul's nn and as x @ W.T (nt)
        have = {(s.m, s.n, s.k, s.layout) for s in shapes}
        for layout in ([args.layout] if args.layout else ["nn", "nt"]):
            shapes += [Shape(m, n, k, layout) for (m, n, k) in ANCHORS if (m, n, k, layout) not in have]
    return shapes[: args.limit] if args.limit else shapes


def programs_for(problem, per_family: int) -> list:
    from gemmgen.backends import cuda
    from gemmgen.dsl import diagnose
    chosen, count = [], dict.fromkeys(FAMILIES, 0)
    for p in cuda.space(problem):
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
    from gemmgen.measure.numerics import bucket_of
    rows = []
    torch_ms = (report.get("torch", {}).get("timing") or {}).get("device_ms")
    base = {"m": shape.m, "n": shape.n, "k": shape.k, "layout": shape.layout, "gflop": shape.gflop,
            "bucket": bucket_of(shape.gflop), "floor_ms": problem.floor_s * 1e3, "torch_ms": torch_ms}
    for i, (program, built) in enumerate(zip(programs, builds)):
        name = f"p{i}"
        entry = report.get(name, {})
        timing = entry.get("timing") or {}
        ms = timing.get("device_ms")
        ref_ms = entry.get("torch_ms") or torch_ms
        status = ("build_failed" if isinstance(built, Exception) else
                  "ok" if ms else "failed_check" if entry.get("check") else "not_run")
        rows.append({**base, "family": program.mainloop, "program": to_text(program), "status": status,
                     "message": str(built) if isinstance(built, Exception) else
                     "; ".join((entry.get("check") or {}).get("failures", []))[:500],
                     "max_rel_err": (entry.get("check") or {}).get("max_rel_err"),
                     "device_ms": ms, "tflops": problem.flops / (ms * 1e-3) / 1e12 if ms else None,
                     "fraction_of_floor": problem.floor_s * 1e3 / ms if ms else None,
                     "torch_ms_same_session": ref_ms,
                     "speedup_vs_torch": ref_ms / ms if ms and ref_ms else None,
                     "resources": getattr(built, "meta", {}).get("resources") if not isinstance(built, Exception) else None})
    return rows


def best_per_shape(rows: list[dict]) -> list[dict]:
    """Per shape and family, the fastest program that passed."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        key = (r["m"], r["n"], r["k"], r["layout"], r["family"])
        if key not in best or r["device_ms"] < best[key]["device_ms"]:
            best[key] = r
    return list(best.values())


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def bucket_table(best: list[dict]) -> str:
    from gemmgen.measure.numerics import bucket_names
    lines = [f"{'bucket':>8} {'family':>15} {'shapes':>6} {'geomean x torch':>15} {'median floor frac':>17} {'best TFLOP/s':>12}"]
    for bucket in bucket_names():
        for family in FAMILIES + ("best of all",):
            if family == "best of all":
                per_shape: dict[tuple, dict] = {}
                for r in best:
                    if r["bucket"] == bucket:
                        key = (r["m"], r["n"], r["k"], r["layout"])
                        if key not in per_shape or r["device_ms"] < per_shape[key]["device_ms"]:
                            per_shape[key] = r
                rs = list(per_shape.values())
            else:
                rs = [r for r in best if r["bucket"] == bucket and r["family"] == family]
            if not rs:
                continue
            fracs = sorted(r["fraction_of_floor"] for r in rs)
            g = geomean(r["speedup_vs_torch"] for r in rs)
            lines.append(f"{bucket:>8} {family:>15} {len(rs):>6} {g if g else float('nan'):>15.3f} "
                         f"{fracs[len(fracs) // 2]:>17.3f} {max(r['tflops'] for r in rs):>12.1f}")
    small = [r for r in best if r["family"] == "multistage" and r["gflop"] < 16]
    lines.append(f"multistage geomean x torch on shapes < 16 GFLOP: {geomean(r['speedup_vs_torch'] for r in small) or float('nan'):.3f}"
                 f" ({len(small)} shapes; target >= 1.00)")
    for m, n, k in ANCHORS:
        for r in best:
            if (r["m"], r["n"], r["k"]) == (m, n, k) and r["family"] != "multistage":
                lines.append(f"{r['family']} at {m}x{n}x{k} ({r['layout']}): {r['speedup_vs_torch']:.3f}x torch, "
                             f"{r['tflops']:.0f} TFLOP/s (target >= 0.95x)")
    return "\n".join(lines)


def plot(best: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for family, marker in zip(FAMILIES, "os^"):
        rs = [r for r in best if r["family"] == family and r["speedup_vs_torch"]]
        ax.scatter([r["gflop"] for r in rs], [r["speedup_vs_torch"] for r in rs], marker=marker, label=family, alpha=0.7)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("GFLOP (2MNK / 1e9)")
    ax.set_ylabel("speedup over torch.matmul (device time)")
    ax.set_title("gemmgen raw CUDA backend, best program per shape and family (H200, offline)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=str(HERE / "shapes" / "cudal2_sample100.csv"))
    ap.add_argument("--out", required=True)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--per-family", type=int, default=2, help="programs measured per family and shape")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds; no new shape starts after")
    ap.add_argument("--trial-timeout", type=float, default=90.0, help="seconds per worker job (shape x family group)")
    ap.add_argument("--layout", default=None, help="override every shape's layout (nn, nt, tn, tt)")
    ap.add_argument("--no-anchors", action="store_true", help="skip the added 4096^3 and 8192^3")
    ap.add_argument("--limit", type=int, default=None, help="first N shapes only")
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--build-only", action="store_true", help="build every program and stop (no GPU)")
    args = ap.parse_args(argv)

    from gemmgen.measure.worker import Job, Runner

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    shapes = shapes_from(args)
    plans = [(s, s.problem(), programs_for(s.problem(), args.per_family)) for s in shapes]
    rows: list[dict] = []
    doc_path = out / "cuda_search.json"

    def save() -> None:
        best = best_per_shape(rows)
        doc_path.write_text(json.dumps({"command": " ".join(sys.argv), "elapsed_s": time.monotonic() - start,
                                        "rows": rows, "best": best}, indent=1, default=str))

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
            from gemmgen.dsl import to_text
            # One worker job per family group, so a hung TMA kernel costs its group, not the shape.
            report, trials = {}, {}
            for group in (("multistage",), ("ws_cooperative", "ws_pingpong")):
                entries = [(f"p{j}", b, to_text(p)) for j, (p, b) in enumerate(zip(programs, builds))
                           if not isinstance(b, Exception) and p.mainloop in group]
                if not entries:
                    continue
                result_path = out / f".shape_{i}.json"
                result_path.unlink(missing_ok=True)
                trial = runner.run(Job(f"shape{i}-{group[0]}", measure_shape,
                                       (entries, problem, args.seed + i, str(result_path))))
                part = json.loads(result_path.read_text()) if result_path.exists() else {}
                result_path.unlink(missing_ok=True)
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
    sys.exit(main())
