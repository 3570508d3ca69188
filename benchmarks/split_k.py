"""Split-K reductions on small-MN, long-K shapes: none, `workspace` and `unordered`, per backend.

Session 3 measured CUTLASS's deterministic stream-K turnstile slower than no split at all
(256x128x8192: split 16 39.8 us, data-parallel 21.8 us, cuBLAS 7.9 us). This script times
the same programs with each reduction, on Triton and CUTLASS, to see what the turnstile costs:

1. programs  per shape and backend, a few tiles, each with split_k 1 and, for each split
             factor, `workspace` and `unordered` (for CUTLASS the reduction is a runtime
             argument: one build serves them all);
2. build     all of them with backends/build.py's process pool (-j, default all cores);
3. measure   one isolated worker job per shape and backend: each program is checked, then
             torch.matmul and the passing ones are timed in one session (offline: L2 flushed,
             CUPTI device time).

Writes --out/split_k.json (every program's check and time) and split_k.png, and prints, per
shape, the best of each (backend, reduction) against torch.matmul of the same session
(`--report` redraws both from the JSON, without a GPU).

    python benchmarks/split_k.py --out benchmarks/results/split_k -j 16
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import search_common as common  # noqa: E402 - from this script's folder

SHAPES = ((64, 64, 12288), (256, 128, 8192), (256, 256, 4096), (512, 256, 16384), (512, 512, 16384),
          (1024, 128, 16384), (128, 2048, 16384), (2048, 64, 8192))
SPLITS = (4, 8, 16)
REDUCES = ("workspace", "unordered")


def base_programs(problem) -> dict[str, list]:
    """Per backend, the split_k 1 programs whose splits are tried."""
    from gemmgen.dsl.ir import Program, Tile

    def cutlass(tile):
        return Program(problem=problem, backend="cutlass", tile=Tile(*tile), warps=(8, 1), mainloop="ws_cooperative",
                       scheduler="persistent")

    def triton(tile, warps, stages):
        return Program(problem=problem, backend="triton", tile=Tile(*tile), warps=warps, mainloop="multistage",
                       stages=stages)

    return {"cutlass": [cutlass((128, 128, 64)), cutlass((128, 64, 64))],
            "triton": [triton((64, 64, 64), (2, 2), 4), triton((64, 128, 64), (2, 2), 3), triton((32, 64, 128), (2, 2), 3)]}


def programs_for(problem) -> dict[str, list]:
    """Every valid (base, split, reduction) program per backend."""
    from gemmgen.dsl import diagnose

    out = {}
    for backend, bases in base_programs(problem).items():
        programs = []
        for base in bases:
            programs += [base] + [replace(base, split_k=s, split_k_reduce=r) for s in SPLITS for r in REDUCES]
        out[backend] = [p for p in programs if not diagnose(p)]
    return out


def reduction_of(program) -> str:
    return "none" if program.split_k == 1 else program.split_k_reduce


def rows_for(shape, problem, backend, programs, builds, report) -> list[dict]:
    from gemmgen.dsl import to_text

    rows = []
    torch_ms = ((report.get("torch") or {}).get("timing") or {}).get("device_ms")
    for j, (program, built) in enumerate(zip(programs, builds)):
        entry = report.get(f"p{j}", {})
        ms = (entry.get("timing") or {}).get("device_ms")
        status, message = common.entry_outcome(entry, built)
        rows.append({**common.shape_fields(shape, problem, torch_ms), "backend": backend,
                     "reduction": reduction_of(program), "split_k": program.split_k, "program": to_text(program),
                     "status": status, "device_ms": ms, "message": message,
                     "speedup_vs_torch": torch_ms / ms if ms and torch_ms else None})
    return rows


def table(rows: list[dict]) -> str:
    """Per shape, the best of each (backend, reduction) as x torch.matmul (same session)."""
    columns = [(b, r) for b in ("triton", "cutlass") for r in ("none",) + REDUCES]
    head = f"{'shape':>18} {'torch us':>9} " + " ".join(f"{b[:3]}:{r[:5]:>5}" for b, r in columns)
    lines = [head]
    for key in dict.fromkeys(common.shape_key(r) for r in rows):
        mine = [r for r in rows if common.shape_key(r) == key and r["status"] == "ok"]
        cells = []
        for b, red in columns:
            best = [r["speedup_vs_torch"] for r in mine if r["backend"] == b and r["reduction"] == red]
            cells.append(f"{max(best):>9.2f}" if best else f"{'-':>9}")
        torch_ms = next((r["torch_ms"] for r in mine if r["torch_ms"]), None)
        lines.append(f"{'x'.join(map(str, key[:3])):>18} {torch_ms * 1e3 if torch_ms else float('nan'):>9.1f} "
                     + " ".join(cells))
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Per shape, the best of each (backend, reduction) as x torch.matmul: grouped bars."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    keys = list(dict.fromkeys(common.shape_key(r) for r in rows))
    columns = [(b, r) for b in ("triton", "cutlass") for r in ("none",) + REDUCES]
    width = 0.8 / len(columns)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for c, (backend, red) in enumerate(columns):
        heights = [max([r["speedup_vs_torch"] for r in rows if common.shape_key(r) == key and r["status"] == "ok"
                        and r["backend"] == backend and r["reduction"] == red] or [0.0]) for key in keys]
        ax.bar([i + c * width for i in range(len(keys))], heights, width, label=f"{backend} {red}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))])
    ax.set_xticklabels(["x".join(map(str, k[:3])) for k in keys], rotation=30, ha="right")
    ax.set_ylabel("x torch.matmul (same session)")
    ax.set_title("split-K reductions on small M x N, long K (H200, device time, offline)")
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    import argparse
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--time-budget", type=float, default=None, help="seconds; no new shape starts after")
    ap.add_argument("--trial-timeout", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--report", action="store_true", help="table and plot from --out/split_k.json (no GPU)")
    args = ap.parse_args(argv)
    if args.report:
        rows = json.loads((Path(args.out) / "split_k.json").read_text())["rows"]
        plot(rows, Path(args.out) / "split_k.png")
        print(table(rows))
        return 0

    from gemmgen.backends import get
    from gemmgen.backends.build import build_many
    from gemmgen.measure.shapes import Shape
    from gemmgen.measure.worker import Runner

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    shapes = [Shape(m, n, k, "nn") for m, n, k in SHAPES]
    plans = [(s, s.problem(), programs_for(s.problem())) for s in shapes]
    sources = [(i, b, j, get(b).lower(p)) for i, (_, _, by) in enumerate(plans) for b, ps in by.items()
               for j, p in enumerate(ps)]
    distinct = {src.digest: src for *_, src in sources}        # one CUTLASS build serves every shape
    built = dict(zip(distinct, build_many(list(distinct.values()), jobs=args.jobs)))
    builds = {(i, b, j): built[src.digest] for i, b, j, src in sources}
    print(f"built {sum(not isinstance(r, Exception) for r in built.values())} of {len(built)} in "
          f"{time.monotonic() - start:.0f} s", flush=True)
    rows: list[dict] = []
    with Runner(timeout_s=args.trial_timeout) as runner:
        for i, (shape, problem, by) in enumerate(plans):
            if args.time_budget and time.monotonic() - start > args.time_budget:
                print(f"time budget spent after {i} shapes", flush=True)
                break
            for backend, programs in by.items():
                results = [builds[(i, backend, j)] for j in range(len(programs))]
                entries = common.entries_for(programs, results)
                trial, report = common.run_shape_job(runner, f"{shape.key}-{backend}", backend, entries, problem,
                                                     args.seed + i, out / f".shape_{i}.json")
                shape_rows = rows_for(shape, problem, backend, programs, results, report)
                for r in shape_rows:
                    if r["status"] == "not_run" and not trial.ok:
                        r["status"], r["message"] = trial.status, trial.message
                rows += shape_rows
            common.write_doc(out / "split_k.json", start, rows=rows)
            print(table([r for r in rows if common.shape_key(r) == (shape.m, shape.n, shape.k, shape.layout)])
                  .splitlines()[-1], flush=True)
    common.write_doc(out / "split_k.json", start, rows=rows)
    plot(rows, out / "split_k.png")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
