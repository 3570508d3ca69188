"""The direct family: operands from global memory straight into mma.sync registers, for skinny
products that stream one operand once (`x @ W.T` at a small batch, written with `swap_ab` so
that the weight W is A and its N rows fill the MMA's M side).

No shared memory ring: each thread keeps `stages` k tiles of 16-byte loads in flight in its
registers, and K is split over `split_k` CTAs whose fp32 partials are summed in one launch:
in arrival order through an fp32 workspace (`unordered`: the tile's last CTA applies the
epilogue), or, with `split_k S cluster`, by the S CTAs of one thread-block cluster through
distributed shared memory, in slice order (deterministic, no workspace). Both operands must be
K-contiguous. The output may be stored transposed (c=col), which is what `swap_ab` computes.

`rules` says what the family refuses, `defines` fixes the program's decisions for
templates/direct.cu, `DirectLauncher` launches it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gemmgen.backends.cuda import launch as L
from gemmgen.backends.cuda.source import assemble, epilogue_defines, layout_defines, stored
from gemmgen.backends.workspace import persistent_buffer
from gemmgen.dsl.ir import ARRIVAL_ORDER_REDUCES, CLUSTER_REDUCE, Program
from gemmgen.dsl.resources import DIRECT_MAX_STAGES

ENTRY = "gemm_direct"
TILE_K = (32, 64, 128)
WARP_COUNTS = (1, 2, 4, 8)
MAX_RING_REGS = 128       # registers a thread's ring of loads may take (4 a 16-byte load)
MAX_ACC_PER_THREAD = 32   # a direct warp tile is a few mma tiles; more belongs to multistage
AUTO_STAGES = 4


def _mma_tiles(program: Program) -> tuple[int, int]:
    """(16-row blocks, 8-column blocks) of one warp's tile."""
    (wm, wn), t = program.warps, program.tile
    return t.m // wm // 16, t.n // wn // 8


