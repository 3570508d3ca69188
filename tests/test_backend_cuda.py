"""CPU tests of the raw CUDA backend: lowering, sm_90a compilation, SASS, refusals, space.

Compiles take seconds each on the CPU machine, so the compiled set is small:
the shipped examples plus one program per family, cached on disk by build.py.
"""
from __future__ import annotations

import re
from dataclasses import replace
import shutil

import pytest

from gemmgen.backends import cuda
from gemmgen.backends.cuda.compile import nvrtc_usable
from gemmgen.dsl import examples, parse
from gemmgen.backends import diagnose, lower
from gemmgen.dsl.ir import CLUSTER_REDUCE, Epilogue, Instr, Problem, Tile

from cuda_backend_cases import hopper, multistage, random_multistage

needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None and not nvrtc_usable(),
                                    reason="needs nvcc or NVRTC to compile CUDA C")


def _cuda_examples():
    out = {}
    for name, path in examples().items():
        program = parse(path.read_text(), filename=path.name)
        if program.backend == "cuda":
            out[name] = program
    return out


@needs_compiler
@pytest.mark.parametrize("name", sorted(_cuda_examples()))
def test_every_cuda_example_compiles_to_sm90a(name):
    program = _cuda_examples()[name]
    assert diagnose(program) == []
    source = lower(program)          # through backends.lower: a swap_ab example computes C^T
    artifact = cuda.build(source)
    assert artifact.meta["arch"] == "sm_90a" and artifact.data[:4] == b"\x7fELF"
    for entry in source.meta["entries"]:
        res = artifact.meta["resources"][entry]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (entry, res)


@needs_compiler
def test_multistage_sass_has_hmma_and_no_local_memory():
    program = multistage(Problem(4096, 4096, 4096, b_major="col", epilogue=Epilogue(bias="n", activation="gelu")),
                         tile=(128, 256, 32), warps=(2, 4), stages=3)
    report = cuda.kernel_report(cuda.compile_program(program))
    sass, res = report["sass"], report["resources"]["gemm_multistage"]
    # 64x64 warp tile, K32 per stage: 4 x 8 mma per 16-wide k step, 2 steps per tile.
    assert sass["HMMA"] >= 64 and sass["LDSM"] > 0 and sass["LDGSTS"] > 0
    assert sass["HGMMA"] == 0
    assert sass["LDL"] == 0 and sass["STL"] == 0
    assert res["stack_bytes"] == 0 and res["spill_stores"] == 0


@needs_compiler
@pytest.mark.parametrize("scheduler", ["tile", "persistent", "stream_k"])
def test_multistage_wgmma_sass_has_hgmma_from_the_cp_async_ring(scheduler):
    """`instr wgmma`: the ring's copies (LDGSTS) feed HGMMA, with no ldmatrix, no HMMA and no
    local memory, for both majors of B (K-contiguous rows, N-contiguous 64-wide boxes)."""
    for b_major in ("col", "row"):
        program = multistage(Problem(4096, 4096, 4096, b_major=b_major, epilogue=Epilogue(bias="n")),
                             tile=(128, 128, 64), warps=(8, 1), stages=4, scheduler=scheduler, wgmma=True)
        assert diagnose(program) == [] and cuda._family_rules(program) == []
        report = cuda.kernel_report(cuda.compile_program(program))
        sass, res = report["sass"], report["resources"]["gemm_multistage"]
        # one m64n128k16 a 16-deep k step, 4 steps a 64-deep k tile
        assert sass["HGMMA"] >= 4 and sass["LDGSTS"] > 0, sass
        assert sass["HMMA"] == 0 and sass["LDSM"] == 0, sass
        assert sass["LDL"] == 0 and sass["STL"] == 0 and res["spill_stores"] == 0, (sass, res)


