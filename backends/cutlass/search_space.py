"""The CUTLASS search space: what an expert would try for one problem, best first.

A small fixed library of builds (per operand majors and epilogue), reused for
every shape through runtime arguments:

    ws_cooperative  128x128, 128x192, 128x256, 256x128 (K 64)  clusters 1x1, 2x1, 1x2  persistent
    ws_cooperative  128x128, 128x192, 128x256, 256x128 (K 64)  cluster 1x1     stream-K scheduler
    ws_pingpong      64x128,  64x256, 128x128 (K 64)  clusters 1x1, 2x1, 1x2  persistent
    ws_cooperative  128x64                            cluster 1x1              stream-K scheduler
    ws_pingpong      64x64                            cluster 1x1              persistent
    ws_pingpong      64x16, 64x32, 64x64, 64x128, 128x128  cluster 1x1         one tile per CTA
    ws_pingpong      64x32, 64x64, 64x128                  cluster 1x1         K slices (split_k N workspace)

That is 35 builds (the table TILES); stages are automatic (the builder fills shared memory after
the epilogue's carve-out). Where the output is large and K short (`_store_bound`), the 7
persistent 1x1 builds of WIDE_EPILOGUE store through a wide epilogue sub-tile
(`tile ... epilogue=MxN`) instead of CUTLASS's automatic one: 7 more instances for a library
that serves such shapes too. Per shape the runtime choices vary for free: raster
order, swizzle 1/2/4/8, on the stream-K builds the decomposition (stream-K,
or split-K with 2-16 splits, added in arrival order), and on the K-slice builds the
slice count (2-64, where K cuts into equal slices of a multiple of 8).

Ordered by a waves-and-efficiency estimate (`estimate_us`): each output tile
costs its MACs at the tensor-core peak scaled by a per-tile efficiency
(bigger tiles reuse operands more; ping-pong hides its epilogue); tiles run in
waves of the co-resident CTAs; stream-K spreads the last wave's work evenly at
a fix-up cost; a persistent build pays its scheduler's start-up, a build of one
tile per CTA a prologue and epilogue per wave; DRAM traffic gives a floor. It only
orders; the timer decides.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from gemmgen.backends.cutlass.rules import RULES, SUPPORT, on_stream_k_scheduler, sliced_split_k
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import Problem, Program, Tile

SMS = SM90A.sms
# The model's rates as fractions of the hardware's; they only rank.
MMA_EFFICIENCY = 0.80   # what a good SM90 GEMM sustains of the tensor-core peak
DRAM_EFFICIENCY = 0.75  # a GEMM's streaming rate: 3.6 TB/s of the datasheet's 4.8
PEAK_FLOPS = SM90A.peak_flops_f16 * MMA_EFFICIENCY
DRAM_BYTES_PER_S = DRAM_EFFICIENCY * SM90A.peak_bytes_per_s
LAUNCH_US = 3.0
FIXUP_US = 2.0  # one stream-K/split-K partial tile written and read back
MIN_SK_ITERS = 8  # K-iterations a stream-K unit takes at least

# The builds, as data: (mainloop, tile M, tile N) -> (relative efficiency of the tile at
# full occupancy, the tile schedulers it is built with). `persistent` is built with every
# cluster of CLUSTERS where the tile is 128 or more wide, else 1x1 only; `stream_k` and
# `tile` with cluster 1x1.
#
# `tile` is CUTLASS's non-persistent kernel, one tile per CTA. On the H200 (111 sample
# shapes) it ran a median 15-16 % faster than the persistent build of the same
# tile on shapes of few tiles (no scheduler start-up), and up to 2.8x slower on shapes of
# many waves (each CTA fills shared memory, so waves do not overlap). Persistent 64x16 and
# 64x32 builds never won a shape there, so those tiles are built one per CTA only. The
# 128x64 cooperative tile is there for split-K on small M x N with long K (18 long-K sample
# shapes: 0.829x -> 0.871x with it). `sliced` builds run `split_k N workspace`: N K slices
# as one batched GEMM into fp32 partials, then a reduce kernel with the epilogue, as cuBLAS
# does at these shapes; on the same 18 shapes 0.871x -> 1.050x (13 chose them).
# The 128x192 cooperative tile fills one wave where 128x256 leaves SMs idle and 128x128
# spills into a second (256 x 12288: 128 tiles against 96 or 192; cuBLAS runs a 192x128
# kernel there); on the H200 it took 256x12288x2048 from 0.84x to 0.98x and 256x12288x4096
# from 0.86x to 1.01x of torch.matmul.
TILES = {
    ("ws_cooperative", 128, 256): (1.00, ("persistent", "stream_k")),
    ("ws_cooperative", 256, 128): (1.00, ("persistent", "stream_k")),
    ("ws_cooperative", 128, 192): (0.96, ("persistent", "stream_k")),
    ("ws_cooperative", 128, 128): (0.90, ("persistent", "stream_k")),
    ("ws_cooperative", 128, 64): (0.70, ("stream_k",)),
    ("ws_pingpong", 64, 256): (0.93, ("persistent",)),
    ("ws_pingpong", 128, 128): (0.92, ("persistent", "tile")),
    ("ws_pingpong", 64, 128): (0.80, ("persistent", "tile", "sliced")),
    ("ws_pingpong", 64, 64): (0.65, ("persistent", "tile", "sliced")),
    ("ws_pingpong", 64, 32): (0.45, ("tile", "sliced")),
    ("ws_pingpong", 64, 16): (0.30, ("tile",)),
}
# Short K: a tile's prologue and epilogue cost about EPILOGUE_K_TILES k-tiles of its mainloop
# (`estimate_us`). The TMA-store epilogue in 128- or 64-row sub-tiles 128 wide instead of 32
# (CUTLASS's automatic choice) took 0.89-0.93x the time at K of one or two k-tiles on the H200:
# 16384x4096x128 0.925x -> 1.018x of torch.matmul, 4096x16384x64 0.956x -> 1.050x, about 1.7
# k-tiles. It shrinks the ring by a stage, so it is used only where K is short; at 4096^3 it
# was level. The outputs measured were 4M to 64M elements; smaller ones are left to the builds
# that won them. It replaces the automatic epilogue of those builds rather than adding twins: it
# was at least as fast in every pair measured at these shapes, and twins crowded other builds
# out of the timed candidates (8192x512x128 lost its 64x256 cluster 1x2 winner, 0.946x -> 0.907x).
EPILOGUE_K_TILES = 2.0
WIDE_EPILOGUE_K_TILES = 1.7
SHORT_K_TILES = 4
STORE_BOUND_OUTPUT = 1 << 22
WIDE_EPILOGUE = {
    ("ws_cooperative", 128, 256): (128, 128),
    ("ws_cooperative", 256, 128): (128, 128),
    ("ws_cooperative", 128, 192): (128, 64),
    ("ws_cooperative", 128, 128): (128, 128),
    ("ws_pingpong", 64, 256): (64, 128),
    ("ws_pingpong", 128, 128): (64, 128),
    ("ws_pingpong", 64, 128): (64, 128),
}
SCHEDULER_START_US = 0.7  # a persistent build's extra time per launch (median of 120 pairs under 1 GFLOP: 0.69 us)
WAVE_US = 1.0  # one tile per CTA: each wave after the first adds a prologue and epilogue no tile hides
CLUSTERS = ((1, 1), (2, 1), (1, 2))
SPLITS = (2, 4, 8, 16)
SLICED_SPLITS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
REDUCE_US = 2.5  # the sliced split-K's second kernel: a launch and its tail
SWIZZLES = (1, 2, 4, 8)
TILE_K = 64
SPACE_SIZE = 40
NEAR_BEST = 1.25  # estimates within 25 % of the best are ties


def library(problem: Problem) -> list[Program]:
    """The builds (one program per build key) for a problem's majors and epilogue; where the
    bound problem is store-bound, the persistent 1x1 ones with their wide epilogue."""
    programs, store_bound = [], _store_bound(problem)
    for (mainloop, tm, tn), (_, schedulers) in TILES.items():
        warps = (8, 1) if mainloop == "ws_cooperative" else (4, 1)
        base = Program(problem=problem, backend="cutlass", tile=Tile(tm, tn, TILE_K), warps=warps,
                       mainloop=mainloop)
        for scheduler in schedulers:
            if scheduler == "sliced":   # split_k N workspace: K slices, one tile per CTA, a reduce kernel
                programs.append(replace(base, scheduler="tile", split_k=2, split_k_reduce="workspace"))
                continue
            clusters = CLUSTERS if scheduler == "persistent" and tn >= 128 else ((1, 1),)
            programs += [replace(base, scheduler=scheduler, cluster=c,
                                 epilogue_tile=_library_epilogue(base, scheduler, c, store_bound)) for c in clusters]
    return programs


def _library_epilogue(p: Program, scheduler: str, cluster: tuple[int, int], store_bound: bool):
    """The epilogue sub-tile of the library's build: wide for the persistent 1x1 ones where the
    store is the work, else CUTLASS's automatic one."""
    if scheduler == "persistent" and cluster == (1, 1) and store_bound:
        return WIDE_EPILOGUE.get((p.mainloop, p.tile.m, p.tile.n))
    return None


