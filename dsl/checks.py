"""The checks a kernel engineer makes before compiling, as pure functions.

Each check takes a program and the hardware model and yields `(statement, message)`
pairs; `validate.py` locates them. Messages say what is wrong and what would fix it.
`VALUE_CHECKS` come first: if any fails, the arithmetic checks are skipped (they
would divide by a zero tile or read an unknown mainloop).
"""
from __future__ import annotations

import math
from typing import Iterator

from gemmgen.dsl import ir
from gemmgen.dsl import resources as res
from gemmgen.dsl.hardware import Hardware, is_pow2
from gemmgen.dsl.ir import Program

Finding = tuple[str, str]
MAX_RASTER_SWIZZLE = 16


def _choices(values) -> str:
    return ", ".join("auto" if v is None else str(v) for v in values)


# -- single values --------------------------------------------------------------

def check_values(p: Program, hw: Hardware) -> Iterator[Finding]:
    """Every field holds a value of the language (programs built in code can hold anything)."""
    pr, e = p.problem, p.problem.epilogue
    for name, value, allowed in (("backend", p.backend, ir.BACKENDS), ("mainloop", p.mainloop, ir.MAINLOOPS),
                                 ("scheduler", p.scheduler, ir.SCHEDULERS)):
        if value not in allowed:
            yield name, f"unknown {name} {value!r}: write one of {_choices(allowed)}"
    for what, value in (("a", pr.a_major), ("b", pr.b_major), ("c", pr.c_major)):
        if value not in ir.MAJORS:
            yield "gemm", f"{what}={value!r} is not a layout: write {what}=row or {what}=col"
    for d, name in ((pr.m, "M"), (pr.n, "N"), (pr.k, "K")):
        if d is not None and d < 1:
            yield "gemm", f"{name}={d}: a dimension is a positive whole number (or * for generic)"
    if pr.in_dtype not in ir.DTYPES or pr.acc_dtype not in ir.DTYPES or e.out_dtype not in ir.DTYPES:
        yield "gemm", f"dtypes must be among {_choices(ir.DTYPES)}"
    if min(p.tile.m, p.tile.n, p.tile.k) < 1:
        yield "tile", f"tile {p.tile.m}x{p.tile.n}x{p.tile.k} has a zero size: write e.g. `tile 128x128x64`"
    if min(p.warps) < 1:
        yield "warps", f"warps {p.warps[0]}x{p.warps[1]} has no warps along one axis: write e.g. `warps 2x2`"
    if p.instr is not None and p.instr.kind not in ("wgmma", "mma"):
        yield "instr", f"unknown instruction {p.instr.kind!r}: write `instr auto`, `instr wgmma 64xNx16` or `instr mma 16x8x16`"
    if p.raster not in ("m", "n"):
        yield "raster", f"raster {p.raster!r}: write `raster m` or `raster n`"
    if p.split_k < 1:
        yield "split_k", f"split_k {p.split_k}: write `split_k 1` for no split, or a count of at least 2"
    if p.split_k_reduce not in ir.SPLIT_K_REDUCES:
        yield "split_k", f"unknown split-K reduction {p.split_k_reduce!r}: write {_choices(ir.SPLIT_K_REDUCES)}"
    if e.bias not in (None, "m", "n"):
        yield "epilogue", f"bias={e.bias!r}: write bias=n (one value per column) or bias=m (per row)"
    if e.activation not in (None, *ir.ACTIVATIONS):
        yield "epilogue", f"unknown activation {e.activation!r}: write one of {_choices(ir.ACTIVATIONS)}"
    if e.gate not in (None, *ir.ACTIVATIONS):
        yield "epilogue", f"gate={e.gate!r}: the gate's activation is one of {_choices(ir.ACTIVATIONS)}"
    if e.halves not in (None, *ir.HALVES):
        yield "epilogue", f"halves={e.halves!r}: write halves={' or halves='.join(ir.HALVES)}"


