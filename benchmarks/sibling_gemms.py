"""Sibling projections of one input: separate matmuls against one matmul on their joined weights.

GPU only (an H200). A Llama layer multiplies one activation by q, k and v (and by gate and up)
weights of the same K; joined, they are one wider GEMM with fewer partial waves and one
launch. This measures, with cuBLAS (torch.matmul) for every matmul, what joining could save
at the Llama-1B shapes: per group and M, the device time of the separate calls, of the joined
call, and of joining the weights (torch.cat) each call, in turns over repeats (CUDA events
around loops of calls, median of repeats). Writes results.json and sibling_gemms.png under --out.

    python benchmarks/sibling_gemms.py --out benchmarks/results/sibling_gemms
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

GROUPS = {"qkv": (2048, 2048, 2048), "gate_up": (5632, 5632)}
K = 2048


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--ms", default="8,2048,4096", help="token counts M (default 8,2048,4096)")
    p.add_argument("--iters", type=int, default=50, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=15)
    return p.parse_args(argv)


def measure_group(m: int, widths: tuple, iters: int, repeats: int) -> dict:
    import torch
    from gemmgen.measure.turns import in_turns, loop_ms

    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, K, device="cuda", dtype=torch.float16, generator=g)
    ws = [torch.randn(n, K, device="cuda", dtype=torch.float16, generator=g) / K ** 0.5 for n in widths]
    joined = torch.cat(ws)
    ref = torch.cat([x @ w.t() for w in ws], dim=1)
    got = x @ joined.t()
    if (ref.float() - got.float()).abs().max().item() > 1e-2:
        raise SystemExit(f"M={m}: the joined product differs from the separate ones")
    variants = {
        "separate": lambda: [x @ w.t() for w in ws],
        "joined": lambda: x @ joined.t(),
        "cat_then_joined": lambda: x @ torch.cat(ws).t(),
    }
    for fn in variants.values():                 # warm-up: cuBLAS heuristics, clocks
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in variants}
    for _, name in in_turns(list(variants), repeats):   # in turns, so drift hits all alike
        fn = variants[name]
        times[name].append(loop_ms(lambda i, fn=fn: fn(), iters))
    med = {name: statistics.median(v) for name, v in times.items()}
    ratios = sorted(s / j for s, j in zip(times["separate"], times["joined"]))
    flop = 2 * m * sum(widths) * K
    return {"m": m, "widths": list(widths), "k": K, "median_ms": med, "times_ms": times,
            "separate_over_joined": statistics.median(ratios),
            "ratio_range": [ratios[0], ratios[-1]],
            "tflops": {name: flop / (t * 1e-3) / 1e12 for name, t in med.items()}}


def plot(rows: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['group']}\nM={r['m']}" for r in rows]
    xs = range(len(rows))
    for i, (name, color) in enumerate((("separate", "tab:gray"), ("joined", "tab:green"),
                                       ("cat_then_joined", "tab:red"))):
        ax.bar([x + (i - 1) * 0.27 for x in xs], [r["median_ms"][name] * 1e3 for r in rows], 0.27,
               label=name, color=color)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("device time per call (us)")
    ax.set_title("Sibling projections on an H200: separate cuBLAS calls vs one on joined weights")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    import torch

    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("sibling_gemms.py needs a CUDA GPU (it times cuBLAS on the device)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for m in (int(v) for v in args.ms.split(",")):
        for group, widths in GROUPS.items():
            rows.append({"group": group, **measure_group(m, widths, args.iters, args.repeats)})
    command = "python benchmarks/sibling_gemms.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "command": command}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, out / "sibling_gemms.png")
    print(f"{'group':8} {'M':>5} {'separate us':>12} {'joined us':>10} {'cat+joined':>11} {'sep/joined':>11}")
    for r in rows:
        med = r["median_ms"]
        print(f"{r['group']:8} {r['m']:5d} {med['separate'] * 1e3:12.1f} {med['joined'] * 1e3:10.1f} "
              f"{med['cat_then_joined'] * 1e3:11.1f} {r['separate_over_joined']:11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
