"""How fast can mma.sync m16n8k16 (fp16 in, fp32 accumulators) issue on this GPU?

The multistage family is built on that instruction; cuBLAS's Hopper kernels use wgmma. This
microbenchmark runs chains of register-only mma.sync (no memory traffic) with ILP independent
accumulator sets per warp and 4-16 warps per SM, one CTA per SM, and reports TFLOP/s and the
cycles between two mma.sync of one SM sub-partition (from clock64 in the kernel, so the
figure does not depend on the clock the power cap allows). The best row is the family's
ceiling; the ILP at which it saturates is the latency the K loop must cover.

    python benchmarks/mma_peak.py --out DIR          (GPU)
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

ILPS = (1, 2, 4, 8, 16)
WARPS = (4, 8, 16)
FLOP_PER_MMA = 2 * 16 * 8 * 16

SOURCE = r"""
template <int ILP>
__device__ void chain(float* out, long long* cycles, int iters) {
    unsigned a[4], b[2];
    float acc[ILP][4];
    for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u ^ (threadIdx.x << (i + 1));
    for (int i = 0; i < 2; ++i) b[i] = 0x3c003c00u ^ (threadIdx.x << (i + 3));
    #pragma unroll
    for (int j = 0; j < ILP; ++j) for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
    __syncthreads();
    long long start = clock64();
    for (int it = 0; it < iters; ++it) {
        #pragma unroll
        for (int j = 0; j < ILP; ++j)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __syncthreads();
    long long stop = clock64();
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < ILP; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}
""" + "".join(
    f'extern "C" __global__ void mma_ilp{n}(float* out, long long* cycles, int iters) '
    f"{{ chain<{n}>(out, cycles, iters); }}\n" for n in ILPS)


def run(args) -> dict:
    import torch

    from gemmgen.backends import cuda_compile, cuda_launch as L
    from gemmgen.measure.clocks import ClockSampler, nvml_index

    compiled = cuda_compile.compile_cubin(SOURCE, name="mma_peak.cu")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    funcs = L.load_functions("mma_peak", compiled.cubin, tuple(f"mma_ilp{n}" for n in ILPS),
                             torch.cuda.current_device(), 0)
    out = torch.empty(sms * 32 * max(WARPS), device="cuda")
    cycles = torch.empty(sms, dtype=torch.int64, device="cuda")
    sampler = ClockSampler(nvml_index(torch.cuda.current_device()))
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for warps in WARPS:
        for ilp in ILPS:
            iters = args.mmas // ilp
            pack = L.ArgPack(ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(cycles.data_ptr()), ctypes.c_int(iters))
            fn = funcs[f"mma_ilp{ilp}"]
            L.launch(fn, (sms, 1, 1), 32 * warps, 0, stream, pack)      # warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            L.launch(fn, (sms, 1, 1), 32 * warps, 0, stream, pack)
            end.record()
            sampler.sample()
            end.synchronize()
            ms = start.elapsed_time(end)
            mmas_per_ssp = warps / 4 * iters * ilp
            cyc = cycles.double().median().item()
            rows.append({"warps_per_sm": warps, "ilp": ilp, "ms": ms,
                         "tflops": sms * warps * iters * ilp * FLOP_PER_MMA / (ms * 1e-3) / 1e12,
                         "cycles_per_mma_per_subpartition": cyc / mmas_per_ssp,
                         "warp_cycles_per_mma": cyc / (iters * ilp)})
            print(f"warps/SM {warps:2d} ILP {ilp:2d}: {rows[-1]['tflops']:6.0f} TFLOP/s, "
                  f"{rows[-1]['cycles_per_mma_per_subpartition']:.2f} cycles between mma.sync of a sub-partition, "
                  f"{rows[-1]['warp_cycles_per_mma']:.2f} per warp", flush=True)
    clocks = sampler.summary()
    sampler.close()
    best = max(rows, key=lambda r: r["tflops"])
    return {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
            "command": "python " + " ".join(sys.argv), "mmas_per_warp": args.mmas,
            "registers": {k: vars(v) for k, v in compiled.resources.items()},
            "clocks": clocks, "best": best, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--mmas", type=int, default=1 << 16, help="mma.sync per warp per launch")
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("mma_peak.py needs a CUDA GPU (an H200); none is visible.", file=sys.stderr)
        return 2
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mma_peak.json").write_text(json.dumps(result, indent=1))
    b = result["best"]
    print(f"\nbest: {b['tflops']:.0f} TFLOP/s at {b['warps_per_sm']} warps/SM, ILP {b['ilp']} "
          f"({b['cycles_per_mma_per_subpartition']:.2f} cycles per mma.sync per sub-partition); "
          f"SM clock median {result['clocks'].get('sm_mhz_median')} MHz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