def test_multistage_wgmma_rules():
    """What `instr wgmma` asks of a multistage program, each refusal naming the field to change."""
    from gemmgen.backends.cuda import multistage as ms
    base = multistage(Problem(2048, 2048, 2048), tile=(128, 128, 64), warps=(4, 1), stages=4, wgmma=True)
    assert ms.rules(base) == [] and ms.defines(base)["WGMMA"] == 1
    assert ms.smem_bytes(base) == 4 * 32768 + 1024                      # the ring moved up to 1024 bytes
    assert ms.stages_of(replace(base, stages=None)) == 5                 # three k tiles loading ahead
    bad = {
        "warps": replace(base, warps=(2, 2)),                            # not warpgroups
        "instr": replace(base, instr=Instr("wgmma", 64, 64, 16)),        # not the warpgroup's 128 columns
        "tile": replace(base, tile=Tile(128, 128, 32)),                  # not one 128-byte swizzle atom deep
        "stages": replace(base, stages=2),
    }
    for field, program in bad.items():
        assert field in [f for f, _ in ms.rules(program)], (field, ms.rules(program))
    row_b = multistage(Problem(2048, 2048, 2048, b_major="row"), tile=(128, 64, 64), warps=(4, 2), stages=4,
                       wgmma=True)
    assert [f for f, _ in ms.rules(row_b)] == ["tile"]                   # 32 N-contiguous columns: no whole box


def _k_loop(sass_text: str) -> list[str]:
    """The opcodes of the multistage K loop: from the wait on the ring (DEPBAR) to the
    branch that jumps back to it."""
    ins = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)",
                                                    sass_text)]
    jumps = [(int(a, 16), int(t, 16)) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+@?!?P?\w*\s*BRA\s+(0x[0-9a-f]+)",
                                                             sass_text)]
    for start, op in ins:
        if op.startswith("DEPBAR"):
            back = [(a, t) for a, t in jumps if a > start and start - 0x80 <= t <= start]
            if back:
                a_end, target = back[-1]
                return [op for a, op in ins if target <= a <= a_end]
    raise AssertionError("no K loop found in the SASS")


@needs_compiler
def test_multistage_k_loop_is_mostly_tensor_and_copy_instructions():
    """The copies unroll into straight-line code with addresses worked out before the loop:
    a 128x128x64 tile on 2x4 warps issues 64 HMMA, 24 LDSM and 8 LDGSTS per k tile, and at
    most 100 other instructions (before the fix: 789 static instructions, with the
    copies in inner loops)."""
    from gemmgen.backends.cuda.compile import sass
    program = multistage(Problem(128, 12288, 4096), tile=(128, 128, 64), warps=(2, 4), stages=4, swizzle=8)
    artifact = cuda.compile_program(program)
    loop = _k_loop(sass(artifact.data))
    count = {name: sum(1 for op in loop if op.split(".")[0] == name) for name in ("HMMA", "LDSM", "LDGSTS")}
    assert count == {"HMMA": 64, "LDSM": 24, "LDGSTS": 8}, count
    assert len(loop) - sum(count.values()) <= 100, len(loop)
    # every stage's copies are straight-line: the prologue's STAGES-1 stages and the loop's one
    assert cuda.kernel_report(artifact)["sass"]["LDGSTS"] == 4 * 8


def test_space_tries_square_warp_tiles_first_among_ties():
    """Warp layouts of one tile and ring tie in the cost model; they were timed side by
    side, and square warp tiles (the wider in N among equals) were fastest. (wgmma's warpgroups
    stack along M: no layouts to choose between.)"""
    def order(shape, tile):
        from gemmgen.backends.cuda import search_space as cuda_space
        problem = Problem(*shape)
        ranked = cuda_space._round_robin(cuda_space._multistage(problem), problem)
        return [q.warps for q in ranked if q.instr.kind == "mma" and (q.tile.m, q.tile.n) == tile
                and q.split_k == 1][:3]
    assert order((4096, 4096, 4096), (256, 128))[0] == (4, 2)
    assert order((64, 64, 512), (64, 64)) == [(2, 2), (4, 1), (1, 4)]