def check_dtypes(p: Program, hw: Hardware) -> Iterator[Finding]:
    pr = p.problem
    if pr.in_dtype not in ir.INPUT_DTYPES:
        yield "gemm", (f"in={pr.in_dtype}: gemmgen generates GEMMs with {', '.join(ir.INPUT_DTYPES)} inputs; "
                       f"write in={ir.INPUT_DTYPES[0]}")
    if pr.acc_dtype != "f32":
        yield "gemm", (f"acc={pr.acc_dtype}: gemmgen never accumulates in anything but fp32 "
                       "(fp16 accumulation fails the accuracy check as K grows); write acc=f32")


# -- the tile, the warps and the instruction ----------------------------------------

def check_instruction(p: Program, hw: Hardware) -> Iterator[Finding]:
    """The math warps and the instruction shape tile the CTA tile exactly."""
    t, (wm, wn) = p.tile, p.warps
    tile = f"tile {t.m}x{t.n}x{t.k}"
    kind = p.instr.kind if p.instr else ("wgmma" if res.is_ws(p) else None)
    if p.instr is not None and p.instr.kind == "wgmma":
        i = p.instr
        if i.m != hw.wgmma_m or i.k != hw.wgmma_k_f16 or i.n not in hw.wgmma_n:
            yield "instr", (f"wgmma {i.m}x{i.n}x{i.k} does not exist for fp16: write `instr wgmma 64xNx16` "
                            f"with N a multiple of 8 from 8 to 256")
            return
    if p.instr is not None and p.instr.kind == "mma":
        i = p.instr
        if (i.m, i.n, i.k) not in hw.mma_shapes_f16:
            yield "instr", f"mma {i.m}x{i.n}x{i.k} does not exist for fp16: write `instr mma 16x8x16`"
            return
    if t.k % hw.wgmma_k_f16:
        yield "tile", f"{tile}: tile_k must be a multiple of 16 (the K of every fp16 tensor-core instruction)"
    if t.m % wm or t.n % wn:
        yield "warps", (f"warps {wm}x{wn} do not divide {tile}: tile_m must be a multiple of {wm} "
                        f"and tile_n of {wn}")
        return
    warp_m, warp_n = t.m // wm, t.n // wn
    if kind == "wgmma":
        groups_m = wm // hw.warps_per_warpgroup
        if wm % hw.warps_per_warpgroup:
            yield "warps", (f"warps {wm}x{wn}: wgmma runs on warpgroups of 4 warps stacked along M, so the "
                            f"first number must be a multiple of 4 (e.g. `warps {4 * max(1, wm // 4)}x{wn}`)")
            return
        group_m = t.m // groups_m
        n_step = p.instr.n if p.instr else 8
        if t.m % groups_m or group_m % hw.wgmma_m:
            yield "tile", (f"{tile} with warps {wm}x{wn}: each warpgroup computes {t.m}/{groups_m} rows, "
                           f"which must be a multiple of 64 (wgmma's M); use tile_m = {64 * groups_m} or a multiple")
        # a gated program's instruction may also span the gate's and the up's columns at once
        both_halves = res.b_tiles(p) > 1 and n_step == 2 * warp_n
        if warp_n % n_step and not both_halves:
            joined = (f" (or 64x{2 * warp_n}x16 over the gate's and up's together)"
                      if res.b_tiles(p) > 1 and 2 * warp_n in hw.wgmma_n else "")
            yield "tile", (f"{tile} with warps {wm}x{wn}: each warpgroup computes {warp_n} columns, which "
                           f"must be a multiple of the instruction's N={n_step}; use instr wgmma 64x{_gcd_n(warp_n, hw)}x16"
                           f"{joined} or change tile_n")
    elif p.mainloop in res.REGISTER_MAINLOOPS and kind is None:
        return   # the backend picks the math (Triton's direct: FMA); its own rules size the tile
    else:
        if warp_m % 16 or warp_n % 8:
            yield "tile", (f"{tile} with warps {wm}x{wn} gives each warp {warp_m}x{warp_n}, which mma.sync "
                           f"16x8x16 cannot tile: each warp needs a multiple of 16 rows and 8 columns")