def ring_regs_per_stage(program: Program) -> int:
    """Registers one k tile of loads takes in a thread: 16 bytes of two rows of each 16-row
    block and of one column of each 8-column block, per 32-wide chunk of K."""
    mt, nt = _mma_tiles(program)
    return (2 * mt + nt) * (program.tile.k // 32) * 4


def stages_of(program: Program) -> int:
    """The program's ring depth; `auto`: the deepest up to AUTO_STAGES within the register budget."""
    if program.stages is not None:
        return program.stages
    per = max(1, ring_regs_per_stage(program))
    return max(1, min(AUTO_STAGES, MAX_RING_REGS // per))


def rules(program: Program) -> list[tuple[str, str]]:
    """What this family cannot build, as (program field, what to change)."""
    out: list[tuple[str, str]] = []
    t, (wm, wn), p = program.tile, program.warps, program.problem
    if program.instr is not None and (program.instr.kind, program.instr.m, program.instr.n,
                                      program.instr.k) != ("mma", 16, 8, 16):
        out.append(("instr", "mainloop direct issues mma.sync m16n8k16: write `instr mma 16x8x16` or `instr auto`"))
    if program.scheduler != "tile":
        out.append(("scheduler", "mainloop direct runs one CTA a tile and K slice: write `scheduler tile`"))
    if program.cluster != (1, 1):
        out.append(("cluster", "mainloop direct has no clusters: write `cluster 1x1`"))
    if program.smem_swizzle is not None:
        out.append(("smem_swizzle", "mainloop direct uses no shared memory: write `smem_swizzle auto`"))
    if program.split_k > 1 and program.split_k_reduce not in ARRIVAL_ORDER_REDUCES | {CLUSTER_REDUCE}:
        out.append(("split_k", f"mainloop direct adds its split-K partials in the same launch: write "
                               f"`split_k {program.split_k} unordered` or `split_k {program.split_k} cluster`"))
    if t.k not in TILE_K:
        out.append(("tile", f"tile K must be 32, 64 or 128 for mainloop direct, not {t.k}"))
    if wm * wn not in WARP_COUNTS:
        out.append(("warps", f"mainloop direct runs 1, 2, 4 or 8 warps; {wm}x{wn} is {wm * wn}"))
    if t.m % (16 * wm) or t.n % (8 * wn):
        out.append(("warps", f"each warp's tile must be a multiple of 16x8: tile {t.m}x{t.n} over warps {wm}x{wn} is not"))
    else:
        mt, nt = _mma_tiles(program)
        if 4 * mt * nt > MAX_ACC_PER_THREAD:
            out.append(("tile", f"a {t.m // wm}x{t.n // wn} warp tile holds {4 * mt * nt} fp32 accumulators per thread; "
                                f"mainloop direct takes at most {MAX_ACC_PER_THREAD}: use more warps or a smaller tile "
                                "(or mainloop multistage for wide tiles)"))
        if program.stages is not None and not 1 <= program.stages <= DIRECT_MAX_STAGES:
            out.append(("stages", f"mainloop direct keeps 1 to {DIRECT_MAX_STAGES} k tiles of loads in flight, "
                                  f"not {program.stages}"))
        elif (regs := stages_of(program) * ring_regs_per_stage(program)) > MAX_RING_REGS:
            out.append(("stages", f"{stages_of(program)} stages of a {t.m}x{t.n}x{t.k} tile over warps {wm}x{wn} take "
                                  f"{regs} registers a thread for loads in flight (at most {MAX_RING_REGS}): use fewer "
                                  "stages, a shorter tile K or more warps"))
    if p.a_major != "row" or p.b_major != "col":
        out.append(("gemm", f"mainloop direct loads both operands 16 bytes along K at a time, so A must be row-major "
                            f"and B column-major (a=row b=col), not a={p.a_major} b={p.b_major}; `x @ W.T` written "
                            "with swap_ab is (W is A, x^T is B)"))
    if p.is_bound:
        if p.k % 8:
            out.append(("gemm", f"mainloop direct reads K in 16-byte chunks: K={p.k} must be a multiple of 8 "
                                "(pad K, or use backend triton)"))
        k_tiles = math.ceil(p.k / t.k)
        if program.split_k > k_tiles:
            out.append(("split_k", f"split_k {program.split_k} exceeds the {k_tiles} K tiles of K={p.k}"))
    return out


def defines(program: Program) -> dict[str, int]:
    t = program.tile
    d = {"BM": t.m, "BN": t.n, "BK": t.k,
         "WARPS_M": program.warps[0], "WARPS_N": program.warps[1],
         "STAGES": stages_of(program),
         "SPLIT_K": program.split_k,
         "SPLIT_CLUSTER": int(program.cluster_sum),
         "STORE_T": int(program.problem.c_major == "col")}
    d.update(layout_defines(program))   # the shared raster helper's constants (unused here)
    # the epilogue's row, column, bias axis and operands are those of the stored matrix
    d.update(epilogue_defines(stored(program)))
    return d


def lower_text(program: Program) -> str:
    return assemble(program, defines(program), "direct.cu")


def entries(program: Program) -> tuple[str, ...]:
    return (ENTRY,)


@dataclass(frozen=True)
class Geometry(L.LaunchGeometry):
    """The direct family's launch (no shared memory)."""

    split_k: int
    cluster_split: bool      # the split_k CTAs of a tile are one cluster (grid z)


def geometry(program: Program) -> Geometry:
    return Geometry(threads=32 * program.num_warps, smem=0, tile_m=program.tile.m, tile_n=program.tile.n,
                    split_k=program.split_k, cluster_split=program.cluster_sum)


class DirectLauncher(L.FamilyLauncher):
    """Runs one direct program: fn(a, b, out, *, bias, residual, c, alpha, beta), out (and c and
    residual) in the computed problem's layout, as backends.swap hands them over."""

    def __init__(self, artifact, program: Program):
        super().__init__(artifact, program, geometry(program), entries(program))
        self.gemm_args = L.GemmArgs()
        self.pack = L.ArgPack(self.gemm_args, self.epi_args)
        self._workspaces: dict = {}

    def _workspace(self, M: int, N: int, device):
        """fp32 sums and an arrival counter per tile, zero, made once per output shape; the
        last CTA of each tile leaves its part at zero again."""
        # Deferred: torch (optional, heavy to import).
        import torch
        key = (M, N, device)
        if key not in self._workspaces:
            self._workspaces[key] = (persistent_buffer(M * N, torch.float32, device, zero=True),
                                     persistent_buffer(L.tile_count(self.geo, M, N), torch.int32, device, zero=True))
        return self._workspaces[key]

    def _set_operands(self, a, b, M, N, K, ld_a, ld_b) -> None:
        ga = self.gemm_args
        ga.a, ga.ld_a, ga.b, ga.ld_b = a.data_ptr(), ld_a, b.data_ptr(), ld_b
        ga.M, ga.N, ga.K = M, N, K
        if self.geo.split_k > 1 and not self.geo.cluster_split:
            ws, counters = self._workspace(M, N, a.device)
            ga.workspace, ga.counters = ws.data_ptr(), counters.data_ptr()

    def _launch(self, M, N, stream) -> None:
        g = self.geo
        cluster = (1, 1, g.split_k) if g.cluster_split else None
        L.launch(self.funcs[ENTRY], (L.tile_count(g, M, N), 1, g.split_k), g.threads, 0, stream, self.pack,
                 cluster=cluster)


def launcher(artifact, program: Program) -> DirectLauncher:
    return DirectLauncher(artifact, program)
