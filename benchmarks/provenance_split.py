"""gemmgen's speedup over torch.matmul in a `gemmgen bench` run, split by what gemmgen.compile
served: the exact winner, a neighbour's re-bound program ('nearest'), or the baseline.

    python3 benchmarks/provenance_split.py benchmarks/results/gemmgen_1000_offline --nearest-max-gflop inf

Rows record the choice in their notes (`how`) since the bench records it; for older runs the
choice is looked up again here (CPU is enough) from the shipped database, under the rules of
this checkout. `--nearest-max-gflop` sets the size cap on re-bound programs to the one in force
when the run was measured (`inf`: no cap, before gemmgen.compile.NEAREST_MAX_GFLOP existed).
Writes provenance.json (per shape and per group x FLOP bucket) and provenance.png.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from gemmgen.measure.numerics import geomean



def served_by(row: dict) -> str:
    """What gemmgen.compile chose for a gemmgen row: from its notes, else looked up now."""
    how = row.get("notes", {}).get("how")
    if how:
        return how
    import gemmgen
    from gemmgen.measure.shapes import Shape

    problem = Shape(row["m"], row["n"], row["k"], row["layout"]).problem()
    return gemmgen.compile(problem, device="NVIDIA H200").provenance.how


def split(rows: list) -> list[dict]:
    """Per shape: GFLOP, bucket, what was served, speedup of gemmgen over torch: timed in the
    bench process (`speedup`) and, where the row has it, beside torch.matmul in gemmgen's own
    worker session (`same_session`), which drift between the two sessions does not touch."""
    by_shape: dict = defaultdict(dict)
    for r in rows:
        if r.get("status") == "ok" and r.get("device_ms"):
            by_shape[(r["m"], r["n"], r["k"], r["layout"])][r["name"]] = r
    out = []
    for (m, n, k, layout), named in sorted(by_shape.items()):
        if "gemmgen" in named and "torch" in named:
            g = named["gemmgen"]
            reference = g.get("notes", {}).get("reference_device_ms")
            out.append({"m": m, "n": n, "k": k, "layout": layout, "gflop": g["gflop"], "bucket": g["bucket"],
                        "how": served_by(g), "speedup": named["torch"]["device_ms"] / g["device_ms"],
                        "same_session": reference / g["device_ms"] if reference else None})
    return out


def summarise(shapes: list[dict]) -> dict:
    groups: dict = defaultdict(list)
    for s in shapes:
        for key in (s["how"], f"{s['how']} {s['bucket']}", "all"):
            groups[key].append(s)
    summary = {}
    for key, members in sorted(groups.items()):
        v = [s["speedup"] for s in members]
        same = [s["same_session"] for s in members if s["same_session"]]
        summary[key] = {"shapes": len(v), "geomean": round(geomean(v), 4), "min": round(min(v), 4),
                        "below_0.97": sum(x < 0.97 for x in v),
                        "same_session_geomean": round(geomean(same), 4) if same else None,
                        "same_session_min": round(min(same), 4) if same else None}
    return summary


def plot(shapes: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    same_session = all(s["same_session"] for s in shapes)
    key = "same_session" if same_session else "speedup"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for how, color in (("baseline", "0.6"), ("nearest", "tab:orange"), ("library", "tab:green"), ("exact", "tab:blue")):
        pts = [s for s in shapes if s["how"] == how]
        if pts:
            ax.scatter([s["gflop"] for s in pts], [s[key] for s in pts], s=10, color=color,
                       label=f"{how} ({len(pts)}, geomean {geomean([s[key] for s in pts]):.3f}x)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("GFLOP")
    ax.set_ylabel("speedup over torch.matmul (device time" + (", same session)" if same_session else ")"))
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a gemmgen bench output directory (with results.json)")
    ap.add_argument("--nearest-max-gflop", type=float, default=None,
                    help="the re-binding cap in force when the run was measured (default: this checkout's)")
    args = ap.parse_args(argv)
    if args.nearest_max_gflop is not None:
        import gemmgen.compile as compile_module

        compile_module.NEAREST_MAX_GFLOP = args.nearest_max_gflop
    run = Path(args.run)
    doc = json.loads((run / "results.json").read_text())
    shapes = split(doc["rows"])
    summary = summarise(shapes)
    meta = {"source": str(run / "results.json"), "date": doc["meta"].get("date"),
            "nearest_max_gflop": args.nearest_max_gflop}
    (run / "provenance.json").write_text(json.dumps({"meta": meta, "summary": summary, "shapes": shapes}, indent=1))
    plot(shapes, run / "provenance.png", f"gemmgen vs torch.matmul by what compile served ({len(shapes)} shapes)")
    print(f"{'group':22} {'shapes':>6} {'geomean':>8} {'min':>7} {'<0.97':>6} {'same session':>13} {'min':>7}")
    for key, s in summary.items():
        same = (f"{s['same_session_geomean']:13.4f} {s['same_session_min']:7.3f}"
                if s["same_session_geomean"] else f"{'-':>13} {'-':>7}")
        print(f"{key:22} {s['shapes']:6d} {s['geomean']:8.4f} {s['min']:7.3f} {s['below_0.97']:6d} {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
