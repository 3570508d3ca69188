"""The multistage family: cp.async + ldmatrix + mma.sync m16n8k16 (sm_80 style, run on sm_90a),
or, with `instr wgmma 64xNx16`, the same cp.async ring laid out for wgmma and read by it.

wgmma has about 1.6 times mma.sync's rate and reads its operands from shared memory once a
warpgroup, where ldmatrix reads them once a warp: the two limits measured on
this family (docs/design/cuda_kernels.md) at 1-16 GFLOP. Unlike the TMA family it needs no 16-byte aligned tensor map and
no producer warpgroup.

`rules` says what this family refuses (the validator reads it through
SUPPORT.extra_rules), `defines` fixes the program's decisions for the C
template, `geometry` is what the loader needs to launch it.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

from gemmgen.dsl.checks import gate_findings
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import ARRIVAL_ORDER_REDUCES, Program
from gemmgen.dsl.resources import b_tiles
from gemmgen.backends.cuda import launch as L
from gemmgen.backends.base import BackendError
from gemmgen.backends.cuda.source import assemble, epilogue_defines, layout_defines, with_wgmma
from gemmgen.backends.workspace import persistent_buffer

MAX_SMEM = SM90A.max_smem_per_block
MAX_ACC_PER_THREAD = 128      # fp32 accumulators per thread before ptxas spills
MAX_ACC_STREAM_K = 64         # with stream-K's partial tiles in flight too (a 64x64 warp tile spilled 28 bytes)
# Below 64, for problems of few tiles: more CTAs, each with a shorter chain of mma.sync per k step.
TILE_SIZES = (16, 32, 64, 128, 192, 256)
ENTRY = "gemm_multistage"
EPILOGUE_BUFFER = 512        # bytes a warp stages its stores through past the ring, when persistent
REDUCE_ENTRY = "splitk_reduce"
WGMMA_BK = 64                # one 128-byte swizzle atom of fp16 along K
WGMMA_ALIGN = 1024           # the ring is moved up to wgmma's 1024-byte swizzle atoms


def stages_of(program: Program) -> int:
    """The program's stage count, or the deepest ring that fits when `auto`: up to 3 k tiles
    loading ahead, which is the stages less one with mma.sync, less two with wgmma."""
    if program.stages is not None:
        return program.stages
    per_stage, spare = smem_per_stage(program), 2 if wgmma(program) else 1
    fits = (MAX_SMEM - epilogue_buffers(program) - (WGMMA_ALIGN if wgmma(program) else 0)) // per_stage
    return max(1 + spare, min(3 + spare, fits))


def gated(program: Program) -> bool:
    """A gated epilogue: B's tile is two of tile N wide, the gate's columns then the up's."""
    return bool(program.problem.epilogue.gate)


def b_tile_n(program: Program) -> int:
    """Columns of B a k tile loads: tile N, or its gate and up halves (2 x tile N) when gated."""
    return b_tiles(program) * program.tile.n


def smem_per_stage(program: Program) -> int:
    t = program.tile
    return (t.m + b_tile_n(program)) * t.k * 2


def persistent(program: Program) -> bool:
    return program.scheduler == "persistent"


def stream_k(program: Program) -> bool:
    return program.scheduler == "stream_k"


def wgmma(program: Program) -> bool:
    return program.instr is not None and program.instr.kind == "wgmma"


def wgmma_n(program: Program) -> int:
    """The N of the program's wgmma: a warpgroup's whole share of the tile's columns."""
    return program.tile.n // program.warps[1]


def epilogue_buffers(program: Program) -> int:
    """A CTA that walks tiles (persistent, stream-K) holds the next tile's loads in its ring
    while it stores this one, so its stores stage past the ring; one CTA a tile stages them in
    the ring, then free."""
    return EPILOGUE_BUFFER * program.num_warps if persistent(program) or stream_k(program) else 0


def partial_bytes(program: Program) -> int:
    """The fp32 partial tile a slice parks in its ring for its cluster (0 when not summed so)."""
    return 4 * program.tile.m * program.tile.n if program.cluster_sum else 0


def smem_bytes(program: Program) -> int:
    align = WGMMA_ALIGN if wgmma(program) else 0
    ring = max(stages_of(program) * smem_per_stage(program), partial_bytes(program))
    return ring + epilogue_buffers(program) + align


