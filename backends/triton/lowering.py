"""Program -> Triton source text: the pure half of the Triton backend.

Three kernel shapes come out of here, each with the whole epilogue fused:

* `scheduler tile`: a pointer kernel, one CTA per output tile (times split-K
  slices); Triton pipelines its `tl.load`s with cp.async over `num_stages`.
  Rows and columns past the matrix edge are wrapped (`% M`) so operand loads
  need no M/N masks; K is masked unless `EVEN_K`.
* `scheduler persistent`: one CTA per SM walking the output tiles, operands
  loaded through host-built TMA tensor descriptors (out-of-bounds boxes read
  zeros, so no masks at all), the tile loop flattened into the K loop so the
  next tile's loads overlap this tile's epilogue.
* `scheduler stream_k` (stream_k.py): one wave of pointer-kernel CTAs sharing
  out every tile's k-iterations, partial tiles added in K order in the same launch.
* `mainloop direct`: for decode products (`x @ W.T` at a batch of one or two, written
  swap_ab), no tensor cores and nothing staged in shared memory: each CTA owns a few weight
  rows and loads tile K contiguous elements of each per step, multiplying by FMA into fp32
  partial sums that are added along K once at the end (`stages` S > 1: S steps of loads in
  flight in registers, `_direct_ring`). Row-contiguous steps read the weight
  nearly as fast as a plain read does (benchmarks/gemv_patterns.py); mma fragments would
  scatter each load over eight rows.

Split-K writes fp32 partials; a second kernel in the same module reduces them
(in slice order for `workspace`, so results are deterministic) and applies the
epilogue. `unordered` and `atomic` add partials into one fp32 buffer with
`tl.atomic_add`; the finalize kernel takes it with `tl.atomic_xchg` (reading each sum and
leaving a zero, so the buffer is clean for the next call without a memset) and applies the
epilogue. An exchange, because on the H200 a plain load returned values the atomics had not
yet added in: at 1024x2048x12288, split 2, 128x128 tiles, a plain load lost up to 0.6 % of
the outputs in 12 of 12 calls and an L2-only load (`.cg`) in 9 of 12; the exchange lost none
(docs/backends.md).
(Triton's `atomic` is this same buffer: the DSL's restriction of `atomic` to f32 out and no
activation holds for backends that add into the output itself.)

Everything a loader needs (kernel names, argument roles and types, constexprs,
divisibility hints, grid recipe) travels in `Source.meta`, as plain data.
"""
from __future__ import annotations

import hashlib
import math

from gemmgen.backends.base import Source, refuse_swapped
from gemmgen.backends.triton import stream_k
from gemmgen.backends.triton.pieces import (
    GENERIC_HINT, SIGNATURE_DTYPE, Args, epilogue_args, epilogue_call, epilogue_fn, epilogue_scalars,
    out_offsets, pointer_args, pointer_mainloop, pointer_store, pow2_divisor, shape_args, tile_coords_fn)
from gemmgen.dsl import to_text
from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import ARRIVAL_ORDER_REDUCES, DTYPE_BYTES, Program
from gemmgen.dsl.resources import b_tiles

REDUCE_BLOCK = (32, 128)   # tile of the split-K reduce / finalize kernel
REDUCE_WARPS = 4