def test_unordered_split_k_is_one_launch_of_the_arrival_order_kernel():
    """`unordered` and `atomic` build the same kernel (fp32 workspace, the last CTA of a tile
    applies the epilogue): no second reduce kernel, any epilogue."""
    from gemmgen.backends.cuda import multistage as ms
    problem = Problem(256, 256, 4096, epilogue=Epilogue(bias="n", activation="gelu"))
    unordered = multistage(problem, tile=(64, 64, 64), split_k=8, reduce="unordered")
    workspace = multistage(problem, tile=(64, 64, 64), split_k=8, reduce="workspace")
    assert diagnose(unordered) == []
    assert ms.defines(unordered)["SPLIT_ATOMIC"] == 1 and ms.entries(unordered) == (ms.ENTRY,)
    assert ms.defines(workspace)["SPLIT_ATOMIC"] == 0 and ms.entries(workspace) == (ms.ENTRY, ms.REDUCE_ENTRY)
    assert re.search(r"#define SPLIT_ATOMIC\s+1\n", cuda.lower(unordered).text)


def test_hopper_shared_memory_covers_the_epilogue_staging_buffers():
    """The kernel puts 512 bytes per consumer warp after the ring's barriers (16-byte
    aligned, behind a ring aligned to 1 KiB); what the launcher asks for must cover it."""
    from gemmgen.backends.cuda import hopper as hop
    for shape in ((4096, 4096, 4096), (8192, 8192, 8192), (1000, 1000, 1000)):
        for p in cuda.space(Problem(*shape)):
            if p.mainloop == "multistage":
                continue
            s, warps = hop.stages_of(p), hop.consumers(p) * 4
            used = 1023 + s * hop.stage_bytes(p) + 16 * s + 15 + warps * 512
            assert hop.smem_bytes(p) >= used, (p, hop.smem_bytes(p), used)
            assert hop.smem_bytes(p) <= hop.MAX_SMEM


@needs_compiler
def test_small_problems_get_a_two_stage_ring_that_compiles():
    """At 64^3 (one K tile) the space offers the shape Triton measured fastest there: a
    64x64x64 tile, 4x1 warps, 2 stages; it compiles with HMMA and no local memory."""
    problem = Problem(64, 64, 64)
    offered = [(p.tile.m, p.tile.n, p.tile.k, p.warps, p.stages) for p in cuda.space(problem)]
    assert offered[0][4] == 2 and (64, 64, 64, (4, 1), 2) in offered
    program = multistage(problem, tile=(64, 64, 64), warps=(4, 1), stages=2)
    report = cuda.kernel_report(cuda.compile_program(program))
    sass, res = report["sass"], report["resources"]["gemm_multistage"]
    assert sass["HMMA"] >= 32 and sass["LDL"] == 0 and sass["STL"] == 0     # 1 x 8 mma per k16 step, 4 steps
    assert res["spill_stores"] == 0 and res["stack_bytes"] == 0


@needs_compiler
def test_hopper_sass_has_hgmma_tma_and_no_spills():
    program = hopper(Problem(4096, 4096, 4096, b_major="col", epilogue=Epilogue(residual=True)),
                     tile=(128, 256, 64), stages=4, cluster=(2, 1))
    report = cuda.kernel_report(cuda.compile_program(program))
    sass, res = report["sass"], report["resources"]
    assert sass["HGMMA"] > 0, sass
    assert sass["UTMALDG"] > 0, sass
    assert sass["LDL"] == 0 and sass["STL"] == 0
    for entry, r in res.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack_bytes"] == 0, (entry, r)


@needs_compiler
def test_pingpong_compiles_with_hgmma_and_setmaxnreg():
    program = hopper(Problem(4096, 4096, 4096, a_major="col", b_major="row"), tile=(128, 128, 64),
                     mainloop="ws_pingpong", warps=(4, 1), stages=4)
    assert diagnose(program) == []
    report = cuda.kernel_report(cuda.compile_program(program))
    assert report["sass"]["HGMMA"] > 0 and report["sass"]["LDL"] == 0
    assert report["resources"]["gemm_hopper_ws"]["spill_stores"] == 0


