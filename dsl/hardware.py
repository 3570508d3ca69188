"""The hardware model the validator and the derived facts read: one sm_90a GPU.

Numbers are NVIDIA's published limits for compute capability 9.0 (CUDA C
Programming Guide, "Technical Specifications per Compute Capability"; Hopper
tuning guide; PTX ISA for wgmma / mma.sync shapes) and the H200 datasheet.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """What a kernel for this GPU may use; every field is a hard limit or a peak rate."""

    name: str
    arch: str
    sms: int
    max_smem_per_block: int          # bytes of dynamic shared memory one CTA may opt into
    smem_per_sm: int                 # bytes of shared memory per SM
    regs_per_sm: int                 # 32-bit registers
    regs_per_block: int
    max_regs_per_thread: int
    max_threads_per_block: int
    warp_size: int
    warps_per_warpgroup: int
    max_cluster_size: int            # portable limit, in CTAs
    wgmma_m: int
    wgmma_k_f16: int
    wgmma_n: tuple[int, ...]         # legal N of m64nNk16 (fp16 in, fp32 accumulate)
    mma_shapes_f16: tuple[tuple[int, int, int], ...]  # mma.sync shapes (M, N, K)
    copy_alignment_bytes: int        # TMA boxes and 16-byte cp.async need this alignment
    smem_swizzle_bytes: tuple[int, ...]
    peak_flops_f16: float            # dense fp16 tensor-core peak, FLOP/s
    peak_bytes_per_s: float          # DRAM bandwidth, datasheet
    l2_bytes: int

    @property
    def threads_per_warpgroup(self) -> int:
        return self.warp_size * self.warps_per_warpgroup

    def legal_cluster(self, cluster: tuple[int, int]) -> bool:
        cm, cn = cluster
        return (_is_pow2(cm) and _is_pow2(cn) and cm * cn <= self.max_cluster_size)

    def persistent_grid(self, cluster_size: int) -> int:
        """CTAs a persistent kernel launches: whole clusters filling the SMs once."""
        return (self.sms // cluster_size) * cluster_size


def _is_pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


SM90A = Hardware(
    name="NVIDIA H200 SXM (sm_90a)",
    arch="sm_90a",
    sms=132,
    max_smem_per_block=227 * 1024,   # 232448 B
    smem_per_sm=228 * 1024,          # 233472 B
    regs_per_sm=64 * 1024,
    regs_per_block=64 * 1024,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    warp_size=32,
    warps_per_warpgroup=4,
    max_cluster_size=8,
    wgmma_m=64,
    wgmma_k_f16=16,
    wgmma_n=tuple(range(8, 257, 8)),
    mma_shapes_f16=((16, 8, 16),),
    copy_alignment_bytes=16,
    smem_swizzle_bytes=(0, 32, 64, 128),
    peak_flops_f16=989e12,
    peak_bytes_per_s=4.8e12,
    l2_bytes=60 * 1024 * 1024,       # H200 as measured; an H100 has 50 MiB
)

H100_L2_BYTES = 50 * 1024 * 1024

is_pow2 = _is_pow2
