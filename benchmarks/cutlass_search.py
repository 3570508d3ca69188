"""The best CUTLASS program per shape: build the library once, select, then measure.

1. build   every candidate of every shape (backends/cutlass_space.py, top --top valid
           programs per shape) maps to a small library of instances (~21 per layout and
           epilogue; runtime choices are arguments). They are built first, all at once,
           with -j N nvcc processes, into the disk cache (a second run builds nothing).
2. select  per shape, in an isolated worker (gemmgen.measure.Runner; a hang or crash
           costs that shape's selection): every candidate is checked on shared inputs,
           then all that pass are timed together, offline mode (cold L2, CUPTI device
           time), the same timer the report uses; the fastest is the shape's program.
           Where that session is long (the best over ALONE_FROM_MS), the candidates within
           FINALIST_GAP of the best are timed again one by one, each in its own worker job
           beside torch.matmul as step 3 times it, once per --modes mode; the best of their
           worse speedup over the modes wins. A long session of 16 candidates runs at the power
           cap, where they rank otherwise than alone, and a hot offline pair otherwise than a
           server pair, which has gaps (8192^3: ping-pong 128x128 1.038x of
           torch.matmul beside it offline, 0.907x in the server bench).
3. measure the selected programs against torch.matmul with `gemmgen bench`'s own
           runner (gemmgen.measure.bench), offline and server mode, each saving as it goes.

Shapes: 4096^3 and 8192^3 unless --no-anchors, then the CSV's (all in --out/shapes.csv).
Writes under --out: library.json (builds, builds/minute), selection.json, offline/ and
server/ (results.json + plots from gemmgen.measure), summary.json; prints the per-bucket
table last. --time-budget bounds steps 2 and 3 (half for selection, a quarter per mode).

    python benchmarks/cutlass_search.py --shapes benchmarks/shapes/cudal2_sample100.csv \\
        --out benchmarks/results/cutlass_search -j 16 --time-budget 900
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import search_common as common  # noqa: E402 - from this script's folder

SELECTION_ENV = "GEMMGEN_CUTLASS_SELECTION"
# From here a group session reads its programs slower than the bench does: the group's best over
# the selected program's bench time, median 1.01x at 0.01-0.15 ms, 1.07x at 0.15-0.25 ms and
# 1.04x (to 1.17x) above (111 shapes, H200).
ALONE_FROM_MS = 0.15
FINALIST_GAP = 0.05      # within 5 % of the group's best: a tie at the cap


# ---- run in workers (module-level so they pickle by reference) ----------------------------

def select_on_shape(entries, problem, seed: int, result_path: str):
    """A no-argument job: check each (name, artifact, program), time the passing ones together."""
    def run():
        from dataclasses import replace

        from gemmgen.backends import cutlass
        from gemmgen.measure.cases import make_cases
        from gemmgen.measure.checking import check
        from gemmgen.measure.timing import TimingOptions, time_many

        cases = make_cases(problem, seed, "cuda")
        report, passing = {}, []
        for name, artifact, program in entries:
            try:
                fn = cutlass.load(artifact, program)
                verdict = check(fn, problem, cases=cases)
            except Exception as exc:  # noqa: BLE001 - one bad candidate is one row
                report[name] = {"passed": False, "failures": [f"{type(exc).__name__}: {exc}"]}
                continue
            report[name] = {"passed": verdict.passed, "failures": list(verdict.failures)}
            if verdict.passed:
                passing.append((name, fn, problem))
        options = replace(TimingOptions(), min_reps=10, max_reps=40, host_reps=0)
        for name, timing in (time_many(passing, "offline", options=options) if passing else {}).items():
            report[name]["device_ms"] = None if isinstance(timing, Exception) else timing.device_ms
            if isinstance(timing, Exception):
                report[name]["failures"].append(str(timing))
        Path(result_path).write_text(json.dumps(report))
    return run


def finalists(timed: dict[str, float]) -> list[str]:
    """The candidates to time again alone: within FINALIST_GAP of the best together, when the
    best is long enough for the group session to have run at the power cap (else none)."""
    if not timed:
        return []
    best = min(timed.values())
    names = [n for n, ms in timed.items() if ms <= (1 + FINALIST_GAP) * best]
    return names if best >= ALONE_FROM_MS and len(names) > 1 else []


def time_alone(runner, names, entries, problem, seed: int, modes=("offline", "server")) -> dict[str, dict]:
    """Each named candidate in its own worker job beside torch.matmul (the bench's protocol), once
    per mode, in a seeded random order; name -> {"offline": torch ms / its ms, "server": ...} for
    those that timed in every mode."""
    import random

    from gemmgen.backends import cutlass
    from gemmgen.measure import Job

    by_name = {n: (artifact, p) for n, artifact, p in entries}
    order = [(name, mode) for name in sorted(names) for mode in modes]
    random.Random(seed).shuffle(order)
    out: dict[str, dict] = {}
    for name, mode in order:
        result = runner.run(Job(f"alone {problem.key} {mode} {name}", cutlass.load, by_name[name], problem,
                                check=False, mode=mode, seed=seed, reference="torch"))   # checked in the group job
        ms, torch_ms = (result.timing or {}).get("device_ms"), (result.reference_timing or {}).get("device_ms")
        if result.ok and ms and torch_ms:
            out.setdefault(name, {})[mode] = torch_ms / ms
    return {name: speedups for name, speedups in out.items() if len(speedups) == len(modes)}


def selected_kernel(problem):
    """Candidate factory for gemmgen.measure.bench: the program selection.json chose for this shape."""
    from gemmgen.backends import cutlass
    from gemmgen.dsl import parse
    from gemmgen.errors import GemmgenError

    selection = json.loads(Path(os.environ[SELECTION_ENV]).read_text())
    entry = selection.get(problem.key)
    if not entry or not entry.get("program"):
        raise GemmgenError(f"no CUTLASS program was selected for {problem.key} "
                           f"({(entry or {}).get('why', 'not reached within the time budget')})")
    program = parse(entry["program"]).bind(problem)
    return cutlass.load(cutlass.build(cutlass.lower(program)), program)


# ---- the parent ----------------------------------------------------------------------------

def candidates_for(shapes, top: int):
    """Per shape: the first `top` valid programs of the CUTLASS space."""
    from gemmgen.backends import cutlass
    from gemmgen.backends import diagnose

    chosen = {}
    for shape in shapes:
        problem = shape.problem()
        valid = [p for p in cutlass.space(problem) if not diagnose(p)]
        chosen[shape] = valid[:top]
    return chosen


def with_anchors(shapes: list, path: Path, skip: bool) -> list:
    """The anchors the CSV lacks (nn), then the CSV's shapes, written to `path` for the bench to read.

    Anchors first: a selection or bench cut short by --time-budget then never drops the two shapes
    the targets name (a sample run that selected them last lost both that way)."""
    if not skip:
        shapes = common.anchors_missing(shapes, ["nn"]) + shapes
    path.write_text("M,N,K,layout\n" + "".join(f"{s.m},{s.n},{s.k},{s.layout}\n" for s in shapes))
    return shapes


def build_library(chosen, jobs: int, out: Path) -> dict:
    from gemmgen.backends import cutlass
    from gemmgen.backends.build import build_many, is_cached

    sources = {}
    for programs in chosen.values():
        for p in programs:
            source = cutlass.lower(p)
            sources.setdefault(source.digest, source)
    unique = list(sources.values())
    cached = sum(is_cached(s, cutlass.ARCH, cutlass.toolchain(), cutlass.NVCC_FLAGS) for s in unique)
    print(f"library: {len(unique)} instances ({cached} cached), building with -j {jobs}", flush=True)
    started = time.monotonic()
    done = [0]

    def progress(i, result):
        done[0] += 1
        print(f"  [{done[0]}/{len(unique)}] {'FAILED ' + str(result)[:300] if isinstance(result, Exception) else 'ok'}",
              flush=True)

    results = build_many(unique, jobs=jobs, progress=progress)
    seconds = time.monotonic() - started
    artifacts = {s.digest: r for s, r in zip(unique, results)}
    fresh = len(unique) - cached
    info = {"instances": len(unique), "cached_before": cached, "built": fresh, "jobs": jobs,
            "seconds": round(seconds, 1), "cpus": os.cpu_count(),
            "builds_per_minute": round(fresh / seconds * 60, 2) if fresh and seconds > 0 else None,
            "failed": [str(r) for r in results if isinstance(r, Exception)],
            "compile_s": sorted(r.meta.get("compile_s") for r in results if not isinstance(r, Exception)
                                and r.meta.get("compile_s"))}
    path = out / "library.json"
    if not fresh and path.exists():
        # An all-cached run measures no build rate: keep the one of the run that built.
        before = json.loads(path.read_text())
        info["last_fresh_build"] = before.get("last_fresh_build") if not before.get("built") else {
            k: before.get(k) for k in ("instances", "built", "jobs", "seconds", "cpus", "builds_per_minute")}
    path.write_text(json.dumps(info, indent=1))
    print(f"library: {fresh} built in {seconds:.0f} s = {info['builds_per_minute']} builds/minute; "
          f"{len(info['failed'])} failed", flush=True)
    return artifacts


def select(chosen, artifacts, out: Path, budget_s, timeout_s: float, seed: int,
           modes=("offline", "server")) -> dict:
    from gemmgen.backends import cutlass
    from gemmgen.dsl import to_text
    from gemmgen.measure import Job, Runner

    selection, started = {}, time.monotonic()
    scratch = out / "select"
    scratch.mkdir(exist_ok=True)
    with Runner(timeout_s=timeout_s) as runner:
        for i, (shape, programs) in enumerate(chosen.items()):
            problem = shape.problem()
            if budget_s is not None and time.monotonic() - started > budget_s:
                selection[problem.key] = {"program": None, "why": "selection time budget reached"}
                continue
            entries = []
            for j, p in enumerate(programs):
                artifact = artifacts.get(cutlass.lower(p).digest)
                if artifact is not None and not isinstance(artifact, Exception):
                    entries.append((f"c{j}", artifact, p))
            if not entries:
                selection[problem.key] = {"program": None, "why": "no valid CUTLASS program (alignment?)"}
                continue
            path = scratch / f"{i}.json"
            result = runner.run(Job(f"select {shape.key}", select_on_shape, (entries, problem, seed, str(path))))
            report = json.loads(path.read_text()) if result.ok and path.exists() else {}
            timed = {n: r["device_ms"] for n, r in report.items() if r.get("passed") and r.get("device_ms")}
            by_name = {n: p for n, _, p in entries}
            best = min(timed, key=timed.get) if timed else None
            why = "fastest offline" if best else f"{result.status}: {result.message}"
            alone = time_alone(runner, finalists(timed), entries, problem, seed, modes)
            if alone:
                for name, speedups in alone.items():
                    report[name]["alone_speedups"] = speedups
                best = max(alone, key=lambda n: min(alone[n].values()))
                why = (f"best worse-mode speedup beside torch.matmul, alone, of {len(alone)} within "
                       f"{FINALIST_GAP:.0%} together")
            selection[problem.key] = {
                "shape": shape.key,
                "program": to_text(by_name[best]) if best else None,
                "why": why,
                "candidates": {n: {"program": to_text(by_name[n]).splitlines()[3:], **report.get(n, {})}
                               for n in by_name},
            }
            print(f"select {shape.key}: {result.status}, best {timed.get(best) if best else None} ms", flush=True)
    (out / "selection.json").write_text(json.dumps(selection, separators=(",", ":")))   # compact: it is committed
    return selection


def bucket_table(docs: dict) -> str:
    """Per bucket of GFLOP: shapes, geomean CUTLASS/torch speedup per mode, two ways.

    `x torch` divides torch.matmul's time from its own session by the CUTLASS program's from
    the program's worker session; `same sess.` divides by torch.matmul timed in that worker
    session, interleaved with the program. A session of two kernels does twice the work of
    torch's own, so on long kernels it runs further into the power cap (8192^3 on the H200:
    torch.matmul 1.46 ms alone, 1.67 ms beside the program); the second figure shares it."""
    from gemmgen.measure.numerics import bucket_names, geomean

    lines = [f"{'bucket':<14}" + "".join(f"{mode + ' n':>11}{mode + ' x torch':>18}{'same sess.':>12}"
                                         for mode in docs)]
    per_mode = {}
    for mode, doc in docs.items():
        torch_ms = {(r["m"], r["n"], r["k"]): r["device_ms"] for r in doc.get("rows", [])
                    if r["name"] == "torch" and r.get("passed") and r.get("device_ms")}
        speedups = {}
        for r in doc.get("rows", []):
            shape = (r["m"], r["n"], r["k"])
            if r["kind"] != "candidate" or not (r.get("passed") and r.get("device_ms")) or shape not in torch_ms:
                continue
            same = (r.get("notes") or {}).get("reference_device_ms")
            pair = (torch_ms[shape] / r["device_ms"], same / r["device_ms"] if same else None)
            for key in (r["bucket"], "all") + ((f"{r['m']}^3",) if shape in common.ANCHORS else ()):
                speedups.setdefault(key, []).append(pair)
        per_mode[mode] = speedups
    for key in list(bucket_names()) + ["all", "4096^3", "8192^3"]:
        cells = ""
        for mode in docs:
            pairs = per_mode[mode].get(key, [])
            cross, same = geomean([p[0] for p in pairs]), geomean([p[1] for p in pairs if p[1]])
            cells += f"{len(pairs):>11}" + (f"{cross:>18.3f}" if cross else f"{'-':>18}")
            cells += f"{same:>12.3f}" if same else f"{'-':>12}"
        lines.append(f"{key:<14}" + cells)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=str(common.DEFAULT_SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count(), help="parallel nvcc builds")
    ap.add_argument("--top", type=int, default=4, help="candidates selected among per shape")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds for selection + measurement")
    ap.add_argument("--build-only", action="store_true", help="build the library and stop (no GPU needed)")
    ap.add_argument("--modes", default="offline,server")
    ap.add_argument("--baselines", default="torch")
    ap.add_argument("--trial-timeout", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--no-anchors", action="store_true", help="leave out 4096^3 and 8192^3 (added unless in the CSV)")
    args = ap.parse_args(argv)

    from gemmgen.measure.shapes import read_shapes

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = with_anchors(read_shapes(args.shapes), out / "shapes.csv", args.no_anchors)
    chosen = candidates_for(shapes, args.top)
    artifacts = build_library(chosen, args.jobs, out)
    if args.build_only:
        return 0

    from gemmgen.measure import bench, plots
    from gemmgen.measure.timing import TimingOptions

    budget = args.time_budget
    started = time.monotonic()
    modes = [m for m in args.modes.split(",") if m]
    selection = select(chosen, artifacts, out, budget / 2 if budget else None, args.trial_timeout, args.seed,
                       tuple(modes))
    os.environ[SELECTION_ENV] = str((out / "selection.json").resolve())
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(HERE))
    docs = {}
    for mode in modes:
        left = None if budget is None else max(0.0, budget - (time.monotonic() - started)) / (len(modes) - len(docs))
        cfg = bench.BenchConfig(shapes=str(out / "shapes.csv"), out=str(out / mode), mode=mode,
                                baselines=[b for b in args.baselines.split(",") if b],
                                candidates=["cutlass_search:selected_kernel"], time_budget_s=left,
                                seed=args.seed, timing=TimingOptions(), trial_timeout_s=args.trial_timeout,
                                command=" ".join(sys.argv))
        docs[mode] = bench.run(cfg)
        plots.plot_all(docs[mode], out / mode)
        print(bench.table(docs[mode]), flush=True)
    selected = sum(1 for s in selection.values() if s.get("program"))
    table = bucket_table(docs)
    (out / "summary.json").write_text(json.dumps({
        "shapes": len(shapes), "selected": selected, "top": args.top, "table": table.splitlines(),
        "summaries": {mode: doc.get("summary") for mode, doc in docs.items()}}, indent=1))
    print(f"\n{selected}/{len(shapes)} shapes have a CUTLASS program; speedup = torch.matmul time / CUTLASS time")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
