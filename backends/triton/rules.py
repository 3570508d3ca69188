"""What the Triton backend can realise: its limits and rules, and `SUPPORT`, the table the
validator reads (docs/backends.md, "Triton")."""
from __future__ import annotations

from gemmgen.backends.base import INT32_LIMIT, Support, int32_overflows
from gemmgen.backends.triton.lowering import direct_ring, epilogue_staging_bytes, num_stages
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import ARRIVAL_ORDER_REDUCES, DTYPE_BYTES, INPUT_DTYPES, Problem, Program
from gemmgen.dsl.resources import DIRECT_MAX_STAGES, b_tiles

WARP_COUNTS = (4, 8, 16)
MAX_TILE = {"m": 256, "n": 256, "k": 128}
MAX_STAGES = 6
MAX_SPLIT_K = 32
MAX_ACC_REGS = 128           # fp32 accumulator registers per thread before spills dominate
INDEXES = "the Triton kernels compute element offsets (row x stride + column) in 32-bit integers"
# mainloop direct (lowering.py): FMA on CUDA cores over row-contiguous K steps, no tensor cores
DIRECT_TILE = {"m": (1, 64), "n": (1, 16), "k": (64, 2048)}
DIRECT_WARPS = (1, 2, 4, 8)
DIRECT_MAX_PARTIALS = 64     # fp32 partial sums a thread keeps (direct_partials)
DIRECT_MAX_RING_REGS = 128   # registers a thread's ring of loads in flight may take (direct_ring_regs)

__all__ = ["INDEXES", "INT32_LIMIT", "SUPPORT", "index_counts", "tma_misaligned"]


