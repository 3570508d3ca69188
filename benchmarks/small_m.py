"""Which kernel idea streams the weight fastest for `x @ W.T` at M <= 128, measured idea by idea.

For each shape (M x N x K, layout nt: the activation x row-major, the weight W stored N x K),
every program of five ideas, four written in the DSL for the Triton backend and one for raw CUDA:

  tile      one CTA per output tile, tiles of 16-128 rows (no wider than M needs)
  split_k   the same tiles, K split over enough CTAs to fill the SMs, partials added as they
            arrive, then a second kernel applies the epilogue (`split_k S unordered`)
  stream_k  one wave of CTAs shares out tiles x k-tiles evenly; partial tiles are added in K
            order inside the same launch (`scheduler stream_k`)
  persistent one CTA per SM walking the tiles, operands by TMA (`scheduler persistent`)
  swap      `swap_ab` programs, C^T = W x^T (N x M x K), so that the weight's N fills the
            MMA's M side and the batch is a narrow N (16-128) of wgmma: one CTA a tile with K
            split 1-8 ways, and stream-K.
  direct    raw CUDA's direct family under swap_ab: the weight streams from global memory
            straight into mma.sync registers, K split over a few CTAs an SM, partials added in
            the same launch (every program of `backends/cuda/search_space.direct_programs`), timed on
            the original problem.

Each program is built, checked by the harness (gemmgen.measure.check) and timed beside
torch.matmul in one isolated worker per shape (offline, L2 flushed, CUPTI device time), as
benchmarks/triton_search.py does. Reports each idea's best per shape as speedup over
torch.matmul and as the fraction of the bandwidth floor (bytes / 4.8 TB/s) it reaches.

    python benchmarks/small_m.py --out benchmarks/results/small_m -j 16 --time-budget 300
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import search_common as common  # noqa: E402 - from this script's folder
import triton_search  # noqa: E402 - its build and row helpers

MS = (1, 16, 128)
# (N, K) of Llama-3-8B's layers: q/o, gate or up, down
WIDTHS = ((4096, 4096), (14336, 4096), (4096, 14336))
IDEAS = ("tile", "split_k", "stream_k", "persistent", "swap", "direct")


def idea_of(program) -> str:
    if program.mainloop == "direct":
        return "direct"
    if program.swap_ab:
        return "swap"
    if program.split_k > 1:
        return "split_k"
    return program.scheduler


def swapped_candidates(problem) -> list:
    """`swap_ab` programs (C^T = W x^T: M' = the weight's N, N' = the batch): one CTA a tile with
    K split 1-8 ways (partials added as they arrive, then the finishing kernel), and stream-K."""
    from gemmgen.backends import diagnose
    from gemmgen.backends.triton.search_space import warp_layout
    from gemmgen.dsl.ir import Program, Tile

    bn = min(128, max(16, 1 << max(0, (problem.m - 1).bit_length())))
    out = []
    for bm in (64, 128):
        for bk in (64, 128):
            for stages in (4, 6):
                for scheduler, split in (("stream_k", 1), ("tile", 1), ("tile", 2), ("tile", 4), ("tile", 8)):
                    out.append(Program(problem=problem, backend="triton", tile=Tile(bm, bn, bk),
                                       warps=warp_layout(bm, 4), mainloop="multistage", stages=stages,
                                       scheduler=scheduler, raster="n", swizzle=8, split_k=split,
                                       split_k_reduce="unordered" if split > 1 else "workspace", swap_ab=True))
    return [p for p in dict.fromkeys(out) if not diagnose(p)]


def candidates(problem) -> list:
    """The programs of every idea for one problem, valid on the Triton backend."""
    from gemmgen.backends import diagnose
    from gemmgen.backends.triton.search_space import warp_layout
    from gemmgen.dsl.hardware import SM90A
    from gemmgen.dsl.ir import Program, Tile

    m, n = problem.m, problem.n
    bm0 = min(128, max(16, 1 << max(0, (m - 1).bit_length())))
    rows = (bm0, bm0 // 2) if bm0 >= 128 else (bm0,)

    def program(bm, bn, bk, stages, scheduler="tile", split=1, warps=4):
        return Program(problem=problem, backend="triton", tile=Tile(bm, bn, bk), warps=warp_layout(bm, warps),
                       mainloop="multistage", stages=stages, scheduler=scheduler, raster="n", swizzle=8,
                       split_k=split, split_k_reduce="unordered" if split > 1 else "workspace")

    out = []
    for bm in rows:
        for bn in (32, 64, 128):
            out.append(program(bm, bn, 128, 4))
        for bn in (64, 128):
            tiles = math.ceil(m / bm) * math.ceil(n / bn)
            split = min(16, 1 << max(0, math.ceil(math.log2(max(1, SM90A.sms / tiles)))))
            if split > 1:
                out.append(program(bm, bn, 128, 4, split=split))
        for bn in (32, 64, 128, 256):
            for bk in (64, 128):
                for stages in (3, 4, 6):
                    warps = 8 if bm * bn >= 128 * 128 else 4
                    out.append(program(bm, bn, bk, stages, "stream_k", warps=warps))
        out.append(program(bm, 128, 128, 4, "persistent"))
    return [p for p in dict.fromkeys(out) if not diagnose(p)]


def table(rows: list[dict]) -> str:
    by_shape: dict = {}
    torch_ms = {(r["m"], r["n"], r["k"]): r["torch_ms"] for r in rows if r["torch_ms"]}
    for r in rows:
        key = (r["m"], r["n"], r["k"])
        if r["status"] == "ok" and key in torch_ms:
            r["speedup_vs_torch"] = torch_ms[key] / r["device_ms"]
            by_shape.setdefault(key, []).append(r)
    head = f"{'shape':>16} {'torch floor':>11} " + " ".join(f"{i + ' x / floor':>20}" for i in IDEAS)
    lines = [head]
    for (m, n, k), rs in sorted(by_shape.items()):
        torch_frac = rs[0]["floor_ms"] / torch_ms[(m, n, k)]
        cells = []
        for idea in IDEAS:
            mine = [r for r in rs if r["idea"] == idea]
            best = min(mine, key=lambda r: r["device_ms"]) if mine else None
            cells.append(f"{best['speedup_vs_torch']:>8.3f}x {best['fraction_of_floor']:>8.3f}   " if best
                         else f"{'-':>20}")
        lines.append(f"{m:>4}x{n:>5}x{k:>5} {torch_frac:>11.3f} " + " ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("-j", "--jobs", type=int, default=16)
    ap.add_argument("--time-budget", type=float, default=None, help="seconds; no new shape starts after")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated M values")
    ap.add_argument("--widths", default=",".join(f"{n}x{k}" for n, k in WIDTHS),
                    help="comma-separated NxK of the weights (default: Llama-3-8B's q/o, gate, down)")
    ap.add_argument("--ideas", default=",".join(IDEAS), help=f"comma-separated, of {', '.join(IDEAS)}")
    ap.add_argument("--seed", type=int, default=20261201)
    args = ap.parse_args(argv)
    from gemmgen.backends.cuda.search_space import direct_programs
    from gemmgen.measure.shapes import Shape
    from gemmgen.measure.worker import Runner

    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ideas = set(args.ideas.split(","))
    unknown = ideas - set(IDEAS)
    if unknown:
        ap.error(f"unknown idea(s) {', '.join(sorted(unknown))}: choose from {', '.join(IDEAS)}")
    plans = []
    widths = [tuple(map(int, w.split("x"))) for w in args.widths.split(",")]
    for m in map(int, args.ms.split(",")):
        for n, k in widths:
            shape = Shape(m, n, k, "nt")
            mine = [p for p in candidates(shape.problem()) if idea_of(p) in ideas]
            mine += swapped_candidates(shape.problem()) if "swap" in ideas else []
            mine += direct_programs(shape.problem()) if "direct" in ideas else []
            if mine:
                plans.append((shape, shape.problem(), mine))
    builds = triton_search.build_all(plans, args.jobs)
    rows: list[dict] = []
    with Runner(timeout_s=240) as runner:
        for i, shape, trial, srows in triton_search.measured_shapes(runner, plans, builds, out, args.seed, start,
                                                                   args.time_budget):
            for r, p in zip(srows, plans[i][2]):
                r["idea"] = idea_of(p)
            rows.extend(srows)
            ok = [r for r in srows if r["status"] == "ok"]
            print(f"[{i + 1}/{len(plans)}] {shape.key} {trial.status} {len(ok)}/{len(srows)} passed", flush=True)
            common.write_doc(out / "small_m.json", start, rows=rows)
    text = table(rows)
    (out / "table.txt").write_text(text + "\n")
    print(text)
    failed = [r for r in rows if r["status"] not in ("ok",)]
    for r in failed[:20]:
        print(r["status"], r["program"].splitlines()[-3:], r["message"][:300])
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
