"""How fast a kernel that only reads a layer's weight can run on this GPU: the ceiling of any
decode GEMM (M = 1), which must read at least the weight.

For each distinct weight (N x K, fp16) of a shapes file, this times plain reads of exactly that
many bytes under the harness's flush (L2 cleaned by a read of 4 x L2 before every call; CUPTI
device time): torch.sum over the weight, and a Triton kernel that sums it in blocks, over a few
block sizes and warp counts. The fastest is the ceiling. Reported per weight: its time, its
fraction of the bandwidth floor (bytes / 4.8 TB/s, `Problem.floor_s`) and the rate in TB/s.
A small weight cannot reach HBM's sustained rate: the launch, the first load's latency and the
last wave's tail are a fixed cost its few bytes do not hide.

With `--ctas`, it times instead reads by a fixed number of CTAs (each walking every C-th run of
blocks, 2-16 blocks in flight) of the weights named by `--weights`: how many CTAs a kernel
needs to stream a weight at the read's rate, which bounds a product that gives the weight to
fewer tiles than there are SMs (at M <= 128, N / tile rows of them).

    python3 benchmarks/read_ceiling.py --shapes benchmarks/shapes/llm_layers.csv --part tuning \\
        --out benchmarks/results/read_ceiling
    python3 benchmarks/read_ceiling.py --ctas 16,32,64,132 --weights 4096x4096 --out DIR
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

BLOCKS = (4096, 8192, 16384)
WARPS = (4, 8)
REPS = 50
#: The CTA-limited reader: elements a block, blocks in flight, warps. Every thread loads 16
#: bytes a block (block >= 256 x warps); up to 16 x 16 B x 1024 threads = 256 KB in flight a CTA.
STRIDED_BLOCKS = (2048, 4096, 8192)
UNROLLS = (2, 4, 8, 16)
STRIDED_WARPS = (8, 16, 32)


def weights(path: str, part: str) -> list[tuple[int, int]]:
    from gemmgen.measure.shapes import read_shapes

    return sorted({(s.n, s.k) for s in read_shapes(path, part)}, key=lambda nk: nk[0] * nk[1])


@functools.lru_cache(maxsize=None)
def _block_sum():
    import triton
    import triton.language as tl

    @triton.jit
    def block_sum(src, dst, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(src + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
        tl.store(dst + pid, tl.sum(x.to(tl.float32), axis=0))

    return block_sum


def block_reader(w, block: int, warps: int):
    """A callable that reads every byte of w in blocks of `block` elements (one float out each)."""
    import torch
    import triton

    flat = w.view(-1)
    grid = (triton.cdiv(flat.numel(), block),)
    dst = torch.empty(grid[0], dtype=torch.float32, device=w.device)
    return lambda: _block_sum()[grid](flat, dst, flat.numel(), BLOCK=block, num_warps=warps)


@functools.lru_cache(maxsize=None)
def _strided_sum():
    import triton
    import triton.language as tl

    @triton.jit
    def strided_sum(src, dst, n, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        pid, ctas = tl.program_id(0), tl.num_programs(0)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for first in range(pid * UNROLL * BLOCK, n, ctas * UNROLL * BLOCK):
            for u in tl.static_range(UNROLL):
                offs = first.to(tl.int64) + u * BLOCK + tl.arange(0, BLOCK)
                acc += tl.load(src + offs, mask=offs < n, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(dst + pid, tl.sum(acc, axis=0))

    return strided_sum


def strided_reader(w, ctas: int, block: int, unroll: int, warps: int):
    """A callable that reads every byte of w with exactly `ctas` CTAs (one float out each)."""
    import torch

    flat = w.view(-1)
    dst = torch.empty(ctas, dtype=torch.float32, device=w.device)
    return lambda: _strided_sum()[(ctas,)](flat, dst, flat.numel(), BLOCK=block, UNROLL=unroll, num_warps=warps)


def strided_readers(w, ctas: int):
    """name -> a callable reading w with `ctas` CTAs, over the block sizes, unrolls and warps."""
    return {f"b{block} u{unroll} w{warps}": strided_reader(w, ctas, block, unroll, warps)
            for block in STRIDED_BLOCKS for unroll in UNROLLS for warps in STRIDED_WARPS
            if block >= 256 * warps}


def readers(w):
    """name -> a callable that reads every byte of w: torch.sum and the block readers."""
    import torch

    out = {"torch.sum": lambda: torch.sum(w.view(-1), dtype=torch.float32)}
    out.update({f"triton b{block} w{warps}": block_reader(w, block, warps) for block in BLOCKS for warps in WARPS})
    return out


def _kernel_us(calls) -> list[float]:
    """Device durations (us) of the kernels `calls` launches, in launch order (CUPTI)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        calls()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [e.device_time_total for e in sorted(kernels, key=lambda e: e.time_range.start)]