def rules(program: Program) -> list[tuple[str, str]]:
    """What this family cannot build, as (program field, what to change)."""
    out: list[tuple[str, str]] = []
    t, (wm, wn) = program.tile, program.warps
    p = program.problem
    if wgmma(program):
        out.extend(_wgmma_rules(program))
    elif program.instr is not None and (program.instr.kind, program.instr.m, program.instr.n, program.instr.k) != ("mma", 16, 8, 16):
        out.append(("instr", "mainloop multistage issues mma.sync m16n8k16 (`instr mma 16x8x16` or `instr auto`) "
                             "or wgmma (`instr wgmma 64xNx16`)"))
    if program.scheduler not in ("tile", "persistent", "stream_k"):
        out.append(("scheduler", "mainloop multistage runs `scheduler tile` (a CTA a tile), `scheduler persistent` "
                                 "or `scheduler stream_k`"))
    elif program.scheduler != "tile" and program.split_k > 1:
        out.append(("scheduler", f"mainloop multistage's `scheduler {program.scheduler}` splits K its own way: with "
                                 "split_k above 1 write `scheduler tile`"))
    if program.cluster != (1, 1):
        out.append(("cluster", "mainloop multistage has no clusters: write `cluster 1x1`"))
    if program.smem_swizzle is not None:
        out.append(("smem_swizzle", "mainloop multistage always XOR-swizzles its 16-byte chunks: write `smem_swizzle auto`"))
    if t.k not in (32, 64, 128):
        out.append(("tile", f"tile K must be 32, 64 or 128 for mainloop multistage, not {t.k}"))
    if wm * wn not in (4, 8):
        out.append(("warps", f"mainloop multistage runs 4 or 8 warps; {wm}x{wn} is {wm * wn}"))
    if wm < 1 or wn < 1 or t.m % (16 * wm) or t.n % (16 * wn):
        out.append(("warps", f"each warp's tile must be a multiple of 16x16: tile {t.m}x{t.n} over warps {wm}x{wn} is not"))
    elif (acc := b_tiles(program) * (t.m // wm) * (t.n // wn) // 32) > \
            (limit := MAX_ACC_STREAM_K if stream_k(program) else MAX_ACC_PER_THREAD):
        both = " (gate and up)" if gated(program) else ""
        out.append(("warps", f"a {t.m // wm}x{t.n // wn} warp tile needs {acc} fp32 accumulators{both} "
                             f"per thread (at most {limit}{' with scheduler stream_k' if stream_k(program) else ''}); "
                             "use more warps or a smaller tile"))
    if t.m not in TILE_SIZES or t.n not in TILE_SIZES:
        out.append(("tile", f"mainloop multistage takes tile M and N in {', '.join(map(str, TILE_SIZES))}; "
                            f"not {t.m}x{t.n}"))
    elif p.b_major == "row" and 32 * wm * wn % (b_tile_n(program) // 8):
        # an N-contiguous B tile's rows are copied a 16-byte chunk a thread, each thread down one column
        out.append(("tile", f"B is row-major, so each k row of its {b_tile_n(program)}-column tile is "
                            f"{b_tile_n(program) // 8} 16-byte chunks, which must divide the {32 * wm * wn} threads: "
                            "use a power-of-2 tile N"))
    if program.stages is not None and program.stages < 2:
        out.append(("stages", "mainloop multistage needs at least 2 stages"))
    if smem_bytes(program) > MAX_SMEM:
        out.append(("stages", f"{stages_of(program)} stages of a {t.m}x{t.n}x{t.k} tile"
                              f"{' (B twice tile N wide: gate and up)' if gated(program) else ''} need {smem_bytes(program)} bytes of "
                              f"shared memory, over the {MAX_SMEM} an sm_90a CTA may use; use fewer stages"))
    # 16-byte cp.async copies need every row of A and B to start 16-byte aligned.
    if p.is_bound:
        a_lead = p.k if p.a_major == "row" else p.m
        b_lead = p.k if p.b_major == "col" else p.n
        if a_lead % 8:
            dim = "K" if p.a_major == "row" else "M"
            out.append(("gemm", f"A is {p.a_major}-major so its rows are {dim}={a_lead} fp16 long; 16-byte cp.async needs "
                                f"{dim} to be a multiple of 8 (pad {dim}, or use backend triton)"))
        if b_lead % 8 and p.b_major == "row" and gated(program):
            # B is K x 2N: each row's up half starts N columns in, 16-byte aligned only with N
            out.append(("gemm", f"B is row-major and gated, so each of its rows is the gate's N={p.n} fp16 then the up "
                                f"projection's N; 16-byte cp.async needs N to be a multiple of 8 (pad N, store B "
                                "column-major (b=col), or use backend triton)"))
        elif b_lead % 8:
            dim = "K" if p.b_major == "col" else "N"
            out.append(("gemm", f"B is {p.b_major}-major so its rows are {dim}={b_lead} fp16 long; 16-byte cp.async needs "
                                f"{dim} to be a multiple of 8 (pad {dim}, or use backend triton)"))
        if program.split_k > 1 and program.split_k > math.ceil(p.k / t.k):
            out.append(("split_k", f"split_k {program.split_k} exceeds the {math.ceil(p.k / t.k)} K tiles of K={p.k}"))
    out.extend(gate_rules(program))
    return out


def gate_rules(program: Program) -> list[tuple[str, str]]:
    """A gated epilogue (`gate=ACT halves=stacked`) in this family: one CTA a tile over the whole
    of K, gate(acc_gate) * acc_up and nothing else in the epilogue."""
    e = program.problem.epilogue
    if not e.gate:
        return []
    out: list[tuple[str, str]] = []
    what = f"backend cuda's gated epilogue (gate={e.gate})"
    if program.scheduler != "tile":
        out.append(("scheduler", f"{what} runs one CTA a tile: write `scheduler tile`, not `scheduler "
                                 f"{program.scheduler}`"))
    if program.split_k > 1:
        out.append(("split_k", f"{what} needs the whole K sum in one CTA (the gate is not linear): write `split_k 1`"))
    # the language's own words for a malformed gate, also when lower() is called directly
    out.extend(("epilogue", finding) for finding in gate_findings(e))
    return out


def _wgmma_rules(program: Program) -> list[tuple[str, str]]:
    """What `instr wgmma` adds: warpgroups, one instruction across a warpgroup's columns, the
    128-byte swizzle's 64-deep k tile, a ring one slot deeper."""
    out: list[tuple[str, str]] = []
    t, (wm, wn), i = program.tile, program.warps, program.instr
    n = wgmma_n(program)
    if wm % 4:
        out.append(("warps", f"wgmma runs on warpgroups of 4 warps stacked along M: warps {wm}x{wn} is not "
                             "(write e.g. `warps 4x1`, `4x2` or `8x1`)"))
    elif t.m % (64 * (wm // 4)):
        out.append(("tile", f"tile M {t.m} over {wm // 4} warpgroup(s) along M must give each a multiple of 64 rows"))
    if (i.m, i.k) != (64, 16) or i.n != n:
        out.append(("instr", f"mainloop multistage issues one wgmma across a warpgroup's {n} columns "
                             f"(tile N {t.n} over {wn} warpgroup(s)): write `instr wgmma 64x{n}x16`"))
    if n % 8 or n > 256:
        out.append(("tile", f"a warpgroup's {n} columns must be a multiple of 8, at most 256 (wgmma's N)"))
    if t.k != WGMMA_BK:
        out.append(("tile", f"tile K must be {WGMMA_BK} (one 128-byte swizzle atom of fp16) with instr wgmma"))
    if program.problem.b_major == "row" and n % 64:
        out.append(("tile", f"B is row-major (N contiguous), laid out in 64-wide boxes for wgmma: a warpgroup's "
                            f"{n} columns must be a multiple of 64"))
    if program.stages is not None and program.stages < 3:
        out.append(("stages", "instr wgmma needs at least 3 stages (a slot is refilled once the wgmma before last "
                              "is done)"))
    return out


def arrival_order(program: Program) -> bool:
    """`atomic` and `unordered` build the same kernel: partials are added into an fp32
    workspace as CTAs arrive and the last CTA of a tile applies the epilogue, so an fp16
    output never accumulates in fp16 and one launch does the whole product."""
    return program.split_k > 1 and program.split_k_reduce in ARRIVAL_ORDER_REDUCES


def defines(program: Program) -> dict[str, int]:
    t = program.tile
    d = {
        "BM": t.m, "BN": t.n, "BK": t.k,
        "WARPS_M": program.warps[0], "WARPS_N": program.warps[1],
        "STAGES": stages_of(program),
        "SPLIT_K": program.split_k,
        "SPLIT_ATOMIC": int(arrival_order(program)),
        "SPLIT_CLUSTER": int(program.cluster_sum),
        "PERSISTENT": int(persistent(program)),
        "STREAM_K": int(stream_k(program)),
        "WGMMA": int(wgmma(program)),
    }   # GATED and GATE_*: epilogue_defines
    d.update(layout_defines(program))
    d.update(epilogue_defines(program))
    return d


def lower_text(program: Program) -> str:
    if wgmma(program):
        return with_wgmma(assemble(program, defines(program), "wgmma.cuh", "multistage_ring.cuh", "multistage.cu"),
                          program, wgmma_n(program))
    return assemble(program, defines(program), "multistage_ring.cuh", "multistage.cu")


@dataclass(frozen=True)
class Geometry(L.LaunchGeometry):
    """The multistage family's launch."""

    split_k: int
    atomic: bool
    cluster_split: bool      # the split_k CTAs of a tile are one cluster (grid z)
    persistent: bool
    stream_k: bool
    tile_k: int


def geometry(program: Program) -> Geometry:
    return Geometry(threads=32 * program.num_warps, smem=smem_bytes(program),
                    tile_m=program.tile.m, tile_n=program.tile.n, split_k=program.split_k,
                    atomic=arrival_order(program), cluster_split=program.cluster_sum,
                    persistent=persistent(program), stream_k=stream_k(program),
                    tile_k=program.tile.k)


def iteration_count(geo: Geometry, M: int, N: int, K: int) -> int:
    """(tile, k tile) pairs of the whole product: what stream-K shares out."""
    return L.tile_count(geo, M, N) * math.ceil(K / geo.tile_k)


def grid_size(geo: Geometry, M: int, N: int, K: int, wave: int | None) -> int:
    """CTAs to launch: one a tile; persistent, at most `wave` (the CTAs the SMs hold at once),
    each walking tiles; stream-K, `wave`, each walking an even share of the (tile, k tile)
    iterations (launch.stream_k_grid)."""
    if geo.stream_k and wave:
        return L.stream_k_grid(iteration_count(geo, M, N, K), wave)
    tiles = L.tile_count(geo, M, N)
    return min(tiles, wave) if geo.persistent and wave else tiles


def entries(program: Program) -> tuple[str, ...]:
    if program.split_k > 1 and program.split_k_reduce == "workspace":
        return (ENTRY, REDUCE_ENTRY)
    return (ENTRY,)


class MultistageLauncher(L.FamilyLauncher):
    """Runs one multistage program: fn(a, b, out, *, bias, residual, c, alpha, beta)."""

    def __init__(self, artifact, program: Program):
        super().__init__(artifact, program, geometry(program), entries(program))
        self.gemm_args = L.GemmArgs()
        self.pack = L.ArgPack(self.gemm_args, self.epi_args)
        self._reduce_m, self._reduce_n = ctypes.c_int(), ctypes.c_int()
        self._reduce_ws = ctypes.c_void_p()
        self.reduce_pack = L.ArgPack(self._reduce_ws, self._reduce_m, self._reduce_n, self.epi_args)
        self._workspaces: dict = {}
        self.wave = None
        if self.geo.persistent or self.geo.stream_k:
            # Deferred: torch (optional, heavy to import).
            import torch
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            self.wave = L.resident_ctas(self.funcs[ENTRY], self.geo.threads, self.geo.smem) * sms

    def _workspace(self, M: int, N: int, device):
        """fp32 partials (and arrival counters when atomic), made once per output shape; for
        stream-K a partial tile and a flag per CTA of the wave, made once."""
        # Deferred: torch (optional, heavy to import).
        import torch
        key = (None, None, device) if self.geo.stream_k else (M, N, device)
        ws = self._workspaces.get(key)
        if ws is None:
            g = self.geo
            if g.stream_k:
                ws = (persistent_buffer(self.wave * g.tile_m * g.tile_n, torch.float32, device),
                      persistent_buffer(self.wave, torch.int32, device, zero=True))
            elif g.atomic:
                ws = (persistent_buffer(M * N, torch.float32, device, zero=True),
                      persistent_buffer(L.tile_count(g, M, N), torch.int32, device, zero=True))
            else:
                ws = (persistent_buffer(g.split_k * M * N, torch.float32, device), None)
            self._workspaces[key] = ws
        return ws

    def _set_operands(self, a, b, M, N, K, ld_a, ld_b) -> None:
        ga = self.gemm_args
        ga.a, ga.ld_a, ga.b, ga.ld_b = a.data_ptr(), ld_a, b.data_ptr(), ld_b
        ga.M, ga.N, ga.K = M, N, K
        if self.geo.stream_k and iteration_count(self.geo, M, N, K) >= 2 ** 31:
            raise BackendError(f"{M}x{N}x{K} has 2^31 (tile, k tile) iterations or more, past what the stream-K "
                               "kernel counts in 32 bits: use `scheduler persistent`")
        if (self.geo.split_k > 1 and not self.geo.cluster_split) or self.geo.stream_k:
            ws, counters = self._workspace(M, N, a.device)
            ga.workspace = ws.data_ptr()
            ga.counters = counters.data_ptr() if counters is not None else None

    def _launch(self, M, N, stream) -> None:
        g, ga = self.geo, self.gemm_args
        L.launch(self.funcs[ENTRY], (grid_size(g, M, N, ga.K, self.wave), 1, g.split_k), g.threads, g.smem, stream,
                 self.pack, cluster=(1, 1, g.split_k) if g.cluster_split else None)
        if g.split_k > 1 and not g.atomic and not g.cluster_split:
            self._reduce_ws.value, self._reduce_m.value, self._reduce_n.value = ga.workspace, M, N
            blocks = min(math.ceil(M * N / 256), SM90A.sms * 16)
            L.launch(self.funcs[REDUCE_ENTRY], (blocks, 1, 1), 256, 0, stream, self.reduce_pack)


def launcher(artifact, program: Program) -> MultistageLauncher:
    return MultistageLauncher(artifact, program)
