"""Programs against torch.matmul at their shapes (the anchors first), in turns, in one process.

GPU only (an H200). The search scripts time torch.matmul in the bench's process and each
candidate in an isolated worker beside a second torch.matmul. At 8192^3 those two
torch.matmul times differ by up to 15 % (1.44 ms and 1.65 ms in session 14's CUTLASS run),
because the power cap lowers the clock by how much work came just before
(`benchmarks/results/process_bias/`). Here every variant runs in one process: each program
is checked first (`gemmgen.measure.checking.check`, random inputs), then loops of `--iters`
back-to-back calls take turns with torch.matmul (and a second torch.matmul, the control),
in the orders of `gemmgen.measure.turns.in_turns` (each variant follows every other
equally often), the SM clock sampled at the end of every loop. Per
variant: the median time, TFLOP/s, the per-repeat ratio to torch.matmul with its 95 %
interval, and the clocks. Writes results.json and anchor_turns.png under --out.

`--protocol pairs` times instead as the bench times a candidate: each program in an offline
session (cold L2, CUPTI device time) with torch.matmul alone, program after program in
turns, so that every program meets the same clocks (`gemmgen.measure.turns.in_pairs`).
`--swizzles m1,n8` adds each program's run-time raster/swizzle variants (no new build).
`--rotate N` (turns) gives each call of a loop the next of N copies of B and the output, as a
model's layers do: the weights come from DRAM, not from the L2 the previous call filled, while
the loop still runs at the power cap.

    python benchmarks/anchor_turns.py --out DIR PROGRAM.gemm [PROGRAM.gemm ...]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("programs", nargs="+", help="DSL files, each a program bound to its shape")
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=20, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--protocol", choices=("turns", "pairs"), default="turns",
                   help="turns: warm loops in turns (sustained, at the power cap); pairs: each program "
                        "with torch.matmul in its own offline session (cold L2), as the bench times a candidate")
    p.add_argument("--rotate", type=int, default=1,
                   help="turns: cycle each loop's calls over this many copies of B and the output (cold weights)")
    p.add_argument("--swizzles", default="",
                   help="also time each program at these raster/swizzle run-time choices, e.g. m1,m8,n4")
    return p.parse_args(argv)


def loaded(program):
    """(callable, build seconds) for a program, through its backend's cached build."""
    from gemmgen import backends

    backend = backends.get(program.backend)
    t0 = time.perf_counter()
    artifact = backend.build(backend.lower(program))
    return backend.load(artifact, program), time.perf_counter() - t0


def operands(problem, seed: int, copies: int = 1) -> list[tuple]:
    """`copies` argument tuples (a, b, out): one A, and B and the output `copies` times."""
    import torch
    from gemmgen.measure.cases import empty_laid_out

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def filled(rows, cols, major):
        t = empty_laid_out(rows, cols, major, torch.float16, "cuda")
        t.copy_(torch.randn((rows, cols), generator=gen, device="cuda"))
        return t

    a = filled(problem.m, problem.k, problem.a_major)
    return [(a, filled(problem.k, problem.n, problem.b_major),
             empty_laid_out(problem.m, problem.n, problem.c_major, torch.float16, "cuda")) for _ in range(copies)]


def on_copies(fn, ops: list[tuple]):
    """fn as a loop's call: call i takes argument tuple i mod len(ops) (--rotate's copies)."""
    return lambda i: fn(*ops[i % len(ops)])


