"""gemmgen against inductor's max-autotune on layers no tuning saw: compile time, and the speed
of what each serves, timed with gemmgen's timer.

For each `x @ W.T` problem (default: the layer set's held-out families at decode and small
batch), in one process on the GPU:
  - inductor: `torch.compile(mm_into, mode="max-autotune-no-cudagraphs")`, where `mm_into(a, b,
    out)` is `torch.mm(a, b, out=out)`; its compile time is the wall clock of the first call
    (autotuning included). CUDA graphs are left out: the timer gives each call fresh inputs,
    which a graph would first copy into its own buffers. Where inductor does not fuse the write
    into `out` (its mm templates and cuBLAS calls), a copy kernel follows, and it is timed too;
  - gemmgen: `gemmgen.compile(shape, b_major="col")` (what is served without tuning), or with
    `--tune S` `gemmgen.compile(..., tune=S)` into a fresh database; its compile time likewise;
  - torch.matmul.
The three are then timed side by side (gemmgen.measure.time_many: offline, CUPTI device time of
every kernel a call launches, L2 flushed, outputs checked). Writes OUT/inductor_compare.json
with each one's kernels, and prints one line a problem and the geomeans.

    python benchmarks/inductor_compare.py --out benchmarks/results/inductor_compare --time-budget 300
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from on_demand import geomeans, layer_shapes, scratch_db, side_by_side  # noqa: E402 - this folder's helpers

PROBLEMS = tuple((model, layer, m) for model in ("gemma2_9b", "phi3_medium", "granite3_8b")
                 for layer, m in (("gate", 1), ("down", 16), ("qkv", 64), ("o", 128)))


def mm_into(a, b, out):
    """What inductor compiles: the product written into the caller's `out`, as a kernel is timed."""
    import torch

    return torch.mm(a, b, out=out)


def inductor_kernel(mode: str = "max-autotune-no-cudagraphs"):
    """(a `fn(a, b, out, **epilogue)` for the timer, the compiled function)."""
    import torch

    compiled = torch.compile(mm_into, mode=mode, dynamic=False)

    def fn(a, b, out, **_):
        return compiled(a, b, out)

    return fn, compiled


def first_call_s(fn, problem, device="cuda") -> float:
    """Wall seconds of `fn(a, b, out)`'s first call (compiling, autotuning, building), synchronised."""
    import torch

    from gemmgen.runtime.tensors import operands

    (a, b, out), _ = operands(problem, 0, device)
    start = time.perf_counter()
    fn(a, b, out)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tune", type=float, default=None, help="gemmgen.compile(..., tune=S) first")
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="start no new problem after S seconds; results are saved")
    args = ap.parse_args(argv)

    import torch

    import gemmgen
    from gemmgen.measure.env import environment

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = scratch_db("gemmgen-inductor-compare-")

    def save(rows: list) -> dict:
        summary = geomeans(rows, ("gemmgen_x_inductor", "inductor_x_torch", "gemmgen_x_torch"))
        summary.update(inductor_compile_s=sum(r["inductor_compile_s"] for r in rows),
                       gemmgen_compile_s=sum(r["gemmgen_compile_s"] for r in rows))
        (out / "inductor_compare.json").write_text(json.dumps(
            {"command": " ".join(sys.argv), "environment": environment(), "tune_s": args.tune, "summary": summary,
             "rows": rows}, indent=1))
        return summary

    rows, start = [], time.monotonic()
    for name, shape in layer_shapes(PROBLEMS):
        if args.time_budget is not None and time.monotonic() - start > args.time_budget:
            break
        torch._dynamo.reset()
        t0 = time.monotonic()
        kernel = gemmgen.compile(shape, b_major="col", db=db, tune=args.tune)
        problem = kernel.problem
        # its first call builds (or loads) the kernel: part of its compile time
        gemmgen_s = time.monotonic() - t0 + first_call_s(lambda a, b, out: kernel(a, b, out=out), problem)
        fn, _ = inductor_kernel()
        inductor_s = first_call_s(fn, problem)
        ms, timed = side_by_side({"inductor": fn, "gemmgen": kernel.fn}, problem)
        row = {"layer": name, "problem": problem.key, "inductor_compile_s": inductor_s, "gemmgen_compile_s": gemmgen_s,
               "gemmgen_served": kernel.provenance.summary,
               "kernels": {k: (list(t.kernels) if not isinstance(t, Exception) else str(t)) for k, t in timed.items()},
               **{f"{k}_ms": v for k, v in ms.items()}}
        if all(ms.values()):
            row.update(gemmgen_x_inductor=ms["inductor"] / ms["gemmgen"], inductor_x_torch=ms["torch"] / ms["inductor"],
                       gemmgen_x_torch=ms["torch"] / ms["gemmgen"])
        rows.append(row)
        save(rows)      # after every problem: a run stopped later keeps what it measured
        print(f"{name:>18} {problem.m}x{problem.n}x{problem.k}: max-autotune {inductor_s:5.1f} s, "
              f"{row.get('inductor_x_torch', 0):.3f}x torch; gemmgen {gemmgen_s:5.1f} s, "
              f"{row.get('gemmgen_x_torch', 0):.3f}x torch, {row.get('gemmgen_x_inductor', 0):.3f}x max-autotune",
              flush=True)
    print(json.dumps(save(rows), indent=1))
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
