"""Which of the 27 plain CUTLASS SM90 instances hang or fault on the H200, and why.

The 27: ws_cooperative 128x128/128x256/256x128 and ws_pingpong 64x128/64x256/128x128
tiles, clusters 1x1/2x1/1x2, persistent or stream-K (ping-pong has no stream-K:
CUTLASS static_asserts it, hence 18 + 9), automatic stages, A and B row-major.

Each instance is built first (in parallel, cached), then run in an isolated worker
(gemmgen.measure.Runner) with a time limit, in phases, each its own job:

  launch   first launch + sync; 50 back-to-back launches + sync (stream-K barriers
           reused); 10 replays of a captured CUDA graph; on 4096^3 and on 1000x1000x4096
  check    gemmgen.measure.check + offline timing, the benchmark's own path
  stale    (--reproduce) stream-K with its barrier workspace zeroed once only, as a
           harness does that calls CUTLASS's initialize() once and run() in a loop

A phase records its progress in a file, so a timeout says which step never
returned. Results go to OUT/hang_probe.json with a table last. The validator
refuses what this finds unsafe (backends/cutlass_rules.py, docs/backends.md).

    python benchmarks/cutlass_hang_probe.py --out benchmarks/results/cutlass_hang_probe -j 16
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

SHAPES = ((4096, 4096, 4096), (1000, 1000, 4096))


def instances():
    """The 27 programs (unvalidated: some are refused by the validator on purpose)."""
    from gemmgen.dsl.ir import Problem, Program, Tile

    problem = Problem(None, None, None, "row", "row")
    out = []
    for mainloop, tiles, warps, schedulers in (
        ("ws_cooperative", ((128, 128), (128, 256), (256, 128)), (8, 1), ("persistent", "stream_k")),
        ("ws_pingpong", ((64, 128), (64, 256), (128, 128)), (4, 1), ("persistent",)),
    ):
        for (tm, tn) in tiles:
            for cluster in ((1, 1), (2, 1), (1, 2)):
                for scheduler in schedulers:
                    out.append(Program(problem=problem, backend="cutlass", tile=Tile(tm, tn, 64), warps=warps,
                                       mainloop=mainloop, cluster=cluster, scheduler=scheduler))
    return out


def name_of(p) -> str:
    return f"{p.mainloop}_{p.tile.m}x{p.tile.n}_c{p.cluster[0]}x{p.cluster[1]}_{p.scheduler}"


# ---- jobs (top-level so the worker can unpickle them) ------------------------------------

def _mark(progress: str, step: str) -> None:
    with open(progress, "a") as f:
        f.write(step + "\n")
        f.flush()
        os.fsync(f.fileno())


def launch_phases(artifact, program, progress: str, stale_workspace: bool = False):
    """A no-argument job: raw launches, repeated launches, graph replays; marks each step."""
    def run():
        import torch
        from gemmgen.backends import cutlass

        fn = cutlass.load(artifact, program)
        _mark(progress, "loaded")
        for (m, n, k) in SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(k, n, device="cuda", dtype=torch.float16)
            out = torch.empty(m, n, device="cuda", dtype=torch.float16)
            if stale_workspace:
                fn._lib.gg_debug_skip_workspace_init(0)
                fn(a, b, out)  # first call zeroes the barriers (CUTLASS's initialize())
                fn._lib.gg_debug_skip_workspace_init(1)
            fn(a, b, out)
            torch.cuda.synchronize()
            _mark(progress, f"{m}x{n}x{k} first")
            err = (out.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()
            if not err < 1e-2:
                raise RuntimeError(f"{m}x{n}x{k}: relative error {float(err):.3g}")
            for _ in range(50):
                fn(a, b, out)
            torch.cuda.synchronize()
            _mark(progress, f"{m}x{n}x{k} 50 back-to-back")
            if not stale_workspace:
                graph = torch.cuda.CUDAGraph()
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    fn(a, b, out)  # warm-up on the capture stream
                    torch.cuda.synchronize()
                    with torch.cuda.graph(graph, stream=stream):
                        fn(a, b, out)
                for _ in range(10):
                    graph.replay()
                torch.cuda.synchronize()
                _mark(progress, f"{m}x{n}x{k} graph")
    return run


def load_program(artifact, program):
    from gemmgen.backends import cutlass

    return cutlass.load(artifact, program)


# ---- the parent ----------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for hang_probe.json")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count(), help="parallel nvcc builds")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per phase before it counts as a hang")
    ap.add_argument("--reproduce", action="store_true",
                    help="also run stream-K with a stale barrier workspace (expected to hang: the diagnosis)")
    ap.add_argument("--only", default="", help="substring filter on instance names")
    args = ap.parse_args(argv)

    from gemmgen.backends import cutlass
    from gemmgen.backends.build import build_many
    from gemmgen.dsl import diagnose
    from gemmgen.measure import Job, Runner

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    programs = [p for p in instances() if args.only in name_of(p)]
    started = time.monotonic()
    built = build_many([cutlass.lower(p) for p in programs], jobs=args.jobs)
    build_s = time.monotonic() - started
    print(f"built {len(programs)} instances in {build_s:.0f} s with -j {args.jobs}", flush=True)

    records = []
    with Runner(timeout_s=args.timeout) as runner:
        for program, artifact in zip(programs, built):
            name = name_of(program)
            refused = [d.message for d in diagnose(program.bind((4096, 4096, 4096)))]
            record = {"name": name, "refused_by_validator": refused, "phases": {}}
            if isinstance(artifact, Exception):
                record["build"] = str(artifact)
                records.append(record)
                print(f"{name}: build failed: {artifact}", flush=True)
                continue
            record["build"] = {k: artifact.meta.get(k) for k in ("smem_bytes", "stages", "threads", "compile_s")}
            phases = [("launch", False)] + ([("stale", True)] if args.reproduce and program.scheduler == "stream_k"
                                             else [])
            for phase, stale in phases:
                progress = out_dir / f"{name}.{phase}.progress"
                progress.unlink(missing_ok=True)
                # The stale-barrier run is expected to hang: do not wait long for it.
                result = runner.run(Job(f"{name}:{phase}", launch_phases, (artifact, program, str(progress), stale),
                                        timeout_s=min(args.timeout, 15.0) if stale else None))
                steps = progress.read_text().split("\n")[:-1] if progress.exists() else []
                record["phases"][phase] = {"status": result.status, "message": result.message,
                                           "wall_s": round(result.wall_s, 2), "steps_done": steps}
            problem = replace(program.problem, m=4096, n=4096, k=4096)
            result = runner.run(Job(f"{name}:check", load_program, (artifact, program), problem=problem,
                                    timeout_s=max(args.timeout, 90.0)))
            record["phases"]["check"] = {"status": result.status, "message": result.message,
                                         "wall_s": round(result.wall_s, 2),
                                         "device_ms": (result.timing or {}).get("device_ms")}
            records.append(record)
            print(f"{name}: " + ", ".join(f"{k}={v['status']}" for k, v in record["phases"].items()), flush=True)

    summary = {"instances": len(records), "build_s": round(build_s, 1), "jobs": args.jobs,
               "timeout_s": args.timeout, "records": records}
    (out_dir / "hang_probe.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{'instance':44s} {'validator':9s} {'launch':8s} {'check':8s} {'stale':8s} ms@4096^3")
    for r in records:
        ph = r["phases"]
        ms = (ph.get("check") or {}).get("device_ms")
        print(f"{r['name']:44s} {'refuses' if r['refused_by_validator'] else 'accepts':9s} "
              f"{(ph.get('launch') or {}).get('status', '-'):8s} {(ph.get('check') or {}).get('status', '-'):8s} "
              f"{(ph.get('stale') or {}).get('status', '-'):8s} {ms if ms is None else round(ms, 3)}")
    bad = [r["name"] for r in records if any(v["status"] != "ok" for v in r["phases"].values())
           and not r["refused_by_validator"]]
    print(f"\naccepted by the validator yet not ok: {bad or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
