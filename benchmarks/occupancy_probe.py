"""Variants of the multistage family's selected programs, timed as the bench times them.

Session 16 (`--set ring64`): does a second resident CTA per SM speed up the mid shapes?

Session 15's Nsight Compute runs found the family's selected programs at 1-16 GFLOP holding one
4-warp CTA per SM: a 3-stage ring of 128-deep k tiles takes 147 KB of shared memory
(`backends/CUDA_NOTES.md`). This probe writes, for every shape of a cuda_search result in a
GFLOP range, the selected multistage program and variants whose rings leave room for two or
three CTAs (64-deep k tiles), plus an 8-warp variant of the selected tile; `report` asks the
driver how many CTAs of each an SM holds; the timing is `anchor_turns.py --protocol pairs`
(the bench's protocol); `summarize` joins the two.

Session 24 (`--set short_k --max-k 512 --min-gflop 0.25`): persistent CTAs on wider tiles for
the short-K shapes (CUDA_NOTES.md, session 24).

Session 25 (`--set split --min-k 1024`, on a trial template whose workspace split-K finished in
the GEMM kernel: `results/split_probe/template.diff`): wide tiles split along K for the long-K
shapes whose outputs hold too few wide tiles to fill the SMs. Then (`--set stream_k`) stream-K
CTAs on the tiles of 64 accumulators a thread.

Session 26 (`--set wgmma`): the family's cp.async ring read by wgmma instead of ldmatrix +
mma.sync, on one or two warpgroups, each scheduler.

    python benchmarks/occupancy_probe.py write --search RESULT.json --out DIR      (the programs)
    python benchmarks/occupancy_probe.py report --out DIR/resident.json DIR/*.gemm       (GPU)
    python benchmarks/anchor_turns.py --protocol pairs --repeats 3 --out DIR/pairs DIR/*.gemm  (GPU; pairs*/ all read)
    python benchmarks/occupancy_probe.py summarize DIR
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple, Optional


class Variant(NamedTuple):
    label: str
    tile_m: int
    tile_n: int
    tile_k: int
    warps: tuple[int, int]
    stages: int
    scheduler: str
    split_k: Optional[int] = None      # None: the selected program's split where the variant allows it
    wgmma: bool = False                # `instr wgmma 64xNx16` across a warpgroup's columns


def _split_variants() -> tuple[Variant, ...]:
    """Wide tiles (64x64 or 128x32 a warp) split 2-8 ways along K."""
    tiles = (("128x128", 128, 128, (2, 2)), ("128x128w8", 128, 128, (4, 2)), ("256x128", 256, 128, (4, 2)),
             ("128x256", 128, 256, (2, 4)), ("64x128", 64, 128, (2, 2)))
    return tuple(Variant(f"s{name}k64s3x{split}", tm, tn, 64, warps, 3, "tile", split)
                 for name, tm, tn, warps in tiles for split in (2, 3, 4, 6, 8))


VARIANT_SETS = {
    # Session 16: rings of 64-deep k tiles, 48-96 KB a CTA, so that 2-3 CTAs fit an SM.
    "ring64": (
        Variant("t64x128k64s3", 64, 128, 64, (2, 2), 3, "tile"),
        Variant("t64x128k64s4", 64, 128, 64, (2, 2), 4, "tile"),
        Variant("t128x128k64s3", 128, 128, 64, (2, 2), 3, "tile"),
        Variant("t128x128k64s3w8", 128, 128, 64, (4, 2), 3, "tile"),
        Variant("t64x64k64s4", 64, 64, 64, (2, 2), 4, "tile"),
        Variant("t128x64k64s3", 128, 64, 64, (2, 2), 3, "tile"),
    ),
    # Short K: persistent CTAs whose next tile loads during this tile's stores, on tiles wide
    # enough to read A and B from L2 fewer times per output element.
    "short_k": (
        Variant("p64x128k64s3", 64, 128, 64, (2, 2), 3, "persistent"),
        Variant("p128x64k64s3", 128, 64, 64, (4, 1), 3, "persistent"),
        Variant("p128x128k64s3w8", 128, 128, 64, (4, 2), 3, "persistent"),
        Variant("p128x128k64s3", 128, 128, 64, (2, 2), 3, "persistent"),
        Variant("p128x128k32s4w8", 128, 128, 32, (4, 2), 4, "persistent"),
        Variant("p256x128k64s2", 256, 128, 64, (4, 2), 2, "persistent"),
        Variant("p256x128k64s3", 256, 128, 64, (4, 2), 3, "persistent"),
        Variant("p128x256k64s3", 128, 256, 64, (2, 4), 3, "persistent"),
        Variant("p256x128k32s4", 256, 128, 32, (4, 2), 4, "persistent"),
        Variant("t256x128k64s3", 256, 128, 64, (4, 2), 3, "tile"),
        Variant("t128x128k64s3w8", 128, 128, 64, (4, 2), 3, "tile"),
    ),
    # Long K, few wide tiles: split along K (timed on session 25's trial template, whose last
    # slice of a tile summed the partials: results/split_probe/template.diff).
    "split": _split_variants(),
    # Stream-K: one wave of CTAs shares the iterations evenly (warp tiles of 64 accumulators a
    # thread at most).
    "stream_k": (
        Variant("k64x128k64s3", 64, 128, 64, (2, 2), 3, "stream_k", 1),
        Variant("k64x128k128s3", 64, 128, 128, (2, 2), 3, "stream_k", 1),
        Variant("k64x128k32s4", 64, 128, 32, (2, 2), 4, "stream_k", 1),
        Variant("k128x64k64s3", 128, 64, 64, (4, 1), 3, "stream_k", 1),
        Variant("k64x64k64s4", 64, 64, 64, (2, 2), 4, "stream_k", 1),
        Variant("k128x128k64s3w8", 128, 128, 64, (4, 2), 3, "stream_k", 1),
    ),
    # wgmma from the cp.async ring: 64-deep k tiles (the 128-byte swizzle), 4-5 stages (the
    # ring holds two k tiles besides the ones loading), one or two warpgroups.
    "wgmma": tuple(
        Variant(f"{s[0] if s != 'stream_k' else 'k'}{tm}x{tn}w{w[0]}x{w[1]}s{st}", tm, tn, 64, w, st, s,
                1 if s == "stream_k" else None, True)
        for s, tm, tn, w, st in (
            ("tile", 64, 64, (4, 1), 4), ("tile", 64, 128, (4, 1), 4), ("tile", 64, 128, (4, 1), 5),
            ("tile", 128, 64, (4, 1), 4), ("tile", 64, 256, (4, 1), 4), ("tile", 128, 128, (4, 1), 4),
            ("tile", 128, 128, (8, 1), 4), ("tile", 128, 256, (8, 1), 4), ("tile", 128, 128, (4, 2), 4),
            ("persistent", 128, 128, (4, 1), 4), ("persistent", 128, 256, (8, 1), 4),
            ("persistent", 64, 128, (4, 1), 5), ("persistent", 128, 128, (8, 1), 4),
            ("stream_k", 64, 128, (4, 1), 4), ("stream_k", 128, 64, (4, 1), 4),
            ("stream_k", 128, 128, (8, 1), 4))),
}


def selected_rows(search: dict, low: float, high: float) -> list[dict]:
    """The fastest checked multistage row of every shape with low <= GFLOP < high."""
    best: dict = {}
    for r in search["rows"]:
        if r.get("family") != "multistage" or r.get("status") != "ok" or not low <= r["gflop"] < high:
            continue
        key = (r["m"], r["n"], r["k"], r["layout"])
        if key not in best or r["speedup_vs_torch"] > best[key]["speedup_vs_torch"]:
            best[key] = r
    return [best[k] for k in sorted(best)]


def _worth_splitting(problem, var: Variant) -> bool:
    """Split only tiles too few to fill the SMs, into at most 4 CTAs an SM, each slice at least
    4 k tiles deep."""
    from gemmgen.dsl.hardware import SM90A
    tiles = -(-problem.m // var.tile_m) * -(-problem.n // var.tile_n)
    return tiles < SM90A.sms and tiles * var.split_k <= 4 * SM90A.sms and problem.k // var.tile_k >= 4 * var.split_k


def variants_of(program, variant_set: str = "ring64") -> list[tuple[str, object]]:
    """The selected program, its 8-warp twin (and persistent twin where the set has persistent
    variants), and the set's variants the multistage rules accept (split-K kept where the
    variant allows it, else dropped)."""
    from gemmgen.backends import cuda_multistage as ms
    from gemmgen.dsl.ir import Instr, Tile

    out = [("selected", program)]
    t = program.tile
    if program.num_warps == 4:
        wide = (program.warps[0] * 2, program.warps[1]) if t.m >= t.n else (program.warps[0], program.warps[1] * 2)
        out.append(("selected_w8", replace(program, warps=wide)))
    variants = VARIANT_SETS[variant_set]
    if any(v.scheduler == "persistent" for v in variants):
        out.append(("selected_p", replace(program, scheduler="persistent", split_k=1)))
    for var in variants:
        v = replace(program, tile=Tile(var.tile_m, var.tile_n, var.tile_k), warps=var.warps, stages=var.stages,
                    scheduler=var.scheduler, swizzle=8 if var.tile_m * var.tile_n >= 128 * 128 else 4,
                    instr=Instr("wgmma", 64, var.tile_n // var.warps[1], 16) if var.wgmma else program.instr)
        if var.split_k is not None:
            if var.split_k > 1 and not _worth_splitting(program.problem, var):
                continue
            v = replace(v, split_k=var.split_k, split_k_reduce="workspace")
        elif ms.rules(v) and v.split_k > 1:
            v = replace(v, split_k=1)
        out.append((var.label, v))
    return [(label, v) for label, v in out if not ms.rules(v)]


def write(args) -> int:
    from gemmgen import dsl

    if not Path(args.search).is_file():
        print(f"--search {args.search}: no such file (a cuda_search.py results JSON)", file=sys.stderr)
        return 2
    path = Path(args.search)
    search = json.loads(gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for row in selected_rows(search, args.min_gflop, args.max_gflop):
        if not args.min_k <= row["k"] <= args.max_k:
            continue
        program = dsl.parse(row["program"])
        stem = f"{row['m']}x{row['n']}x{row['k']}_{row['layout']}"
        seen = set()
        for label, v in variants_of(program, args.set):
            if v in seen:
                continue
            seen.add(v)
            (out / f"{stem}_{label}.gemm").write_text(dsl.to_text(v))
            n += 1
    print(f"wrote {n} programs under {out}")
    return 0


def report(args) -> int:
    """Registers, shared memory and resident CTAs per SM of every program (loads each on the GPU)."""
    import torch

    from gemmgen import backends, dsl
    from gemmgen.backends import cuda_launch, cuda_multistage as ms

    if not torch.cuda.is_available():
        print("report needs a CUDA GPU: it asks the driver for each kernel's occupancy", file=sys.stderr)
        return 2
    backend = backends.get("cuda")
    rows = {}
    for path in args.programs:
        program = dsl.parse(Path(path).read_text())
        artifact = backend.build(backend.lower(program))
        fn = backend.load(artifact, program)
        geo = ms.geometry(program)
        ctas = cuda_launch.resident_ctas(fn.funcs[ms.ENTRY], geo.threads, geo.smem)
        regs = (artifact.meta.get("resources") or {}).get(ms.ENTRY, {}).get("registers")
        rows[Path(path).stem] = {"registers": regs, "smem": geo.smem, "threads": geo.threads,
                                 "resident_ctas": ctas, "warps_per_scheduler": ctas * geo.threads / 32 / 4}
        print(f"{Path(path).stem:48s} regs {regs} smem {geo.smem // 1024} KB -> {ctas} CTAs/SM", flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


def summarize(args) -> int:
    """Per shape: the selected program's ratio to torch.matmul, the best variant's, and the geomeans."""
    from gemmgen.measure.numerics import geomean

    d = Path(args.dir)
    shapes = [s for f in sorted(d.glob("pairs*/results.json")) for s in json.loads(f.read_text())["shapes"]]
    if not shapes:
        print(f"{d}: no pairs*/results.json (run anchor_turns.py --protocol pairs --out {d}/pairs first)",
              file=sys.stderr)
        return 2
    resident = json.loads((d / "resident.json").read_text()) if (d / "resident.json").exists() else {}
    table, sel_all, best_all, by_label = [], [], [], {}
    for s in shapes:
        ratios = {n: v["vs_torch_median_ratio"][1] for n, v in s["variants"].items()
                  if v.get("vs_torch_median_ratio") and not n.startswith("torch")}
        sel = next((r for n, r in ratios.items() if n.endswith("_selected")), None)
        if sel is None or not ratios:
            continue
        best_name = max(ratios, key=ratios.get)
        label = best_name.split("_", 2)[-1]
        by_label[label] = by_label.get(label, 0) + 1
        sel_all.append(sel)
        best_all.append(ratios[best_name])
        table.append({"shape": s["shape"], "selected": sel, "best": label, "best_ratio": ratios[best_name],
                      "best_ctas": resident.get(best_name, {}).get("resident_ctas"), "ratios": ratios})
    summary = {"shapes": len(table), "geomean_selected": geomean(sel_all), "geomean_best": geomean(best_all),
               "wins_by_variant": by_label, "rows": table}
    (d / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(table, d / "occupancy_probe.png")
    for r in table:
        print(f"{r['shape']:18s} selected {r['selected']:.3f}  best {r['best_ratio']:.3f} {r['best']}"
              f" ({r['best_ctas']} CTAs/SM)")
    print(f"\n{len(table)} shapes: geomean x torch.matmul selected {summary['geomean_selected']:.3f}, "
          f"best variant {summary['geomean_best']:.3f}; wins {by_label}")
    return 0


def plot(table: list[dict], path: Path) -> None:
    """Per shape: the selected program's ratio to torch.matmul and the best variant's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(table, key=lambda r: r["selected"])
    y = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(rows) + 1.2))
    ax.scatter([r["selected"] for r in rows], y, label="selected by the search", color="tab:gray")
    ax.scatter([r["best_ratio"] for r in rows], y, label="best variant", color="tab:green", marker="x")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(y), [r["shape"] for r in rows], fontsize=7)
    ax.set_xlabel("x torch.matmul (bench protocol, median of 3 pairs)")
    ax.set_title(f"multistage family: {path.parent.name}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--search", required=True, help="a cuda_search.py results JSON (or .json.gz)")
    w.add_argument("--out", required=True)
    w.add_argument("--min-gflop", type=float, default=1.0)
    w.add_argument("--max-gflop", type=float, default=16.0)
    w.add_argument("--max-k", type=int, default=1 << 30, help="only shapes with K up to this")
    w.add_argument("--min-k", type=int, default=0, help="only shapes with K from this")
    w.add_argument("--set", choices=sorted(VARIANT_SETS), default="ring64", help="which variants to write")
    r = sub.add_parser("report")
    r.add_argument("programs", nargs="+")
    r.add_argument("--out", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("dir")
    args = p.parse_args(argv)
    return {"write": write, "report": report, "summarize": summarize}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
