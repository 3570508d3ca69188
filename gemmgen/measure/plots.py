"""Plots from a saved results document (matplotlib, Agg): no GPU, no torch.

speedup.png: per shape, speedup over the reference baseline (torch) against GFLOP,
log-log, one series per other name. buckets.png: per GFLOP bucket, the geometric-mean
speedup of each name over the reference, as grouped bars.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

from gemmgen.measure.numerics import bucket_names, bucket_of, geomean
from gemmgen.measure.results import _ratios, _usable, shape_key, summarize

REFERENCE = "torch"


def _reference(doc: dict) -> Optional[str]:
    """torch when measured, else the first baseline: what every speedup is taken over."""
    summary = summarize(doc["rows"])
    if REFERENCE in summary["names"]:
        return REFERENCE
    return summary["baselines"][0] if summary["baselines"] else None


def _pyplot():
    # Deferred: matplotlib (optional, heavy to import).
    import matplotlib
    matplotlib.use("Agg")
    # Deferred: matplotlib (optional, heavy to import).
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, path, dpi: int = 120) -> None:
    """`fig` as a PNG of at most 256 colours: a plot's few colours and their anti-aliased edges
    look the same, in about 40 % of the bytes of matplotlib's own PNG, and committed results
    stay small. Pillow comes with matplotlib."""
    # Deferred: PIL (optional, heavy to import; matplotlib's dependency).
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    image.save(path, format="PNG", optimize=True)


def _save(fig, ax, path: Path) -> Path:
    """Legend, layout, write, close: how every plot here ends."""
    # Deferred: matplotlib (optional, heavy to import).
    import matplotlib.pyplot as plt

    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, over no point
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return path


def _gflop(row: dict) -> float:
    return 2.0 * row["m"] * row["n"] * row["k"] / 1e9


def plot_speedup(doc: dict, path: Path) -> Optional[Path]:
    plt = _pyplot()
    rows = doc["rows"]
    ref = _reference(doc)
    if ref is None:
        return None
    by_shape: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        by_shape.setdefault(shape_key(row), {})[row["name"]] = row
    names = [n for n in summarize(rows)["names"] if n != ref]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    every = []
    for name in names:
        xs, ys = [], []
        for named in by_shape.values():
            a, b = named.get(name), named.get(ref)
            if a and b and _usable(a) and _usable(b):
                xs.append(_gflop(a))
                ys.append(b["device_ms"] / a["device_ms"])
        if xs:
            ax.scatter(xs, ys, s=14, alpha=0.75, label=name)
            every.extend(ys)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    if every and max(every) / min(every) > 4:      # wide: log, else linear reads better
        ax.set_yscale("log")
        # Deferred: matplotlib (optional, heavy to import).
        from matplotlib.ticker import FuncFormatter
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("GFLOP (2MNK / 1e9)")
    ax.set_ylabel(f"speedup over {ref} (device time)")
    mode = doc.get("meta", {}).get("mode", "")
    ax.set_title(f"device-time speedup over {ref}, {mode} mode")
    return _save(fig, ax, path)


def plot_buckets(doc: dict, path: Path) -> Optional[Path]:
    plt = _pyplot()
    rows = doc["rows"]
    ref = _reference(doc)
    if ref is None:
        return None

    names = [n for n in summarize(rows)["names"] if n != ref]
    buckets = [b for b in bucket_names()
               if any(bucket_of(_gflop(r)) == b for r in rows)]
    fig, ax = plt.subplots(figsize=(9, 5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        heights = []
        for bucket in buckets:
            inside = [r for r in rows if bucket_of(_gflop(r)) == bucket]
            heights.append(geomean(_ratios(inside, name, ref, "device_ms")) or 0.0)
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(buckets))]
        bars = ax.bar(xs, heights, width=width, label=name)
        ax.bar_label(bars, labels=[f"{h:.3f}" if h else "" for h in heights], fontsize=7, rotation=90, padding=2)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.margins(y=0.12)
    ax.set_xticks(range(len(buckets)))
    ax.set_xticklabels([f"{b} GFLOP" for b in buckets])
    ax.set_ylabel(f"geomean speedup over {ref}")
    ax.set_title(f"speedup over {ref} by size, {doc.get('meta', {}).get('mode', '')} mode")
    return _save(fig, ax, path)


def plot_all(doc: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    made = [plot_speedup(doc, out / "speedup.png"), plot_buckets(doc, out / "buckets.png")]
    return [p for p in made if p is not None]
