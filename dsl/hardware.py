"""The hardware model every reader of hardware numbers uses: one sm_90a GPU.

The validator, the derived facts, the physical floor (`Problem.floor_s`) and every cost model
read `SM90A`; a cost model that assumes less than a rate here says so with a named efficiency
factor of it. Limits are NVIDIA's published ones for compute capability 9.0 (CUDA C
Programming Guide, "Technical Specifications per Compute Capability"; Hopper tuning guide;
PTX ISA for wgmma / mma.sync shapes) and the H200 datasheet; measured rates are from one
H200 SXM (docs/design/cuda_kernels.md, "Reference numbers").
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """What a kernel for this GPU may use: hard limits, peak rates, measured rates, and the
    few rates the cost models share that were not measured here (marked as estimates)."""

    name: str
    arch: str
    sms: int
    max_smem_per_block: int          # bytes of dynamic shared memory one CTA may opt into
    smem_per_sm: int                 # bytes of shared memory per SM
    smem_reserved_per_block: int     # bytes of an SM's shared memory the driver keeps per CTA
    regs_per_sm: int                 # 32-bit registers
    regs_per_block: int
    max_regs_per_thread: int
    max_threads_per_block: int
    max_threads_per_sm: int
    warp_size: int
    warps_per_warpgroup: int
    max_cluster_size: int            # portable limit, in CTAs
    wgmma_m: int
    wgmma_k_f16: int
    wgmma_n: tuple[int, ...]         # legal N of m64nNk16 (fp16 in, fp32 accumulate)
    mma_shapes_f16: tuple[tuple[int, int, int], ...]  # mma.sync shapes (M, N, K)
    copy_alignment_bytes: int        # TMA boxes and 16-byte cp.async need this alignment
    smem_swizzle_bytes: tuple[int, ...]
    peak_flops_f16: float            # dense fp16 tensor-core peak (wgmma), FLOP/s, datasheet
    mma_sync_flops_f16: float        # mma.sync m16n8k16 with fp32 accumulators, FLOP/s, measured
    peak_bytes_per_s: float          # DRAM bandwidth, datasheet: the physical floor's rate
    dram_read_bytes_per_s: float     # sustained DRAM read, measured
    l2_bytes_per_s: float            # operand bytes L2 feeds all SMs together
    sm_load_bytes_per_s: float       # operand bytes one SM pulls on its own, at most
    dram_latency_s: float            # a DRAM round trip under load
    l2_bytes: int

    @property
    def threads_per_warpgroup(self) -> int:
        return self.warp_size * self.warps_per_warpgroup

    def legal_cluster(self, cluster: tuple[int, int]) -> bool:
        cm, cn = cluster
        return (_is_pow2(cm) and _is_pow2(cn) and cm * cn <= self.max_cluster_size)

    def ctas_by_smem(self, smem_bytes: int) -> int:
        """CTAs of `smem_bytes` of shared memory each that one SM holds at once."""
        return self.smem_per_sm // (smem_bytes + self.smem_reserved_per_block)

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
    smem_reserved_per_block=1024,
    regs_per_sm=64 * 1024,
    regs_per_block=64 * 1024,
    max_regs_per_thread=255,
    max_threads_per_block=1024,
    max_threads_per_sm=2048,
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
    # one instruction every 6.0 cycles per SM sub-partition at 1,980 MHz: about 60 % of
    # wgmma's nominal rate at that clock (1,070 TFLOP/s)
    mma_sync_flops_f16=646e12,
    peak_bytes_per_s=4.8e12,
    dram_read_bytes_per_s=4.24e12,   # H200: 4.24-4.30 TB/s; 4.4-4.6 on reads of >= 117 MB (read_ceiling)
    l2_bytes_per_s=10e12,            # estimate, not measured here
    sm_load_bytes_per_s=150e9,       # estimate, not measured here
    dram_latency_s=0.8e-6,           # estimate, not measured here
    l2_bytes=60 * 1024 * 1024,       # H200 as measured; an H100 has 50 MiB
)

is_pow2 = _is_pow2
