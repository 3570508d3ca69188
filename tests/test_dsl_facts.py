"""Derived facts against hand-computed values; the arithmetic is written out in each test."""
from __future__ import annotations

import math

import pytest

from gemmgen.dsl import SM90A, facts, parse

PEAK, BW = 989e12, 4.8e12


def program(gemm: str, *rest: str):
    return parse("\n".join((gemm, *rest)) + "\n")


def test_square_multistage_tile_scheduler():
    p = program("gemm 4096x4096x4096", "backend triton", "tile 128x256x64", "warps 2x4", "stages 3",
                "mainloop multistage")
    f = facts(p)
    assert f.threads == 8 * 32 == 256
    # 3 stages x (128*64 A + 64*256 B) fp16 elements x 2 B; the epilogue reuses the ring
    assert f.smem_bytes == 3 * (128 * 64 + 64 * 256) * 2 == 147456
    assert f.acc_regs_per_thread == 128 * 256 / 256 == 128
    assert (f.tiles_m, f.tiles_n) == (4096 // 128, 4096 // 256) == (32, 16)
    assert f.ctas == f.grid == 512
    assert f.k_tiles == 4096 // 64 == 64
    assert f.waves == pytest.approx(512 / 132)                      # 3.88 waves
    assert f.wave_efficiency == pytest.approx(512 / (4 * 132))      # 4 waves, the last 116/132 full
    flops = 2 * 4096**3
    moved = (4096 * 4096 + 4096 * 4096) * 2 + 4096 * 4096 * 2      # read A and B once, write C once
    assert (f.flops, f.bytes) == (flops, moved) == (137438953472, 100663296)
    assert f.arithmetic_intensity == pytest.approx(flops / moved)   # 1365.3 FLOP/B
    assert f.floor_s == pytest.approx(max(flops / PEAK, moved / BW))  # compute-bound: 139 us
    assert f.floor_s == pytest.approx(1.3897e-4, rel=1e-3)


def test_split_k_skinny_long_k():
    p = program("gemm 128x128x16384 b=col", "backend triton", "tile 64x64x128", "warps 2x2", "stages 3",
                "mainloop multistage", "split_k 8 workspace")
    f = facts(p)
    assert (f.tiles_m, f.tiles_n) == (2, 2)
    assert f.ctas == 2 * 2 * 8 == 32                                  # four tiles, eight K slices each
    assert f.smem_bytes == 3 * (64 * 128 + 128 * 64) * 2 == 98304
    assert f.waves == pytest.approx(32 / 132)
    assert f.wave_efficiency == pytest.approx(32 / 132)               # one partial wave: 24 %
    moved = (128 * 16384 + 16384 * 128) * 2 + 128 * 128 * 2
    assert f.bytes == moved == 8421376
    assert f.flops == 2 * 128 * 128 * 16384 == 536870912
    # memory-bound: 8.4 MB / 4.8 TB/s = 1.75 us > 0.54 us of math
    assert f.floor_s == pytest.approx(moved / BW) == pytest.approx(1.7544e-6, rel=1e-3)
    assert f.arithmetic_intensity == pytest.approx(536870912 / 8421376)


def test_persistent_cooperative_cluster_with_fused_epilogue():
    p = program("gemm 8192x8192x8192 b=col", "epilogue bias=n gelu residual out=f16", "backend cutlass",
                "tile 128x256x64", "warps 8x1", "instr wgmma 64x256x16", "cluster 2x1", "stages 4",
                "mainloop ws_cooperative", "scheduler persistent")
    f = facts(p)
    assert f.threads == (8 + 4) * 32 == 384                           # producer warpgroup + 2 consumers
    # 4 stages x (49152 B of A+B + 16 B of mbarriers) + TMA-store epilogue:
    # (output + residual) x 2 buffers x 64x32 subtile x 2 B
    assert f.smem_bytes == 4 * ((128 * 64 + 64 * 256) * 2 + 16) + 2 * 2 * 64 * 32 * 2 == 213056
    assert f.ctas == (8192 // 128) * (8192 // 256) == 2048
    assert f.grid == (132 // 2) * 2 == 132                            # 66 clusters of 2 fill 132 SMs
    assert f.wave_efficiency == pytest.approx(2048 / (math.ceil(2048 / 132) * 132))  # 16 rounds: 97 %
    moved = (8192 * 8192 * 2) * 2 + 8192 * 8192 * 2 + 8192 * 8192 * 2 + 8192 * 2  # A, B, C, residual, bias
    assert f.bytes == moved
    assert f.floor_s == pytest.approx(2 * 8192**3 / PEAK)             # 1.11 ms, compute-bound


def test_stream_k_spreads_k_iterations():
    p = program("gemm 2048x2176x8192 b=col", "backend cutlass", "tile 128x128x64", "warps 8x1",
                "stages 4", "mainloop ws_cooperative", "scheduler stream_k")
    f = facts(p)
    tiles = 16 * 17                                                   # 272 tiles: 2.06 waves
    iterations = tiles * (8192 // 64)                                 # 34816 k-iterations
    assert f.ctas == tiles and f.grid == 132
    assert f.wave_efficiency == pytest.approx(iterations / (math.ceil(iterations / 132) * 132))  # 99.9 %


def test_generic_program_has_only_shape_free_facts():
    f = facts(program("gemm *x*x*", "backend triton", "tile 128x128x64", "warps 2x2", "stages auto",
                      "mainloop multistage"))
    assert not f.bound and f.ctas is None and f.floor_s is None
    # stages auto: the most that fit, capped at 8: 232448 // 32768 = 7
    assert f.stages == min(8, SM90A.max_smem_per_block // ((128 * 64 + 64 * 128) * 2)) == 7
