"""The Triton search space: what a Hopper Triton expert would try for one problem, best first.

Enumerated: tiles {64,128,256} x {64,128,256} x {32,64,128}, 4 or 8 warps,
2-5 stages, pointer (scheduler tile) or persistent TMA kernels, split-K
{1,2,4,8,16} when the output has too few tiles to fill the GPU (each reduced in a
deterministic workspace or `unordered`, fp32 partials added as they arrive), and for the
leading configurations the rasterisation (raster n swizzle=8 is triton's GROUP_M=8 order;
also swizzle 16, raster m, and no banding).

At a batch of 1-2 (`x @ W.T`), `mainloop direct` programs (FMA over row-contiguous K steps,
under swap_ab), in the order a sweep of them measured best, alternate with the swapped
tensor-core programs on weights of 4096 rows or more; the swapped ones lead on the wider
weights at a batch of 2. At a batch of 3-4 on a weight a quarter of L2 holds, direct programs
of one batch column a CTA come first.

Pruned: tiles much wider than the matrix (a 256-row tile for M=64), shared
memory over the limit, accumulators over 128 registers per thread, TMA on
unaligned operands, split-K slices shorter than two K tiles.

Ordered by a roofline-with-waves estimate (`estimate_us`, documented in
docs/backends.md): each CTA runs its tile at the tensor-core rate scaled by an
efficiency that grows with tile area, depth of pipeline and warps, or at the
rate its SM can stream operands (bytes in flight per memory latency); CTAs run in
waves of SMs x (CTAs per SM); DRAM and L2 traffic give floors; split-K adds
its workspace traffic and a reduce launch. The estimate only orders
candidates; the measured time decides. A diversity pass keeps the first dozen
from being twelve variants of one idea.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Iterable

from gemmgen.backends.triton.rules import SUPPORT, tma_misaligned
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import DTYPE_BYTES, Problem, Program, Tile

TILE_MN = (64, 128, 256)
TILE_K = (32, 64, 128)
SPLITS = (1, 2, 4, 8, 16)
SMALL_M = 128                 # x @ W.T at decode and small batch: the weight's bytes are the time
SMALL_TILE_M = (16, 32)
SMALL_TILE_N = (32,)
STREAM_K_MIN_K_TILES = 4
STREAM_K_MAX_WAVES = 4           # past a few waves the idle part of the last is a small share
LARGE_M_STREAM_K = 2             # stream-K candidates a problem past SMALL_M gets
#: At M <= SMALL_M the estimate sees one DRAM floor for every candidate, so the space starts
#: with what measured best on the H200: (scheduler, tile N, tile K, stages, warps, split-K),
#: tile M from M. First found with benchmarks/small_m.py (Llama-3-8B's q, gate and down at
#: M = 1, 16, 128), then ordered by the layer set's tuning at M = 4-128 (48 problems, shipped
#: records): the fastest Triton program on 11 of the 25 problems that tried the first, on 2 of
#: 18 for the second, on 0 of 14 for `stream_k` 128 x 128 on 4 stages.
SMALL_M_HEAD = (("tile", 128, 128, 4, 4, 1), ("stream_k", 64, 128, 6, 4, 1), ("tile", 64, 128, 4, 4, 4),
                ("stream_k", 32, 128, 6, 4, 1), ("stream_k", 128, 128, 3, 8, 1), ("stream_k", 128, 128, 4, 4, 1))
#: At M <= SWAP_MAX_M, programs of the swapped problem C^T = W x^T (`swap_ab`): the weight's N
#: fills the tile's M side and the batch is a tile N of 16-64. Measured best with benchmarks/
#: small_m.py (1.14x torch.matmul at 16x4096x4096, where no other idea passed 1.06x; no gain at
#: M = 128): (scheduler, tile M, tile K, stages), 4 warps, tile N from M. In the same tuning the
#: first was the fastest Triton program on 12 of 25 problems, the second on 3 of 10, the
#: stream-K ones on none of 13 each; the swapped head leads the small-M head at M <= 64. K
#: split 2-8 ways over the swapped tiles was best only at K = 14336, by at most 1%: not offered
#: (results/small_m_swap/).
SWAP_MAX_M = 64
SWAP_HEAD = (("tile", 64, 128, 6), ("tile", 128, 128, 4), ("stream_k", 128, 64, 6), ("stream_k", 64, 128, 6),
             ("stream_k", 128, 128, 4))
#: At M <= DIRECT_MAX_M (decode), `mainloop direct` under swap_ab: FMA over row-contiguous K
#: steps, which read the weight nearly at a plain read's rate (benchmarks/gemv_patterns.py).
#: (weight rows a CTA, tile K at a batch of one, warps), best measured first. At M = 1, 8 rows,
#: K steps of 1024 and 4 warps beat 4 rows on 2 warps (the best of the rest before) on all 22
#: layers tried, by 1.02-1.16x (tune_llm_direct_m1_lanes/). At M = 2 one partial sum a batch
#: column measured 0.955x torch.matmul over 20 layers, at M = 4 0.63x, and a form with 8x
#: fewer partials 0.72x at M = 4 and 0.19x at 16 (tune_llm_direct_columns/): the FMA work grows
#: with the batch. Tile N is the batch rounded up to a power of two and tile K shrinks as it
#: grows, keeping the partial sums a thread holds. Every tile K spans all lanes of every warp
#: (DIRECT_LANES_K): a narrower step puts warps on rows, the batch column's load takes another
#: layout, and Triton converts the weight through shared memory behind two barriers every
#: step; 16x1x1024 on 8 warps measured 1.44x the leader's time over 20 layers.
DIRECT_MAX_M = 2
#: At a batch of 3-4 on a weight a quarter of L2 holds: one batch column a CTA (tile N 1), the
#: first DIRECT_COLUMNS_PROGRAMS of DIRECT_HEAD. Each CTA column re-reads the weight, from L2
#: after the first, at the one-column form's speed. On an H100 at M = 4
#: (results/direct_small_weights_h100/) `8x1x1024` and `4x1x2048` were the fastest of every
#: program tried at the four problems of weights up to 10.5 MB (1.05-1.50x torch.matmul), and
#: ran 0.96x at 16.8 MB, where a raw CUDA cluster split won, as it did on every weight at M = 8.
DIRECT_COLUMNS_MAX_M = 4
DIRECT_COLUMNS_MAX_BYTES = SM90A.l2_bytes // 4
DIRECT_COLUMNS_PROGRAMS = 3
#: At M <= DIRECT_MAX_M the direct and swapped heads alternate on weights of SWAP_ALTERNATES_MIN_N
#: rows or more, the swapped one first at M = 2 from SWAP_LEADS_MIN_N rows; narrower weights get
#: every direct program first. The swapped 64 x 16 x 128 program reads the weight in about the
#: same time at a batch of 1-16. An estimate across runs from the shipped records (its time at
#: M = 4 against torch.matmul's at M = 2 or 1, beside the best direct program there): at M = 2
#: it was ahead on all 14 weights of 6144 rows or more (1.00-1.11x against 0.88-1.04x), level
#: or behind on the 4096-row ones; at M = 1 ahead on 10 of 24 weights, by 1-7%; on 1024 rows
#: 0.67-0.75x, behind direct at 4 of 5 problems and level at 2x1024x8192.
SWAP_ALTERNATES_MIN_N = 4096
SWAP_LEADS_MIN_N = 6144
DIRECT_HEAD = ((8, 1024, 4), (4, 1024, 2), (4, 2048, 4), (2, 1024, 2), (1, 1024, 1), (8, 2048, 8))
DIRECT_LANES_K = 8 * 32           # a warp's 32 lanes of 16-byte (8-element) loads along K
DRAM_EFFICIENCY = 0.75          # a streaming kernel's rate, not the datasheet's: 3.6 TB/s of 4.8
DRAM_BYTES_PER_S = DRAM_EFFICIENCY * SM90A.peak_bytes_per_s
L2_BYTES_PER_S = SM90A.l2_bytes_per_s
SM_BYTES_PER_S = SM90A.sm_load_bytes_per_s
MEMORY_LATENCY_S = SM90A.dram_latency_s   # what the pipeline must cover
REDUCE_LAUNCH_US = 2.5
LAUNCH_US = 2.0
#: what a persistent TMA kernel costs more than a pointer kernel when there is little work (not
#: profiled: its tile loop's set-up and TMA loads are the candidates): in the shipped database the
#: best `scheduler tile` program beat the best persistent one by 0.13-1.25 us (median 0.45 us) on
#: all 25 problems under 2 GFLOP where both were timed
PERSISTENT_START_US = 0.5
SPACE_SIZE = 48


def _pow2_at_least(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1): Triton block shapes are powers of two."""
    return 1 << max(0, (x - 1).bit_length())