def _gcd_n(columns: int, hw: Hardware) -> int:
    best = [n for n in hw.wgmma_n if columns % n == 0]
    return best[-1] if best else 8


def check_threads(p: Program, hw: Hardware) -> Iterator[Finding]:
    """Thread count, warpgroups for the schedule, and the register file."""
    wm, wn = p.warps
    math_warps = wm * wn
    threads = res.threads(p, hw)
    if threads > hw.max_threads_per_block:
        yield "warps", (f"warps {wm}x{wn} with mainloop {p.mainloop} makes {threads} threads per CTA; "
                        f"the limit is {hw.max_threads_per_block}: use fewer warps")
    if res.is_ws(p):
        if math_warps % hw.warps_per_warpgroup:
            yield "warps", (f"mainloop {p.mainloop} runs whole consumer warpgroups: warps {wm}x{wn} = "
                            f"{math_warps} warps is not a multiple of 4")
    acc = res.acc_regs_per_thread(p, hw)
    if acc + res.REG_RESERVE > hw.max_regs_per_thread:
        both = " (gate and up)" if res.b_tiles(p) > 1 else ""
        yield "tile", (f"tile {p.tile.m}x{p.tile.n} over {math_warps} math warps holds {acc:g} fp32 accumulators{both} "
                       f"per thread; with {res.REG_RESERVE} more registers that exceeds "
                       f"{hw.max_regs_per_thread} per thread: use more warps or a smaller tile")
    elif res.regs_per_cta(p, hw) > hw.regs_per_block:
        yield "warps", (f"tile {p.tile.m}x{p.tile.n} with {threads} threads needs about {res.regs_per_cta(p, hw)} "
                        f"registers per CTA; the register file holds {hw.regs_per_block}: use fewer warps "
                        f"or a smaller tile")


# -- shared memory -------------------------------------------------------------

def check_shared_memory(p: Program, hw: Hardware) -> Iterator[Finding]:
    t = p.tile
    tile = f"tile {t.m}x{t.n}x{t.k}"
    fit = res.max_stages(p, hw)
    lowest = res.min_stages(p)
    if p.stages is not None and p.stages < lowest:
        yield "stages", (f"stages {p.stages}: mainloop {p.mainloop} needs at least {lowest} "
                         f"({'a TMA pipeline overlaps loads with math' if lowest > 1 else 'one buffer'})")
        return
    stages = p.stages if p.stages is not None else lowest
    need = res.smem_bytes(p, stages)
    if need <= hw.max_smem_per_block:
        return
    epi = res.epilogue_smem_bytes(p)
    extra = f" (including {epi} B for the TMA-store epilogue)" if epi else ""
    if p.stages is None:
        yield "tile", (f"{tile} needs {need} B of shared memory for even {lowest} stage(s){extra}; the limit is "
                       f"{hw.max_smem_per_block} B: use a smaller tile")
    elif fit >= lowest:
        yield "stages", (f"{tile} with stages {p.stages} needs {need} B of shared memory{extra}; the limit is "
                         f"{hw.max_smem_per_block} B: use stages <= {fit} or a smaller tile")
    else:
        yield "tile", (f"{tile} needs {need} B of shared memory{extra}; the limit is {hw.max_smem_per_block} B "
                       f"even at {lowest} stage(s): use a smaller tile")


