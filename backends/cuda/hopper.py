"""The warp-specialized Hopper family: TMA + mbarrier ring + wgmma, persistent.

Handles `mainloop ws_cooperative` (consumer warpgroups share each tile) and
`ws_pingpong` (two consumer warpgroups take alternate tiles, one's epilogue under
the other's math) for both majors of A and B: K-contiguous
operands are loaded as one BK x rows TMA box per stage, MN-contiguous ones as
64-wide boxes and read by wgmma with the transpose bit; either way the rows must
be 16-byte aligned (TMA's rule). `warps WMxWN` are the consumer warps: WM/4
warpgroups stacked along M times WN along N. A gated epilogue (`gate=ACT halves=stacked`)
loads the gate's and the up's B tile into each stage and keeps both accumulators.
`split_k S cluster` (ws_cooperative, one CTA a tile and K slice): the S slices of a tile are one
cluster, each parks its fp32 partial tile in shared memory and sums a 1/S share of the tile over
all S through distributed shared memory, in slice order: enough CTAs to stream a skinny
product's weight on every SM, in one launch and with no workspace. That sum stores C either way,
so `swap_ab` (C^T = W x^T, c=col) runs here too: the weight's rows fill wgmma's M side.
`scheduler stream_k` (ws_cooperative): one wave of CTAs deals out the (tile, k tile) iterations
evenly, the producer streams its share across tile boundaries, and the CTA that began a tile adds
the others' partials in K order from a workspace slot per CTA. ws_cooperative stores C^T too
(c=col, each element at its transposed place), under every scheduler. A one-consumer program of
`scheduler tile` whose ring fits twice in an SM is built for two CTAs an SM (`ctas_per_sm`).
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

from gemmgen.backends.cuda import launch as L
from gemmgen.backends.cuda.launch import check
from gemmgen.backends.cuda.source import (
    assemble,
    epilogue_defines,
    layout_defines,
    stored,
    with_wgmma,
)
from gemmgen.backends.workspace import persistent_buffer
from gemmgen.dsl.checks import gate_findings
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import CLUSTER_REDUCE, Program
from gemmgen.dsl.resources import b_tiles

MAX_SMEM = SM90A.max_smem_per_block
SMS = SM90A.sms
BK = 64                      # one 128-byte swizzle atom of fp16 along K
MAX_ACC_PER_THREAD = 128
# Accumulators a consumer thread may hold in a kernel built for two CTAs an SM, that is for 128
# registers a thread: 64 build without spills, 128 (a 64x256 tile) do not build at all.
TWO_CTAS_MAX_ACC = 64
PRODUCER_REGS = 40
ENTRY = "gemm_hopper_ws"


def stages_of(program: Program) -> int:
    if program.stages is not None:
        return program.stages
    spare = MAX_SMEM - 2048 - staging_bytes(program) - partial_bytes(program)
    return max(2, min(6, spare // stage_bytes(program)))


def stage_bytes(program: Program) -> int:
    """A and B tiles of one stage: B twice over (gate and up) for a gated epilogue."""
    return (program.tile.m + b_tiles(program) * program.tile.n) * program.tile.k * 2


def acc_per_thread(program: Program) -> int:
    """fp32 accumulators a consumer thread holds: its warpgroup's share of the tile (twice,
    gate and up, when gated)."""
    wgs_m, wgs_n = warpgroups(program)
    return b_tiles(program) * program.tile.m * program.tile.n // (128 * wgs_m * wgs_n)


def staging_bytes(program: Program) -> int:
    """512 bytes per consumer warp for the interior tiles' epilogue, 16-byte aligned."""
    return consumers(program) * 4 * 512 + 16


# fp32 columns a parked partial row is padded by: a half-warp's 8-byte stores of 4 rows then
# fall in 32 different banks
PARTIAL_PAD = 8


def splits_k(program: Program) -> bool:
    """The K slices of each tile run as one cluster and sum their partials in shared memory."""
    return program.split_k > 1


def partial_bytes(program: Program) -> int:
    """The fp32 partial tile a K slice parks for its cluster's sum (none without split-K): row by
    row, or column by column when C is stored transposed (c=col), so the sum reads along the
    stored rows either way."""
    t = program.tile
    if not splits_k(program):
        return 0
    return (t.n * (t.m + PARTIAL_PAD) if program.problem.c_major == "col" else t.m * (t.n + PARTIAL_PAD)) * 4


