"""GPU kernels planted to prove the checks and the runner catch what they must (triton).

Imported only by the loaders in planted.py and by tests/test_measure_gpu.py, never at
package import: it needs triton (and a GPU to run).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def spin_kernel(flag_ptr):
    """Never returns while *flag_ptr == 0: a hung GPU."""
    while tl.load(flag_ptr, volatile=True) == 0:
        pass


@triton.jit
def poke_kernel(ptr, offset):
    """Stores far outside any allocation: an illegal address that poisons the CUDA context."""
    idx = tl.arange(0, 16)
    tl.store(ptr + offset + idx, tl.zeros((16,), dtype=tl.float16))


@triton.jit
def matmul_f16_acc_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """A plain tiled matmul whose tensor-core accumulator is fp16 (out_dtype=tl.float16)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float16)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * s_am + kk[None, :] * s_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * s_bk + rn[None, :] * s_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, out_dtype=tl.float16)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_f16_acc(a, b, out, **_):
    """Kernel-convention wrapper (no epilogue): the fp16-accumulation cheat."""
    m, k = a.shape
    n = b.shape[1]
    grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
    matmul_f16_acc_kernel[grid](a, b, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                out.stride(0), out.stride(1), BM=64, BN=64, BK=32)


def spin(a, b, out, **_):
    import torch

    flag = torch.zeros(1, dtype=torch.int32, device=out.device)
    spin_kernel[(1,)](flag)


def poke(a, b, out, **_):
    poke_kernel[(1,)](out, 1 << 40)
