"""What a cuBLASLt library search found, from its exported choices (no GPU).

Per FLOP bucket: the choices, how many serve (beat torch.matmul beyond their noise), the
geomean of torch.matmul over the chosen algorithm (same session), and, for searches that
tried the heuristic's neighbours (`gemmgen.measure.library`), how much the neighbours gained
over the heuristic's best in the selection session, and which knobs the winners changed.
Writes --out/library_report.json and library_report.png.

    python3 benchmarks/library_report.py tuning_db/shipped/h200.jsonl.gz --out benchmarks/results/library_search
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

from gemmgen.measure.numerics import bucket_names, bucket_of, geomean
from gemmgen.measure.plots import save_png


def rows_of(path: Path, search: str) -> list[dict]:
    """The checked and timed choices of the `search` method ('any': every method), the latest per problem."""
    from gemmgen.tuning_db.exchange import read_any
    from gemmgen.tuning_db.records import LibraryChoice

    latest: dict[str, LibraryChoice] = {}
    for c in read_any(path):
        if isinstance(c, LibraryChoice) and (search == "any" or c.config.get("search", "heuristic") == search):
            if c.problem.key not in latest or c.created > latest[c.problem.key].created:
                latest[c.problem.key] = c
    rows = []
    for c in latest.values():
        if not c.check_passed or not c.device_ms:
            continue
        p, sel = c.problem, c.config.get("selection") or {}
        rows.append({"m": p.m, "n": p.n, "k": p.k, "gflop": p.flops / 1e9, "bucket": bucket_of(p.flops / 1e9),
                     "x_torch": c.speedup, "serves": c.beats_torch(), "noise": c.noise,
                     "from": c.config.get("from", "heuristic"),
                     "x_heuristic": (sel["heuristic_best_ms"] / sel["selected_ms"]
                                     if sel.get("heuristic_best_ms") and sel.get("selected_ms") else None)})
    return rows


def knob(label: str) -> str:
    """'heuristic #3 with split_k=8, reduction_scheme=2' -> 'split_k'; a heuristic pick -> 'heuristic'."""
    found = re.search(r" with (\w+)=", label)
    return found.group(1) if found else "heuristic"


def table(rows: list[dict]) -> tuple[str, dict]:
    lines = [f"{'bucket':>8} {'choices':>7} {'serve':>5} {'x torch (all)':>13} {'x torch (serving)':>17} "
             f"{'neighbour won':>13} {'x heuristic best':>16}"]
    summary = {}
    for bucket in list(bucket_names()) + ["all"]:
        rs = [r for r in rows if bucket == "all" or r["bucket"] == bucket]
        if not rs:
            continue
        serving = [r for r in rs if r["serves"]]
        won = [r for r in rs if knob(r["from"]) != "heuristic"]
        s = {"choices": len(rs), "serve": len(serving), "x_torch": geomean(r["x_torch"] for r in rs),
             "x_torch_serving": geomean(r["x_torch"] for r in serving) if serving else None,
             "neighbour_won": len(won),
             "x_heuristic": geomean(r["x_heuristic"] for r in rs if r["x_heuristic"])}
        summary[bucket] = s
        lines.append(f"{bucket:>8} {s['choices']:>7} {s['serve']:>5} {s['x_torch']:>13.3f} "
                     f"{s['x_torch_serving'] or float('nan'):>17.3f} {s['neighbour_won']:>13} "
                     f"{s['x_heuristic'] or float('nan'):>16.3f}")
    knobs = Counter(knob(r["from"]) for r in rows)
    lines.append("winning knob: " + ", ".join(f"{k} {v}" for k, v in knobs.most_common()))
    summary["knobs"] = dict(knobs)
    return "\n".join(lines), summary


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, pick in (("heuristic's own algorithm", lambda r: knob(r["from"]) == "heuristic"),
                        ("a neighbour (one knob changed)", lambda r: knob(r["from"]) != "heuristic")):
        rs = [r for r in rows if pick(r)]
        ax.scatter([r["gflop"] for r in rs], [r["x_torch"] for r in rs], label=label, alpha=0.7, s=14)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("GFLOP (2MNK / 1e9)")
    ax.set_ylabel("torch.matmul / chosen algorithm (same session)")
    ax.set_title("cuBLASLt search per shape (H200, device time, offline)")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", help="a `gemmgen db export` file (or a database)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--search", default=None, help="only choices of this search method (default: the current "
                    "one, gemmgen.measure.library.SEARCH; 'any': all)")
    args = ap.parse_args(argv)
    from gemmgen.measure.library import SEARCH

    from gemmgen.errors import GemmgenError
    try:
        rows = rows_of(Path(args.export), args.search or SEARCH)
    except GemmgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(f"no checked and timed library choices in {args.export}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text, summary = table(rows)
    (out / "library_report.json").write_text(json.dumps({"command": " ".join(sys.argv), "summary": summary,
                                                         "rows": rows}, indent=1))
    plot(rows, out / "library_report.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
