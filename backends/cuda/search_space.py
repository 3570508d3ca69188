"""The search space an expert would enumerate for the raw CUDA backend, best first.

A coarse cost model orders the candidates (waves, tile efficiency, K-loop
latency, split-K traffic); it only ranks, the GPU measurement decides. Its rates
are fractions of the hardware model's (`SM90A`): leads, not measurements of these
kernels (docs/design/cuda_kernels.md).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

from gemmgen.backends.cuda import direct
from gemmgen.backends.cuda import multistage as ms
from gemmgen.backends.cuda.launch import stream_k_grid
from gemmgen.backends.ranking import near_first, take_turns
from gemmgen.dsl.checks import check_alignment, check_split_k
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import CLUSTER_REDUCE, Instr, Problem, Program, Tile
from gemmgen.dsl.resources import b_tiles

SMS = SM90A.sms
# The model's rates as fractions of the hardware's; they only rank.
MMA_SYNC_EFFICIENCY = 620 / 646   # what mma.sync kernels reach at best: 620 TFLOP/s
WGMMA_EFFICIENCY = 800 / 989      # best hand-written wgmma GEMMs: 800 TFLOP/s
DRAM_EFFICIENCY = 5 / 6           # a GEMM's streaming rate: 4.0 TB/s of the datasheet's 4.8
MMA_SYNC_RATE = MMA_SYNC_EFFICIENCY * SM90A.mma_sync_flops_f16
WGMMA_RATE = WGMMA_EFFICIENCY * SM90A.peak_flops_f16
DRAM_RATE = DRAM_EFFICIENCY * SM90A.peak_bytes_per_s
L2_RATE = SM90A.l2_bytes_per_s
LAUNCH_S = 2.5e-6
MAX_SMEM = SM90A.max_smem_per_block
# A k-tile's copies take about this long to land when the L2 is cold. A CTA with a ring of S
# stages has S - 1 tiles in flight, so its K loop cannot run faster than one tile per
# LOAD_LATENCY_S / (S - 1). A rough calibration: 0.65-0.7 us per k tile of 64x64x64 with 3
# stages at 64x64xK on the H200, partly the K loop's own instructions; it only ranks.
LOAD_LATENCY_S = 1.3e-6
STAGES = (2, 3, 4, 5, 6, 8)
# wgmma's rings: one 4-warp CTA an SM keeps its loads' latency covered only with many k tiles
# in flight (8 stages beat 6 by 3-15 % at 64x128 tiles, K 512-4096, on the H200).
WGMMA_STAGES = (3, 4, 5, 6, 8, 10, 12)
# Multistage tiles under 64: on problems of a few tiles they spread the work over more SMs and
# shorten each CTA's chain of mma.sync per k step (CUTLASS's 64x16 tile won the smallest
# sample shapes on the H200). Offered only where the 64x64 tiles leave SMs idle.
NARROW_TILES = ((64, 32), (32, 64), (32, 32), (64, 16), (16, 64))
SPLITS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# The multistage ring read by wgmma (best of 16 such variants 0.835x torch.matmul at the 29
# sample shapes of 1-16 GFLOP, against 0.726x for the selected mma.sync programs, on the H200):
# 64-deep k tiles, warpgroups stacked along M.
WGMMA_WARPS = {64: ((4, 1),), 128: ((4, 1), (8, 1)), 256: ((8, 1),)}
MMA_WARPS = ((2, 2), (2, 4), (4, 2), (4, 1), (1, 4))

# (tile M, tile N) -> fraction of the instruction rate a CTA of that tile sustains
# (narrow tiles scaled from 64x64 by their operand reuse, tile M*N / (M + N): a guess that ranks)
_MS_TILE_EFF = {(64, 64): 0.45, (64, 128): 0.62, (128, 64): 0.62, (128, 128): 0.82, (128, 256): 0.92,
                (256, 128): 0.9, (64, 32): 0.30, (32, 64): 0.30, (32, 32): 0.22, (64, 16): 0.18, (16, 64): 0.18}
# (the gated ping-pong tiles are ranked level with the gated cooperative 128x128 until measured)
_WS_TILE_EFF = {("ws_cooperative", 128, 128): 0.78, ("ws_cooperative", 128, 256): 0.95,
                ("ws_cooperative", 256, 128): 0.93, ("ws_pingpong", 128, 128): 0.9, ("ws_pingpong", 64, 256): 0.88,
                ("ws_pingpong", 64, 128): 0.78, ("ws_pingpong", 128, 64): 0.78}
# The TMA family's tiles. A gated tile keeps gate and up accumulators, twice a plain tile's, so
# only 128x128 fits two cooperating warpgroups, and a ping-pong warpgroup's whole tile is half as
# wide: 64x128 (one wgmma 64x256 over both halves, the shape of cuBLAS's 64x256 ping-pong) or 128x64.
HOPPER_TILES = (("ws_cooperative", 128, 128, (8, 1)), ("ws_cooperative", 128, 256, (8, 1)),
                ("ws_cooperative", 256, 128, (8, 1)), ("ws_pingpong", 128, 128, (4, 1)),
                ("ws_pingpong", 64, 256, (4, 1)))
GATED_HOPPER_TILES = (("ws_cooperative", 128, 128, (8, 1)), ("ws_pingpong", 64, 128, (4, 1)),
                      ("ws_pingpong", 128, 64, (4, 1)))


def _bound(problem: Problem) -> Problem:
    if not problem.is_bound:
        return problem.with_shape(problem.m or 4096, problem.n or 4096, problem.k or 4096)
    return problem


def _multistage(problem: Problem) -> list[Program]:
    p = _bound(problem)
    out = []
    k_tiles_64 = math.ceil(p.k / 64)
    splits = [(1, "workspace")]
    tiles_min = math.ceil(p.m / 128) * math.ceil(p.n / 128)
    # A gated epilogue (gate(A B_gate) * (A B_up)) needs a tile's whole K sum in one CTA: one CTA
    # a tile, no split-K (multistage.gate_rules). Its tile N counts output columns; B's tile is
    # twice that (gate and up), which the rules' accumulator and shared-memory limits see.
    gated = bool(problem.epilogue.gate)
    if tiles_min < SMS // 2 and p.k >= 1024 and not gated:     # small M*N, long K: fill the machine along K
        # Workspace only: the arrival-order kernel (atomic adds, last CTA finishes) measured
        # 1.8-11x slower than torch.matmul on the 22 shapes it was tried (docs/design/cuda_kernels.md)
        # and 0.68-0.85 of the workspace's speed at the narrow weights; the cluster's sum level
        # with it there (docs/backends_cuda.md, "multistage").
        splits += [(s, "workspace") for s in SPLITS if s <= k_tiles_64 // 4 and tiles_min * s <= 4 * SMS]
    tiles = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
    if math.ceil(p.m / 64) * math.ceil(p.n / 64) < SMS:
        tiles += NARROW_TILES
    if gated and p.m <= 32:
        # A few rows of a gated MLP (decode): tiles of 16 or 32 rows waste no mma work on zero rows.
        # At 16x14336x4096 on the H200 16x64 and 16x128 (1x4 warps) ran 64 us, 1.12x the unfused
        # torch product; the 64-row tiles 71-77 us (docs/design/cuda_kernels.md).
        tiles += tuple(t for t in ((16, 64), (16, 128), (32, 64), (32, 128)) if t not in tiles)
    for (tm, tn) in tiles:
        # More tiles than SMs: persistent CTAs, whose ring runs across tiles, so the next tile
        # loads during this one's stores and a ring deeper than one tile's K loop still fills
        # (docs/design/cuda_kernels.md). Under four waves of tiles and K of 1024 or more:
        # stream-K, whose CTAs share the iterations evenly, so no wave runs part empty (at K <=
        # 512 it lost to the persistent twin at all 12 shapes measured, by 3-32 %).
        n_tiles = math.ceil(p.m / tm) * math.ceil(p.n / tn)
        schedulers = ("tile", "persistent") if n_tiles > SMS and not gated else ("tile",)
        if n_tiles < 4 * SMS and p.k >= 1024 and not gated:
            schedulers += ("stream_k",)
        # (instruction, tile K, warps); no k tile twice as deep as K (half of it would be zeros)
        maths = [(Instr("mma", 16, 8, 16), tk, warps) for tk in (32, 64, 128) if tk == 32 or p.k > tk // 2
                 for warps in MMA_WARPS]
        if p.k > 32 and tm <= 64 * math.ceil(p.m / 64) and tn <= 64 * math.ceil(p.n / 64):  # no wgmma on zero rows
            maths += [(Instr("wgmma", 64, tn // warps[1], 16), 64, warps) for warps in WGMMA_WARPS.get(tm, ())]
        for (instr, tk, warps), scheduler in itertools.product(maths, schedulers):
            # A ring deeper than the K loop only costs shared memory and start-up (a
            # persistent or stream-K ring runs on into the next tile: up to 4); 2 stages
            # (what Triton's fastest program at 64^3 used) only where K is a few tiles long.
            # wgmma's ring holds one slot more than its loads in flight.
            k_tiles = math.ceil(p.k / tk)
            deepest = (4 if scheduler != "tile" else max(2, k_tiles + 1)) + (instr.kind == "wgmma")
            rings = [s for s in (WGMMA_STAGES if instr.kind == "wgmma" else STAGES)
                     if s <= deepest and not (s == 2 and k_tiles > 4)]
            for stages, (split, reduce) in itertools.product(rings, splits if scheduler == "tile" else
                                                             [(1, "workspace")]):
                prog = Program(problem=problem, backend="cuda", tile=Tile(tm, tn, tk), warps=warps,
                               mainloop="multistage", instr=instr, stages=stages,
                               scheduler=scheduler, raster="m", swizzle=8 if tm * tn >= 128 * 128 else 4,
                               split_k=split, split_k_reduce=reduce)
                if not ms.rules(prog.bind(p) if not problem.is_bound else prog):
                    out.append(prog)
    return out


def _hopper(problem: Problem) -> list[Program]:
    try:
        from gemmgen.backends.cuda import hopper as hop
    except ImportError:
        return []
    p = _bound(problem)
    out = []
    for mainloop, tm, tn, warps in GATED_HOPPER_TILES if problem.epilogue.gate else HOPPER_TILES:
        wg_n = tn // warps[1]
        # a gated tile's gate and up columns in one wgmma (A read once for both), or one each
        widths = (2 * wg_n, wg_n) if problem.epilogue.gate and warps[1] == 1 and 2 * wg_n <= 256 else (wg_n,)
        for stages, cluster, n in itertools.product((3, 4, 5, 6), ((1, 1), (2, 1)), widths):
            prog = Program(problem=problem, backend="cuda", tile=Tile(tm, tn, 64), warps=warps,
                           mainloop=mainloop, instr=Instr("wgmma", 64, n, 16),
                           cluster=cluster, stages=stages, scheduler="persistent", raster="m",
                           swizzle=8 if p.m >= p.n else 4, smem_swizzle=128)
            bound = prog.bind(p) if not problem.is_bound else prog
            if _tma_accepts(hop, bound):
                out.append(prog)
    return out


def _tma_accepts(hop, program: Program) -> bool:
    """The TMA family's rules and the language's rules they lean on: its TMA alignment, which
    covers the output's rows too, and every K slice at least one k tile."""
    return not (hop.rules(program) or any(check_alignment(program, SM90A)) or any(check_split_k(program, SM90A)))