def measure_shape(problem, programs: list, args) -> dict:
    """Check every program of one shape, then time them and torch.matmul (twice) in turns."""
    import torch
    from gemmgen.dsl import to_text
    from gemmgen.measure.clocks import ClockSampler, nvml_index
    from gemmgen.measure.comparison import median_interval, ratio_of_medians_interval
    from gemmgen.measure.turns import checked_variants, in_pairs, in_turns, loop_ms

    named = []
    for name, program in programs:
        fn, build_s = loaded(program)
        named.append((name, fn, {"program": to_text(program), "build_s": round(build_s, 1)}))
    rows: dict = {}
    variants = checked_variants(problem, named, args.seed, rows)
    if args.protocol == "pairs":
        return in_pairs(problem, variants, rows, args.repeats, args.seed)
    ops = operands(problem, args.seed, args.rotate)
    names = list(variants)
    samplers = {n: ClockSampler(nvml_index(torch.cuda.current_device())) for n in names}
    for n in names:                                   # warm-up: heuristics, clocks
        loop_ms(on_copies(variants[n], ops), 3, samplers[n])
        samplers[n].samples.clear()
    times = {n: [] for n in names}
    for _, n in in_turns(names, args.repeats):
        times[n].append(loop_ms(on_copies(variants[n], ops), args.iters, samplers[n]))
    flop = 2 * problem.m * problem.n * problem.k
    for n in names:
        med = statistics.median(times[n])
        row = rows.setdefault(n, {"program": None})
        row.update(median_ms=med, tflops=flop / (med * 1e-3) / 1e12, times_ms=times[n],
                   clocks=samplers[n].summary())
        if n != "torch":
            ratios = [t / x for x, t in zip(times[n], times["torch"])]
            row["vs_torch_median_ratio"] = [round(v, 4) for v in median_interval(ratios)]
            row["vs_torch_ratio_of_medians"] = [round(v, 4) for v in ratio_of_medians_interval(
                list(zip(times[n], times["torch"])))]
        samplers[n].close()
    return {"shape": f"{problem.m}x{problem.n}x{problem.k}", "key": problem.key, "variants": rows}


def with_swizzles(name: str, program, swizzles: str) -> list:
    """The program, then its run-time raster/swizzle variants (one build serves them all);
    ValueError names a choice that is not raster m or n and a width, or that the program refuses."""
    from dataclasses import replace

    from gemmgen.dsl import diagnose

    out = [(name, program)]
    for choice in filter(None, (c.strip() for c in swizzles.split(","))):
        if not re.fullmatch(r"[mn][0-9]+", choice):
            raise ValueError(f"--swizzles {choice!r}: write the raster (m or n) then the width, e.g. m8")
        variant = replace(program, raster=choice[0], swizzle=int(choice[1:]))
        problems = diagnose(variant)
        if problems:
            raise ValueError(f"--swizzles {choice} for {name}: {problems[0].message}")
        if variant != program:
            out.append((f"{name}_{choice}", variant))
    return out


def plot(shapes: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4), squeeze=False)
    for ax, s in zip(axes[0], shapes):
        timed = {n: v for n, v in s["variants"].items() if v.get("tflops")}
        names = list(timed)
        ax.barh(names, [timed[n]["tflops"] for n in names],
                color=["tab:gray" if n.startswith("torch") else "tab:green" for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("TFLOP/s (median of repeats, in turns)")
        ax.set_title(s["shape"])
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    import torch

    from gemmgen import dsl

    args = parse_args(argv)
    if args.rotate < 1 or (args.rotate > 1 and args.protocol != "turns"):
        print("--rotate takes a count of 1 or more, and only with --protocol turns "
              "(pairs times offline sessions, which flush the L2 anyway)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("anchor_turns.py needs a CUDA GPU (an H200); none is visible.", file=sys.stderr)
        return 2
    by_shape: dict = {}
    for path in args.programs:
        program = dsl.parse(Path(path).read_text())
        if not program.problem.is_bound:
            print(f"{path}: the program's gemm line must give M, N and K", file=sys.stderr)
            return 2
        try:
            by_shape.setdefault(program.problem, []).extend(with_swizzles(Path(path).stem, program, args.swizzles))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = [measure_shape(problem, programs, args) for problem, programs in by_shape.items()]
    for s in shapes:
        print(f"\n{s['shape']}")
        for n, v in s["variants"].items():
            if v.get("median_ms") is None:
                print(f"  {n:28s} not timed: {'; '.join(v.get('failures', []))[:200]}")
                continue
            ratio = v.get("vs_torch_median_ratio")
            clock = v["clocks"].get("sm_mhz_median")
            print(f"  {n:28s} {v['median_ms']:.4f} ms {v['tflops']:6.0f} TFLOP/s"
                  + (f"  SM {clock} MHz" if clock else "")
                  + (f"  x torch {ratio[1]:.3f} ({ratio[0]:.3f}-{ratio[2]:.3f})" if ratio else ""))
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "command": "python " + " ".join(sys.argv), "args": vars(args)}
    (out / "results.json").write_text(json.dumps({**meta, "shapes": shapes}, indent=1))
    plot(shapes, out / "anchor_turns.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
