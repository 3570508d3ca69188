"""A Llama MLP's gate and up projections, with silu(gate) * up fused into one Triton kernel.

GPU only (an H200). The question before building it into gemmgen: does a dual GEMM that never
writes gate and up to memory beat what torch.compile makes of `silu(x @ Wg.T) * (x @ Wu.T)`
(two cuBLAS calls and a fused pointwise kernel)? Per M, the device time of

* `inductor`: torch.compile (default mode) of that expression;
* `dual_ptr` / `dual_tma`: one Triton kernel, two accumulators (gate, up) per output tile,
  operands by pointer loads or by device-built TMA descriptors;
* `joined_tma`: one accumulator over a joined weight whose column blocks alternate gate and
  up (a copy made once), split in the epilogue,

each over several weight copies in rotation so that weights come from DRAM as in a model.
In turns over repeats (CUDA events around loops of calls, median of repeats). Writes
results.json and swiglu_probe.png under --out.

    python benchmarks/swiglu_probe.py --out benchmarks/results/swiglu_probe
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

HIDDEN, INTERMEDIATE = 2048, 5632
# (kind, BM, BN of the output tile, BK, stages, warps); GROUP_M 8 throughout
CONFIGS = [
    ("dual_ptr", 128, 128, 64, 3, 8), ("dual_ptr", 128, 128, 64, 4, 8),
    ("dual_ptr", 128, 64, 64, 4, 4), ("dual_ptr", 128, 64, 64, 4, 8),
    ("dual_tma", 128, 128, 64, 3, 8), ("dual_tma", 128, 128, 64, 4, 8),
    ("dual_tma", 128, 64, 64, 4, 4), ("dual_tma", 128, 64, 64, 4, 8),
    ("joined_tma", 128, 128, 64, 3, 8), ("joined_tma", 128, 128, 64, 4, 8),
    ("joined_tma", 128, 64, 64, 4, 4),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--ms", default="2048,4096", help="token counts M (default 2048,4096)")
    p.add_argument("--copies", type=int, default=4, help="weight copies in rotation")
    p.add_argument("--iters", type=int, default=24, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--model", action="store_true",
                   help="also time llama_compile.py's 1B Llama prefill cases under torch.compile (default "
                        "mode), stock against every MLP's gate/up/silu*mul replaced by the joined kernel")
    return p.parse_args(argv)


def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def tile_of(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
        num_pid_m = tl.cdiv(M, BM)
        num_pid_n = tl.cdiv(N, BN)
        per_group = GROUP_M * num_pid_n
        first_m = (pid // per_group) * GROUP_M
        rows = min(num_pid_m - first_m, GROUP_M)
        return first_m + (pid % per_group) % rows, (pid % per_group) // rows

    @triton.jit
    def store_swiglu(out_ptr, g, u, pid_m, pid_n, M, N, BM: tl.constexpr, BN: tl.constexpr):
        h = (g * tl.sigmoid(g) * u).to(tl.float16)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], h, mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.jit
    def dual_ptr(x_ptr, wg_ptr, wu_ptr, out_ptr, M, N, K,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = tile_of(tl.program_id(0), M, N, BM, BN, GROUP_M)
        rm = (pid_m * BM + tl.arange(0, BM)) % M
        rn = (pid_n * BN + tl.arange(0, BN)) % N
        rk = tl.arange(0, BK)
        a_ptrs = x_ptr + rm[:, None] * K + rk[None, :]
        g_ptrs = wg_ptr + rn[None, :] * K + rk[:, None]      # W is [N, K]: B = W.T, column-major
        u_ptrs = wu_ptr + rn[None, :] * K + rk[:, None]
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, K // BK):
            a = tl.load(a_ptrs)
            acc_g = tl.dot(a, tl.load(g_ptrs), acc_g)
            acc_u = tl.dot(a, tl.load(u_ptrs), acc_u)
            a_ptrs += BK
            g_ptrs += BK
            u_ptrs += BK
        store_swiglu(out_ptr, acc_g, acc_u, pid_m, pid_n, M, N, BM, BN)

    @triton.jit
    def dual_tma(x_ptr, wg_ptr, wu_ptr, out_ptr, M, N, K,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = tile_of(tl.program_id(0), M, N, BM, BN, GROUP_M)
        x_d = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        g_d = tl.make_tensor_descriptor(wg_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
        u_d = tl.make_tensor_descriptor(wu_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K // BK):
            a = x_d.load([pid_m * BM, k * BK])
            acc_g = tl.dot(a, g_d.load([pid_n * BN, k * BK]).T, acc_g)
            acc_u = tl.dot(a, u_d.load([pid_n * BN, k * BK]).T, acc_u)
        store_swiglu(out_ptr, acc_g, acc_u, pid_m, pid_n, M, N, BM, BN)

    @triton.jit
    def joined_tma(x_ptr, w_ptr, out_ptr, M, N, K,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        # w is [2N, K]: rows [2jBN, 2jBN+BN) are gate block j, the next BN rows up block j
        pid_m, pid_n = tile_of(tl.program_id(0), M, N, BM, BN, GROUP_M)
        x_d = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        w_d = tl.make_tensor_descriptor(w_ptr, shape=[2 * N, K], strides=[K, 1], block_shape=[2 * BN, BK])
        acc = tl.zeros((BM, 2 * BN), dtype=tl.float32)
        for k in range(0, K // BK):
            acc = tl.dot(x_d.load([pid_m * BM, k * BK]), w_d.load([pid_n * 2 * BN, k * BK]).T, acc)
        g, u = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN)), (0, 2, 1)))
        store_swiglu(out_ptr, g, u, pid_m, pid_n, M, N, BM, BN)

    return {"dual_ptr": dual_ptr, "dual_tma": dual_tma, "joined_tma": joined_tma}


def interleave(wg, wu, bn: int):
    """[2N, K]: gate rows jBN..(j+1)BN, then up rows jBN..(j+1)BN, for each block j."""
    import torch

    n, k = wg.shape
    return torch.stack([wg.view(n // bn, bn, k), wu.view(n // bn, bn, k)], dim=1).reshape(2 * n, k).contiguous()


def measure(m: int, args, fns) -> dict:
    import torch
    import torch.nn.functional as F
    import triton

    from gemmgen.measure.turns import in_turns, loop_ms

    g = torch.Generator(device="cuda").manual_seed(m)
    n, k = INTERMEDIATE, HIDDEN
    xs = [torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g) for _ in range(args.copies)]
    wgs = [torch.randn(n, k, device="cuda", dtype=torch.float16, generator=g) / k ** 0.5 for _ in range(args.copies)]
    wus = [torch.randn(n, k, device="cuda", dtype=torch.float16, generator=g) / k ** 0.5 for _ in range(args.copies)]
    outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(args.copies)]
    ref = (F.silu(xs[0].float() @ wgs[0].float().t()) * (xs[0].float() @ wus[0].float().t()))

    def swiglu(x, wg, wu):
        return F.silu(x @ wg.t()) * (x @ wu.t())

    def rotating(fn, operand_lists, *rest, **kwargs):
        """A call taking turns over the copies: call i takes copy i % copies of each operand."""
        return lambda i: fn(*(ops[i % args.copies] for ops in operand_lists), *rest, **kwargs)

    compiled = torch.compile(swiglu)
    variants = {"inductor": rotating(compiled, (xs, wgs, wus)), "eager": rotating(swiglu, (xs, wgs, wus))}
    errors = {}
    for kind, bm, bn, bk, stages, warps in CONFIGS:
        name = f"{kind}_{bm}x{bn}x{bk}_s{stages}w{warps}"
        launch = fns[kind][(triton.cdiv(m, bm) * triton.cdiv(n, bn),)]
        opts = dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, num_stages=stages, num_warps=warps)
        if kind == "joined_tma":
            joined = [interleave(a, b, bn) for a, b in zip(wgs, wus)]
            fn = rotating(launch, (xs, joined, outs), m, n, k, **opts)
        else:
            fn = rotating(launch, (xs, wgs, wus, outs), m, n, k, **opts)
        t0 = time.time()
        try:
            fn(0)
            torch.cuda.synchronize()
        except Exception as exc:                 # a config Triton cannot build is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        err = ((outs[0].float() - ref).abs().max() / ref.abs().max()).item()
        if err > 5e-3:
            errors[name] = f"wrong result: max error {err:.2e} of max |ref|"
            continue
        print(f"M={m} {name}: compiled and checked in {time.time() - t0:.1f} s (rel err {err:.1e})", flush=True)
        variants[name] = fn
    got = compiled(xs[0], wgs[0], wus[0])
    inductor_err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
    for fn in variants.values():                 # warm-up: cuBLAS heuristics, clocks
        for i in range(2 * args.copies):
            fn(i)
    torch.cuda.synchronize()
    times = {name: [] for name in variants}
    for _, name in in_turns(list(variants), args.repeats):   # in turns, so drift hits all alike
        fn = variants[name]
        times[name].append(loop_ms(fn, args.iters))
    med = {name: statistics.median(v) for name, v in times.items()}
    flop = 2 * m * 2 * n * k
    return {"m": m, "n": n, "k": k, "median_ms": med, "times_ms": times, "errors": errors,
            "inductor_rel_err": inductor_err,
            "over_inductor": {name: statistics.median([a / b for a, b in zip(times["inductor"], v)])
                              for name, v in times.items()},
            "tflops": {name: flop / (t * 1e-3) / 1e12 for name, t in med.items()}}


MODEL_KERNEL = (128, 128, 64, 4, 8)     # joined_tma BM, BN, BK, stages, warps


def model_probe(args, fns) -> list:
    """The same question inside a model: prefill of the 1B Llama, torch.compile default mode."""
    import torch
    import triton

    sys.path.insert(0, str(Path(__file__).parent))
    import llama_compile as lc

    bm, bn, bk, stages, warps = MODEL_KERNEL
    kern = fns["joined_tma"]

    @torch.library.custom_op("swiglu_probe::swiglu", mutates_args=(), schema="(Tensor x, Tensor w) -> Tensor")
    def swiglu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()   # the kernel takes rows of stride K
        m, k = x2.shape
        n = w.shape[0] // 2
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
        kern[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](x2, w, out, m, n, k, BM=bm, BN=bn, BK=bk,
                                                          GROUP_M=8, num_stages=stages, num_warps=warps)
        return out.view(*x.shape[:-1], n)

    @swiglu.register_fake
    def _(x, w):
        return x.new_empty(*x.shape[:-1], w.shape[0] // 2)

    def fused_mlp(down_proj, joined, x):
        return down_proj(swiglu(x, joined))

    la = lc.parse_args(["--out", args.out])
    stock, cfg = lc.build_model(la)
    fused, _ = lc.build_model(la)               # same seed: the same weights
    for layer in fused.model.layers:
        mlp = layer.mlp
        joined = interleave(mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach(), bn)
        mlp.forward = functools.partial(fused_mlp, mlp.down_proj, joined)
    rows = []
    for c in lc.CASES:
        if c[1] != "prefill":
            continue
        torch._dynamo.reset()
        case = lc.Case(*c, stock, cfg, iters=la.iters)
        calls, outs = [], []
        for model in (stock, fused):
            call, reset = case.call_for(torch.compile(model, dynamic=False))
            with torch.no_grad():
                outs.append(call().float())
            calls.append((call, reset))
        err = ((outs[1] - outs[0]).abs().max() / outs[0].abs().max()).item()
        with torch.no_grad():
            times = lc.time_interleaved(calls, case.iters, args.repeats)
        rows.append({"case": case.name, "stock_ms": statistics.median(times[0]),
                     "fused_ms": statistics.median(times[1]), "times_ms": times, "fused_vs_stock_rel_err": err,
                     "stock_over_fused": lc.versus(times[1], times[0])})
        print(f"{case.name}: stock {rows[-1]['stock_ms']:.3f} ms, fused MLP {rows[-1]['fused_ms']:.3f} ms, "
              f"{rows[-1]['stock_over_fused']} (rel err {err:.1e})", flush=True)
    return rows


def plot(rows: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(6 * len(rows), 4.5), squeeze=False)
    for ax, r in zip(axes[0], rows):
        names = sorted(r["median_ms"], key=r["median_ms"].get)
        ax.barh(names, [r["median_ms"][n] * 1e3 for n in names],
                color=["tab:gray" if n in ("inductor", "eager") else "tab:green" for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("device time per call (us)")
        ax.set_title(f"gate/up + silu*mul, M={r['m']}, N={r['n']}, K={r['k']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    import torch
    import triton

    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("swiglu_probe.py needs a CUDA GPU (an H200); none is visible.", file=sys.stderr)
        return 2
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    fns = kernels()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [measure(int(m), args, fns) for m in args.ms.split(",") if m]
    model_rows = model_probe(args, fns) if args.model else []
    for r in rows:
        print(f"\nM={r['m']} (inductor rel err {r['inductor_rel_err']:.1e})")
        for name in sorted(r["median_ms"], key=r["median_ms"].get):
            print(f"  {name:34s} {r['median_ms'][name] * 1e3:8.1f} us  {r['tflops'][name]:6.0f} TFLOP/s  "
                  f"{r['over_inductor'][name]:.3f}x inductor")
        for name, e in r["errors"].items():
            print(f"  {name}: {e}")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d"), "command": "python " + " ".join(sys.argv), "args": vars(args)}
    (out / "results.json").write_text(json.dumps({**meta, "rows": rows, "model": model_rows}, indent=1))
    if rows:
        plot(rows, out / "swiglu_probe.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