def smem_bytes(program: Program) -> int:
    """Ring of A and B tiles, 16 bytes of barriers per stage, the epilogue's staging
    buffers, the parked partial tile of split-K, 1 KiB to align the ring."""
    s = stages_of(program)
    return s * stage_bytes(program) + 16 * s + staging_bytes(program) + partial_bytes(program) + 1024


def warpgroups(program: Program) -> tuple[int, int]:
    """Consumer warpgroups along M and along N of one tile."""
    return program.warps[0] // 4, program.warps[1]


def consumers(program: Program) -> int:
    """Consumer warpgroups of the CTA: a tile's worth, twice over for ping-pong."""
    wgs_m, wgs_n = warpgroups(program)
    return wgs_m * wgs_n * (2 if program.mainloop == "ws_pingpong" else 1)


def instr_n(program: Program) -> int:
    """The N of the wgmma the program issues."""
    wgs_m, wgs_n = warpgroups(program)
    if program.instr is not None and program.instr.kind == "wgmma":
        return program.instr.n
    return min(256, program.tile.n // max(1, wgs_n))


def joins_halves(program: Program) -> bool:
    """A gated program whose one wgmma spans its warpgroup's gate columns and its up columns:
    B's two tiles lie one after the other in a stage, so a single instruction reads A once for
    both (two instructions each read the same A tile)."""
    wgs_n = max(1, warpgroups(program)[1])
    return b_tiles(program) > 1 and instr_n(program) == 2 * (program.tile.n // wgs_n)


def out_n(program: Program) -> int:
    """Output columns of one wgmma's accumulator block: half the instruction where it joins halves."""
    return instr_n(program) // (2 if joins_halves(program) else 1)


def ctas_per_sm(program: Program) -> int:
    """CTAs an SM runs at once: two for a one-consumer program of `scheduler tile` whose ring
    fits twice in an SM's shared memory and whose accumulators fit in half the registers (their
    loads then overlap, and a grid of up to 2 x SMs CTAs is one wave), else one. The kernel is
    built for that many (`__launch_bounds__`)."""
    if consumers(program) != 1 or program.scheduler != "tile" or acc_per_thread(program) > TWO_CTAS_MAX_ACC:
        return 1
    return 2 if SM90A.ctas_by_smem(smem_bytes(program)) >= 2 else 1


def consumer_regs(consumers: int, ctas: int = 1) -> int:
    """What each consumer thread may take once the producer gave back its registers, with
    `ctas` CTAs sharing the SM's register file."""
    free = SM90A.regs_per_sm // ctas - 128 * PRODUCER_REGS
    return min(240, free // (128 * consumers) // 8 * 8)


def rules(program: Program) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    p, t = program.problem, program.tile
    wm, wn = program.warps
    pingpong = program.mainloop == "ws_pingpong"
    if program.instr is not None and (program.instr.kind != "wgmma" or program.instr.m != 64 or program.instr.k != 16):
        out.append(("instr", f"mainloop {program.mainloop} issues wgmma: write `instr wgmma 64xNx16` or `instr auto`"))
    if program.smem_swizzle not in (None, 128):
        out.append(("smem_swizzle", "the TMA/wgmma family uses the 128-byte swizzle: write `smem_swizzle 128` or `auto`"))
    if program.split_k > 1:
        out.extend(("split_k", finding) for finding in _split_findings(program))
    # a gated epilogue: the language's own words for a malformed gate, also when lower() is called directly
    out.extend(("epilogue", finding) for finding in gate_findings(p.epilogue))
    if stream_k(program):
        out.extend(("scheduler", finding) for finding in _stream_k_findings(program))
    if p.c_major == "col" and p.epilogue.gate:
        out.append(("gemm", "a gated epilogue stores C row-major (c=row): its gate and up halves are columns of B"))
    if program.cluster not in ((1, 1), (2, 1)):
        out.append(("cluster", "the TMA/wgmma family runs cluster 1x1 or 2x1 (two CTAs along M share B by multicast)"))
    if t.k != BK:
        out.append(("tile", f"tile K must be {BK} (one 128-byte swizzle atom of fp16) for mainloop {program.mainloop}"))
    if wm % 4 or wm < 4 or wn < 1:
        out.append(("warps", f"warps {wm}x{wn}: consumer warpgroups are 4 warps stacked along M (e.g. `warps 8x1`)"))
        return out
    wgs_m, wgs_n = warpgroups(program)
    if pingpong and (wgs_m, wgs_n) != (1, 1):
        out.append(("warps", f"mainloop ws_pingpong gives each of its two consumer warpgroups a whole tile: "
                             f"write `warps 4x1`, not {wm}x{wn}"))
    elif not pingpong and wgs_m * wgs_n > 2:
        # one warpgroup a tile is allowed: 64-row tiles give a skinny weight twice the CTAs
        out.append(("warps", f"mainloop ws_cooperative shares each tile between 1 or 2 consumer warpgroups "
                             f"(`warps 4x1`, `warps 8x1` or `warps 4x2`); warps {wm}x{wn} makes {wgs_m * wgs_n}"))
    if t.m % wgs_m or (t.m // wgs_m) % 64 or t.m > 256:
        out.append(("tile", f"each consumer warpgroup needs a multiple of 64 rows: tile M {t.m} over {wgs_m} "
                            f"warpgroup(s) along M (tile M at most 256, the TMA box limit)"))
    n_inst, n_out = instr_n(program), out_n(program)
    if joins_halves(program) and wgs_n != 1:
        out.append(("instr", f"one wgmma over the gate's and the up's columns ({n_inst}) needs them side by side "
                             f"in a stage: one consumer warpgroup along N (warps 8x1 or 4x1), not {wm}x{wn}"))
    if t.n % wgs_n or t.n > 256 or n_inst % 8 or n_inst > 256 or (t.n // wgs_n) % n_out:
        out.append(("tile", f"tile N {t.n} over {wgs_n} warpgroup(s) along N must be a multiple of the wgmma N "
                            f"({n_inst}), at most 256"))
    elif acc_per_thread(program) > MAX_ACC_PER_THREAD:
        gated = " (gate and up)" if p.epilogue.gate else ""
        out.append(("tile", f"tile {t.m}x{t.n} over {wgs_m * wgs_n} consumer warpgroup(s) holds "
                            f"{acc_per_thread(program)} fp32 accumulators per thread{gated} (at most "
                            f"{MAX_ACC_PER_THREAD}): use `warps 8x1` or a smaller tile"))
    if program.cluster == (2, 1) and (t.n // 2) % 8:
        out.append(("cluster", "cluster 2x1 splits the B tile in halves of whole 8-row groups: tile N must be a multiple of 16"))
    if stages_of(program) < 2:
        out.append(("stages", "the TMA pipeline needs at least 2 stages"))
    if smem_bytes(program) > MAX_SMEM:
        out.append(("stages", f"{stages_of(program)} stages of a {t.m}x{t.n}x{t.k} tile need {smem_bytes(program)} "
                              f"bytes of shared memory (over {MAX_SMEM}): use fewer stages"))
    if p.b_major == "row" and (t.n % 64 or n_inst % 64 or (program.cluster == (2, 1) and (t.n // 2) % 64)):
        out.append(("tile", f"B is row-major (N contiguous), loaded in 64-wide TMA boxes: tile N ({t.n}), the wgmma N "
                            f"({n_inst}) and, with cluster 2x1, half of tile N must be multiples of 64"))
    if p.is_bound:
        for name, major, dim, extent in (("A", p.a_major, "K" if p.a_major == "row" else "M", p.k if p.a_major == "row" else p.m),
                                         ("B", p.b_major, ("2N" if p.epilogue.gate else "N") if p.b_major == "row"
                                          else "K", p.b_cols if p.b_major == "row" else p.k)):
            if extent % 8:
                out.append(("gemm", f"TMA needs 16-byte aligned rows: {name} is {major}-major, so {dim}={extent} must be "
                                    f"a multiple of 8; pad {dim} or use mainloop multistage"))
    return out


def _split_findings(program: Program) -> list[str]:
    """What `split_k S` needs here; the language already checks S against the cluster size and K."""
    where = f"split_k {program.split_k}"
    out = []
    if program.split_k_reduce != CLUSTER_REDUCE:
        out.append(f"the TMA/wgmma family sums a tile's K slices across a cluster: write `{where} cluster` "
                   f"(or use mainloop multistage for `{where} {program.split_k_reduce}`)")
    if program.scheduler != "tile":
        out.append(f"{where} cluster gives each CTA one tile's K slice: write `scheduler tile`")
    if program.problem.epilogue.gate:
        out.append("a gated epilogue needs a tile's whole K sum in one CTA: write `split_k 1`")
    return out


def stream_k(program: Program) -> bool:
    """One wave of CTAs shares the (tile, k tile) iterations (`scheduler stream_k`)."""
    return program.scheduler == "stream_k"


def _stream_k_findings(program: Program) -> list[str]:
    """What `scheduler stream_k` needs here (the template's #error says the same): both consumer
    warpgroups on every tile, no cluster, no split-K, no gate."""
    out = []
    if program.mainloop != "ws_cooperative":
        out.append("stream-K runs in mainloop ws_cooperative (ping-pong's warpgroups take whole tiles in turn): "
                   "write `mainloop ws_cooperative` or `scheduler persistent`")
    if program.cluster != (1, 1):
        out.append("stream-K's CTAs walk iterations of their own, with no cluster partner: write `cluster 1x1`")
    if program.split_k > 1:
        out.append(f"stream-K already splits K between CTAs: write `split_k 1`, not {program.split_k}")
    if program.problem.epilogue.gate:
        out.append("a gated epilogue needs a tile's whole K sum in one CTA: write `scheduler persistent`")
    return out


def defines(program: Program) -> dict[str, int]:
    t = program.tile
    wgs_m, wgs_n = warpgroups(program)
    n_consumers, ctas = consumers(program), ctas_per_sm(program)
    d = {"BM": t.m, "BN": t.n, "BK": t.k, "STAGES": stages_of(program), "CONSUMERS": n_consumers,
         "PINGPONG": int(program.mainloop == "ws_pingpong"),
         "WGS_M": wgs_m, "WGS_N": wgs_n, "INSTR_N": out_n(program), "JOINED_HALVES": int(joins_halves(program)),
         "CLUSTER_M": program.cluster[0], "SPLIT_K": program.split_k, "PARTIAL_PAD": PARTIAL_PAD,
         "STREAM_K": int(stream_k(program)),
         "STORE_T": int(program.problem.c_major == "col"),
         "CTAS_PER_SM": ctas,
         "PRODUCER_REGS": PRODUCER_REGS, "CONSUMER_REGS": consumer_regs(n_consumers, ctas)}
    d.update(layout_defines(program))
    # the epilogue's row, column, bias axis and operands are those of the stored matrix
    d.update(epilogue_defines(stored(program)))
    return d


def lower_text(program: Program) -> str:
    return with_wgmma(assemble(program, defines(program), "wgmma.cuh", "hopper_ws.cu"), program, instr_n(program))


def entries(program: Program) -> tuple[str, ...]:
    return (ENTRY,)


@dataclass(frozen=True)
class Geometry(L.LaunchGeometry):
    """The TMA family's launch."""

    cluster_m: int
    persistent: bool
    split_k: int = 1         # K slices of a tile, one cluster (grid z)
    stream_k: bool = False
    acc_floats: int = 0      # fp32 accumulators of a CTA's consumers: a stream-K partial tile


def geometry(program: Program) -> Geometry:
    return Geometry(threads=128 * (1 + consumers(program)), smem=smem_bytes(program), tile_m=program.tile.m,
                    tile_n=program.tile.n, cluster_m=program.cluster[0],
                    persistent=program.scheduler == "persistent", split_k=program.split_k,
                    stream_k=stream_k(program), acc_floats=128 * consumers(program) * acc_per_thread(program))


def grid_size(geo: Geometry, M: int, N: int, K: int, sms: int = SMS) -> int:
    """CTAs to launch: every (pair of) tile(s) once, at most one wave when persistent, or, for
    stream-K, one wave sharing the (tile, k tile) iterations (at most one CTA an SM: its ring
    takes most of the shared memory, and every CTA must be resident for the hand-off)."""
    if geo.stream_k:
        return L.stream_k_grid(L.tile_count(geo, M, N) * math.ceil(K / BK), sms)
    pairs = math.ceil(math.ceil(M / geo.tile_m) / geo.cluster_m) * math.ceil(N / geo.tile_n)
    if geo.persistent:
        pairs = min(pairs, sms // geo.cluster_m)
    return max(1, pairs) * geo.cluster_m


class TensorMap(ctypes.Structure):
    """The 128-byte CUtensorMap, as the kernel parameter receives it."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


class ProblemArgs(ctypes.Structure):
    _fields_ = [("M", ctypes.c_int), ("N", ctypes.c_int), ("K", ctypes.c_int)]


class StreamKProblemArgs(ProblemArgs):
    """ProblemArgs and, for stream-K, its workspace and flags (the C struct's STREAM_K fields)."""

    _fields_ = [("workspace", ctypes.c_void_p), ("counters", ctypes.c_void_p)]


def encode_tensor_map(dest: TensorMap, ptr: int, mn: int, k: int, ld: int, rows: int, k_contiguous: bool) -> None:
    """A 2-D fp16 tensor map of an MN x K operand, 128B swizzle, zeros out of bounds.

    K-contiguous: inner dimension K, box BK x `rows`. MN-contiguous: inner dimension
    MN, box 64 x BK (the kernel issues `rows`/64 of them).
    """
    # Deferred: cuda (optional, heavy to import).
    from cuda.bindings import driver
    dims, box = ([k, mn], [BK, rows]) if k_contiguous else ([mn, k], [64, BK])
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t  # older cuda-bindings (13.3) take no plain ints
    tmap = check(driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, ptr,
        [u64(d) for d in dims], [u64(ld * 2)], [u32(b) for b in box], [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    ctypes.memmove(ctypes.addressof(dest), tmap.getPtr(), ctypes.sizeof(TensorMap))


class HopperLauncher(L.FamilyLauncher):
    """Runs one ws_cooperative / ws_pingpong program: fn(a, b, out, *, bias, residual, c, alpha, beta)."""

    def __init__(self, artifact, program: Program):
        # Deferred: torch (optional, heavy to import).
        import torch
        super().__init__(artifact, program, geometry(program), (ENTRY,))
        self.sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.fn = self.funcs[ENTRY]
        self.tmap_a, self.tmap_b = TensorMap(), TensorMap()
        self.problem_args = StreamKProblemArgs() if self.geo.stream_k else ProblemArgs()
        self.pack = L.ArgPack(self.tmap_a, self.tmap_b, self.problem_args, self.epi_args)
        self._maps_for = None   # the (pointers, shapes, strides) the tensor maps describe
        self._workspaces: dict = {}

    def _workspace(self, device):
        """Stream-K's partial tile and flag per CTA of the wave, made once per device."""
        # Deferred: torch (optional, heavy to import).
        import torch
        ws = self._workspaces.get(device)
        if ws is None:
            ws = (persistent_buffer(self.sms * self.geo.acc_floats, torch.float32, device),
                  persistent_buffer(self.sms, torch.int32, device, zero=True))
            self._workspaces[device] = ws
        return ws

    def _set_operands(self, a, b, M, N, K, ld_a, ld_b) -> None:
        key = (a.data_ptr(), b.data_ptr(), M, N, K, ld_a, ld_b)
        if key != self._maps_for:
            p = self.program.problem
            encode_tensor_map(self.tmap_a, a.data_ptr(), M, K, ld_a, self.geo.tile_m, p.a_major == "row")
            # a gated B is the gate's N columns then the up's: one map over all 2N
            encode_tensor_map(self.tmap_b, b.data_ptr(), N * b_tiles(self.program), K, ld_b,
                              self.geo.tile_n // self.geo.cluster_m, p.b_major == "col")
            self._maps_for = key
        self.problem_args.M, self.problem_args.N, self.problem_args.K = M, N, K
        if self.geo.stream_k:
            ws, flags = self._workspace(a.device)
            self.problem_args.workspace, self.problem_args.counters = ws.data_ptr(), flags.data_ptr()

    def _launch(self, M, N, stream) -> None:
        g = self.geo
        cluster = (1, 1, g.split_k) if g.split_k > 1 else (g.cluster_m, 1, 1) if g.cluster_m > 1 else None
        L.launch(self.fn, (grid_size(g, M, N, self.problem_args.K, self.sms), 1, g.split_k), g.threads, g.smem,
                 stream, self.pack, cluster=cluster)


def launcher(artifact, program: Program) -> HopperLauncher:
    return HopperLauncher(artifact, program)