def device_us(fn, flush) -> float:
    """Median device time of one call of fn, each call after a flush."""
    for _ in range(3):
        flush(); fn()
    per_flush = len(_kernel_us(flush))

    def loop():
        for _ in range(REPS):
            flush()
            fn()

    kernels = _kernel_us(loop)
    per_rep = len(kernels) // REPS
    if per_rep * REPS != len(kernels) or per_rep <= per_flush:
        raise RuntimeError(f"{len(kernels)} kernels in {REPS} calls after a {per_flush}-kernel flush")
    return statistics.median(sum(kernels[i * per_rep + per_flush:(i + 1) * per_rep]) for i in range(REPS))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="benchmarks/shapes/llm_layers.csv")
    ap.add_argument("--part", default="tuning", choices=("all", "tuning", "held-out"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctas", default="", metavar="C,C,...",
                    help="time reads by exactly these CTA counts instead (writes read_by_ctas.json, ctas.txt)")
    ap.add_argument("--weights", default="4096x4096", metavar="NxK,...", help="the weights --ctas reads")
    args = ap.parse_args(argv)
    try:
        ctas = [int(c) for c in args.ctas.split(",") if c.strip()]
        chosen = [tuple(int(d) for d in nk.lower().split("x")) for nk in args.weights.split(",")]
    except ValueError:
        raise SystemExit(f"--ctas takes counts like 32,64 and --weights sizes like 4096x4096; got "
                         f"{args.ctas!r} and {args.weights!r}")
    if any(c < 1 for c in ctas) or any(len(nk) != 2 or min(nk) < 1 for nk in chosen):
        raise SystemExit("--ctas counts and --weights sizes must be positive, weights as NxK")

    import torch
    from tqdm import tqdm

    from gemmgen.errors import NoGPUError
    from gemmgen.measure.timing import TimingOptions, flusher

    if not torch.cuda.is_available():
        raise SystemExit(str(NoGPUError("read_ceiling")))
    flush = flusher(TimingOptions(), "cuda")
    if ctas:
        return _by_ctas(chosen, ctas, flush, Path(args.out))
    rows = []
    for n, k in tqdm(weights(args.shapes, args.part), desc="weights"):
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        rows.append(read_row(w, readers(w), flush))
        del w
    lines = [f"{'N':>7} {'K':>6} {'MB':>7} {'read us':>8} {'floor':>6} {'TB/s':>5}  fastest reader"]
    lines += [f"{r['n']:>7} {r['k']:>6} {r['bytes'] / 1e6:>7.1f} {r['device_us']:>8.2f} "
              f"{r['fraction_of_floor']:>6.3f} {r['tb_per_s']:>5.2f}  {r['best']}" for r in rows]
    return write_results(Path(args.out), "read_ceiling.json", "table.txt", rows, lines)


def read_row(w, named_readers: dict, flush) -> dict:
    """The fastest of `named_readers` over the weight w: its time, fraction of the floor, rate."""
    from gemmgen.dsl.ir import Problem

    n, k = w.shape
    times = {name: device_us(fn, flush) for name, fn in named_readers.items()}
    best = min(times, key=times.get)
    floor_us = Problem(1, n, k, b_major="col").floor_s * 1e6
    return {"n": n, "k": k, "bytes": 2 * n * k, "best": best, "device_us": times[best],
            "fraction_of_floor": floor_us / times[best], "tb_per_s": 2 * n * k / times[best] / 1e6,
            "all_us": times}


def write_results(out: Path, json_name: str, table_name: str, rows: list, lines: list) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / json_name).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    (out / table_name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _by_ctas(chosen, ctas, flush, out: Path) -> int:
    import torch
    from tqdm import tqdm

    rows = []
    for (n, k), c in tqdm([(nk, c) for nk in chosen for c in ctas], desc="weights x CTAs"):
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        row = read_row(w, strided_readers(w, c), flush)
        rows.append({**row, "ctas": c, "gb_per_s_per_cta": row["tb_per_s"] * 1e3 / c})
        del w
    lines = [f"{'N':>7} {'K':>6} {'CTAs':>5} {'read us':>8} {'floor':>6} {'TB/s':>5} {'GB/s a CTA':>10}  fastest"]
    lines += [f"{r['n']:>7} {r['k']:>6} {r['ctas']:>5} {r['device_us']:>8.2f} {r['fraction_of_floor']:>6.3f} "
              f"{r['tb_per_s']:>5.2f} {r['gb_per_s_per_cta']:>10.1f}  {r['best']}" for r in rows]
    return write_results(out, "read_by_ctas.json", "ctas.txt", rows, lines)


if __name__ == "__main__":
    sys.exit(main())
