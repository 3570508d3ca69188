"""What a program costs on the chip: threads, shared memory, registers.

The validator and the derived facts both read these, so one model serves both.
The model (documented in docs/dsl.md, "Resource model"):

* `warps WMxWN` are the math warps that share one CTA tile, WM along M, WN along N.
* multistage: threads = 32 * WM * WN.
* ws_cooperative: one producer warpgroup (TMA) plus the WM*WN consumer warps:
  threads = 32 * (WM * WN + 4).
* ws_pingpong: one producer warpgroup plus two consumer groups of WM*WN warps, each
  on its own tile: threads = 32 * (2 * WM * WN + 4).
* shared memory = stages * (tile_m * tile_k + tile_k * tile_n) * sizeof(in)
  + for warp-specialized mainloops: two 8-byte mbarriers per stage and the TMA-store
  epilogue's double-buffered output subtile, 64x32 or the program's (`tile ... epilogue=MxN`),
  one more per C/residual operand read; a backend's rules may give its own automatic subtile
  (CUTLASS's 128x32 or 64x32, `cutlass_rules.epilogue_tile`).
  A multistage epilogue reuses the mainloop's buffers.
* direct: no shared memory; its `stages` are k tiles of loads in flight in each thread's
  registers, at most DIRECT_MAX_STAGES (the backend bounds the registers they take).
* accumulator registers per math thread = tile_m * tile_n / (32 * WM * WN) fp32 values,
  plus REG_RESERVE for addresses, indices and fragments.
"""
from __future__ import annotations

from typing import Optional

from gemmgen.dsl.hardware import SM90A, Hardware
from gemmgen.dsl.ir import DTYPE_BYTES, Program

WS_MAINLOOPS = ("ws_cooperative", "ws_pingpong")
REGISTER_MAINLOOPS = ("direct",)   # operands go from global memory straight to registers
DIRECT_MAX_STAGES = 8
PRODUCER_WARPS = 4
REG_RESERVE = 32            # registers a math thread needs beside its accumulators
PRODUCER_REGS = 40          # a TMA producer warpgroup after setmaxnreg.dec
EPILOGUE_SUBTILE = (64, 32)  # the TMA-store epilogue's staging subtile
MBARRIER_BYTES_PER_STAGE = 16
AUTO_STAGES_CAP = 8          # `stages auto` is taken as the most that fit, at most this


def is_ws(program: Program) -> bool:
    return program.mainloop in WS_MAINLOOPS


def math_warps(program: Program) -> int:
    return program.warps[0] * program.warps[1]


def consumer_groups(program: Program) -> int:
    return 2 if program.mainloop == "ws_pingpong" else 1


def warps_per_cta(program: Program) -> int:
    producer = PRODUCER_WARPS if is_ws(program) else 0
    return consumer_groups(program) * math_warps(program) + producer


def threads(program: Program, hw: Hardware = SM90A) -> int:
    return warps_per_cta(program) * hw.warp_size


def in_bytes(program: Program) -> int:
    return DTYPE_BYTES.get(program.problem.in_dtype, 2)


def b_tiles(program: Program) -> int:
    """Tiles of B a K step loads, and accumulators a tile holds: two for a gated epilogue (its
    gate and up halves), else one."""
    return 2 if program.problem.epilogue.gate else 1


def stage_bytes(program: Program) -> int:
    t = program.tile
    return (t.m * t.k + b_tiles(program) * t.k * t.n) * in_bytes(program)


def epilogue_smem_bytes(program: Program, default_subtile: Optional[tuple[int, int]] = None) -> int:
    """The TMA-store epilogue's staging: two buffers of its sub-tile for D and for each source read.

    The sub-tile is the program's `epilogue=`, else `default_subtile` (a backend's own automatic
    choice, e.g. CUTLASS's), else a generic 64x32 clipped to the tile."""
    if not is_ws(program):
        return 0
    e = program.problem.epilogue
    out = DTYPE_BYTES.get(e.out_dtype, 2)
    sub_m, sub_n = program.epilogue_tile or default_subtile or (min(program.tile.m, EPILOGUE_SUBTILE[0]),
                                                                min(program.tile.n, EPILOGUE_SUBTILE[1]))
    buffers = 1 + (float(e.beta) != 0.0) + bool(e.residual)
    return buffers * 2 * sub_m * sub_n * out


def per_stage_bytes(program: Program) -> int:
    """Shared memory one more stage costs, barriers included (none for a register ring)."""
    if program.mainloop in REGISTER_MAINLOOPS:
        return 0
    return stage_bytes(program) + (MBARRIER_BYTES_PER_STAGE if is_ws(program) else 0)


def smem_bytes(program: Program, stages: int) -> int:
    return stages * per_stage_bytes(program) + epilogue_smem_bytes(program)


def max_stages(program: Program, hw: Hardware = SM90A) -> int:
    """The most stages whose shared memory fits one CTA (0 if not even one)."""
    if program.mainloop in REGISTER_MAINLOOPS:
        return DIRECT_MAX_STAGES
    per = per_stage_bytes(program)
    if per <= 0:
        return 0
    return max(0, (hw.max_smem_per_block - epilogue_smem_bytes(program)) // per)


def min_stages(program: Program) -> int:
    return 2 if is_ws(program) else 1


def resolved_stages(program: Program, hw: Hardware = SM90A) -> Optional[int]:
    """`stages N` as written; for `stages auto`, the most that fit (capped); None if none fit."""
    if program.stages is not None:
        return program.stages
    fit = min(max_stages(program, hw), AUTO_STAGES_CAP)
    return fit if fit >= min_stages(program) else None


def acc_regs_per_thread(program: Program, hw: Hardware = SM90A) -> float:
    t = program.tile
    return b_tiles(program) * t.m * t.n / (math_warps(program) * hw.warp_size)


def regs_per_cta(program: Program, hw: Hardware = SM90A) -> int:
    """Registers the CTA needs under the model: math threads plus a producer warpgroup."""
    per_math = min(hw.max_regs_per_thread, int(acc_regs_per_thread(program, hw)) + REG_RESERVE)
    total = consumer_groups(program) * math_warps(program) * hw.warp_size * per_math
    if is_ws(program):
        total += PRODUCER_WARPS * hw.warp_size * PRODUCER_REGS
    return total