def check_smem_swizzle(p: Program, hw: Hardware) -> Iterator[Finding]:
    s = p.smem_swizzle
    if s is not None and s not in hw.smem_swizzle_bytes:
        yield "smem_swizzle", (f"smem_swizzle {s} is not a swizzle width: write one of auto, "
                               f"{_choices(hw.smem_swizzle_bytes)} (bytes)")
        return
    if not s:
        return
    t, pr, b = p.tile, p.problem, res.in_bytes(p)
    rows = (("A", pr.a_major, "tile_k" if pr.a_major == "row" else "tile_m", t.k if pr.a_major == "row" else t.m),
            ("B", pr.b_major, "tile_n" if pr.b_major == "row" else "tile_k", t.n if pr.b_major == "row" else t.k))
    for operand, major, dim, extent in rows:
        if (extent * b) % s:
            yield "smem_swizzle", (f"smem_swizzle {s} needs each operand tile's contiguous extent to be a multiple "
                                   f"of {s} B; {operand} is {major}-major, so its rows are {dim}={extent} elements "
                                   f"= {extent * b} B: use a smaller smem_swizzle (or auto) or a larger {dim}")


# -- cluster, schedule, split-K ----------------------------------------------------

def check_cluster(p: Program, hw: Hardware) -> Iterator[Finding]:
    cm, cn = p.cluster
    if not hw.legal_cluster(p.cluster):
        yield "cluster", (f"cluster {cm}x{cn} is not legal: each side must be a power of 2 and the product at most "
                          f"{hw.max_cluster_size} CTAs (e.g. `cluster 2x1`, `cluster 2x2`)")
        return
    pr = p.problem
    if p.scheduler == "tile" and pr.is_bound and cm * cn > 1:
        tiles_m, tiles_n = math.ceil(pr.m / p.tile.m), math.ceil(pr.n / p.tile.n)
        if tiles_m % cm or tiles_n % cn:
            yield "cluster", (f"cluster {cm}x{cn} must divide the CTA grid of {tiles_m}x{tiles_n} tiles "
                              f"(M={pr.m}/tile_m {p.tile.m}, N={pr.n}/tile_n {p.tile.n}) under scheduler tile: "
                              f"use cluster 1x1, a tile that gives a divisible grid, or scheduler persistent")


def check_raster(p: Program, hw: Hardware) -> Iterator[Finding]:
    if not (is_pow2(p.swizzle) and p.swizzle <= MAX_RASTER_SWIZZLE):
        yield "raster", (f"swizzle={p.swizzle}: the raster swizzle is a power of 2 from 1 to "
                         f"{MAX_RASTER_SWIZZLE} (CTAs grouped along the raster axis), e.g. `raster m swizzle=8`")


def check_grid(p: Program, hw: Hardware) -> Iterator[Finding]:
    """`scheduler persistent N`: a persistent grid on at most N SMs, in whole clusters."""
    n = p.grid_sms
    if n is None:
        return
    if p.scheduler != "persistent":
        yield "scheduler", (f"an SM count sizes a persistent grid, and `scheduler {p.scheduler}` has none: "
                            f"write `scheduler {p.scheduler}`")
        return
    size = p.cluster[0] * p.cluster[1]
    if not size <= n <= hw.sms or n % size:
        yield "scheduler", (f"scheduler persistent {n}: the grid's SMs are whole clusters of {size} from {size} to "
                            f"{hw.persistent_grid(size)} on the {hw.name}, e.g. `scheduler persistent 128`")


