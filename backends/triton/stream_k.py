"""Program -> Triton source for `scheduler stream_k`: one wave of CTAs shares out every tile's
k-iterations evenly, and the partial tiles are added up inside the same launch.

Where it pays: few output tiles over a long K, above all `x @ W.T` at M <= 128, where one
CTA a tile leaves most SMs idle and a split-K reduce kernel costs as much as the GEMM
(docs/backends.md, "Stream-K").

The work is tiles x k-tiles iterations, tile-major. CTA c takes iterations
[c * per, (c + 1) * per) with per = ceil(total / CTA_CAP), so at most CTA_CAP CTAs, one wave.
A CTA covering a whole tile stores it with the epilogue. One covering part of a tile (only its
first and its last tile can be partial) writes an fp32 partial to its own slot in the workspace,
then takes a ticket from the tile's counter (a CTA barrier, then an acq_rel atomic: the same
release/acquire pattern as CUTLASS's semaphore). The CTA whose ticket completes the tile adds
every contributor's partial in K order (so the result is the same bits every run), applies the
epilogue, stores, and sets the counter back to zero for the next launch. Nobody waits, so a
CTA that is not resident can never hang the grid.

Workspace (fp32 words, zeroed once when allocated): 2 slots of BLOCK_M x BLOCK_N per CTA, then
one int32 counter per tile.
"""
from __future__ import annotations

import math

from gemmgen.backends.triton.pieces import Args, pointer_args, pointer_mainloop, pointer_store
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import Program

CTA_CAP = SM90A.sms   # one CTA per SM: every CTA is resident, and its pipeline has the SM's shared memory


def work_split(grid: dict, m: int, n: int, k: int) -> tuple[int, int, int]:
    """(tiles, iterations per CTA, CTAs) of a stream-K recipe at M, N, K, as the kernel computes them."""
    tiles = math.ceil(m / grid["block_m"]) * math.ceil(n / grid["block_n"])
    total = tiles * math.ceil(k / grid["block_k"])
    per = math.ceil(total / grid["cta_cap"])
    return tiles, per, math.ceil(total / per)


def workspace_words(grid: dict, m: int, n: int, k: int) -> int:
    """fp32 words of the workspace: two partial-tile slots per CTA, then a counter per tile."""
    tiles, _, ctas = work_split(grid, m, n, k)
    return ctas * 2 * grid["block_m"] * grid["block_n"] + tiles


def stream_k_kernel(program: Program, name: str, bound: bool, epi_params: list[str]) -> tuple[str, Args, dict, dict]:
    p, t = program.problem, program.tile
    args = pointer_args(program, bound, workspace=True, epilogue=True)
    constexprs = {"BLOCK_M": t.m, "BLOCK_N": t.n, "BLOCK_K": t.k, "GROUP": program.swizzle,
                  "CTA_CAP": CTA_CAP, "EVEN_K": bound and p.k % t.k == 0}
    for c in constexprs:
        args.add(c, "constexpr", "const")
    # A store in each branch: an accumulator yielded out of the branches broke Triton 3.6's
    # layout pass (RemoveLayoutConversions) at 128x64 tiles with an f32 output.
    text = f'''@triton.jit
def {name}(
{args.text()}
):
    """Iterations [pid * per, (pid + 1) * per) of the tiles x k-tiles; partial tiles added in K order."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = num_pid_m * num_pid_n * k_tiles
    per = tl.cdiv(total, CTA_CAP)
    ctas = tl.cdiv(total, per)
    it_begin = pid * per
    it_end = tl.minimum(it_begin + per, total)
    first_tile = it_begin // k_tiles
    slot_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    counters = (ws_ptr + ctas * 2 * BLOCK_M * BLOCK_N).to(tl.pointer_type(tl.int32))
    for tile in range(first_tile, (it_end - 1) // k_tiles + 1):
        k_begin = tl.maximum(it_begin - tile * k_tiles, 0)
        k_end = tl.minimum(it_end - tile * k_tiles, k_tiles)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_a = offs_m % M  # wrap past the edge: loads stay in bounds, the store is masked
        cols_b = offs_n % N
        offs_k = k_begin * BLOCK_K + tl.arange(0, BLOCK_K)
{pointer_mainloop(program, " " * 8)}
        if (k_begin > 0) | (k_end < k_tiles):
            # slot 0: this CTA's first tile; slot 1: its last (no other tile can be partial)
            slot = (pid * 2 + (tile != first_tile).to(tl.int32)) * BLOCK_M * BLOCK_N
            tl.store(ws_ptr + slot + slot_offs, acc)
            tl.debug_barrier()   # every thread's partial is written before the ticket releases it
            first_cta = (tile * k_tiles) // per
            last_cta = ((tile + 1) * k_tiles - 1) // per
            ticket = tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == last_cta - first_cta:   # the last partial: this CTA adds them all
                tile_sum = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for c in range(first_cta, last_cta + 1):   # K order: the same sum every run
                    c_slot = (c * 2 + (tile != (c * per) // k_tiles).to(tl.int32)) * BLOCK_M * BLOCK_N
                    tile_sum += tl.load(ws_ptr + c_slot + slot_offs, cache_modifier=".cg")
                tl.atomic_xchg(counters + tile, 0, sem="relaxed", scope="gpu")
{pointer_store(program, epi_params, " " * 16, acc="tile_sum")}
        else:   # the whole tile's K loop was this CTA's
{pointer_store(program, epi_params, " " * 12)}
'''
    grid = {"kind": "stream_k", "block_m": t.m, "block_n": t.n, "block_k": t.k, "cta_cap": CTA_CAP, "split_k": 1}
    return text, args, constexprs, grid
