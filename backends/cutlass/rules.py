"""What the CUTLASS backend refuses, and why: each rule returns (field, message) pairs.

Three kinds of rule: CUTLASS's own compile-time constraints (a static_assert
would stop nvcc after a minute of work, so say it in a millisecond instead),
TMA's alignment rules (checked against the bound shape), and configurations
judged unsafe to run (hangs), each with the reason; docs/design/cutlass.md has the
hang analysis.
"""
from __future__ import annotations

from gemmgen.backends.base import Support, int32_overflows
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import DTYPE_BYTES, INPUT_DTYPES, Program
from gemmgen.dsl.resources import epilogue_smem_bytes, stage_bytes

SMEM_BYTES = SM90A.max_smem_per_block  # usable dynamic shared memory per CTA on sm_90a (227 KiB)
MAX_ACCUMULATORS_PER_THREAD = 128  # fp32 accumulator registers per consumer thread
SWIZZLES = (1, 2, 4, 8)  # CUTLASS rounds max_swizzle_size down to a power of two <= 8
# Tile N below 64 (one 64xN wgmma; B's shared-memory rows swizzled at 32 or 64 bytes):
# small problems, where more CTAs each with less work finish sooner. ping-pong only.
NARROW_TILE_N = (16, 32)
# `tile ... epilogue=MxN`: the TMA-store epilogue's sub-tile, M the rows of the consumer warpgroups
# that store together (both of a cooperative tile, one ping-pong group's), N one of these.
EPILOGUE_TILE_N = (32, 64, 128)


def epilogue_rows(p: Program) -> int:
    """The rows the epilogue stores at a time: both consumer warpgroups' (cooperative) or one's."""
    return 128 if p.mainloop == "ws_cooperative" else 64


def epilogue_tile(p: Program) -> tuple[int, int]:
    """The epilogue's sub-tile: the program's, else what CUTLASS's automatic choice gives."""
    return p.epilogue_tile or (epilogue_rows(p), 32)


def _consumer_threads(program: Program) -> int:
    # Cooperative: two consumer warpgroups share one tile; ping-pong: one per tile.
    return 256 if program.mainloop == "ws_cooperative" else 128