# The direct family (operands straight into registers) is for `x @ W.T` at a small batch: the
# weight is read once and is nearly all the bytes. Proposed under swap_ab (the weight's N rows
# fill mma's M side, the batch is the narrow N) up to this batch: past it every warp re-reads
# the batch's columns for each 16 weight rows, and at M = 64 and 128 its best program ran
# 0.27-0.63x torch.matmul on the H200 (benchmarks/results/small_m_direct/).
DIRECT_MAX_M = 16
# The grid a direct program aims for: about 4 CTAs an SM (the best programs of the H200 sweep
# ran 224-896 CTAs), each thread keeping up to 512 bytes of loads in flight. With the K slices
# summed across a cluster, about 2: at the 1,024-row weights at M = 4-16, 32-row tiles split 8
# ways (256 CTAs) ran best of the cluster splits, and 16-row ones (512 CTAs) 10 % slower in
# geomean (H100, results/direct_small_weights_h100/). A cluster sum beat the arrival-order one
# at every one of those 15 problems and of 12 on wider weights (results/direct_cluster_wide_h100/),
# so it goes first.
DIRECT_CTAS = 4 * SMS
DIRECT_CLUSTER_CTAS = 2 * SMS
DIRECT_IN_FLIGHT = 512


def direct_programs(problem: Problem) -> list[Program]:
    """swap_ab programs of the direct family: tile M (weight rows) 16-256, tile N the batch
    rounded up to 8 or 16, K split so the grid holds 2-8 CTAs an SM, the slices summed in
    arrival order or (at most a cluster's 8 of them) across a cluster; each way in the family's
    order, the two taking turns."""
    p = _bound(problem)
    if p.m > DIRECT_MAX_M or (p.a_major, p.b_major) != ("row", "col") or problem.epilogue.gate:
        return []
    tile_n = 8 if p.m <= 8 else 16
    out = []
    for rows_per_warp, warps_m, tk, stages in itertools.product((16, 32), (1, 2, 4, 8), (32, 64, 128), (2, 4, 8)):
        tile_m = rows_per_warp * warps_m
        tiles = math.ceil(p.n / tile_m) * math.ceil(p.m / tile_n)
        whole_k_tiles = max(1, p.k // tk)      # every K slice at least one whole k tile
        splits = sorted({min(whole_k_tiles, max(1, 1 << round(math.log2(max(1, c / tiles)))))
                         for c in (DIRECT_CTAS // 2, DIRECT_CTAS, 2 * DIRECT_CTAS)})
        ways = {(split, "unordered" if split > 1 else "workspace") for split in splits}
        ways |= {(min(split, SM90A.max_cluster_size), CLUSTER_REDUCE) for split in splits if split > 1}
        for split, reduce in sorted(ways):
            prog = Program(problem=problem, backend="cuda", tile=Tile(tile_m, tile_n, tk), warps=(warps_m, 1),
                           mainloop="direct", instr=Instr("mma", 16, 8, 16), stages=stages, scheduler="tile",
                           split_k=split, split_k_reduce=reduce, swap_ab=True)
            if not direct.rules(prog.bind(p).computed):
                out.append(prog)
    # the two ways of summing the K slices take turns, the cluster's first
    return take_turns([sorted((q for q in out if q.cluster_sum == cluster),
                              key=lambda q: direct_rank(q, p)) for cluster in (True, False)])


# The TMA family under swap_ab at a batch past the direct family's: one consumer warpgroup a
# 64-row tile of the weight (wgmma's M side), the batch rounded up to the tile's N. 64-row tiles
# give a 4096-row weight 64 CTAs where 128-row ones gave 32, and one CTA draws at most 70-76
# GB/s (benchmarks/results/read_by_ctas_h100/). On the H100 (tune_tma_one_consumer_h100/) their
# best ran 1.033x / 0.994x torch.matmul at Llama's layers at M = 32 / 64, where 128-row tiles
# ran 0.868x / 0.841x; K split in 2 or 4 by a cluster won where the weight has few tiles
# (1,024 rows) or K is deep (14,336), persistent CTAs elsewhere. Over the layer set's tuning
# part (tune_llm_swapped_tma_h100/) they beat torch.matmul and cuBLASLt's heuristic, timed
# beside them, at 10 of the 24 layers reached at M = 32 and 10 of 31 at 64; a 128-wide batch
# tile at 1 of 43 at M = 128 (best per layer 0.908x torch.matmul), so the head stops at 64.
# Where a program has more CTAs than SMs, a ring shallow enough for two CTAs an SM
# (`hopper.ctas_per_sm`) beat the deepest one-CTA ring at all 20 such (layer, split) pairs of
# tune_two_ctas_h100/ (by 0.5-26 %), and lost or tied at 15 of the 16 with fewer CTAs.
SWAPPED_TMA_MAX_M = 64
SWAPPED_TMA_ROWS = 64
# (batch tile, ring depth): the deepest ring that fits beside one CTA's other shared memory
SWAPPED_TMA_TILES = ((32, 10), (64, 8))
SWAPPED_TMA_SPLITS = (1, 2, 4)
# The grid the family's order aims for first: the measured reads needed about 64 CTAs to come
# within 10 % of the device's rate.
SWAPPED_TMA_CTAS = 64


def swapped_tma_programs(problem: Problem) -> list[Program]:
    """swap_ab programs of the TMA family for `x @ W.T` at a batch of 17-64: 64-row tiles on
    one consumer warpgroup, K unsplit or split in 2 or 4 across a cluster; the split that first
    gives SWAPPED_TMA_CTAS CTAs first, then the others by their distance. A program with at most
    one CTA an SM takes the deepest ring (persistent when unsplit), one with more takes the
    deepest ring that lets two CTAs share an SM."""
    try:
        from gemmgen.backends.cuda import hopper as hop
    except ImportError:
        return []
    p = _bound(problem)
    if not DIRECT_MAX_M < p.m <= SWAPPED_TMA_MAX_M or (p.a_major, p.b_major) != ("row", "col") \
            or problem.epilogue.gate:
        return []
    batch_tile, stages = next((n, s) for n, s in SWAPPED_TMA_TILES if n >= p.m)
    tiles = math.ceil(p.n / SWAPPED_TMA_ROWS) * math.ceil(p.m / batch_tile)
    first = next((s for s in SWAPPED_TMA_SPLITS if tiles * s >= SWAPPED_TMA_CTAS), SWAPPED_TMA_SPLITS[-1])
    out = []
    for split in sorted(SWAPPED_TMA_SPLITS, key=lambda s: abs(math.log2(s / first))):
        two_ctas = tiles * split > SMS
        prog = Program(problem=problem, backend="cuda", tile=Tile(SWAPPED_TMA_ROWS, batch_tile, hop.BK), warps=(4, 1),
                       mainloop="ws_cooperative", instr=Instr("wgmma", 64, batch_tile, 16), stages=stages,
                       scheduler="persistent" if split == 1 and not two_ctas else "tile", raster="m", swizzle=1,
                       smem_swizzle=128, split_k=split,
                       split_k_reduce=CLUSTER_REDUCE if split > 1 else "workspace", swap_ab=True)
        if two_ctas:
            prog = _two_ctas_an_sm(hop, prog, p)
        if _tma_accepts(hop, prog.bind(p).computed):
            out.append(prog)
    return out


def _two_ctas_an_sm(hop, program: Program, problem: Problem) -> Program:
    """The program with the deepest ring that lets two of its CTAs share an SM (unchanged if
    none does)."""
    for stages in range(program.stages - 1, 1, -1):
        shallower = replace(program, stages=stages)
        if hop.ctas_per_sm(shallower.bind(problem).computed) == 2:
            return shallower
    return program


def direct_rank(program: Program, problem: Problem) -> tuple:
    """The direct family's order, read off the H200 sweep of every program at M = 1 and 16
    (best of the first 4 within 0.97 of the best of all, geomean over 6 shapes): a grid near
    DIRECT_CTAS (DIRECT_CLUSTER_CTAS for a cluster sum), then more bytes of loads in flight a
    thread (up to DIRECT_IN_FLIGHT), then 4 warps a CTA, then fewer K slices."""
    c = program.bind(problem).computed
    t = program.tile
    ctas = math.ceil(c.problem.m / t.m) * math.ceil(c.problem.n / t.n) * program.split_k
    aim = DIRECT_CLUSTER_CTAS if program.cluster_sum else DIRECT_CTAS
    in_flight = direct.stages_of(c) * direct.ring_regs_per_stage(c) * 4
    return (round(abs(math.log2(ctas / aim))), -min(in_flight, DIRECT_IN_FLIGHT),
            abs(math.log2(program.num_warps / 4)), program.split_k)


def _resident(program: Program) -> int:
    """Multistage CTAs an SM holds at once, from shared memory and a register guess (1.5 a
    fp32 accumulator plus 56: 64x128 on 2x2 warps measured 120-182, 128x128 236-255; the
    driver decides at launch). CTAs resident together overlap their loads' latency."""
    if program.mainloop != "multistage":
        return 1
    t = program.tile
    acc = b_tiles(program) * t.m * t.n / (SM90A.warp_size * program.num_warps)
    regs_per_thread = min(SM90A.max_regs_per_thread, 1.5 * acc + 56)
    regs_per_warp = math.ceil(regs_per_thread * SM90A.warp_size / 256) * 256
    by_regs = SM90A.regs_per_sm // (regs_per_warp * program.num_warps)
    by_smem = SM90A.ctas_by_smem(ms.smem_bytes(program))
    return max(1, min(by_regs, by_smem))


def _wgmma_ring(program: Program) -> bool:
    """A multistage program whose cp.async ring wgmma reads (the TMA families' rings keep the
    general ring model)."""
    return program.mainloop == "multistage" and ms.wgmma(program)


def _loads_ahead(program: Program, stages: int) -> int:
    """k tiles a ring of `stages` keeps loading: one slot is being read, and with wgmma
    another still may be (docs/design/cuda_kernels.md)."""
    return max(1, stages - (2 if _wgmma_ring(program) else 1))


def _k_iters(program: Program, problem: Problem) -> int:
    """K tiles one CTA walks (its split-K slice)."""
    return math.ceil(math.ceil(problem.k / program.tile.k) / program.split_k)


def estimate_seconds(program: Program, problem: Problem) -> float:
    """A ranking model: time of the waves of CTAs plus start-up and K-loop latency."""
    p, t = problem, program.tile
    ws = program.mainloop != "multistage"
    tiles = math.ceil(p.m / t.m) * math.ceil(p.n / t.n)
    ctas = tiles * program.split_k
    k_iters = _k_iters(program, p)
    eff = _WS_TILE_EFF.get((program.mainloop, t.m, t.n), 0.6) if ws else _MS_TILE_EFF.get((t.m, t.n), 0.6)
    rate_per_sm = (WGMMA_RATE if ws or _wgmma_ring(program) else MMA_SYNC_RATE) * eff / SMS
    stream_k = program.scheduler == "stream_k"
    if stream_k:
        ctas = stream_k_grid(tiles * k_iters, SMS * _resident(program))
    if ws:   # persistent: tiles spread over the SMs, the last partial wave costs what it holds
        waves = tiles / SMS
        waves = math.floor(waves) + (1.0 if waves % 1 else 0.0)
    elif stream_k:     # every CTA gets the same share of the iterations
        waves = tiles / min(ctas, SMS)
    else:
        waves = math.ceil(ctas / SMS)
    halves = b_tiles(program)     # a gated tile computes its gate and its up half
    compute = waves * 2 * t.m * halves * t.n * k_iters * t.k / rate_per_sm
    split = program.split_k > 1
    # Split-K: every slice writes its partial tile, a second kernel reads them all back.
    # Stream-K: each CTA writes at most one partial tile, which the tile's first CTA reads back
    # in the same launch, one CTA's after another.
    partials = program.split_k * p.m * p.n if split else ctas * t.m * t.n if stream_k else 0
    memory = (p.bytes + partials * 4 * 2) / DRAM_RATE
    stages = min(program.stages or 3, k_iters + 1)       # the ring fills at most the K loop
    in_flight = _loads_ahead(program, stages)
    # Start-up: the ring's first loads. wgmma's rings are not charged past 4 stages: the first
    # wait is on the oldest k tile only, and 8 stages measured faster than 6.
    ring_start = min(stages, 4) if _wgmma_ring(program) else stages
    latency = LAUNCH_S + (ring_start + 2) * 0.1e-6 + split * 2.5e-6
    if stream_k:
        latency += 1.0e-6 + 0.3e-6 * max(0, math.ceil(ctas / tiles) - 1)
    # Each K step streams (tile M + tile N) x tile K operands through L2 into the SM;
    # small tiles are bound by that feed rather than by the tensor cores.
    feed = k_iters * waves * (t.m + halves * t.n) * t.k * 2 / (L2_RATE / SMS)
    # The ring keeps stages - 1 tiles in flight: a shallow one leaves the K loop waiting on loads,
    # unless other CTAs on the SM load meanwhile.
    resident_waves = waves if ws else tiles / ctas if stream_k else math.ceil(ctas / (SMS * _resident(program)))
    pipeline = resident_waves * k_iters * LOAD_LATENCY_S / in_flight if k_iters > 1 else 0.0
    factor = 1.0
    if not ws and program.scheduler == "persistent":
        # One program both ways at 22 shapes on the H200: persistent ran 0.97-1.13x as
        # fast as one CTA a tile from 256 tiles on, 0.94-0.98x at 128-192 (little to load early).
        factor *= 0.95 if tiles >= 2 * SMS else 1.05
    if program.cluster[0] > 1:   # multicast halves B traffic once tiles fill the chip
        factor *= 0.97 if tiles >= 2 * SMS else 1.03
    return max(compute, memory, feed, pipeline) * factor + latency


NEAR_BEST = 1.25  # groups whose best estimate is within this factor of the best take turns first


def _round_robin(programs: list[Program], problem: Problem) -> list[Program]:
    """Ranked, alternating between the (family, tile, split) groups near the best estimate so
    near-ties stay diverse; the groups far behind come after. (Alternating between all groups
    spent the measured slots on tiles that could not win: at 64x64x512 four of six were
    128x128 and larger, 2-4x slower than the 64x64 tile, whose deeper rings went unmeasured.)"""
    scored = [(estimate_seconds(q.bind(problem), problem), q) for q in programs]
    scored.sort(key=lambda eq: (_percent_bin(eq[0]), _tiebreak(eq[1], problem)))
    groups: dict[tuple, list[tuple[float, Program]]] = {}
    for est, q in scored:
        key = (q.mainloop, q.instr.kind if q.instr else None, q.scheduler, q.tile.m, q.tile.n, q.split_k, q.cluster)
        groups.setdefault(key, []).append((est, q))
    return near_first([[q for _, q in g] for g in groups.values()], [g[0][0] for g in groups.values()], NEAR_BEST)


def _percent_bin(seconds: float) -> int:
    """Estimates within about 1 % are ties (the model cannot tell them apart; the tie-break
    then prefers the ring depth the K loop fills)."""
    return round(math.log(max(seconds, 1e-12)) / math.log(1.01))


def _tiebreak(q: Program, problem: Problem) -> tuple:
    """Among equal estimates: the ring depth nearest 4 that the K loop can fill (K tiles + 1,
    at least 2, or 3 when persistent), then 3, then 5 (wgmma: below); wider K tiles; 8 warps for tiles over 128x128, 4 for the others
    (128x128 on 2x2 warps, two CTAs an SM, beat 4x2 at 18 of 22 short-K shapes); then
    square warp tiles, the wider in N first. (The warp layouts of one tile and ring, timed
    side by side on the H200: 256x128 on 2x4 warps, 128x32 each, took 1.06x
    the time of 4x2; 64x64 on 1x4 1.15x that of 2x2; 64x128 on 4x1 1.10x and on 1x4 1.01x;
    of two equally square ones the wider in N won, as 4x2 over 2x4 at 128x128 in 26 of 37.)"""
    # A persistent or stream-K ring runs across tiles: it fills 3 stages however short K is.
    depth = q.stages or 4
    if _wgmma_ring(q):
        # wgmma: the deepest ring the K loop fills, up to 8, then the deeper ones, then the
        # shallower (rings of 6 and 8 won 19 of the 40 shapes wgmma won,
        # 9 of those ranked 24th-29th when depth 4 came first).
        fill = min(8, _k_iters(q, problem) + 2) if q.scheduler == "tile" else 5
        rank = 0 if depth == fill else 1 if depth > fill else min(4, 1 + fill - depth)
    else:
        preferred = min(4, max(3 if q.scheduler != "tile" else 2, _k_iters(q, problem) + 1))
        rank = 0 if depth == preferred else {4: 1, 3: 2, 5: 3}.get(depth, 4)
    warps = -q.num_warps if q.tile.m * q.tile.n > 128 * 128 else q.num_warps
    warp_m, warp_n = q.tile.m / q.warps[0], q.tile.n / q.warps[1]
    warp_tile = (abs(math.log2(warp_m / warp_n)), warp_n < warp_m)
    return (rank, -q.tile.k, warps, warp_tile, q.cluster)


def space(problem: Problem, limit: int = 40) -> list[Program]:
    """The families' candidates for `problem`, best first, at most `limit`.

    Half the slots go to each of multistage and the TMA family when both have candidates, so a
    search always measures some of both; at a small batch of `x @ W.T` the swapped head (the
    direct family's best up to DIRECT_MAX_M, then the TMA family's 64-row tiles up to
    SWAPPED_TMA_MAX_M) comes first, at most half.
    """
    p = _bound(problem)
    swapped_head = direct_programs(problem) or swapped_tma_programs(problem)
    ms = _round_robin(_multistage(problem), p)
    hop = _round_robin(_hopper(problem), p)
    first = swapped_head[: limit // 2]
    rest = limit - len(first)
    half = rest // 2
    take_hop = min(len(hop), max(half, rest - len(ms)))
    chosen = first + ms[: rest - take_hop] + hop[:take_hop]
    return [replace(q, spans={}) for q in chosen]
