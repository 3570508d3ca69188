"""How well a recorded library speedup predicts a later session: the floor of the noise rule.

For every shape a `gemmgen bench` run served from a cuBLASLt choice (`notes.how == "library"`),
compare the speedup over torch.matmul measured in the bench's worker session with the one the
choice recorded when it was searched (the latest choice created before the bench started, so
later searches do not leak in). The standard deviation of log(measured / recorded) is the
session-to-session noise one session cannot see; `gemmgen.measure.comparison.REPLICATE_NOISE`
is twice the pooled offline value. CPU only:

    python3 benchmarks/replicate_noise.py tuning_db/shipped/h200.jsonl.gz \
        benchmarks/results/gemmgen_sample100_{offline,server}_s6b \
        benchmarks/results/gemmgen_sample100_{offline,server}_s7b --out benchmarks/results/replicate_noise
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Optional


def choices_by_problem(path: str) -> dict[tuple, list]:
    from gemmgen.tuning_db import LibraryChoice
    from gemmgen.tuning_db.exchange import read_any

    found: dict[tuple, list] = {}
    for c in read_any(path):
        if isinstance(c, LibraryChoice) and c.check_passed and c.device_ms and c.torch_ms:
            p = c.problem
            found.setdefault((p.m, p.n, p.k, p.a_major, p.b_major), []).append(c)
    return found


def recorded(choice, mode: str) -> tuple[float, str]:
    """The speedup the choice recorded for `mode` (server mode falls back to the offline one)."""
    if mode == "server" and choice.server_ms and choice.torch_server_ms:
        return choice.torch_server_ms / choice.server_ms, "server"
    return choice.speedup, "offline"


def replicate(bench_dir: str, choices: dict) -> dict:
    doc = json.loads((Path(bench_dir) / "results.json").read_text())
    started, mode = doc["meta"]["date"], doc["meta"]["mode"]
    majors = {"n": "row", "t": "col"}
    rows = []
    for r in doc["rows"]:
        notes = r.get("notes") or {}
        if r["name"] != "gemmgen" or notes.get("how") != "library" or not notes.get("reference_device_ms"):
            continue
        key = (r["m"], r["n"], r["k"], majors[r["layout"][0]], majors[r["layout"][1]])
        before = [c for c in choices.get(key, ()) if c.created < started]
        if not before:
            continue
        choice = max(before, key=lambda c: c.created)
        rec, rec_mode = recorded(choice, mode)
        measured = notes["reference_device_ms"] / r["device_ms"]
        rows.append({"m": r["m"], "n": r["n"], "k": r["k"], "recorded": rec, "recorded_mode": rec_mode,
                     "measured": measured, "log_ratio": math.log(measured / rec), "noise": choice.noise})
    logs = [x["log_ratio"] for x in rows]
    return {"bench": bench_dir, "mode": mode, "started": started, "n": len(rows),
            "mean": statistics.mean(logs) if logs else None,
            "sd": statistics.stdev(logs) if len(logs) > 1 else None, "rows": rows}


def pooled_sd(runs: list[dict]) -> Optional[float]:
    dof = sum(r["n"] - 1 for r in runs if r["sd"] is not None)
    return math.sqrt(sum((r["n"] - 1) * r["sd"] ** 2 for r in runs if r["sd"] is not None) / dof) if dof else None


def plot(runs: list[dict], floor: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    for run in runs:
        ax.scatter([x["recorded"] for x in run["rows"]], [x["measured"] for x in run["rows"]], s=14,
                   label=f"{Path(run['bench']).name} ({run['n']}, sd {100 * run['sd']:.2f} %)")
    lo = min(min(x["recorded"], x["measured"]) for r in runs for x in r["rows"]) * 0.99
    hi = max(max(x["recorded"], x["measured"]) for r in runs for x in r["rows"]) * 1.01
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1)
    ax.fill_between(xs, [x * math.exp(-floor) for x in xs], [x * math.exp(floor) for x in xs], color="grey",
                    alpha=0.2, label=f"recorded x exp(+-{100 * floor:.1f} %)")
    ax.axhline(1.0, color="red", lw=0.8, ls="--")
    ax.set_xlabel("speedup over torch.matmul recorded by the search")
    ax.set_ylabel("speedup measured in the later bench session")
    ax.set_title("cuBLASLt choices served: recorded against replicated (H200)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", help="shipped export or database holding the choices")
    ap.add_argument("bench_dirs", nargs="+", help="gemmgen bench result directories")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from gemmgen.measure.comparison import REPLICATE_NOISE

    choices = choices_by_problem(args.records)
    runs = [replicate(d, choices) for d in args.bench_dirs]
    summary = {f"pooled_sd_{mode}": pooled_sd([r for r in runs if r["mode"] == mode]) for mode in ("offline", "server")}
    summary["replicate_noise"] = REPLICATE_NOISE
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replicate_noise.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    plot(runs, REPLICATE_NOISE, out / "replicate_noise.png")
    def pct(x):
        return "-" if x is None else f"{100 * x:.2f} %"

    for r in runs:
        below = sum(1 for x in r["rows"] if x["measured"] < 1.0)
        print(f"{r['bench']:58s} {r['mode']:8s} n={r['n']:3d} mean {pct(r['mean'])} sd {pct(r['sd'])}  "
              f"served under 1.00x: {below}")
    print(f"pooled sd: offline {pct(summary['pooled_sd_offline'])}, server {pct(summary['pooled_sd_server'])}; "
          f"REPLICATE_NOISE {100 * REPLICATE_NOISE:.1f} %")


if __name__ == "__main__":
    main()
