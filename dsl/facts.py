"""Derived facts of a program: what it costs and how well it fills one H200.

Shape-independent facts (threads, shared memory, registers) exist for every program;
the grid, waves and roofline exist once the program is bound to M, N, K (else None).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from gemmgen.dsl import resources as res
from gemmgen.dsl.hardware import SM90A, Hardware
from gemmgen.dsl.ir import Program


@dataclass(frozen=True)
class Facts:
    """`stages` is the resolved count (`stages auto` = the most that fit, at most 8)."""

    threads: int
    warps: int
    stages: Optional[int]
    smem_bytes: Optional[int]
    acc_regs_per_thread: float
    regs_per_cta: int
    tiles_m: Optional[int] = None
    tiles_n: Optional[int] = None
    k_tiles: Optional[int] = None           # k-tiles of one output tile (all split-K slices together)
    ctas: Optional[int] = None              # output tiles x split-K slices
    grid: Optional[int] = None              # CTAs launched (persistent/stream_k: one wave of clusters)
    waves: Optional[float] = None           # ctas / SMs
    wave_efficiency: Optional[float] = None
    flops: Optional[int] = None
    bytes: Optional[int] = None
    arithmetic_intensity: Optional[float] = None
    floor_s: Optional[float] = None

    @property
    def bound(self) -> bool:
        return self.ctas is not None

    def rows(self) -> list[tuple[str, str]]:
        """(name, value) pairs for a readable table; shape facts only when bound."""
        out = [("threads per CTA", f"{self.threads} ({self.warps} warps)"),
               ("pipeline stages", "none fit" if self.stages is None else str(self.stages)),
               ("shared memory per CTA", "-" if self.smem_bytes is None else
                f"{self.smem_bytes} B ({self.smem_bytes / 1024:.1f} KiB of {SM90A.max_smem_per_block // 1024})"),
               ("accumulators per math thread", f"{self.acc_regs_per_thread:g} fp32 registers"),
               ("registers per CTA (model)", str(self.regs_per_cta))]
        if self.bound:
            out += [("CTA grid (tiles)", f"{self.tiles_m} x {self.tiles_n} x {self.ctas // (self.tiles_m * self.tiles_n)} split"),
                    ("CTAs", str(self.ctas)),
                    ("CTAs launched", str(self.grid)),
                    ("k-tiles per output tile", str(self.k_tiles)),
                    (f"waves on {SM90A.sms} SMs", f"{self.waves:.2f}"),
                    ("wave efficiency", f"{100 * self.wave_efficiency:.1f} %"),
                    ("work", f"{self.flops / 1e9:.3f} GFLOP, {self.bytes / 1e6:.3f} MB moved at least"),
                    ("arithmetic intensity", f"{self.arithmetic_intensity:.1f} FLOP/B"),
                    ("roofline floor", f"{self.floor_s * 1e6:.2f} us ({SM90A.peak_flops_f16 / 1e12:.0f} TFLOP/s, "
                                       f"{SM90A.peak_bytes_per_s / 1e12:.1f} TB/s)")]
        return out


def facts(program: Program, hw: Hardware = SM90A) -> Facts:
    """The derived facts of `program` (validated or not; garbage in, garbage facts out), of the
    problem it computes (`swap_ab`: the transposed one)."""
    program = program.computed
    stages = res.resolved_stages(program, hw)
    shape_free = dict(
        threads=res.threads(program, hw),
        warps=res.warps_per_cta(program),
        stages=stages,
        smem_bytes=None if stages is None else res.smem_bytes(program, stages),
        acc_regs_per_thread=res.acc_regs_per_thread(program, hw),
        regs_per_cta=res.regs_per_cta(program, hw),
    )
    pr = program.problem
    if not pr.is_bound:
        return Facts(**shape_free)
    t = program.tile
    tiles_m, tiles_n = math.ceil(pr.m / t.m), math.ceil(pr.n / t.n)
    tiles = tiles_m * tiles_n
    k_tiles = math.ceil(pr.k / t.k)
    ctas = tiles * program.split_k
    cluster = program.cluster[0] * program.cluster[1]
    if program.scheduler == "tile":
        grid = ctas
        efficiency = ctas / (math.ceil(ctas / hw.sms) * hw.sms)
    elif program.scheduler == "persistent":
        grid = min(ctas, hw.persistent_grid(cluster), program.grid_sms or hw.sms)
        efficiency = ctas / (math.ceil(ctas / grid) * hw.sms)
    else:  # stream_k: the k-iterations of all tiles spread evenly over the grid
        work = tiles * k_tiles
        grid = min(work, hw.persistent_grid(cluster))
        efficiency = work / (math.ceil(work / grid) * hw.sms)
    return Facts(
        **shape_free, tiles_m=tiles_m, tiles_n=tiles_n, k_tiles=k_tiles, ctas=ctas, grid=grid,
        waves=ctas / hw.sms, wave_efficiency=efficiency, flops=pr.flops, bytes=pr.bytes,
        arithmetic_intensity=pr.arithmetic_intensity, floor_s=pr.floor_s,
    )
