"""A layer-set bench read by model family: speedup against M, one line per family.

Reads `gemmgen bench` results.json files made on a layer set (benchmarks/shapes/llm_layers.csv)
and the set itself (each row's model and layer), and writes beside the results (or into --out,
which several benches need: one a batch size, read together):

  by_m.png   gemmgen.compile's speedup over torch.matmul (device time) against M, one line per
             family: the geomean over that family's measured layers at each M
  by_m.txt   per M: shapes, geomean speedup over torch.matmul and over cuBLASLt autotuning,
             median fraction of the bandwidth floor of gemmgen and of torch.matmul

    python benchmarks/layers_plot.py benchmarks/results/gemmgen_llm_layers_offline
    python benchmarks/layers_plot.py benchmarks/results/gemmgen_llm_server_h100/m* \
        --out benchmarks/results/gemmgen_llm_server_h100
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def gpu_name(doc: dict) -> str:
    """The GPU the bench ran on, as its results name it ("NVIDIA H100 80GB HBM3" -> "H100")."""
    env = doc.get("meta", {}).get("environment") or {}
    name = (env.get("gpu") or {}).get("name") or (env.get("torch") or {}).get("device_name") or "GPU"
    model = re.search(r"\b[A-Z]\d{2,}\b", name)     # H100, H200, A100 (of "NVIDIA A100-SXM4-80GB")
    return model.group(0) if model else name


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def per_shape(rows: list[dict]) -> dict:
    """(M, N, K) -> {candidate name: its row}, passing and timed rows only."""
    out: dict = defaultdict(dict)
    for r in rows:
        if r.get("status") == "ok" and r.get("device_ms"):
            out[(r["m"], r["n"], r["k"])][r["name"]] = r
    return out


def read_together(docs: dict) -> dict:
    """One bench document of several (folder -> document) made on one GPU, in one part of the set
    and mode, at distinct shapes (one a batch size); its date the earliest, its rows all theirs."""
    from gemmgen.measure.errors import MeasureError

    metas = {folder: doc.get("meta", {}) for folder, doc in docs.items()}
    for what, of in (("GPU", lambda f: gpu_name(docs[f])), ("part of the set", lambda f: metas[f].get("part")),
                     ("mode", lambda f: metas[f].get("mode"))):
        seen = {f: of(f) for f in docs}
        if len(set(seen.values())) > 1:
            raise MeasureError("the benches differ in " + what + ": "
                               + ", ".join(f"{f} {v}" for f, v in seen.items()) + "; read them apart")
    where: dict = {}
    for folder, doc in docs.items():
        for key in {(r.get("m"), r.get("n"), r.get("k")) for r in doc["rows"]}:
            if where.setdefault(key, folder) != folder:
                raise MeasureError(f"{where[key]} and {folder} both measured {key[0]}x{key[1]}x{key[2]}; "
                                   "give each shape's bench once")
    first = min(docs, key=lambda f: metas[f].get("date", ""))
    return {"meta": metas[first], "rows": [r for doc in docs.values() for r in doc["rows"]]}


def main(argv=None) -> int:
    from gemmgen.errors import GemmgenError
    try:
        return _main(argv)
    except GemmgenError as exc:
        print(f"layers_plot: error: {exc}", file=sys.stderr)
        return 2


def _main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+",
                    help="folders holding a gemmgen bench results.json (or results.json.gz)")
    ap.add_argument("--out", default=None, help="where by_m.txt and by_m.png go (default: the one folder)")
    ap.add_argument("--shapes", default=str(REPO / "benchmarks/shapes/llm_layers.csv"))
    ap.add_argument("--candidate", default="gemmgen")
    ap.add_argument("--part", choices=("all", "tuning", "held-out"), default=None,
                    help="whose families a shape's line counts (default: the bench's own --part); "
                         "`tuning` for a bench over a file of the tuning part, such as "
                         "benchmarks/shapes/llm_layers_m1.csv, whose shapes held-out families share")
    args = ap.parse_args(argv)
    if args.out is None and len(args.results) > 1:
        ap.error(f"{len(args.results)} result folders were given: say where their table and plot go with --out")

    from gemmgen.measure.errors import MeasureError
    from gemmgen.measure.numerics import geomean
    from gemmgen.measure.plots import save_png
    from gemmgen.measure.results import load
    from gemmgen.measure.shapes import held_out_models, parse_shapes, read_lines

    docs = {Path(f): load(Path(f)) for f in args.results}
    folder = Path(args.out) if args.out else Path(args.results[0])
    doc = read_together(docs)
    shapes = per_shape(doc["rows"])
    # (M, N, K) -> the families of the bench's part that have that layer (families share shapes)
    part = args.part or doc.get("meta", {}).get("part") or "all"
    held = held_out_models(args.shapes)
    families: dict = defaultdict(set)
    for s in parse_shapes(read_lines(args.shapes), args.shapes):
        if part == "all" or (s.model in held) == (part == "held-out"):
            families[(s.m, s.n, s.k)].add(s.model)
    speedups: dict = defaultdict(lambda: defaultdict(list))   # family -> M -> speedups
    by_m: dict = defaultdict(list)
    for key, names in sorted(shapes.items()):
        if args.candidate not in names or "torch" not in names:
            continue
        cand, torch_row = names[args.candidate], names["torch"]
        sp = torch_row["device_ms"] / cand["device_ms"]
        lt = names.get("lt_autotune")
        by_m[key[0]].append((sp, lt["device_ms"] / cand["device_ms"] if lt else None,
                             cand["fraction_of_floor"], torch_row["fraction_of_floor"]))
        for family in families.get(key, ()):
            speedups[family][key[0]].append(sp)
    if not by_m:     # nothing to show: keep the folder's earlier table and plot
        candidates = sorted({name for names in shapes.values() for name in names} - {"torch"})
        raise MeasureError(f"{', '.join(map(str, docs))}: no shape has both torch and {args.candidate!r} checked; "
                           f"--candidate is one of {', '.join(candidates) or 'none'}")
    lines = [f"{'M':>5} {'shapes':>6} {'x torch':>8} {'x lt_autotune':>13} {'floor frac':>10} {'torch floor frac':>16}"]
    for m in sorted(by_m):
        rs = by_m[m]
        lts = [r[1] for r in rs if r[1]]
        lines.append(f"{m:>5} {len(rs):>6} {geomean([r[0] for r in rs]):>8.3f} "
                     f"{(geomean(lts) if lts else float('nan')):>13.3f} {_median([r[2] for r in rs]):>10.3f} "
                     f"{_median([r[3] for r in rs]):>16.3f}")
    text = "\n".join(lines)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "by_m.txt").write_text(text + "\n")
    print(text)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    colors = plt.get_cmap("tab20").colors      # the default cycle repeats after 10 families
    for i, family in enumerate(sorted(speedups)):
        ms = sorted(speedups[family])
        ax.plot(ms, [geomean(speedups[family][m]) for m in ms], marker="os^"[i // 10 % 3],
                color=colors[i % len(colors)], label=family)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens in the batch)")
    ax.set_ylabel(f"{args.candidate} speedup over torch.matmul (device time)")
    ax.set_title(f"x @ W.T layers on the {gpu_name(doc)}: geomean per family and M "
                 f"({doc.get('meta', {}).get('date', '')[:10]})")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    save_png(fig, folder / "by_m.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