@needs_compiler
def test_one_consumer_warpgroup_a_tile_compiles_and_cutlass_refuses_it():
    """`ws_cooperative` with `warps 4x1`: 64-row tiles, twice the CTAs of 128-row ones on a
    skinny weight (x @ W.T at M = 32 over 4096 rows: 64 tiles). Raw CUDA builds it with 256
    threads and no spills; CUTLASS's cooperative kernel needs two warpgroups; three are refused."""
    from gemmgen.backends.cuda import hopper as ws

    program = replace(hopper(Problem(32, 4096, 4096, b_major="col"), tile=(64, 32, 64), warps=(4, 1), stages=8),
                      swap_ab=True)
    assert diagnose(program) == []
    assert ws.geometry(program.computed).threads == 256
    report = cuda.kernel_report(cuda.build(lower(program)))
    assert report["sass"]["HGMMA"] > 0 and report["sass"]["LDL"] == 0
    assert report["resources"]["gemm_hopper_ws"]["spill_stores"] == 0
    assert any("fixes its consumer warps" in d.message for d in diagnose(replace(program, backend="cutlass")))
    three = hopper(Problem(4096, 4096, 4096), tile=(192, 128, 64), warps=(12, 1))
    assert any("1 or 2 consumer warpgroups" in d.message for d in diagnose(three))


@needs_compiler
def test_one_consumer_tile_program_whose_ring_fits_twice_is_built_for_two_ctas_an_sm():
    """Two CTAs of one consumer warpgroup share an SM when both rings fit in its 228 KB: the
    kernel is then built for two (128 registers a thread at launch, so 256 threads x 2 fit the
    register file), and the consumer's raise leaves the producer's given-back registers to it.
    A persistent program (one CTA an SM by design), a larger ring and more accumulators than
    128 registers hold stay at one."""
    from gemmgen.backends.cuda import hopper as ws

    def swapped(stages, scheduler="tile"):
        return replace(hopper(Problem(32, 14336, 4096, b_major="col"), tile=(64, 32, 64), warps=(4, 1),
                              stages=stages, scheduler=scheduler),
                       split_k=2, split_k_reduce=CLUSTER_REDUCE, swap_ab=True)

    two, big, persistent = swapped(8), swapped(10), replace(swapped(8, "persistent"), split_k=1)
    assert [ws.ctas_per_sm(p.computed) for p in (two, big, persistent)] == [2, 1, 1]
    assert 2 * (ws.smem_bytes(two.computed) + 1024) <= 228 * 1024 < 2 * (ws.smem_bytes(big.computed) + 1024)
    defines = ws.defines(two.computed)
    assert defines["CTAS_PER_SM"] == 2
    # the producer gives back 128 x (128 - 40) registers; the consumer takes exactly those
    assert 128 * (defines["CONSUMER_REGS"] - 128) == 128 * (128 - ws.PRODUCER_REGS)
    # a 64x256 tile's 128 accumulators do not fit 128 registers: one CTA, however small its ring
    wide = hopper(Problem(4096, 4096, 4096, b_major="col"), tile=(64, 256, 64), warps=(4, 1), stages=2,
                  scheduler="tile")
    assert 2 * (ws.smem_bytes(wide) + 1024) <= 228 * 1024 and ws.ctas_per_sm(wide) == 1
    for program, regs in ((two, 128), (big, 240), (wide, 240)):
        report = cuda.kernel_report(cuda.build(lower(program)))
        res = report["resources"]["gemm_hopper_ws"]
        assert res["registers"] == regs and res["spill_stores"] == 0 and report["sass"]["LDL"] == 0, res


