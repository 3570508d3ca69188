"""Training curves: the trainer's log history as JSON, and a plot of it (matplotlib, Agg)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from gemmgen.measure.plots import save_png


def write_curves(log_history: Sequence[dict], out_dir: str | Path, name: str, keys: Sequence[str]) -> dict:
    """`name`.json (every logged row) and `name`.png (the given keys against step)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [dict(r) for r in log_history]
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    present = [k for k in keys if any(k in r for r in rows)]
    paths = {"json": str(out / f"{name}.json")}
    if not present:
        return paths
    # Deferred: matplotlib (optional, heavy to import).
    import matplotlib

    matplotlib.use("Agg")
    # Deferred: matplotlib (optional, heavy to import).
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.6 * len(present)), squeeze=False)
    for ax, key in zip(axes[:, 0], present):
        points = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
        if points:
            ax.plot(*zip(*points), marker=".", linewidth=1)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(name)
    fig.tight_layout()
    save_png(fig, out / f"{name}.png", dpi=110)
    plt.close(fig)
    paths["png"] = str(out / f"{name}.png")
    return paths


def copy_curve(curves_dir: str | Path, name: str, policy_dir: str | Path) -> None:
    """`name`.{json,png} of a run's curves beside the policy it trained, as `name`_curve.*."""
    for suffix in ("json", "png"):
        curve = Path(curves_dir) / f"{name}.{suffix}"
        if curve.is_file():
            (Path(policy_dir) / f"{name}_curve.{suffix}").write_bytes(curve.read_bytes())