def check_split_k(p: Program, hw: Hardware) -> Iterator[Finding]:
    s, pr, e = p.split_k, p.problem, p.problem.epilogue
    if s == 1:
        if p.split_k_reduce != "workspace":
            yield "split_k", "split_k 1 splits nothing, so it takes no reduction: write `split_k 1`"
        return
    if p.scheduler == "stream_k":
        yield "split_k", (f"scheduler stream_k already splits K across CTAs; write `split_k 1` "
                          f"or use scheduler tile with split_k {s}")
    if pr.is_bound and pr.k < s * p.tile.k:
        yield "split_k", (f"split_k {s} with tile_k {p.tile.k} needs K >= {s * p.tile.k} so every slice gets a "
                          f"k-tile; K={pr.k}: use split_k <= {max(1, pr.k // p.tile.k)}")
    if p.split_k_reduce == ir.CLUSTER_REDUCE:
        if s > hw.max_cluster_size:
            yield "split_k", (f"split_k {s} cluster runs the {s} K slices of a tile as one cluster, and a cluster "
                              f"holds at most {hw.max_cluster_size} CTAs: use split_k <= {hw.max_cluster_size} "
                              f"cluster, or split_k {s} unordered")
        if p.cluster != (1, 1):
            yield "split_k", (f"split_k {s} cluster makes each cluster of the {s} K slices of one tile, so it takes "
                              f"no cluster along M or N: write `cluster 1x1`")
    if p.split_k_reduce == "atomic":
        if e.activation:
            yield "split_k", (f"split_k {s} atomic adds partial sums in place, so {e.activation} would see partial "
                              f"sums: use `split_k {s} unordered` or `split_k {s} workspace`")
        if e.out_dtype != "f32":
            yield "split_k", (f"split_k {s} atomic adds fp32 partials into the {e.out_dtype} output, which "
                              f"accumulates in {e.out_dtype}: use `split_k {s} unordered`, `split_k {s} workspace` "
                              f"or out=f32")


def check_epilogue(p: Program, hw: Hardware) -> Iterator[Finding]:
    e = p.problem.epilogue
    if not math.isfinite(e.alpha) or not math.isfinite(e.beta):
        yield "epilogue", f"alpha={e.alpha} beta={e.beta}: both scalars must be finite numbers"
        return
    if e.alpha == 0.0:
        yield "epilogue", ("alpha=0.0 discards the product A @ B, so there is no GEMM to generate: "
                           "drop alpha (it defaults to 1.0) or give a non-zero value")


def check_gate(p: Program, hw: Hardware) -> Iterator[Finding]:
    """A gated epilogue is gate(acc_gate) * acc_up over B's two halves, laid out as `halves` says."""
    for message in gate_findings(p.problem.epilogue):
        yield "epilogue", message


def gate_findings(e: ir.Epilogue) -> Iterator[str]:
    """What is wrong with an epilogue's gate, in words (gemmgen.compile says the same)."""
    if e.halves and not e.gate:
        yield (f"halves={e.halves} lays out a gated epilogue's two halves, but there is no gate: "
               "add gate=silu (or relu, gelu), or drop halves")
    if not e.gate:
        return
    if not e.halves:
        yield (f"gate={e.gate} multiplies two halves of B: say how they lie in it, "
               "halves=stacked (the gate's N columns, then the up projection's)")
    extra = [word for word, used in (("an activation", e.activation), ("bias", e.bias), ("beta (C)", e.beta != 0.0),
                                     ("residual", e.residual), ("alpha", e.alpha != 1.0)) if used]
    if extra:
        yield (f"a gated epilogue is gate(A B_gate) * (A B_up); it takes no {', '.join(extra)} "
               f"beside it: write `epilogue gate={e.gate} halves={e.halves or 'stacked'} out={e.out_dtype}`")


def check_alignment(p: Program, hw: Hardware) -> Iterator[Finding]:
    """TMA (warp-specialized mainloops) needs 16-byte aligned rows of every operand."""
    pr = p.problem
    if not (res.is_ws(p) and pr.is_bound):
        return
    for operand, major, dim, extent, dtype in pr.unaligned_rows(hw.copy_alignment_bytes):
        elems = hw.copy_alignment_bytes // ir.DTYPE_BYTES[dtype]
        padded = -(-extent // elems) * elems
        yield "mainloop", (f"mainloop {p.mainloop} moves tiles with TMA, which needs 16-byte aligned rows: "
                           f"{operand} is {major}-major, so its contiguous dimension {dim}={extent} must be a "
                           f"multiple of {elems} {dtype} elements; use mainloop multistage or pad {dim} to {padded}")


VALUE_CHECKS = (check_values,)
CHECKS = (check_dtypes, check_instruction, check_threads, check_shared_memory, check_smem_swizzle,
          check_cluster, check_raster, check_grid, check_split_k, check_epilogue, check_gate, check_alignment)
