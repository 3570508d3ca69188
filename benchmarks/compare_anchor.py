#!/usr/bin/env python3
"""Compare a bench results.json with the H200 anchor of cuBLAS kernel times (CPU only).

    python benchmarks/compare_anchor.py benchmarks/results/baselines_sample100_offline \
        [--anchor ../shared/anchors/h200_cublas_kernel_time_sample.json] [--out compare.json]

For every anchor shape also in the results (layout nn): our device time / the anchor's,
per baseline (torch, lt_heuristic <- lt_heur, lt_autotune <- lt_auto), then geomeans:
the ratio ours/anchor, and speedups over torch (ours on the common shapes, ours on all
shapes of the run, the anchor's) so a difference of more than 3 % stands out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemmgen.measure.numerics import geomean

PAIRS = (("torch", "torch"), ("lt_heuristic", "lt_heur"), ("lt_autotune", "lt_auto"))
DEFAULT_ANCHOR = Path(__file__).resolve().parents[2] / "shared/anchors/h200_cublas_kernel_time_sample.json"


def load_rows(path: Path) -> dict:
    doc = json.loads((path / "results.json" if path.is_dir() else path).read_text())
    rows = {}
    for r in doc["rows"]:
        if r.get("shape_layout", "nn") == "nn" and r.get("passed") and r.get("device_ms"):
            rows[(r["m"], r["n"], r["k"], r["name"])] = r["device_ms"]
    return doc.get("meta", {}), rows


def compare(rows: dict, anchor: list[dict]) -> dict:
    per_shape, ratios = [], {ours: [] for ours, _ in PAIRS}
    for a in anchor:
        key = (a["M"], a["N"], a["K"])
        ours = {name: rows.get(key + (name,)) for name, _ in PAIRS}
        if all(v is None for v in ours.values()):
            continue
        entry = {"m": key[0], "n": key[1], "k": key[2], "anchor_nalgos": a.get("nalgos")}
        for name, theirs in PAIRS:
            if ours[name] is not None and a.get(theirs):
                entry[name] = ours[name]
                entry[f"{name}_anchor"] = a[theirs]
                entry[f"{name}_ratio"] = ours[name] / a[theirs]
                ratios[name].append(ours[name] / a[theirs])
        per_shape.append(entry)

    def speedups(source, pick):
        return {name: geomean(pick(s, "torch") / pick(s, name) for s in source
                              if pick(s, "torch") and pick(s, name)) for name, _ in PAIRS[1:]}

    common = [e for e in per_shape if all(e.get(n) for n, _ in PAIRS)]
    shapes_all = {k[:3] for k in rows}
    all_rows = [{n: rows.get(s + (n,)) for n, _ in PAIRS} for s in shapes_all]
    return {
        "n_common": len(per_shape),
        "ratio_ours_over_anchor": {n: geomean(v) for n, v in ratios.items()},
        "speedup_over_torch_ours_common": speedups(common, lambda e, n: e.get(n)),
        "speedup_over_torch_anchor_common": speedups(common, lambda e, n: e.get(f"{n}_anchor")),
        "speedup_over_torch_ours_all": speedups(all_rows, lambda e, n: e.get(n)),
        "speedup_over_torch_anchor_all": {n: geomean(a["torch"] / a[t] for a in anchor if a.get(t))
                                          for n, t in PAIRS[1:]},
        "per_shape": per_shape,
    }


def render(result: dict, meta: dict) -> str:
    lines = [f"mode {meta.get('mode', '?')}; {result['n_common']} anchor shapes measured", "",
             f"{'M':>6}{'N':>7}{'K':>7}" + "".join(f"{n + ' ours/anchor':>26}" for n, _ in PAIRS)]
    for e in result["per_shape"]:
        cells = "".join(f"{e.get(n + '_ratio', float('nan')):>26.3f}" for n, _ in PAIRS)
        lines.append(f"{e['m']:>6}{e['n']:>7}{e['k']:>7}{cells}")
    lines.append("")
    fmt = lambda d: ", ".join(f"{k} {v:.3f}" if v else f"{k} -" for k, v in d.items())  # noqa: E731
    lines.append("geomean ours/anchor (device time): " + fmt(result["ratio_ours_over_anchor"]))
    lines.append("speedup over torch, ours on common shapes:   " + fmt(result["speedup_over_torch_ours_common"]))
    lines.append("speedup over torch, anchor on common shapes: " + fmt(result["speedup_over_torch_anchor_common"]))
    lines.append("speedup over torch, ours on all run shapes:  " + fmt(result["speedup_over_torch_ours_all"]))
    lines.append("speedup over torch, anchor on its 74 shapes: " + fmt(result["speedup_over_torch_anchor_all"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="bench output directory or results.json")
    ap.add_argument("--anchor", type=Path, default=DEFAULT_ANCHOR)
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = ap.parse_args(argv)
    try:
        meta, rows = load_rows(args.results)
        anchor = json.loads(args.anchor.read_text())
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        print(f"compare_anchor: cannot read input: {exc}", file=sys.stderr)
        return 2
    result = compare(rows, anchor)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