def test_space_heads_a_batch_of_17_to_64_with_swapped_one_consumer_tiles():
    """Past the direct family's batch, `x @ W.T` leads with 64-row TMA tiles under swap_ab, the
    batch rounded up to the tile's N, K split so the grid first reaches 64 CTAs; a grid past
    the SMs gets a ring that two CTAs an SM can share."""
    from gemmgen.backends.cuda.search_space import SWAPPED_TMA_MAX_M, space, swapped_tma_programs

    def head(m, n, k=4096):
        progs = swapped_tma_programs(Problem(m, n, k, b_major="col"))
        assert all(p.swap_ab and p.warps == (4, 1) and p.tile.m == 64 and not diagnose(p.bind(Problem(
            m, n, k, b_major="col"))) for p in progs)
        return [(p.tile.n, p.split_k, p.scheduler) for p in progs]

    assert head(32, 4096) == [(32, 1, "persistent"), (32, 2, "tile"), (32, 4, "tile")]   # 64 tiles
    # More CTAs than SMs: the deepest ring two CTAs can share an SM with; else the deepest one.
    from gemmgen.backends.cuda import hopper as ws

    def rings(m, n):
        problem = Problem(m, n, 4096, b_major="col")
        return [(p.split_k, p.stages, ws.ctas_per_sm(p.bind(problem).computed))
                for p in swapped_tma_programs(problem)]

    assert rings(32, 4096) == [(1, 10, 1), (2, 10, 1), (4, 8, 2)]
    assert rings(64, 14336) == [(1, 6, 2), (2, 5, 2), (4, 5, 2)] and head(64, 14336)[0][2] == "tile"
    assert head(32, 1024) == [(32, 4, "tile"), (32, 2, "tile"), (32, 1, "persistent")]  # 16 tiles
    assert head(17, 1000, 72)[0] == (32, 1, "persistent")          # unaligned N, K too short to split
    assert [t for t, _, _ in head(64, 4096)] == [64] * 3 and head(33, 6144)[0][0] == 64
    assert head(16, 4096) == [] and head(SWAPPED_TMA_MAX_M + 1, 4096) == []
    assert swapped_tma_programs(Problem(32, 4096, 4096)) == []                   # b=row
    first = space(Problem(32, 4096, 4096, b_major="col"))
    assert [p.swap_ab for p in first[:3]] == [True] * 3 and sum(p.swap_ab for p in first) == 3


@needs_compiler
def test_pingpong_mainloops_take_turns_through_named_barriers():
    """Without turns, the second warpgroup ran ahead into full barriers two phases behind
    (their parity reads as complete) and the kernel faulted on the H200 at 4096^3."""
    from gemmgen.backends.cuda.compile import sass

    def named_barriers(mainloop, warps):
        program = hopper(Problem(4096, 4096, 4096), tile=(128, 128, 64), mainloop=mainloop, warps=warps, stages=5)
        assert diagnose(program) == []
        text = sass(cuda.compile_program(program).data)
        return len(re.findall(r"\bBAR\.ARV\b", text)), len(re.findall(r"\bBAR\.SYNC\b", text))

    arrive, sync = named_barriers("ws_pingpong", (4, 1))
    assert arrive >= 1 and sync >= 2           # __syncthreads, plus the turn's wait
    assert named_barriers("ws_cooperative", (8, 1))[0] == 0


def test_lowering_is_pure_and_carries_every_decision():
    p = multistage(Problem(1000, 1000, 1000, a_major="col", b_major="row", epilogue=Epilogue(bias="m", activation="silu")),
                   tile=(64, 128, 64), warps=(2, 4), stages=5, split_k=2, raster="n", swizzle=4)
    text = cuda.lower(p).text
    assert text == cuda.lower(p).text
    for define in ("BM 64", "BN 128", "BK 64", "WARPS_M 2", "WARPS_N 4", "STAGES 5", "SPLIT_K 2",
                   "A_K_CONTIG 0", "B_K_CONTIG 0", "RASTER_M 0", "SWIZZLE 4", "BIAS_M 1", "ACT_SILU 1"):
        assert "#define " + define.split()[0] in text
        line = next(l for l in text.splitlines() if l.startswith("#define " + define.split()[0] + " "))
        assert line.split()[-1] == define.split()[-1], line
    other = multistage(p.problem, tile=(64, 128, 64), warps=(2, 4), stages=4, split_k=2, raster="n", swizzle=4)
    assert cuda.lower(other).digest != cuda.lower(p).digest


def test_validator_refuses_misaligned_cp_async_rows_with_a_location():
    text = "\n".join([
        "gemm 1000x1001x512 a=row b=row c=row in=f16 acc=f32", "epilogue out=f16", "backend cuda",
        "tile 128x128x32", "warps 2x2", "instr mma 16x8x16", "cluster 1x1", "stages 4", "mainloop multistage",
        "scheduler tile", "raster m swizzle=8", "smem_swizzle auto", "split_k 1"])
    found = diagnose(parse(text, filename="bad.gemm"))
    msgs = [d for d in found if "multiple of 8" in d.message]
    assert msgs and msgs[0].line == 1, found


