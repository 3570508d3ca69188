"""Which way of walking the weight lets a decode product (`x @ W.T`, M <= 16) read it at the
rate of a plain read: an experiment beside `read_ceiling.py`, not a kernel that ships.

A plain read of a 117 MB weight runs at 0.92 of the bandwidth floor on the H200, while
cuBLAS and gemmgen's direct kernels stop near 0.80 at the same layers. This times, under the
harness's flush and beside that read: Triton products whose programs each own BN whole rows
and walk K in BK-wide row-contiguous steps (BN x BK elements a step; FMA and a row sum at
M = 1, tl.dot against the batch padded to 16 otherwise), over BN, BK and warps; each output
is checked against torch.matmul first.

    python3 benchmarks/gemv_patterns.py --out benchmarks/results/gemv_patterns
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read_ceiling import block_reader, device_us  # noqa: E402

SHAPES = ((1, 4096, 4096), (1, 14336, 4096), (1, 4096, 14336), (1, 128256, 4096),
          (8, 4096, 4096), (8, 14336, 4096), (8, 4096, 14336))
ROWS = (1, 2, 4, 8, 16, 32)
STEPS = (256, 512, 1024)
WARPS = (2, 4, 8)


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def rows_fma(w, x, out, N, K, BN: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BN + tl.arange(0, BN)
        acc = tl.zeros((BN, BK), dtype=tl.float32)
        for k0 in range(0, K, BK):
            ks = k0 + tl.arange(0, BK)
            wt = tl.load(w + rows[:, None].to(tl.int64) * K + ks[None, :],
                         mask=(rows[:, None] < N) & (ks[None, :] < K), other=0.0, eviction_policy="evict_first")
            xt = tl.load(x + ks, mask=ks < K, other=0.0)
            acc += wt.to(tl.float32) * xt.to(tl.float32)[None, :]
        tl.store(out + rows, tl.sum(acc, axis=1).to(tl.float16), mask=rows < N)

    @triton.jit
    def rows_dot(w, x, out, M, N, K, BN: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BN + tl.arange(0, BN)
        batch = tl.arange(0, 16)
        acc = tl.zeros((BN, 16), dtype=tl.float32)
        for k0 in range(0, K, BK):
            ks = k0 + tl.arange(0, BK)
            wt = tl.load(w + rows[:, None].to(tl.int64) * K + ks[None, :],
                         mask=(rows[:, None] < N) & (ks[None, :] < K), other=0.0, eviction_policy="evict_first")
            xt = tl.load(x + batch[None, :] * K + ks[:, None], mask=(batch[None, :] < M) & (ks[:, None] < K),
                         other=0.0)
            acc = tl.dot(wt, xt, acc)
        tl.store(out + batch[None, :] * N + rows[:, None], acc.to(tl.float16),
                 mask=(batch[None, :] < M) & (rows[:, None] < N))

    return rows_fma, rows_dot


def _products(x, w, out):
    """name -> callable writing x @ w.T into out."""
    import triton

    rows_fma, rows_dot = _kernels()
    m, k = x.shape
    n = w.shape[0]
    calls = {}
    for bn, bk, warps in itertools.product(ROWS, STEPS, WARPS):
        if bn * bk > 2048 * warps or (m > 1 and bn < 16):   # fp32 partials: <= 64 a thread
            continue
        grid = (triton.cdiv(n, bn),)
        if m == 1:
            calls[f"fma BN{bn} BK{bk} w{warps}"] = (lambda grid=grid, bn=bn, bk=bk, warps=warps:
                                                    rows_fma[grid](w, x, out, n, k, BN=bn, BK=bk, num_warps=warps))
        else:
            calls[f"dot BN{bn} BK{bk} w{warps}"] = (lambda grid=grid, bn=bn, bk=bk, warps=warps:
                                                    rows_dot[grid](w, x, out, m, n, k, BN=bn, BK=bk, num_warps=warps))
    return calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from gemmgen.dsl.ir import Problem
    from gemmgen.measure.timing import TimingOptions, flusher

    flush = flusher(TimingOptions(), "cuda")
    rows = []
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        ref = (x.float() @ w.float().T)
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        floor_us = Problem(m, n, k, b_major="col").floor_s * 1e6
        timed = {"plain read": device_us(block_reader(w, 4096, 8), flush),
                 "torch.matmul": device_us(lambda: torch.matmul(x, w.T), flush)}
        for name, call in _products(x, w, out).items():
            out.fill_(float("nan"))
            call()
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            timed[name] = device_us(call, flush) if err < 1e-2 else None
        best = min((t, name) for name, t in timed.items() if t and name not in ("plain read", "torch.matmul"))
        rows.append({"m": m, "n": n, "k": k, "floor_us": floor_us, "us": timed})
        print(f"{m}x{n}x{k}: read {floor_us / timed['plain read']:.3f} torch {floor_us / timed['torch.matmul']:.3f} "
              f"best {floor_us / best[0]:.3f} ({best[1]}) of the floor", flush=True)
        del x, w, out, ref
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gemv_patterns.json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