def schedule_rules(p: Program) -> list[tuple[str, str]]:
    """Kernel-schedule constraints CUTLASS enforces with static_asserts, and sound register use."""
    out = []
    t = p.tile
    cooperative = p.mainloop == "ws_cooperative"
    if cooperative and t.m % 128:
        out.append(("tile", f"ws_cooperative splits the tile's M over two consumer warpgroups of 64 rows "
                            f"each, so tile M must be a multiple of 128 (got {t.m}): use tile 128x{t.n}x{t.k} "
                            f"or mainloop ws_pingpong"))
    if not cooperative and t.m not in (64, 128):
        out.append(("tile", f"ws_pingpong gives each consumer warpgroup a whole tile; tile M must be 64 or 128 "
                            f"(got {t.m}): use tile 64x{t.n}x{t.k} or mainloop ws_cooperative"))
    if t.n in NARROW_TILE_N:
        if cooperative or t.m != 64:
            out.append(("tile", f"tile N {t.n} is supported only with tile M 64 and mainloop ws_pingpong (the "
                                f"narrow tiles for small problems): use tile 64x{t.n}x{t.k} with mainloop ws_pingpong"))
    elif t.n % 64 or not 64 <= t.n <= 256:
        out.append(("tile", f"tile N must be 16, 32, 64, 128, 192 or 256 (one wgmma spans the tile's N; "
                            f"got {t.n})"))
    if t.k not in (32, 64, 128):
        out.append(("tile", f"tile K must be 32, 64 or 128 (got {t.k}); 64 gives 128-byte swizzled rows"))
    accumulators = t.m * t.n // _consumer_threads(p)
    if accumulators > MAX_ACCUMULATORS_PER_THREAD:
        out.append(("tile", f"a {t.m}x{t.n} tile gives each {'cooperative' if cooperative else 'ping-pong'} "
                            f"consumer thread {accumulators} fp32 accumulators (over {MAX_ACCUMULATORS_PER_THREAD}: "
                            f"the 232-register budget spills); use a smaller tile"
                            + ("" if cooperative else " or mainloop ws_cooperative")))
    expected = (8, 1) if cooperative else (4, 1)
    if tuple(p.warps) != expected:
        out.append(("warps", f"{p.mainloop} fixes its consumer warps: write `warps {expected[0]}x{expected[1]}` "
                             f"({'two warpgroups stacked along M' if cooperative else 'one warpgroup per tile'})"))
    if p.instr is not None and (p.instr.kind, p.instr.m, p.instr.n, p.instr.k) != ("wgmma", 64, t.n, 16):
        out.append(("instr", f"the collective builder derives the instruction from the tile: write "
                             f"`instr wgmma 64x{t.n}x16` or `instr auto`"))
    if cooperative and p.scheduler == "tile":
        out.append(("scheduler", "CUTLASS's ws_cooperative kernel is always persistent: use scheduler persistent "
                                 "or stream_k, or mainloop ws_pingpong for one tile per CTA"))
    if not cooperative and on_stream_k_scheduler(p):
        out.append(("scheduler", "ws_pingpong has no stream-K tile scheduler (CUTLASS static_asserts it): use "
                                 "scheduler persistent with split_k 1, split_k N workspace (K slices reduced by "
                                 "a second kernel), or mainloop ws_cooperative"))
    if p.swizzle not in SWIZZLES:
        out.append(("swizzle", f"swizzle must be one of {', '.join(map(str, SWIZZLES))} "
                               f"(CUTLASS rounds it to a power of two of at most 8; got {p.swizzle})"))
    if p.stages is not None:
        # The ring's stages, and the TMA epilogue's staging of CUTLASS's sub-tile (the automatic one
        # unless the program names one).
        per_stage = stage_bytes(p)
        epilogue_bytes = epilogue_smem_bytes(p, default_subtile=epilogue_tile(p))
        need = p.stages * per_stage + epilogue_bytes
        if p.stages < 2 or need > SMEM_BYTES:
            fit = max(2, (SMEM_BYTES - epilogue_bytes) // per_stage)
            out.append(("stages", f"{p.stages} stages of a {t.m}x{t.n}x{t.k} tile need about {need // 1024} KiB "
                                  f"of shared memory (at most {SMEM_BYTES // 1024} KiB, at least 2 stages): "
                                  f"use stages {fit} or `stages auto`"))
    return out


def epilogue_rules(p: Program) -> list[tuple[str, str]]:
    e = p.problem.epilogue
    out = []
    if e.residual and e.beta != 0.0:
        out.append(("epilogue", "the CUTLASS epilogue reads one source tensor, used either as beta*C or as the "
                                "residual: drop beta or residual (add the residual into C and keep beta)"))
    if p.epilogue_tile is None:
        return out
    rows, cols = p.epilogue_tile
    want = epilogue_rows(p)
    fits = [n for n in EPILOGUE_TILE_N if p.tile.n % n == 0]
    t = p.tile
    if not fits:
        out.append(("epilogue_tile", f"a {t.m}x{t.n} tile is narrower than any epilogue sub-tile "
                                     f"({', '.join(map(str, EPILOGUE_TILE_N))} columns): drop `epilogue=` from `tile`"))
    elif rows != want or cols not in fits:
        out.append(("epilogue_tile", f"a {p.mainloop} {t.m}x{t.n} tile stores sub-tiles of {want} rows "
                                     f"(its {'two consumer warpgroups' if want == 128 else 'consumer warpgroup'}) "
                                     f"and {', '.join(map(str, fits))} columns: write "
                                     f"`tile {t.m}x{t.n}x{t.k} epilogue={want}x{fits[-1]}`, another of those "
                                     f"widths, or no `epilogue=`"))
    if p.split_k > 1:
        out.append(("epilogue_tile", "the split-K builds keep CUTLASS's automatic epilogue (not built or checked "
                                     "with another): drop `epilogue=` from `tile`, or write `split_k 1`"))
    return out


def alignment_rules(p: Program) -> list[tuple[str, str]]:
    """TMA needs 16-byte aligned leading dimensions; checked once M, N, K are bound."""
    pr = p.problem
    if not pr.is_bound:
        return []
    per_16_bytes = 16 // DTYPE_BYTES[pr.in_dtype]
    out_per_16 = 16 // DTYPE_BYTES[pr.epilogue.out_dtype]
    leading = {
        "a": ("K" if pr.a_major == "row" else "M", pr.k if pr.a_major == "row" else pr.m, per_16_bytes),
        "b": ("N" if pr.b_major == "row" else "K", pr.n if pr.b_major == "row" else pr.k, per_16_bytes),
        "c": ("N" if pr.c_major == "row" else "M", pr.n if pr.c_major == "row" else pr.m, out_per_16),
    }
    out = []
    for operand, (name, size, multiple) in leading.items():
        if size % multiple:
            major = getattr(pr, f"{operand}_major")
            out.append(("problem", f"TMA loads and stores need 16-byte aligned rows: with {operand}={major} the "
                                   f"leading dimension is {name}={size}, not a multiple of {multiple}; pad {name} "
                                   f"to {size + multiple - size % multiple} or use the triton backend"))
    if pr.epilogue.bias == "n" and pr.n % out_per_16:
        out.append(("bias", f"bias=n is read in 16-byte vectors: N={pr.n} must be a multiple of {out_per_16}"))
    return out


def sliced_split_k(p: Program) -> bool:
    """`split_k N workspace`: a batched GEMM over N equal K slices into fp32 partials, which a
    second kernel sums in slice order and finishes with the epilogue (deterministic). The
    `unordered` splits run on the stream-K scheduler instead."""
    return p.split_k > 1 and p.split_k_reduce == "workspace"


def stream_k_split(p: Program) -> bool:
    """`split_k N unordered`: splits the stream-K scheduler adds into its workspace as they arrive."""
    return p.split_k > 1 and not sliced_split_k(p)


def on_stream_k_scheduler(p: Program) -> bool:
    """Whether the program needs CUTLASS's stream-K tile scheduler: stream-K itself, or its splits."""
    return p.scheduler == "stream_k" or stream_k_split(p)


def split_rules(p: Program) -> list[tuple[str, str]]:
    if p.grid_sms is not None and stream_k_split(p):
        return [("scheduler", f"`split_k {p.split_k} unordered` runs on the stream-K scheduler, whose fix-up needs "
                              f"every SM: write `scheduler persistent` without the {p.grid_sms}")]
    if sliced_split_k(p):
        out = []
        if p.scheduler == "stream_k":
            out.append(("scheduler", "split_k N workspace runs its K slices as a batched GEMM on a persistent "
                                     "or one-tile-per-CTA build: use scheduler persistent or tile"))
        if p.problem.c_major != "row":
            out.append(("split_k", "the split-K reduce kernel writes row-major C: use c=row"))
        k = p.problem.k
        if k is not None and (k % p.split_k or (k // p.split_k) % 8):
            fits = [s for s in range(2, 65) if k % s == 0 and (k // s) % 8 == 0]
            out.append(("split_k", f"split_k {p.split_k} workspace cuts K={k} into equal slices whose length is a "
                                   f"multiple of 8 (16-byte TMA steps); K={k} allows "
                                   f"{', '.join(map(str, fits[:8])) or 'none'}"))
        return out
    if p.split_k > 1 and p.problem.is_bound:
        k_tiles = -(-p.problem.k // p.tile.k)
        if p.split_k > k_tiles:
            return [("split_k", f"split_k {p.split_k} exceeds the {k_tiles} K-tiles of K={p.problem.k} at tile K "
                                f"{p.tile.k}: use split_k {k_tiles} or fewer")]
    return []


def hang_rules(p: Program) -> list[tuple[str, str]]:
    """Configurations judged unsafe to run: a hang costs the whole GPU session.

    Stream-K and split-K fix-up make a CTA spin on a flag a peer CTA raises; that
    is safe only if every CTA of the grid is co-resident. With clusters, how many
    can be resident depends on how 2- or 4-CTA clusters pack into the H200's GPCs,
    and a grid sized by SM count (CUTLASS's fallback when it is not told the
    occupancy) can exceed it, leaving a spinning CTA waiting on one never started.
    The wrapper asks cudaOccupancyMaxActiveClusters, but until the probe has shown
    stream-K with clusters finishing on the H200 it stays refused.
    """
    size = p.cluster[0] * p.cluster[1]
    if on_stream_k_scheduler(p) and size > 1:
        return [("cluster", f"stream-K/split-K with a {p.cluster[0]}x{p.cluster[1]} cluster is refused as unsafe: "
                            "its fix-up spins on peer CTAs and needs the whole grid co-resident, which clusters "
                            "do not guarantee; use cluster 1x1 or scheduler persistent")]
    return []


INDEXES = "CUTLASS's problem shape (the library's M, N, K) and its tile arithmetic are 32-bit ints"


def index_counts(tile: tuple[int, int, int], m: int, n: int, k: int) -> dict[str, int]:
    """What CUTLASS holds in `int` at M, N, K (its strides and offsets are 64-bit): read by
    `index_rules` at the bound shape and by the launcher at the call's."""
    tm, tn, tk = tile
    return {"M + tile M (the rows the last tile reaches)": m + tm, "N + tile N (its columns)": n + tn,
            "K + tile K (the K its last k tile reaches)": k + tk}


def index_rules(p: Program) -> list[tuple[str, str]]:
    """A bound problem past what the kernel's 32-bit ints can count is refused."""
    pr = p.problem
    if not pr.is_bound:
        return []
    counts = index_counts((p.tile.m, p.tile.n, p.tile.k), pr.m, pr.n, pr.k)
    return [("problem", message) for message in int32_overflows(counts, INDEXES)]


RULES = (schedule_rules, epilogue_rules, alignment_rules, split_rules, hang_rules, index_rules)


SUPPORT = Support(
    mainloops=frozenset({"ws_cooperative", "ws_pingpong"}),
    schedulers=frozenset({"persistent", "stream_k", "tile"}),
    instr_kinds=frozenset({None, "wgmma"}),
    split_k_reduces=frozenset({"workspace", "unordered"}),
    activations=frozenset({"relu", "gelu", "silu"}),
    bias=True,
    residual=True,
    beta=True,
    max_cluster=4,
    smem_swizzles=frozenset({None, 128}),
    auto_stages=True,
    grid_sms=True,
    epilogue_tile=True,
    majors_a=frozenset({"row", "col"}),
    majors_b=frozenset({"row", "col"}),
    majors_c=frozenset({"row"}),
    out_dtypes=frozenset({"f16"}),
    in_dtypes=frozenset(INPUT_DTYPES),
    extra_rules=RULES,
)