def test_validator_refuses_unaligned_tma_rows_with_a_location():
    text = "\n".join([
        "gemm 1001x4096x4096 a=col b=row c=row in=f16 acc=f32", "epilogue out=f16", "backend cuda",
        "tile 128x128x64", "warps 8x1", "instr wgmma 64x128x16", "cluster 1x1", "stages 4",
        "mainloop ws_cooperative", "scheduler persistent", "raster m swizzle=8", "smem_swizzle 128", "split_k 1"])
    found = diagnose(parse(text, filename="tma.gemm"))
    assert any("M=1001" in d.message and d.line > 0 for d in found), found


@pytest.mark.parametrize("majors", [("col", "row"), ("row", "row")])
def test_hopper_mn_contiguous_operands_lower_with_the_transpose_bits(majors):
    a_major, b_major = majors
    p = hopper(Problem(4096, 4096, 4096, a_major=a_major, b_major=b_major), tile=(128, 256, 64), stages=4)
    assert cuda._family_rules(p) == []
    text = cuda.lower(p).text
    assert f"p, 1, 1, {int(a_major == 'col')}, {int(b_major == 'row')};" in text


@pytest.mark.parametrize("change, field, words", [
    (dict(tile=(128, 128, 256)), "tile", "tile K must be 32, 64 or 128"),
    (dict(tile=(128, 256, 32), warps=(2, 2)), "warps", "accumulators"),
    (dict(stages=5, tile=(128, 256, 64), warps=(2, 4)), "stages", "shared memory"),
])
def test_multistage_rules_refuse_what_the_template_cannot_build(change, field, words):
    p = multistage(Problem(4096, 4096, 4096), **change)
    found = cuda._family_rules(p)
    assert any(f == field and words in m for f, m in found), found
    with pytest.raises(cuda.BackendError):
        cuda.lower(p)


def test_space_is_ranked_valid_and_bounded():
    for shape in ((4096, 4096, 4096), (256, 256, 8192), (1000, 1000, 1000), (16, 4096, 4096)):
        problem = Problem(*shape, b_major="col")
        programs = cuda.space(problem)
        assert 10 <= len(programs) <= 40
        for p in programs:
            assert p.backend == "cuda" and not cuda._family_rules(p), p
            assert diagnose(p) == [], (p, diagnose(p))
        if shape == (256, 256, 8192):
            assert any(p.split_k > 1 for p in programs[:5])
        if shape == (4096, 4096, 4096):
            assert {p.mainloop for p in programs} == {"multistage", "ws_cooperative", "ws_pingpong"}


def test_random_cases_are_valid_programs():
    programs = random_multistage(24)
    assert sum(1 for p in programs if cuda._family_rules(p) == [] and diagnose(p) == []) >= 20
    assert {p.problem.a_major for p in programs} == {"row", "col"}
    assert any(p.split_k > 1 for p in programs) and any(p.problem.m % 8 for p in programs)


def test_persistent_multistage_rules_launch_and_shared_memory():
    """`scheduler persistent` in the multistage family: whole K sums only (no split-K); one wave
    of CTAs at most; 512 bytes a warp past the ring for the stores, since the ring holds the
    next tile's loads."""
    from gemmgen.backends.cuda import multistage as ms
    problem = Problem(16384, 2048, 64)
    tile = multistage(problem, tile=(128, 128, 64), warps=(2, 2), stages=3)
    persistent = replace(tile, scheduler="persistent")
    assert ms.rules(persistent) == [] and diagnose(persistent) == []
    assert ms.smem_bytes(persistent) == ms.smem_bytes(tile) + 4 * 512 == 3 * 32768 + 2048
    assert ms.defines(persistent)["PERSISTENT"] == 1 and ms.defines(tile)["PERSISTENT"] == 0
    long_k = replace(persistent, problem=Problem(16384, 2048, 4096), split_k=2)
    assert [f for f, _ in ms.rules(long_k)] == ["scheduler"]
    assert ms.grid_size(ms.geometry(persistent), 16384, 2048, 64, wave=264) == 264
    assert ms.grid_size(ms.geometry(persistent), 256, 256, 64, wave=264) == 4          # fewer tiles than the wave
    assert ms.grid_size(ms.geometry(tile), 16384, 2048, 64, wave=264) == 128 * 16       # one CTA a tile