def _store_bound(problem: Problem) -> bool:
    """A large output and a short K: the epilogue's store is much of the work."""
    return (problem.is_bound and math.ceil(problem.k / TILE_K) <= SHORT_K_TILES
            and problem.m * problem.n >= STORE_BOUND_OUTPUT)


def _tiles(p: Program) -> tuple[int, int]:
    pr = p.problem
    return math.ceil(pr.m / p.tile.m), math.ceil(pr.n / p.tile.n)


def estimate_us(p: Program) -> float:
    """A rough time for ordering candidates (not a prediction to report)."""
    pr = p.problem
    tm_count, tn_count = _tiles(p)
    tiles = tm_count * tn_count
    eff = TILES[(p.mainloop, p.tile.m, p.tile.n)][0]
    sliced = sliced_split_k(p)
    k_tiles = math.ceil(pr.k / p.tile.k / (p.split_k if sliced else 1))
    # Short K leaves the pipeline no time to fill: prologue and epilogue dominate.
    eff *= k_tiles / (k_tiles + (WIDE_EPILOGUE_K_TILES if p.epilogue_tile else EPILOGUE_K_TILES))
    cluster = p.cluster[0] * p.cluster[1]
    if cluster > 1:
        # Multicast halves one operand's L2 traffic: worth it with long K and many tiles;
        # a grid of fewer tiles than cluster slots wastes CTAs.
        eff *= 1.03 if k_tiles >= 16 and tiles >= SMS else 0.97
        span_m, span_n = p.cluster
        padded = math.ceil(tm_count / span_m) * span_m * math.ceil(tn_count / span_n) * span_n
        tiles_eff = padded
    else:
        tiles_eff = tiles
    tile_us = 2 * p.tile.m * p.tile.n * pr.k / (PEAK_FLOPS / SMS) / eff * 1e6
    if sliced:
        # One CTA per tile and slice, in waves; then the reduce kernel reads every slice's
        # fp32 partial and writes the output.
        waves = math.ceil(tiles_eff * p.split_k / SMS)
        compute = waves * tile_us / p.split_k + (waves - 1) * WAVE_US
        reduce = pr.m * pr.n * 4 * (p.split_k + 1) / DRAM_BYTES_PER_S * 1e6 + REDUCE_US
        return max(compute, pr.bytes / DRAM_BYTES_PER_S * 1e6) + reduce + LAUNCH_US
    if p.split_k > 1:
        units = tiles_eff * p.split_k
        compute = math.ceil(units / SMS) * tile_us / p.split_k + FIXUP_US * (1 + p.split_k / 8)
    elif p.scheduler == "stream_k":
        # Full waves stay whole tiles; the remainder's K-iterations are spread over at most
        # one unit per SM, each unit at least MIN_SK_ITERS long (CUTLASS's floor), and
        # every partial tile is fixed up by its peers in turn.
        full, rest = divmod(tiles_eff, SMS)
        compute = full * tile_us
        if rest:
            iters = rest * k_tiles
            units = max(1, min(SMS, iters // MIN_SK_ITERS))
            peers = math.ceil(units / rest)
            compute += math.ceil(iters / units) * tile_us / k_tiles + FIXUP_US * (1 + peers / 8)
    elif p.scheduler == "tile":
        waves = math.ceil(tiles_eff / SMS)
        compute = waves * tile_us + (waves - 1) * WAVE_US
    else:
        compute = math.ceil(tiles_eff / SMS) * tile_us
    # Padding: the tile grid computes MACs beyond M and N that nobody asked for (in tile_us).
    dram = pr.bytes / DRAM_BYTES_PER_S * 1e6
    start = 0.0 if p.scheduler == "tile" else SCHEDULER_START_US
    return max(compute, dram) + LAUNCH_US + start


def balanced_grid_sms(p: Program) -> Optional[int]:
    """The SMs on which a persistent grid gives every cluster the same number of tiles in as
    many rounds as on all of them, when that is fewer SMs (else None).

    At 4096^3 in 128x256 tiles: 512 tiles, 4 rounds either way, 128 CTAs of 4 tiles instead of
    132 of 3 or 4: 1.000x of torch.matmul against 0.989-0.993x on the H200; not better
    everywhere (2048x32000x2048, ping-pong 1x2: 1.008x against 1.019x), hence a variant to time,
    not a default. Tiles are counted as CUTLASS's persistent scheduler counts them: padded to
    whole clusters, then to the swizzle's band.
    """
    if not p.problem.is_bound:
        return None
    cm, cn = p.cluster
    tm_count, tn_count = _tiles(p)
    bm, bn = math.ceil(tm_count / cm) * cm, math.ceil(tn_count / cn) * cn
    low = min(bm, bn)
    log_band = next((b for b, need in ((3, 6), (2, 3), (1, 2)) if p.swizzle >= 1 << b and low >= need), 0)
    bm = math.ceil(bm / ((1 << log_band) * cm)) * (1 << log_band) * cm
    bn = math.ceil(bn / ((1 << log_band) * cn)) * (1 << log_band) * cn
    clusters = bm * bn * (p.split_k if sliced_split_k(p) else 1) // (cm * cn)
    slots = SMS // (cm * cn)
    if clusters <= slots:
        return None
    used = math.ceil(clusters / math.ceil(clusters / slots))
    return used * cm * cn if used < slots else None


def _runtime_variants(p: Program) -> list[Program]:
    """Raster and swizzle (and splits on stream-K builds) for one build: free to vary."""
    pr = p.problem
    tm_count, tn_count = _tiles(p)
    raster = "m" if tm_count >= tn_count else "n"  # walk the long side within a swizzle band
    if sliced_split_k(p):   # the build's variants are its slice counts (the rules drop those K cannot cut)
        return [replace(p, split_k=s, raster="m", swizzle=1) for s in SLICED_SPLITS
                if pr.k // s >= 2 * p.tile.k and tm_count * tn_count * s <= 4 * SMS]
    if p.scheduler == "tile":  # the grid is the tile grid: raster and swizzle do nothing
        return [replace(p, raster="m", swizzle=1)]
    swizzles = [s for s in SWIZZLES if s == 1 or min(tm_count, tn_count) >= 2 * s]
    if tm_count * tn_count > SMS:
        # Grids of several waves: first the band width whose wave reads the least A and B
        # from L2 (a wave is S bands of SMS / S tiles: S * one operand's panel plus SMS / S
        # of the other's), e.g. 8 for 128x256 tiles; the others follow.
        along, across = (p.tile.m, p.tile.n) if raster == "m" else (p.tile.n, p.tile.m)
        best = math.sqrt(SMS * along / across)
        swizzles.sort(key=lambda s: abs(math.log(s / best)))
    out = [replace(p, raster=raster, swizzle=s) for s in swizzles]
    balanced = balanced_grid_sms(out[0]) if p.scheduler == "persistent" and not on_stream_k_scheduler(p) else None
    if balanced:     # the first swizzle again on fewer SMs, second in line
        out.insert(1, replace(out[0], grid_sms=balanced))
    if p.scheduler == "stream_k":
        k_tiles = math.ceil(pr.k / p.tile.k)
        # Splits add in arrival order: in every pair measured on the H200 (8 shapes x 2 tiles x 3
        # split counts) `unordered` was at least as fast as the turnstile, which at 16
        # splits took 27-50 us where `unordered` took 11-38 us.
        out += [replace(p, split_k=s, split_k_reduce="unordered", scheduler="persistent", raster=raster)
                for s in SPLITS if s * 2 <= k_tiles and tm_count * tn_count * s <= 4 * SMS]
    return out


def space(problem: Problem) -> list[Program]:
    """CUTLASS candidates for a bound problem, best first (unvalidated; see gemmgen.backends.cutlass)."""
    e = problem.epilogue
    if (problem.in_dtype not in SUPPORT.in_dtypes or e.out_dtype not in SUPPORT.out_dtypes
            or problem.a_major not in SUPPORT.majors_a or problem.b_major not in SUPPORT.majors_b
            or problem.c_major not in SUPPORT.majors_c or problem.acc_dtype != "f32"):
        return []
    if not problem.is_bound:
        return library(problem)
    candidates = []
    for build in library(problem):
        for p in _runtime_variants(build):
            if not any(rule(p) for rule in RULES):
                candidates.append(p)
    # Ties (e.g. on the DRAM floor, where short-K shapes that write a large output sit) go to the
    # wide epilogue: there the store is the work (4096x16384x64: 0.956x -> 1.050x).
    candidates.sort(key=lambda p: (estimate_us(p), p.epilogue_tile is None))
    # Near-best families first (the estimate cannot tell them apart, the timer can), then
    # the best runtime variant of every other build, then second variants.
    best = estimate_us(candidates[0]) if candidates else 0.0
    leaders, families, builds = [], set(), set()
    for p in candidates:
        family = (p.mainloop, p.tile, "split_k" if p.split_k > 1 else p.scheduler)
        if family not in families and estimate_us(p) <= NEAR_BEST * best:
            leaders.append(p)
            families.add(family)
            builds.add(_build_of(p))
    firsts, rest = [], []
    for p in candidates:
        if p in leaders:
            continue
        (rest if _build_of(p) in builds else firsts).append(p)
        builds.add(_build_of(p))
    ordered = leaders + firsts + rest
    # The best estimate's balanced grid is timed second: the estimate cannot tell the two apart
    # (same rounds), and at 4096^3 only the balanced grid reached torch.matmul.
    twin = next((p for p in rest if p.grid_sms and replace(p, grid_sms=None) == ordered[0]), None)
    if twin is not None:
        ordered.remove(twin)
        ordered.insert(1, twin)
        # And along the other side: at 4096^3 and 4096x8192x4096 the 128x256 tiles read 0.2-0.9 %
        # better walking N (the tile's wider side) than M (the grid's longer side).
        across = replace(twin, raster="n" if twin.raster == "m" else "m")
        if not any(rule(across) for rule in RULES) and across not in ordered:
            ordered.insert(2, across)
        # And without the cluster: the estimate credits multicast, but at 4096^3 the 1x1 build on
        # 128 SMs walking N read 0.1-0.6 % ahead of the 2x1 one in four calls.
        if twin.cluster != (1, 1):
            single = replace(across, cluster=(1, 1),
                             epilogue_tile=_library_epilogue(across, "persistent", (1, 1), _store_bound(problem)))
            single = replace(single, grid_sms=balanced_grid_sms(single))
            if single.grid_sms and not any(rule(single) for rule in RULES):
                if single in ordered:
                    ordered.remove(single)
                ordered.insert(3, single)
    return ordered[:SPACE_SIZE]


def _build_of(p: Program) -> tuple:
    return (p.mainloop, p.tile, p.cluster, on_stream_k_scheduler(p), sliced_split_k(p), p.epilogue_tile)