def _pow2(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def _tile_rules(p: Program) -> list[tuple[str, str]]:
    if p.mainloop == "direct":
        return _direct_rules(p)
    out = []
    t = p.tile
    for dim, value in (("m", t.m), ("n", t.n), ("k", t.k)):
        if not (_pow2(value) and 16 <= value <= MAX_TILE[dim]):
            out.append(("tile", f"tile {dim.upper()}={value} must be a power of two from 16 to {MAX_TILE[dim]} "
                                "(Triton block shapes are powers of two): try "
                                f"{min(MAX_TILE[dim], max(16, 1 << (max(value, 1) - 1).bit_length()))}"))
    if p.num_warps not in WARP_COUNTS:
        out.append(("warps", f"{p.num_warps} warps: Triton on Hopper needs whole warpgroups, "
                             f"write warps 4x1, 8x1 or 16x1 ({', '.join(map(str, WARP_COUNTS))} warps)"))
    elif b_tiles(p) * t.m * t.n // (32 * p.num_warps) > MAX_ACC_REGS:
        need = b_tiles(p) * t.m * t.n // (32 * MAX_ACC_REGS)
        what = "two fp32 accumulators (gate and up)" if b_tiles(p) > 1 else "an fp32 accumulator"
        out.append(("warps", f"{what} of {t.m}x{t.n} over {p.num_warps} warps is "
                             f"{b_tiles(p) * t.m * t.n // (32 * p.num_warps)} registers per thread "
                             f"(most {MAX_ACC_REGS}): use {need} warps or a smaller tile"))
    if p.stages is not None and not 1 <= p.stages <= MAX_STAGES:
        out.append(("stages", f"stages {p.stages}: Triton pipelines 1 to {MAX_STAGES} stages; write stages 3"))
    if p.swizzle < 1:
        out.append(("raster", f"swizzle={p.swizzle}: the group width must be at least 1"))
    stages = num_stages(p)
    staging = epilogue_staging_bytes(p)
    smem = stages * (t.m * t.k + b_tiles(p) * t.k * t.n) * 2 + staging
    if smem > SM90A.max_smem_per_block:
        what = f" plus {staging} B to stage the TMA-stored output" if staging else ""
        out.append(("stages", f"{stages} stages of a {t.m}x{t.n}x{t.k} tile{what} need {smem} B of shared memory "
                              f"(most {SM90A.max_smem_per_block}): use fewer stages or a smaller tile K"))
    return out


def direct_partials(p: Program) -> int:
    """fp32 partial sums a thread of a direct kernel keeps (tile M x N x K over the threads)."""
    return p.tile.m * p.tile.n * p.tile.k // (32 * p.num_warps)


def direct_ring_regs(p: Program) -> int:
    """Registers a thread of a direct kernel holds its ring's loads in: `stages` K steps of
    the tile's rows and columns, two fp16 values a register."""
    t = p.tile
    return direct_ring(p) * (t.m + t.n) * t.k // (32 * p.num_warps * 2)


def _fact_rows(program: Program) -> list[tuple[str, str]]:
    """What `mainloop direct` does otherwise than the language's model of a mainloop."""
    if program.mainloop != "direct":
        return []
    p = program.computed
    ring = direct_ring(p)
    return [("pipeline stages", f"{ring} K step{'s' if ring > 1 else ''} of loads in flight, in registers "
                                f"({direct_ring_regs(p)} a thread); Triton pipelines no dot-less loop"),
            ("accumulators per math thread", f"{direct_partials(p)} fp32 partial sums"),
            ("registers per CTA (model)", "not modelled for mainloop direct")]


def _direct_rules(p: Program) -> list[tuple[str, str]]:
    """mainloop direct: each step loads tile K contiguous elements of every row of A and of
    every column of B, so both must be K-contiguous; one CTA a tile, no split."""
    out, t, pr = [], p.tile, p.problem
    if (pr.a_major, pr.b_major) != ("row", "col"):
        out.append(("gemm", "mainloop direct reads A's rows and B's columns along K: it needs a=row b=col "
                            "(the x @ W.T case is written `swap_ab` over it); use mainloop multistage"))
    for dim, value in (("m", t.m), ("n", t.n), ("k", t.k)):
        low, high = DIRECT_TILE[dim]
        if not (_pow2(value) and low <= value <= high):
            out.append(("tile", f"mainloop direct: tile {dim.upper()}={value} must be a power of two from "
                                f"{low} to {high}"))
    if p.num_warps not in DIRECT_WARPS or p.warps[1] != 1:
        out.append(("warps", f"mainloop direct: warps {p.warps[0]}x{p.warps[1]}; write warps Wx1 with W one of "
                             f"{', '.join(map(str, DIRECT_WARPS))} (at most tile M)"))
    elif direct_partials(p) > DIRECT_MAX_PARTIALS:
        out.append(("tile", f"mainloop direct keeps {t.m}x{t.n}x{t.k} fp32 partial sums, "
                            f"{direct_partials(p)} a thread over {p.num_warps} warps "
                            f"(most {DIRECT_MAX_PARTIALS}): use a smaller tile K or more warps"))
    if p.scheduler != "tile" or p.split_k > 1:
        out.append(("scheduler", "mainloop direct runs one CTA a tile over the whole K: write `scheduler tile` "
                                 "and `split_k 1`"))
    if pr.epilogue.gate:
        out.append(("epilogue", "mainloop direct has no gated epilogue: use mainloop multistage"))
    if p.stages is not None and not 1 <= p.stages <= DIRECT_MAX_STAGES:
        out.append(("stages", f"mainloop direct keeps 1 to {DIRECT_MAX_STAGES} K steps of loads in flight, "
                              f"not {p.stages}"))
    elif direct_ring(p) > 1 and t.n > 1:
        out.append(("stages", f"mainloop direct keeps more than one K step in flight only at tile N 1, "
                              f"not {t.n}: write stages 1"))
    elif direct_ring_regs(p) > DIRECT_MAX_RING_REGS:
        out.append(("stages", f"{direct_ring(p)} K steps of a {t.m}x{t.n}x{t.k} tile over {p.num_warps} warps "
                              f"take {direct_ring_regs(p)} registers a thread (most {DIRECT_MAX_RING_REGS}): "
                              "use fewer stages, a shorter tile K or more warps"))
    return out


def _problem_rules(p: Program) -> list[tuple[str, str]]:
    out = []
    pr = p.problem
    if pr.acc_dtype != "f32":
        out.append(("gemm", f"acc={pr.acc_dtype}: the Triton backend accumulates in fp32; write acc=f32"))
    if pr.epilogue.gate and (p.scheduler != "tile" or p.split_k > 1):
        out.append(("scheduler", "the Triton backend's gated epilogue runs in the one-CTA-a-tile kernel: write "
                                 "`scheduler tile` and `split_k 1`"))
    if p.split_k > MAX_SPLIT_K:
        out.append(("split_k", f"split_k {p.split_k}: at most {MAX_SPLIT_K} slices"))
    if not pr.is_bound:
        return out
    k_tiles = -(-pr.k // p.tile.k)
    if p.split_k > k_tiles:
        out.append(("split_k", f"split_k {p.split_k} leaves slices without work: K={pr.k} has only {k_tiles} "
                               f"K tiles of {p.tile.k}; use split_k {max(1, k_tiles)} or less"))
    out.extend(("gemm", message) for message in int32_overflows(index_counts(p, pr.m, pr.n, pr.k), INDEXES))
    return out


def index_counts(p: Program, m: int, n: int, k: int) -> dict[str, int]:
    """What the kernels hold in int32 at M, N, K: each operand's element offsets (a dimension
    alone is within its operand's count) and the split-K workspace's. The rules read it at the
    bound shape, the launcher at the call's (with the operands' real extents beside it)."""
    counts = {"M x K (A's elements)": m * k, "K x N (B's elements)": k * n * b_tiles(p),
              "M x N (out's elements)": m * n}
    if p.split_k > 1 and p.split_k_reduce not in ARRIVAL_ORDER_REDUCES:   # arrival order sums into M x N
        counts["split_k x M x N (the split-K workspace)"] = p.split_k * m * n
    return counts


def tma_misaligned(problem: Problem) -> list[str]:
    """Operands whose row stride is not a multiple of 16 bytes (TMA cannot describe them)."""
    bad = []
    for operand, major, stride in (("A", problem.a_major, problem.k if problem.a_major == "row" else problem.m),
                                   ("B", problem.b_major, problem.n if problem.b_major == "row" else problem.k)):
        if stride is not None and stride * DTYPE_BYTES[problem.in_dtype] % 16:
            bad.append(f"{operand} ({major}-major, leading dimension {stride})")
    return bad


def _tma_rules(p: Program) -> list[tuple[str, str]]:
    if p.scheduler != "persistent":
        return []
    if p.problem.c_major == "col":
        return [("gemm", "scheduler persistent writes its output row-major (TMA tiles of rows): for c=col "
                         "use scheduler tile or stream_k")]
    bad = tma_misaligned(p.problem)
    if bad:
        return [("scheduler", "scheduler persistent loads operands by TMA, which needs every row stride to be a "
                              f"multiple of 16 bytes (8 fp16 elements); {' and '.join(bad)} is not: "
                              "use scheduler tile (the cp.async pointer kernel, mainloop multistage)")]
    return []


SUPPORT = Support(
    mainloops=frozenset({"multistage", "direct"}),
    schedulers=frozenset({"tile", "persistent", "stream_k"}),
    instr_kinds=frozenset({None}),
    split_k_reduces=frozenset({"workspace", "unordered", "atomic"}),
    activations=frozenset({"relu", "gelu", "silu"}),
    bias=True,
    residual=True,
    beta=True,
    max_cluster=1,
    smem_swizzles=frozenset({None}),
    auto_stages=True,
    majors_a=frozenset({"row", "col"}),
    majors_b=frozenset({"row", "col"}),
    majors_c=frozenset({"row", "col"}),
    gated=True,
    out_dtypes=frozenset({"f16", "bf16", "f32"}),
    in_dtypes=frozenset(INPUT_DTYPES),
    extra_rules=(_tile_rules, _problem_rules, _tma_rules),
    fact_rows=_fact_rows,
)