def auto_stages(program: Program) -> int:
    """Deepest pipeline (2..4) whose operand buffers fit beside the epilogue scratch."""
    t = program.tile
    per_stage = (t.m * t.k + b_tiles(program) * t.k * t.n) * 2
    budget = SM90A.max_smem_per_block - epilogue_scratch_bytes(program)
    return max(2, min(4, budget // per_stage))


def epilogue_scratch_bytes(program: Program) -> int:
    """Shared memory Triton uses to re-layout the accumulator for coalesced stores (upper bound)."""
    return program.tile.m * program.tile.n * 2


DIRECT_TRITON_STAGES = 3   # Triton's default; the loop has no dot, so Triton pipelines nothing


def num_stages(program: Program) -> int:
    """Triton's `num_stages`. A direct program's own `stages` are its register ring
    (`direct_ring`), written into the source."""
    if program.mainloop == "direct":
        return DIRECT_TRITON_STAGES
    if program.stages is not None:
        return program.stages
    return auto_stages(program)


def direct_ring(program: Program) -> int:
    """K steps of a direct program's loads in flight in each thread's registers; `auto` is one
    (each step's loads are used before the next are issued)."""
    return program.stages or 1


def kernel_name(program: Program) -> str:
    p, t = program.problem, program.tile
    kind = "direct" if program.mainloop == "direct" else program.scheduler
    # of the canonical text, so a new IR field with a default leaves every name as it was
    digest = hashlib.sha256(to_text(program).encode()).hexdigest()[:8]
    return f"gemm_{kind}_{t.m}x{t.n}x{t.k}_{p.a_major[0]}{p.b_major[0]}_{digest}"


def tma_store(program: Program) -> bool:
    """Does the persistent kernel store through a TMA descriptor? Needs a bound shape whose
    output rows are 16-byte multiples; the tile is stored as two BLOCK_M x BLOCK_N/2 halves."""
    p = program.problem
    return (program.scheduler == "persistent" and program.split_k == 1 and p.is_bound
            and p.n * DTYPE_BYTES[p.epilogue.out_dtype] % 16 == 0 and program.tile.n >= 32)


def epilogue_staging_bytes(program: Program) -> int:
    """Shared memory the TMA-store epilogue stages one output half-tile in."""
    if not tma_store(program):
        return 0
    e = program.problem.epilogue
    half = program.tile.m * program.tile.n // 2 * DTYPE_BYTES[e.out_dtype]
    # Reading c or a residual in the TMA layout costs Triton one more staged half tile.
    return half * (2 if e.residual or e.beta != 0.0 else 1)


# The one-CTA-a-tile kernels' first lines: this CTA's output tile, its rows and its columns.
TILE_START = """    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(pid, num_pid_m, num_pid_n, GROUP)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)"""


def _tile_kernel(program: Program, name: str, bound: bool, epi_params: list[str]) -> tuple[str, Args, dict, dict]:
    p = program.problem
    split = program.split_k > 1
    args = pointer_args(program, bound, workspace=split, epilogue=not split)   # split: the reduce applies it
    even_k = bound and p.k % program.tile.k == 0
    m_exact = bound and p.m % program.tile.m == 0
    n_exact = bound and p.n % program.tile.n == 0
    constexprs = {"BLOCK_M": program.tile.m, "BLOCK_N": program.tile.n, "BLOCK_K": program.tile.k,
                  "GROUP": program.swizzle, "SPLIT_K": program.split_k, "EVEN_K": even_k}
    for c in constexprs:
        args.add(c, "constexpr", "const")
    rows = ("tl.max_contiguous(tl.multiple_of(offs_m, BLOCK_M), BLOCK_M)" if m_exact
            else "offs_m % M  # wrap past the edge: loads stay in bounds, the store is masked")
    cols = ("tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)" if n_exact
            else "offs_n % N")
    if split:
        tail = f"""    # fp32 partial of this K slice; the reduce kernel applies the epilogue
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    {_partial_store(program)}"""
    else:
        tail = pointer_store(program, epi_params, "    ")
    if split:
        k_range = """    pid_k = tl.program_id(1)
    k_per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, k_tiles)
    offs_k = k_begin * BLOCK_K + tl.arange(0, BLOCK_K)"""
    else:
        k_range = """    k_begin = 0
    k_end = k_tiles
    offs_k = tl.arange(0, BLOCK_K)"""
    text = f'''@triton.jit
def {name}(
{args.text()}
):
    """One BLOCK_M x BLOCK_N output tile (K slice pid_k of SPLIT_K) per CTA."""
{TILE_START}
    rows_a = {rows}
    cols_b = {cols}
    k_tiles = tl.cdiv(K, BLOCK_K)
{k_range}
{pointer_mainloop(program, "    ")}
{tail}
'''
    grid = {"kind": "tiles", "block_m": program.tile.m, "block_n": program.tile.n, "split_k": program.split_k}
    return text, args, constexprs, grid


def _direct_kernel(program: Program, name: str, bound: bool, epi_params: list[str]) -> tuple[str, Args, dict, dict]:
    p, t = program.problem, program.tile
    args = pointer_args(program, bound, workspace=False, epilogue=True)
    constexprs = {"BLOCK_M": t.m, "BLOCK_N": t.n, "BLOCK_K": t.k, "GROUP": program.swizzle,
                  "EVEN_K": bound and p.k % t.k == 0}
    for c in constexprs:
        args.add(c, "constexpr", "const")
    ring = direct_ring(program)
    loop = (_direct_one_column() if ring == 1 else _direct_ring(ring)) if t.n == 1 else _direct_columns(t.n)
    text = f'''@triton.jit
def {name}(
{args.text()}
):
    """BLOCK_M rows of A (K-contiguous) against BLOCK_N columns of B (K-contiguous), by FMA:
    each step loads BLOCK_K contiguous elements of every row; A streams (evict first)."""
{TILE_START}
    offs_k = tl.arange(0, BLOCK_K)
    # rows and columns past the edge wrap: loads stay in bounds, the store is masked
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_a + offs_k[None, :]
{loop}
{pointer_store(program, epi_params, "    ")}
'''
    grid = {"kind": "tiles", "block_m": t.m, "block_n": t.n, "split_k": 1}
    return text, args, constexprs, grid


def _direct_one_column() -> str:
    """A batch of one: BLOCK_M x BLOCK_K partial sums, added along K at the end."""
    return """    b_ptrs = b_ptr + (offs_n % N)[:, None] * stride_b + offs_k[None, :]
    part = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, eviction_policy="evict_first")
            b = tl.load(b_ptrs)
        else:
            k_in = offs_k[None, :] < K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=k_in, other=0.0, eviction_policy="evict_first")
            b = tl.load(b_ptrs, mask=k_in, other=0.0)
        part += a.to(tl.float32) * b.to(tl.float32)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    acc = tl.sum(part, axis=1)[:, None]"""


def _direct_ring(stages: int) -> str:
    """A batch of one with `stages` K steps of loads in flight: each step's loads are issued
    before the oldest step's products are added, so a thread's registers hold stages - 1 steps
    while it waits on one. Steps past K load nothing (a masked load)."""
    def load(tag: str, step: str) -> list[str]:
        return ["        if EVEN_K:",
                f"            in_k = {step} < n_k",
                "        else:",
                f"            in_k = offs_k[None, :] < K - ({step}) * BLOCK_K",
                f"        a{tag} = tl.load(a_ptrs, mask=in_k, other=0.0, eviction_policy=\"evict_first\")",
                f"        b{tag} = tl.load(b_ptrs, mask=in_k, other=0.0)",
                "        a_ptrs += BLOCK_K",
                "        b_ptrs += BLOCK_K"]
    held = range(stages - 1)
    lines = ["    b_ptrs = b_ptr + (offs_n % N)[:, None] * stride_b + offs_k[None, :]",
             "    part = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)",
             "    n_k = tl.cdiv(K, BLOCK_K)"]
    for s in held:
        lines += [line[4:] for line in load(str(s), str(s))]
    lines += ["    for kt in range(0, n_k):"]
    lines += load("_next", f"kt + {stages - 1}")
    lines += ["        part += a0.to(tl.float32) * b0.to(tl.float32)"]
    lines += [f"        a{s}, b{s} = a{s + 1}, b{s + 1}" for s in held[:-1]]
    lines += [f"        a{stages - 2}, b{stages - 2} = a_next, b_next",
              "    acc = tl.sum(part, axis=1)[:, None]"]
    return "\n".join(lines)


def _direct_columns(n: int) -> str:
    """A batch of n: one BLOCK_M x BLOCK_K partial sum a column, written out column by column
    (a third, batch axis in one partial sum measured 0.88x torch.matmul at M = 2, these 0.955x)."""
    cols = range(n)
    lines = [f"    b_ptrs{j} = b_ptr + ((pid_n * BLOCK_N + {j}) % N) * stride_b + offs_k" for j in cols]
    lines += [f"    part{j} = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)" for j in cols]
    lines += ["    for kt in range(0, tl.cdiv(K, BLOCK_K)):",
              "        if EVEN_K:",
              "            a = tl.load(a_ptrs, eviction_policy=\"evict_first\").to(tl.float32)"]
    lines += [f"            b{j} = tl.load(b_ptrs{j})" for j in cols]
    lines += ["        else:",
              "            k_in = offs_k < K - kt * BLOCK_K",
              "            a = tl.load(a_ptrs, mask=k_in[None, :], other=0.0, eviction_policy=\"evict_first\").to(tl.float32)"]
    lines += [f"            b{j} = tl.load(b_ptrs{j}, mask=k_in, other=0.0)" for j in cols]
    lines += [f"        part{j} += a * b{j}.to(tl.float32)[None, :]" for j in cols]
    lines += ["        a_ptrs += BLOCK_K"] + [f"        b_ptrs{j} += BLOCK_K" for j in cols]
    lines += ["    column = tl.arange(0, BLOCK_N)[None, :]",
              "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"]
    lines += [f"    acc = tl.where(column == {j}, tl.sum(part{j}, axis=1)[:, None], acc)" for j in cols]
    return "\n".join(lines)


def _partial_store(program: Program) -> str:
    if program.split_k_reduce in ARRIVAL_ORDER_REDUCES:
        return ("tl.atomic_add(ws_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask, sem=\"relaxed\")")
    return ("tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)")


# ----------------------------------------------------------------------------------------------
# The persistent TMA kernel (scheduler persistent)


def _tma_operands(program: Program) -> dict[str, str]:
    """Descriptor boxes and loads per major-ness; a transposed box is transposed in shared memory."""
    p = program.problem
    if p.a_major == "row":
        a_box, a_load = ("BLOCK_M", "BLOCK_K"), "a_desc.load([off_m, k * BLOCK_K])"
    else:
        a_box, a_load = ("BLOCK_K", "BLOCK_M"), "a_desc.load([k * BLOCK_K, off_m]).T"
    if p.b_major == "row":
        b_box, b_load = ("BLOCK_K", "BLOCK_N"), "b_desc.load([k * BLOCK_K, off_n])"
    else:
        b_box, b_load = ("BLOCK_N", "BLOCK_K"), "b_desc.load([off_n, k * BLOCK_K]).T"
    return {"a_box": a_box, "a_load": a_load, "b_box": b_box, "b_load": b_load}


def _persistent_kernel(program: Program, name: str, bound: bool, epi_params: list[str]) -> tuple[str, Args, dict, dict]:
    p, t = program.problem, program.tile
    ops = _tma_operands(program)
    values = {"BLOCK_M": t.m, "BLOCK_N": t.n, "BLOCK_K": t.k}
    ind = SIGNATURE_DTYPE[p.in_dtype]
    box = lambda dims: ", ".join(str(values[d]) for d in dims)  # noqa: E731
    args = Args()
    args.add("a_desc", f"tensordesc<{ind}[{box(ops['a_box'])}]>", "a_desc")
    args.add("b_desc", f"tensordesc<{ind}[{box(ops['b_box'])}]>", "b_desc")
    out_ty = SIGNATURE_DTYPE[p.epilogue.out_dtype]
    by_tma = tma_store(program)
    if by_tma:
        args.add("out_desc", f"tensordesc<{out_ty}[{t.m}, {t.n // 2}]>", "out_desc")
    else:
        args.add("out_ptr", f"*{out_ty}", "out", 16)
    split = program.split_k > 1
    if split:
        args.add("ws_ptr", "*fp32", "workspace", 16)
    else:
        epilogue_args(args, program, bound)
    shape_args(args, program, bound)
    if not split:
        epilogue_scalars(args, program, bound, out_stride=not by_tma)
    constexprs = {"BLOCK_M": t.m, "BLOCK_N": t.n, "BLOCK_K": t.k, "GROUP": program.swizzle,
                  "SPLIT_K": program.split_k, "NUM_SMS": SM90A.sms}
    for c in constexprs:
        args.add(c, "constexpr", "const")
    if split:
        tail = f"""        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        {_partial_store(program)}"""
    elif by_tma:
        half = "BLOCK_N // 2"
        tail = f"""        # Two BLOCK_M x BLOCK_N/2 halves: half the staging shared memory, and the first
        # half's TMA store overlaps the second half's epilogue math. TMA clips at the edges.
        acc_lo, acc_hi = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, {half})), (0, 2, 1)))
        offs_n = pid_n * BLOCK_N + tl.arange(0, {half})
        out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], {epilogue_call(epi_params, acc="acc_lo")})
        out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + {half}],
                       {epilogue_call(epi_params, acc="acc_hi", offs_n="offs_n + " + half)})"""
    else:
        tail = pointer_store(program, epi_params, "        ")
    if split:
        k_range = """        k_begin = (work // num_tiles) * k_per_split
        k_end = tl.minimum(k_begin + k_per_split, k_tiles)"""
    else:
        k_range = """        k_begin = 0
        k_end = k_tiles"""
    text = f'''@triton.jit
def {name}(
{args.text()}
):
    """NUM_SMS CTAs walk (tile, K slice) work items; operands arrive by TMA, zero-filled past the edges."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
{"    k_per_split = tl.cdiv(k_tiles, SPLIT_K)" + chr(10) if split else ""}    # A second counter for the epilogue keeps it independent of the next tile's prologue,
    # so the flattened loop can issue the next loads before this tile's stores.
    work_epi = start - NUM_SMS
    for work in tl.range(start, num_tiles * SPLIT_K, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coords(work % num_tiles, num_pid_m, num_pid_n, GROUP)
{k_range}
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_begin, k_end):
            a = {ops["a_load"]}
            b = {ops["b_load"]}
            acc = tl.dot(a, b, acc, out_dtype=tl.float32)
        work_epi += NUM_SMS
{"        pid_k = work_epi // num_tiles" + chr(10) if split else ""}        pid_m, pid_n = tile_coords(work_epi % num_tiles, num_pid_m, num_pid_n, GROUP)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
{"" if by_tma else "        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)" + chr(10)}{tail}
'''
    descs = {"a": tuple(values[d] for d in ops["a_box"]), "b": tuple(values[d] for d in ops["b_box"])}
    if by_tma:
        descs["out"] = (t.m, t.n // 2)
    grid = {"kind": "persistent", "block_m": t.m, "block_n": t.n, "split_k": program.split_k,
            "num_sms": SM90A.sms, "boxes": descs}
    return text, args, constexprs, grid


# ----------------------------------------------------------------------------------------------
# The split-K reduce / finalize kernel


def _reduce_kernel(program: Program, name: str, bound: bool, epi_params: list[str]) -> tuple[str, Args, dict, dict]:
    p = program.problem
    args = Args()
    args.add("ws_ptr", "*fp32", "workspace", 16)
    args.add("out_ptr", f"*{SIGNATURE_DTYPE[p.epilogue.out_dtype]}", "out", 16)
    epilogue_args(args, program, bound)
    args.add("M", "i32", "M", pow2_divisor(p.m) if bound else GENERIC_HINT, assumed=not bound)
    args.add("N", "i32", "N", pow2_divisor(p.n) if bound else GENERIC_HINT, assumed=not bound)
    epilogue_scalars(args, program, bound)
    constexprs = {"BLOCK_M": REDUCE_BLOCK[0], "BLOCK_N": REDUCE_BLOCK[1], "SPLIT_K": program.split_k}
    for c in constexprs:
        args.add(c, "constexpr", "const")
    if program.split_k_reduce in ARRIVAL_ORDER_REDUCES:
        doc = ("Takes the atomically summed fp32 buffer with an atomic exchange (read and zeroed for the "
               "next call in one step), applies the epilogue.")
        # exchanged as 32-bit integers: the same atom.exch.b32 on the GPU, and what Triton's
        # interpreter (the CPU tests) can exchange
        body = """    bits = tl.atomic_xchg(ws.to(tl.pointer_type(tl.int32)), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32),
                          mask=mask, sem="relaxed")
    acc = bits.to(tl.float32, bitcast=True)"""
    else:
        doc = "Sums the SPLIT_K fp32 partials in slice order (deterministic), then applies the epilogue."
        body = """    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws + s * M * N, mask=mask, other=0.0)"""
    text = f'''@triton.jit
def {name}(
{args.text()}
):
    """{doc}"""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
{body}
    tl.store(out_ptr + {out_offsets(program, "stride_om")}, {epilogue_call(epi_params)}, mask=mask)
'''
    grid = {"kind": "elementwise", "block_m": REDUCE_BLOCK[0], "block_n": REDUCE_BLOCK[1], "split_k": 1}
    return text, args, constexprs, grid


# ----------------------------------------------------------------------------------------------


def _kernel_meta(name: str, args: Args, constexprs: dict, grid: dict, warps: int, stages: int) -> dict:
    return {"name": name, "params": tuple(args.params), "constexprs": constexprs, "hints": dict(args.hints),
            "assumed": tuple(args.assumed), "num_warps": warps, "num_stages": stages, "grid": grid}


def lower(program: Program) -> Source:
    """The readable Triton module for `program`, plus the loader's recipe in `meta`."""
    refuse_swapped(program)
    p = program.problem
    bound = p.is_bound
    name = kernel_name(program)
    epi_text, epi_params = epilogue_fn(program)
    if program.mainloop == "direct":
        make = _direct_kernel
    else:
        make = {"persistent": _persistent_kernel, "stream_k": stream_k.stream_k_kernel}.get(program.scheduler,
                                                                                         _tile_kernel)
    main_text, *main = make(program, name, bound, epi_params)
    stages = num_stages(program)
    kernels = [_kernel_meta(name, *main, program.num_warps, stages)]
    texts = [main_text]
    if program.split_k > 1:
        reduce_text, *reduce = _reduce_kernel(program, name + "_reduce", bound, epi_params)
        texts.append(reduce_text)
        kernels.append(_kernel_meta(name + "_reduce", *reduce, REDUCE_WARPS, 1))
    t = program.tile
    header = (f'"""gemmgen Triton kernel for {p.key}\n\n'
              f"tile {t.m}x{t.n}x{t.k}, {program.num_warps} warps, {stages} stages, scheduler {program.scheduler}, "
              f"raster {program.raster} swizzle={program.swizzle}, split_k {program.split_k}"
              f"{' ' + program.split_k_reduce if program.split_k > 1 else ''}.\n"
              f"A {p.a_major}-major, B {p.b_major}-major, C {p.c_major}-major; M, N, K are runtime arguments"
              f"{' (divisibility hints from the bound shape)' if bound else ' (shape-generic)'}.\n"
              '"""\n')
    text = "\n\n".join([header + "import triton\nimport triton.language as tl",
                        tile_coords_fn(program.raster), epi_text, *texts]).rstrip() + "\n"
    meta = {
        "kernels": tuple(kernels),
        "in_dtype": p.in_dtype,
        "out_dtype": p.epilogue.out_dtype,
        "shape": (p.m, p.n, p.k) if bound else None,
        "majors": (p.a_major, p.b_major),
        "c_major": p.c_major,
        "gated": bool(p.epilogue.gate),
        "split_k": program.split_k,
        "split_k_reduce": program.split_k_reduce,
        "persistent": program.scheduler == "persistent",
        "alpha": p.epilogue.alpha,
        "beta": p.epilogue.beta,
    }
    return Source(backend="triton", text=text, entry=name, meta=meta)


def workspace_need(meta: dict, m: int, n: int, k: int) -> tuple[int, bool]:
    """fp32 words of scratch a call at M, N, K needs, and whether they must start zeroed."""
    grid = meta["kernels"][0]["grid"]
    if grid["kind"] == "stream_k":
        return stream_k.workspace_words(grid, m, n, k), True
    if meta["split_k"] == 1:
        return 0, False
    arrival = meta["split_k_reduce"] in ARRIVAL_ORDER_REDUCES
    return m * n * (1 if arrival else meta["split_k"]), arrival


def grid_size(grid: dict, m: int, n: int, k: int) -> tuple[int, int, int]:
    """Launch grid for a kernel's recipe at a concrete M, N, K."""
    if grid["kind"] == "stream_k":
        return (stream_k.work_split(grid, m, n, k)[2], 1, 1)
    tiles = math.ceil(m / grid["block_m"]) * math.ceil(n / grid["block_n"])
    if grid["kind"] == "persistent":
        return (min(grid["num_sms"], tiles * grid["split_k"]), 1, 1)
    if grid["kind"] == "elementwise":
        return (math.ceil(m / grid["block_m"]), math.ceil(n / grid["block_n"]), 1)
    return (tiles, grid["split_k"], 1)