def warp_layout(block_m: int, num_warps: int) -> tuple[int, int]:
    """How Triton lays out warps: for wgmma 4 along M per warpgroup, more along M while rows last;
    a tile under 64 rows is mma.sync's, 16 rows a warp, the other warps side by side along N."""
    if block_m < 64:
        wm = min(num_warps, block_m // 16)
        return wm, num_warps // wm
    wm, wn = 4, 1
    while wm * wn < num_warps:
        if block_m > 16 * wm:
            wm *= 2
        else:
            wn *= 2
    return wm, wn


def _smem(t: Tile, stages: int) -> int:
    return stages * (t.m * t.k + t.k * t.n) * 2


def _efficiency(t: Tile, warps: int, stages: int, persistent: bool) -> float:
    """Fraction of tensor-core peak one CTA sustains in its main loop (a coarse table, not a model)."""
    area = t.m * t.n
    eff = {64 * 64: 0.42, 64 * 128: 0.58, 128 * 128: 0.72, 128 * 256: 0.82, 256 * 256: 0.82}.get(area, 0.5)
    if t.m == 64 and t.n == 256:
        eff = 0.66
    if area >= 128 * 256 and warps < 8:
        eff *= 0.7
    if area <= 64 * 128 and warps > 4:
        eff *= 0.9
    eff *= {32: 0.9, 64: 1.0, 128: 0.96}[t.k]
    eff *= 0.85 if stages <= 2 else 1.0
    if persistent:
        eff *= 1.04   # TMA loads free the warps from address math; the flattened loop hides the epilogue
    return eff


def estimate_us(p: Program) -> float:
    """Rough device time of `p` in microseconds; see the module docstring."""
    p = p.computed
    pr, t = p.problem, p.tile
    m, n, k = pr.m, pr.n, pr.k
    stages = p.stages or 3
    split = p.split_k
    tiles = math.ceil(m / t.m) * math.ceil(n / t.n)
    ctas = tiles * split
    smem = _smem(t, stages)
    per_sm = max(1, min(2, SM90A.ctas_by_smem(smem)))
    if p.num_warps * SM90A.warp_size * per_sm > SM90A.max_threads_per_sm or t.m * t.n * per_sm > 2 * 128 * 256:
        per_sm = 1
    k_slice = math.ceil(math.ceil(k / t.k) / split) * t.k
    eff = _efficiency(t, p.num_warps, stages, p.scheduler == "persistent")
    if per_sm > 1:
        eff = min(0.9, eff * 1.08)
    peak_sm = SM90A.peak_flops_f16 / SM90A.sms
    # A CTA is bound by its tensor cores or by how fast its SM pulls operand panels: the bytes
    # a pipeline keeps in flight ((stages - 1) tiles of A and B) per memory latency, up to a cap.
    in_flight = (stages - 1) * (t.m + t.n) * t.k * 2 * per_sm
    sm_bytes_per_s = min(SM_BYTES_PER_S, in_flight / MEMORY_LATENCY_S)
    cta_s = max(2 * t.m * t.n * k_slice / (peak_sm * eff), (t.m + t.n) * k_slice * 2 * per_sm / sm_bytes_per_s)
    if p.scheduler == "persistent":   # one CTA per SM, walking ceil(ctas / SMs) work items
        compute = math.ceil(ctas / SM90A.sms) * cta_s
    else:                             # waves of SMs x CTAs-per-SM, CTAs on one SM sharing its tensor cores
        sharing = min(per_sm, math.ceil(ctas / SM90A.sms))
        compute = math.ceil(ctas / (SM90A.sms * per_sm)) * sharing * cta_s
    if p.scheduler == "stream_k":   # one wave; a CTA streams `per` k-iterations, then fixes up
        k_tiles = math.ceil(k / t.k)
        per = math.ceil(tiles * k_tiles / SM90A.sms)
        iter_s = max(2 * t.m * t.n * t.k / (peak_sm * eff), (t.m + t.n) * t.k * 2 / sm_bytes_per_s)
        # each tile a CTA enters starts a fresh pipeline; a partial tile costs a write and a read
        segments = math.ceil(per / k_tiles) + 1
        compute = per * iter_s + segments * (MEMORY_LATENCY_S + t.m * t.n * 4 * 2 / SM_BYTES_PER_S)
    dram = (m * k + k * n + m * n) * 2 / DRAM_BYTES_PER_S
    l2 = (m * k * math.ceil(n / t.n) + k * n * math.ceil(m / t.m)) * 2 / L2_BYTES_PER_S
    total = max(compute, dram, l2) * 1e6 + LAUNCH_US
    if p.scheduler in ("persistent", "stream_k"):
        total += PERSISTENT_START_US
    if split > 1:
        ws_bytes = m * n * 4 * (2 * split if p.split_k_reduce == "workspace" else 2)
        total += REDUCE_LAUNCH_US + ws_bytes / DRAM_BYTES_PER_S * 1e6
    return total


def _tile_fits(size: int, dim: int) -> bool:
    """No tile more than twice the padded dimension (a 256-row tile for M=64 is waste)."""
    return size <= max(64, _pow2_at_least(dim))


def _tile_choices(pr: Problem) -> Iterable[tuple[int, int, int]]:
    """The usual tiles; at M <= SMALL_M also tiles of 16 or 32 rows (no wider than M needs) and
    32 columns, so that a thin activation meets enough tiles of the weight to fill the SMs."""
    small = pr.m <= SMALL_M
    tile_m = SMALL_TILE_M + TILE_MN if small else TILE_MN
    tile_n = SMALL_TILE_N + TILE_MN if small else TILE_MN
    for bm, bn, bk in itertools.product(tile_m, tile_n, TILE_K):
        if bm < 64 and bm > max(16, _pow2_at_least(pr.m)):
            continue
        if _tile_fits(bm, pr.m) and _tile_fits(bn, pr.n) and bk <= max(32, _pow2_at_least(pr.k)):
            yield bm, bn, bk


def partial_last_wave(tiles: int) -> bool:
    """One CTA a tile leaves SMs idle: fewer tiles than SMs, or a few waves whose last is less
    than half full (160 tiles: the second wave holds 28 of 132). Stream-K deals the work out
    evenly instead."""
    last = tiles % SM90A.sms
    return tiles < SM90A.sms or (tiles < STREAM_K_MAX_WAVES * SM90A.sms and 0 < last < SM90A.sms // 2)


def _schedulers(pr: Problem, tile: Tile) -> tuple[str, ...]:
    """Pointer and persistent TMA kernels; also stream-K where one CTA a tile leaves SMs idle
    (`partial_last_wave`) over a K loop of at least STREAM_K_MIN_K_TILES."""
    out = ("tile",) if tma_misaligned(pr) else ("tile", "persistent")
    tiles = math.ceil(pr.m / tile.m) * math.ceil(pr.n / tile.n)
    if partial_last_wave(tiles) and math.ceil(pr.k / tile.k) >= STREAM_K_MIN_K_TILES:
        out += ("stream_k",)
    return out


def _base_candidates(pr: Problem) -> Iterable[Program]:
    m, n, k = pr.m, pr.n, pr.k
    for bm, bn, bk in _tile_choices(pr):
        if bm * bn > 128 * 256:
            continue
        tile = Tile(bm, bn, bk)
        for warps in (4, 8):
            if bm * bn // (32 * warps) > 128 or (bm * bn <= 64 * 64 and warps == 8):
                continue
            for stages in (2, 3, 4, 5, 6) if m <= SMALL_M else (2, 3, 4, 5):
                if _smem(tile, stages) > SM90A.max_smem_per_block - 2048:
                    continue
                for scheduler in _schedulers(pr, tile):
                    for split in (SPLITS if scheduler != "stream_k" else (1,)):
                        k_iters = math.ceil(math.ceil(k / bk) / split)
                        if split > 1 and (k_iters < 2 or math.ceil(m / bm) * math.ceil(n / bn) >= SM90A.sms):
                            continue
                        if stages > max(2, k_iters + 1):   # a pipeline deeper than the loop buys nothing
                            continue
                        # `unordered` (fp32 partials added as they arrive, then the epilogue) measured
                        # up to 1.14x torch.matmul at small M x N and long K, where `workspace` reached
                        # 0.85x on the H200; Triton lowers `atomic` the same way
                        reduces = ("workspace", "unordered") if split > 1 else ("workspace",)
                        for reduce in reduces:
                            p = Program(problem=pr, backend="triton", tile=tile,
                                        warps=warp_layout(bm, warps), mainloop="multistage", stages=stages,
                                        scheduler=scheduler, raster="n", swizzle=8, split_k=split,
                                        split_k_reduce=reduce)
                            if not any(rule(p) for rule in SUPPORT.extra_rules):
                                yield p


def _family(p: Program) -> tuple:
    return (p.scheduler, p.split_k > 1, p.tile)


def _diverse(ranked: list[Program], count: int) -> list[Program]:
    """Best first, but each repeat of a family (scheduler, split or not, tile) costs 6 %."""
    chosen, seen = [], {}
    pool = [(estimate_us(p), p) for p in ranked]
    while pool and len(chosen) < count:
        best = min(range(len(pool)), key=lambda i: pool[i][0] * (1 + 0.06 * seen.get(_family(pool[i][1]), 0)))
        _, p = pool.pop(best)
        chosen.append(p)
        seen[_family(p)] = seen.get(_family(p), 0) + 1
    return chosen


def _raster_variants(p: Program) -> list[Program]:
    """Triton's GROUP_M=8 order (raster n swizzle=8) first, then wider bands and the mirror image."""
    tiles_m = math.ceil(p.problem.m / p.tile.m)
    tiles_n = math.ceil(p.problem.n / p.tile.n)
    out = [p]
    for raster, group in (("n", 16), ("m", 8), ("n", 1)):
        across = tiles_m if raster == "n" else tiles_n   # the dimension the bands are cut across
        if group == 1 or across > group:
            out.append(replace(p, raster=raster, swizzle=group))
    return out


def generic_space(problem: Problem) -> list[Program]:
    """For a shape-generic problem: the configurations that are good across shapes."""
    configs = [((128, 256, 64), 8, 3, "persistent"), ((128, 128, 64), 8, 4, "persistent"),
               ((128, 128, 64), 4, 4, "tile"), ((128, 256, 64), 8, 3, "tile"), ((64, 128, 64), 4, 4, "tile"),
               ((128, 64, 64), 4, 4, "tile"), ((64, 64, 64), 4, 4, "tile"), ((64, 64, 128), 4, 3, "tile")]
    return [Program(problem=problem, backend="triton", tile=Tile(*t), warps=warp_layout(t[0], w),
                    mainloop="multistage", stages=s, scheduler=sched, raster="n", swizzle=8)
            for t, w, s, sched in configs]


def small_m_head(problem: Problem) -> list[Program]:
    """SMALL_M_HEAD at this problem: tile M the smallest power of two (16 to 128) that holds M,
    and 64 beside 128; those the backend's rules accept."""
    rows = min(128, max(16, _pow2_at_least(problem.m)))
    out = []
    for bm in (rows, 64) if rows == 128 else (rows,):
        for scheduler, bn, bk, stages, warps, split in SMALL_M_HEAD:
            k_tiles = math.ceil(problem.k / bk)
            if (bk > max(32, _pow2_at_least(problem.k))       # no K tile past K
                    or (scheduler == "stream_k" and k_tiles < STREAM_K_MIN_K_TILES) or k_tiles < 2 * split):
                continue
            p = Program(problem=problem, backend="triton", tile=Tile(bm, bn, bk), warps=warp_layout(bm, warps),
                        mainloop="multistage", stages=stages, scheduler=scheduler, raster="n", swizzle=8,
                        split_k=split, split_k_reduce="unordered" if split > 1 else "workspace")
            if not any(rule(p) for rule in SUPPORT.extra_rules):
                out.append(p)
    return out


def swapped_head(problem: Problem) -> list[Program]:
    """SWAP_HEAD at this problem, as `swap_ab` programs: tile N the smallest power of two (16 to
    64) that holds M; those the backend's rules accept for the transposed problem."""
    if problem.m > SWAP_MAX_M or problem.epilogue.gate:     # a gated product's halves are columns
        return []
    cols = max(16, _pow2_at_least(problem.m))
    out = []
    for scheduler, bm, bk, stages in sorted(SWAP_HEAD, key=lambda entry: _swap_order(problem, entry)):
        k_tiles = math.ceil(problem.k / bk)
        if bk > max(32, _pow2_at_least(problem.k)) or (
                scheduler == "stream_k" and k_tiles < STREAM_K_MIN_K_TILES):
            continue
        p = Program(problem=problem, backend="triton", tile=Tile(bm, cols, bk), warps=warp_layout(bm, 4),
                    mainloop="multistage", stages=stages, scheduler=scheduler, raster="n", swizzle=8, swap_ab=True)
        if not any(rule(p.computed) for rule in SUPPORT.extra_rules):
            out.append(p)
    return out


def _swap_order(problem: Problem, entry: tuple) -> tuple:
    """The one-CTA-a-tile entries of SWAP_HEAD by the weight rows an SM takes on in its waves,
    ceil(tiles / SMs) x tile rows, the larger tile first on a tie (it then runs half the CTAs
    in the same waves); the stream-K ones after them, in their listed order. At M = 4-16, of the
    135 layer problems where both tiles were timed (results/tune_llm_small_m_swap2/), this put
    the faster first at all 94 where they differed by over 3 %: 64 rows at weights of
    1,024-8,192 rows and of 18,944 and 22,016 (the 128-row tile at 0.57-0.97x its speed), 128
    rows at 9,216-16,384, 27,648 and 28,672 (1.03-1.22x)."""
    scheduler, bm = entry[0], entry[1]
    if scheduler != "tile":
        return (1, 0, 0)
    return (0, math.ceil(math.ceil(problem.n / bm) / SM90A.sms) * bm, -bm)


def direct_head(problem: Problem) -> list[Program]:
    """DIRECT_HEAD at this problem (`x @ W.T` at M <= DIRECT_MAX_M, or one batch column a CTA
    up to DIRECT_COLUMNS_MAX_M on a weight L2 holds), as swap_ab programs the backend's rules
    accept for the transposed problem."""
    if problem.m is None or problem.epilogue.gate or (problem.a_major, problem.b_major) != ("row", "col"):
        return []
    head = DIRECT_HEAD
    if problem.m <= DIRECT_MAX_M:
        cols = _pow2_at_least(problem.m)
    elif (problem.m <= DIRECT_COLUMNS_MAX_M
          and problem.n * problem.k * DTYPE_BYTES[problem.in_dtype] <= DIRECT_COLUMNS_MAX_BYTES):
        cols, head = 1, DIRECT_HEAD[:DIRECT_COLUMNS_PROGRAMS]
    else:
        return []
    longest = max(64, _pow2_at_least(problem.k))      # no K step past K
    out = []
    for rows, bk, warps in head:
        p = Program(problem=problem, backend="triton", tile=Tile(rows, cols, min(longest, max(64, bk // cols))),
                    warps=(warps, 1), mainloop="direct", scheduler="tile", swap_ab=True)
        if p.tile.k < DIRECT_LANES_K * warps:
            continue
        if p not in out and not any(rule(p.computed) for rule in SUPPORT.extra_rules):
            out.append(p)
    return out


def _interleave(*lists: list) -> list:
    return [x for group in itertools.zip_longest(*lists) for x in group if x is not None]


def space(problem: Problem, size: int = SPACE_SIZE) -> list[Program]:
    """Up to `size` candidate programs for `problem`, best first (unvalidated)."""
    if not problem.is_bound:
        return generic_space(problem)
    ranked = sorted(_base_candidates(problem), key=estimate_us)
    streamed = []
    if problem.m > SMALL_M:
        # Stream-K was measured at small M only, and the estimate favours it where the last wave
        # is part full: the best few go in after the estimate's first choices, to be measured.
        streamed = [p for p in ranked if p.scheduler == "stream_k"][:LARGE_M_STREAM_K]
        ranked = [p for p in ranked if p.scheduler != "stream_k"]
    head = _diverse(ranked[: 6 * size], size)
    if problem.m <= SMALL_M:
        direct, swapped, small = direct_head(problem), swapped_head(problem), small_m_head(problem)
        if direct and problem.n >= SWAP_ALTERNATES_MIN_N:
            swapped_first = problem.m > 1 and problem.n >= SWAP_LEADS_MIN_N
            head = (_interleave(swapped, direct) if swapped_first else _interleave(direct, swapped)) + small + head
        else:
            head = direct + _interleave(swapped, small) + head
    else:
        head = head[:4] + streamed + head[4:]
    out, seen = [], set()
    for i, p in enumerate(head):
        for q in ([p] + (_raster_variants(p)[1:3] if i == 0 and p.problem.m * p.problem.n >= 2048 * 2048 else [])):
            if q not in seen:
                seen.add(q)
                out.append(q)
    return out[:size]
