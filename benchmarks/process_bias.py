#!/usr/bin/env python3
"""Does a timing depend on which process takes it? (run on the GPU)

    python3 benchmarks/process_bias.py --out benchmarks/results/process_bias [--rounds 2]

`gemmgen bench`, the tuning loop and the search scripts time baselines in their own
process and candidates in an isolated worker. On the H200, torch.matmul at 8192^3 read
1.47 ms in one and 1.73 ms in the other (cutlass_search, session 3). This script times
the same torch.matmul call per shape, in turns:

- `parent`: time_many in this process;
- `worker`: a gemmgen.measure Runner job, torch.matmul alone;
- `worker+ref`: the same job with `reference="torch"`, the way a candidate is timed
  (two torch.matmul entries interleaved in one session);
- `worker+check`: the job as the tuning loop runs it, the correctness check first.

Each row keeps the median device time, the cuBLAS kernels launched, and the session's SM
clock (NVML, `gemmgen.measure.clocks`). Writes `results.json` and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gemmgen.measure.shapes import Shape

SHAPES = ("8192x8192x8192", "4096x4096x4096", "12288x12288x4096", "1024x1024x1024", "256x128x8192")
TORCH = "gemmgen.measure.baselines:make_torch"


def _parent(problem) -> dict:
    from gemmgen.measure.baselines import make
    from gemmgen.measure.timing import time

    return time(make("torch", problem).fn, problem, "offline").to_dict()


def _worker(runner, problem, *, reference: bool, check: bool) -> dict:
    from gemmgen.measure.worker import Job, load_named

    job = Job("torch", load_named, (TORCH, problem), problem, check=check,
              reference="torch" if reference else None)
    result = runner.run(job)
    if not result.ok:
        return {"error": f"{result.status}: {result.message}"}
    row = dict(result.timing)
    if reference and result.reference_timing and "device_ms" in result.reference_timing:
        row["reference_device_ms"] = result.reference_timing["device_ms"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated MxNxK (layout nn)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)

    from gemmgen.measure.env import environment
    from gemmgen.measure.worker import Runner

    shapes = [Shape(*map(int, s.split("x"))) for s in args.shapes.split(",")]
    rows = []
    with Runner(timeout_s=120) as runner:
        for rnd in range(args.rounds):
            for shape in shapes:
                problem = shape.problem()
                steps = (("parent", lambda: _parent(problem)),
                         ("worker", lambda: _worker(runner, problem, reference=False, check=False)),
                         ("worker+ref", lambda: _worker(runner, problem, reference=True, check=False)),
                         ("worker+check", lambda: _worker(runner, problem, reference=False, check=True)))
                for where, step in steps:
                    t = step()
                    clocks = t.get("clocks") or {}
                    rows.append({"round": rnd, "shape": shape.key, "where": where, "at_s": time.time(),
                                 "device_ms": t.get("device_ms"), "reference_device_ms": t.get("reference_device_ms"),
                                 "spread": t.get("spread"), "reps": t.get("reps"), "kernels": t.get("kernels"),
                                 "clocks": clocks, "error": t.get("error")})
                    r = rows[-1]
                    print(f"{rnd} {shape.key:22s} {where:13s} "
                          f"{(r['device_ms'] or 0) * 1e3:10.1f} us  ref {(r['reference_device_ms'] or 0) * 1e3:10.1f}"
                          f"  sm {clocks.get('sm_mhz_min')}-{clocks.get('sm_mhz_max')} MHz {clocks.get('reasons')}"
                          f"  {(r['kernels'] or ['?'])[-1][:48]} {r['error'] or ''}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"meta": {"environment": environment(), "command": " ".join(sys.argv)}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