def test_stream_k_multistage_rules_grid_and_shared_memory():
    """`scheduler stream_k` in the multistage family: no split-K on top, warp tiles of at most 64
    accumulators a thread (a 64x64 warp tile spilled), stores staged past the ring as when
    persistent; one wave of CTAs, each at least STREAM_K_MIN_ITERS k tiles."""
    from gemmgen.backends.cuda import multistage as ms
    from gemmgen.backends.cuda.launch import STREAM_K_MIN_ITERS
    problem = Problem(512, 2048, 2048)
    sk = multistage(problem, tile=(64, 128, 64), warps=(2, 2), stages=3, scheduler="stream_k")
    assert ms.rules(sk) == [] and diagnose(sk) == []
    assert ms.defines(sk)["STREAM_K"] == 1 and ms.defines(sk)["PERSISTENT"] == 0
    assert ms.smem_bytes(sk) == 3 * (64 + 128) * 64 * 2 + 4 * 512
    assert [f for f, _ in ms.rules(replace(sk, split_k=2))] == ["scheduler"]
    assert [f for f, _ in ms.rules(replace(sk, tile=Tile(128, 128, 64)))] == ["warps"]
    geo = ms.geometry(sk)
    assert ms.grid_size(geo, 512, 2048, 2048, wave=396) == 396            # 128 tiles x 32 k tiles
    assert ms.grid_size(geo, 64, 128, 256, wave=396) == 1                  # 4 k tiles: one CTA
    assert ms.grid_size(geo, 64, 128, 2048, wave=396) == 32 // STREAM_K_MIN_ITERS


def test_space_offers_stream_k_where_tiles_fill_under_four_waves():
    from gemmgen.backends.cuda import search_space as cuda_space
    def schedulers(shape):
        return {q.scheduler for q in cuda_space._multistage(Problem(*shape))}
    assert "stream_k" in schedulers((512, 2048, 2048))
    assert "stream_k" not in schedulers((8192, 8192, 8192))       # 64x64 tiles: 16,384 of them
    assert "stream_k" not in schedulers((4096, 4096, 256))        # K of 4 k tiles
    # The model spreads stream-K's iterations over the SMs: at 4 tiles of 128x128, one CTA a
    # tile leaves 128 SMs idle.
    tile = multistage(Problem(256, 256, 8192), tile=(128, 128, 64), warps=(4, 2), stages=3)
    assert cuda_space.estimate_seconds(replace(tile, scheduler="stream_k"), tile.problem) < \
        cuda_space.estimate_seconds(tile, tile.problem) / 4


@needs_compiler
@pytest.mark.parametrize("scheduler, k, tile, hmma", [("persistent", 72, (128, 128, 64), 128),
                                                      ("stream_k", 1000, (64, 128, 64), 64)])
def test_walking_multistage_compiles_with_hmma_and_no_spills(scheduler, k, tile, hmma):
    """The CTAs that walk tiles (persistent, stream-K) keep the K loop's HMMAs and spill nothing."""
    program = multistage(Problem(4097, 2055, k, b_major="col", epilogue=Epilogue(bias="n", activation="gelu")),
                         tile=tile, warps=(2, 2), stages=3, scheduler=scheduler)
    report = cuda.kernel_report(cuda.compile_program(program))
    sass, res = report["sass"], report["resources"]["gemm_multistage"]
    assert sass["HMMA"] >= hmma and sass["LDGSTS"] > 0 and sass["LDL"] == 0 and sass["STL"] == 0
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0


def test_space_offers_persistent_twins_only_where_tiles_outnumber_the_sms():
    from gemmgen.backends.cuda.search_space import space

    def schedulers(shape):
        return {q.scheduler for q in space(Problem(*shape), limit=400) if q.mainloop == "multistage"}
    assert schedulers((16384, 2048, 64)) == {"tile", "persistent"}
    assert "persistent" not in schedulers((256, 256, 4096))
    # no k tile twice as deep as K: at K=64 the 128-deep tiles would load half zeros
    assert all(q.tile.k <= 64 for q in space(Problem(16384, 2048, 64), limit=400) if q.mainloop == "multistage")
