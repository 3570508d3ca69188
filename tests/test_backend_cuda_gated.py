"""CPU tests of the raw CUDA backend's gated epilogue (`epilogue gate=ACT halves=stacked`):
out = gate(A B_gate) * (A B_up) over a joined B of K x 2N, in the multistage family and the TMA
family (ws_cooperative, ws_pingpong).

Gated programs validate, lower with both halves in one B tile, and compile to sm_90a with twice
the tensor-core instructions of the plain program and no local memory; what the backend cannot
build (the direct mainloop, walking schedulers and split-K in multistage, accumulators past a
thread's registers, anything beside the gate in the epilogue, unaligned 16-byte rows) is
refused with what to change; the search space offers only programs that validate. The numbers
are checked on the GPU: tests/test_gated_gpu.py.
"""
from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from gemmgen.backends import cuda, diagnose
from gemmgen.backends.base import BackendError
from gemmgen.backends.cuda import multistage as ms
from gemmgen.backends.cuda.compile import nvrtc_usable
from gemmgen.dsl import examples, parse
from gemmgen.dsl.ir import Epilogue, Instr, Problem

from cuda_backend_cases import define, hopper, joined, multistage

needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None and not nvrtc_usable(),
                                    reason="needs nvcc or NVRTC to compile CUDA C")


def gated(m=17, n=2999, k=4104, b="col", gate="silu", out="f16", **epilogue) -> Problem:
    return Problem(m, n, k, b_major=b, epilogue=Epilogue(gate=gate, halves="stacked", out_dtype=out, **epilogue))


def test_the_cuda_backend_declares_the_gated_epilogue():
    assert cuda.SUPPORT.gated


# (problem, program options): mma.sync on both majors of B, wgmma on both, a tile of 16-wide warps
LOWERED = [
    (gated(), dict(tile=(64, 64, 64), warps=(2, 2), stages=3)),
    (gated(n=3000, b="row", gate="gelu", out="bf16"), dict(tile=(128, 64, 32), warps=(2, 2), stages=4)),
    (gated(m=100), dict(tile=(64, 128, 64), warps=(4, 1), stages=4, wgmma=True)),
    (gated(m=100, n=4096, b="row", gate="relu", out="f32"), dict(tile=(64, 128, 64), warps=(4, 1), stages=3,
                                                                 wgmma=True)),
    (gated(m=3), dict(tile=(32, 32, 64), warps=(2, 2), stages=4)),
]


@pytest.mark.parametrize("problem, options", LOWERED, ids=range(len(LOWERED)))
def test_gated_programs_validate_and_lower_both_halves(problem, options):
    program = multistage(problem, **options)
    assert diagnose(program) == [] and cuda._family_rules(program) == []
    text = cuda.lower(program).text
    e = problem.epilogue
    for name, value in (("GATED", 1), ("GATE_SILU", int(e.gate == "silu")), ("GATE_GELU", int(e.gate == "gelu")),
                        ("GATE_RELU", int(e.gate == "relu")), ("BN", program.tile.n), ("SPLIT_K", 1)):
        assert define(text, name) == str(value), name
    # the B tile is the gate's tile N columns, then the up's: twice the plain program's ring
    plain = replace(program, problem=replace(problem, epilogue=Epilogue(out_dtype=e.out_dtype)))
    t = program.tile
    assert ms.smem_per_stage(program) == (t.m + 2 * t.n) * t.k * 2
    assert ms.smem_per_stage(program) - ms.smem_per_stage(plain) == t.n * t.k * 2
    assert define(cuda.lower(plain).text, "GATED") == "0"


@needs_compiler
@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_gated_programs_compile_to_sm90a_with_twice_the_tensor_core_work(index):
    """The gated kernel issues the plain kernel's tensor-core instructions twice (gate and up
    halves of B), spills nothing and keeps no local memory."""
    problem, options = LOWERED[index]
    program = multistage(problem, **options)
    plain = replace(program, problem=replace(problem, epilogue=Epilogue(out_dtype=problem.epilogue.out_dtype)))
    reports = [cuda.kernel_report(cuda.compile_program(p)) for p in (program, plain)]
    op = "HGMMA" if ms.wgmma(program) else "HMMA"
    (sass, res), (plain_sass, _) = [(r["sass"], r["resources"]["gemm_multistage"]) for r in reports]
    assert sass[op] == 2 * plain_sass[op] > 0, (sass[op], plain_sass[op])
    assert sass["LDGSTS"] > 0 and sass["LDL"] == 0 and sass["STL"] == 0, sass
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack_bytes"] == 0, res


def test_accumulators_and_shared_memory_count_both_halves():
    # 128x128 on 2x2 warps: a 64x64 warp tile holds 128 fp32 accumulators, 256 with gate and up
    big = multistage(gated(n=4096, k=4096), tile=(128, 128, 64), warps=(2, 2), stages=3)
    assert any(f == "warps" and "256 fp32 accumulators (gate and up)" in m for f, m in cuda._family_rules(big))
    assert not cuda._family_rules(replace(big, warps=(2, 4)))            # 128 a thread: builds
    deep = multistage(gated(n=4096, k=4096), tile=(128, 128, 64), warps=(2, 4), stages=5)
    assert any(f == "stages" and "gate and up" in m for f, m in cuda._family_rules(deep))  # 5 x 48 KiB


# (what changes, the statement refused, words of the message): each names what to write instead
REFUSED = [
    (lambda p: replace(p, mainloop="direct"), "mainloop", "mainloop multistage"),
    # the TMA family: a tile whose gate and up accumulators pass 128 a thread
    (lambda p: hopper(p.problem, tile=(128, 256, 64)), "tile", "(gate and up)"),
    (lambda p: hopper(p.problem, tile=(128, 128, 64), mainloop="ws_pingpong", warps=(4, 1)), "tile",
     "(gate and up)"),
    (lambda p: replace(hopper(p.problem), problem=replace(p.problem, epilogue=replace(p.problem.epilogue,
                                                                                      bias="n"))), "epilogue", "bias"),
    (lambda p: replace(p, scheduler="persistent"), "scheduler", "scheduler tile"),
    (lambda p: replace(p, scheduler="stream_k"), "scheduler", "scheduler tile"),
    (lambda p: replace(p, split_k=2), "split_k", "split_k 1"),
    (lambda p: replace(p, split_k=4, split_k_reduce="unordered"), "split_k", "split_k 1"),
    (lambda p: replace(p, problem=replace(p.problem, epilogue=replace(p.problem.epilogue, bias="n"))), "epilogue",
     "bias"),
    (lambda p: replace(p, problem=replace(p.problem, epilogue=replace(p.problem.epilogue, residual=True))),
     "epilogue", "residual"),
    (lambda p: replace(p, problem=replace(p.problem, epilogue=replace(p.problem.epilogue, beta=1.0))), "epilogue",
     "beta"),
    (lambda p: replace(p, problem=replace(p.problem, k=4097)), "gemm", "K to be a multiple of 8"),
    (lambda p: replace(p, problem=replace(p.problem, b_major="row")), "gemm", "N to be a multiple of 8"),
]


@pytest.mark.parametrize("change, statement, words", REFUSED, ids=range(len(REFUSED)))
def test_what_the_backend_cannot_build_is_refused_with_what_to_change(change, statement, words):
    base = multistage(gated(), tile=(64, 64, 64), warps=(2, 2), stages=3)
    assert diagnose(base) == []
    program = change(base)
    found = [(d.statement, d.message) for d in diagnose(program)]
    assert any(s == statement and words in m for s, m in found), found
    with pytest.raises(BackendError):
        cuda.lower(program)


def test_swap_ab_of_a_gated_program_is_refused():
    program = replace(multistage(gated(), tile=(64, 64, 64), warps=(2, 2), stages=3), swap_ab=True)
    assert any(d.statement == "swap_ab" for d in diagnose(program))


def test_the_launcher_wants_the_joined_b():
    """B is K x 2N (the gate half, then the up half), out M x N: a B of N columns is refused."""
    torch = pytest.importorskip("torch")
    from gemmgen.backends.cuda.launch import OperandCheck

    program = multistage(gated(m=17, n=64, k=128), tile=(64, 64, 64), warps=(2, 2), stages=3)
    check = OperandCheck(program)
    a, out = torch.zeros(17, 128, dtype=torch.float16), torch.zeros(17, 64, dtype=torch.float16)
    w = torch.zeros(128, 128, dtype=torch.float16)                    # cat([W_gate, W_up]): 2N x K
    assert check.operands(a, w.t(), out) == (17, 64, 128, 128, 128)   # ld_b = K, col-major
    with pytest.raises(BackendError, match="2N"):
        check.operands(a, w[:64].t(), out)


def test_a_gated_call_takes_no_alpha():
    """The language refuses alpha beside a gate; a call's alpha= would scale the gated product
    behind the program's back, so the launcher refuses it too."""
    torch = pytest.importorskip("torch")
    from gemmgen.backends.cuda.launch import EpilogueArgs, OperandCheck

    check = OperandCheck(multistage(gated(m=17, n=64, k=128), tile=(64, 64, 64), warps=(2, 2), stages=3))
    out = torch.zeros(17, 64, dtype=torch.float16)
    check.epilogue(EpilogueArgs(), out, None, None, None, 1.0, 0.0)
    with pytest.raises(BackendError, match="without alpha="):
        check.epilogue(EpilogueArgs(), out, None, None, None, 2.0, 0.0)


def test_the_joined_b_columns_count_against_the_int32_limit():
    program = multistage(gated(m=64, n=2**30, k=64), tile=(64, 64, 64), warps=(2, 2), stages=3)
    assert any("2N + tile N" in m for f, m in cuda._family_rules(program))


@pytest.mark.parametrize("shape", [(1, 14336, 4096), (17, 2999, 4104), (100, 1000, 72), (4096, 14336, 4096),
                                   (64, 64, 64)])
@pytest.mark.parametrize("b", ["col", "row"])
def test_space_offers_only_valid_gated_programs(shape, b):
    problem = gated(*shape, b=b)
    programs = cuda.space(problem)
    if b == "row" and shape[1] % 8:
        assert programs == []       # the up half of each row would start off 16-byte alignment
        return
    assert 10 <= len(programs) <= 40
    for p in programs:
        assert p.problem == problem and p.split_k == 1, p
        assert p.scheduler == ("tile" if p.mainloop == "multistage" else "persistent"), p
        assert diagnose(p) == [], (p, diagnose(p))
    # the TMA family's gated tiles, 128 x 128 on two warpgroups or a ping-pong warpgroup's 64 x 128 or
    # 128 x 64, where every row is 16-byte aligned
    tma = [p for p in cuda.space(problem, limit=400) if p.mainloop != "multistage"]
    assert {(p.mainloop, p.tile.m, p.tile.n) for p in tma} <= {("ws_cooperative", 128, 128),
                                                               ("ws_pingpong", 64, 128), ("ws_pingpong", 128, 64)}
    assert bool(tma) == (shape[1] % 8 == 0 and shape[2] % 8 == 0), [p.tile for p in tma]
    assert {p.instr.kind for p in cuda.space(problem, limit=400)} == ({"mma", "wgmma"} if shape[2] > 32 else {"mma"})
    if shape[0] <= 32:   # a few rows (decode): 16-row tiles, which measured fastest at 16x14336x4096
        assert any(p.tile.m == 16 for p in programs[:8]), [p.tile for p in programs[:8]]


def test_the_gated_example_is_a_cuda_multistage_program():
    program = parse(examples()["cuda_gated_silu"].read_text())
    assert program.backend == "cuda" and program.problem.epilogue.gate == "silu"
    assert diagnose(program) == [] and cuda._family_rules(program) == []


@pytest.mark.parametrize("b", ["col", "row"])
def test_a_gated_tma_program_loads_the_up_half_from_row_n_of_b(b):
    """ws_cooperative 128 x 128 gated: each stage holds A, the gate's B tile and the up's (from N
    on in B's one tensor map over 2N), and 128 accumulators a thread, gate and up."""
    from gemmgen.backends.cuda import hopper as hop

    program = hopper(gated(m=2048, n=14336 if b == "col" else 3000, k=4096, b=b))
    assert diagnose(program) == [] and cuda._family_rules(program) == []
    text = cuda.lower(program).text
    assert define(text, "GATED") == "1" and "N + tn * BN" in text and "acc_up" in text
    plain = replace(program, problem=replace(program.problem, epilogue=Epilogue()))
    assert hop.stage_bytes(program) - hop.stage_bytes(plain) == 128 * 64 * 2
    assert hop.acc_per_thread(program) == 2 * hop.acc_per_thread(plain) == 128


@needs_compiler
def test_a_gated_tma_program_compiles_with_twice_the_wgmma_and_no_spills():
    program = hopper(gated(m=2048, n=14336, k=4096))
    plain = replace(program, problem=replace(program.problem, epilogue=Epilogue()))
    (sass, res), (plain_sass, _) = [(r["sass"], r["resources"]["gemm_hopper_ws"])
                                    for r in (cuda.kernel_report(cuda.compile_program(p)) for p in (program, plain))]
    assert sass["HGMMA"] == 2 * plain_sass["HGMMA"] > 0, (sass["HGMMA"], plain_sass["HGMMA"])
    assert sass["LDL"] == 0 and sass["STL"] == 0, sass
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack_bytes"] == 0, res


@pytest.mark.parametrize("b", ["col", "row"])
def test_one_wgmma_may_span_the_gate_and_the_up_columns(b):
    """instr 64x256x16 on a 128-wide gated tile: the warpgroup's gate rows and up rows lie one after
    the other in a stage, so one instruction reads both (A once); its accumulator's first half is
    the gate's, its second the up's, of the same output columns."""
    from gemmgen.backends.cuda import hopper as hop

    program = joined(hopper(gated(m=2048, n=14336 if b == "col" else 3000, k=4096, b=b), cluster=(2, 1)))
    assert diagnose(program) == [] and cuda._family_rules(program) == []
    assert hop.joins_halves(program) and hop.out_n(program) == 128
    text = cuda.lower(program).text
    assert define(text, "JOINED_HALVES") == "1" and define(text, "INSTR_N") == "128"
    assert "m64n256k16" in text and "float (&d)[128]" in text
    assert hop.acc_per_thread(program) == 128 and hop.stage_bytes(program) == hop.stage_bytes(hopper(program.problem))
    split = hopper(program.problem, cluster=(2, 1))
    assert not hop.joins_halves(split) and define(cuda.lower(split).text, "JOINED_HALVES") == "0"


# (program, statement, words): where one instruction over both halves cannot go
JOINED_REFUSED = [
    # not gated: the instruction is wider than the warpgroup's columns (the language's rule)
    (lambda: joined(hopper(Problem(2048, 4096, 4096, b_major="col"))), "tile", "instruction's N=256"),
    # two warpgroups along N: each one's gate and up columns are not side by side in a stage
    (lambda: replace(hopper(gated(m=2048, n=4096, k=4096), warps=(4, 2)), instr=Instr("wgmma", 64, 128, 16)),
     "instr", "one consumer warpgroup along N"),
    # the multistage family issues one wgmma per warpgroup's columns
    (lambda: replace(multistage(gated(m=100), tile=(64, 128, 64), warps=(4, 1), stages=4, wgmma=True),
                     instr=Instr("wgmma", 64, 256, 16)), "instr", "write `instr wgmma 64x128x16`"),
]


@pytest.mark.parametrize("make, statement, words", JOINED_REFUSED, ids=range(len(JOINED_REFUSED)))
def test_one_wgmma_over_both_halves_is_refused_where_it_cannot_run(make, statement, words):
    found = [(d.statement, d.message) for d in diagnose(make())]
    assert any(s == statement and words in m for s, m in found), found


def test_the_space_offers_gated_tma_programs_both_ways():
    programs = cuda.space(gated(m=2048, n=14336, k=4096), limit=400)
    tma = [p for p in programs if p.mainloop == "ws_cooperative"]
    assert {p.instr.n for p in tma} == {128, 256}
    assert sum(p.instr.n == 256 for p in tma) == sum(p.instr.n == 128 for p in tma)
    assert all(diagnose(p) == [] for p in tma)
    # ping-pong: each warpgroup's whole tile, 64 x 128 or 128 x 64, one wgmma over both halves or one each
    pingpong = {(p.tile.m, p.tile.n, p.instr.n) for p in programs if p.mainloop == "ws_pingpong"}
    assert pingpong == {(64, 128, 256), (64, 128, 128), (128, 64, 128), (128, 64, 64)}, pingpong
    assert all(diagnose(p) == [] for p in programs if p.mainloop == "ws_pingpong")


# ping-pong gated tiles: (tile, wgmma N), with the 128 accumulators a thread the two halves take
GATED_PINGPONG = [((64, 128, 64), 256), ((64, 128, 64), 128), ((128, 64, 64), 128), ((128, 64, 64), 64)]


@pytest.mark.parametrize("tile, n", GATED_PINGPONG, ids=[f"{t[0]}x{t[1]}-n{n}" for t, n in GATED_PINGPONG])
def test_a_gated_pingpong_program_lowers_with_both_halves(tile, n):
    from gemmgen.backends.cuda import hopper as hop

    program = replace(hopper(gated(m=2048, n=14336, k=4096), tile=tile, mainloop="ws_pingpong", warps=(4, 1)),
                      instr=Instr("wgmma", 64, n, 16))
    assert diagnose(program) == [] and cuda._family_rules(program) == []
    assert hop.acc_per_thread(program) == 128 and hop.consumers(program) == 2
    text = cuda.lower(program).text
    assert define(text, "PINGPONG") == "1" and define(text, "GATED") == "1"
    assert define(text, "JOINED_HALVES") == str(int(n == 2 * tile[1]))


@needs_compiler
@pytest.mark.parametrize("tile, n", GATED_PINGPONG[:3:2], ids=["64x128-n256", "128x64-n128"])
def test_a_gated_pingpong_program_compiles_without_spills(tile, n):
    from gemmgen.backends.cuda import hopper as hop

    program = replace(hopper(gated(m=2048, n=14336, k=4096), tile=tile, mainloop="ws_pingpong", warps=(4, 1)),
                      instr=Instr("wgmma", 64, n, 16))
    report = cuda.kernel_report(cuda.compile_program(program))
    sass, res = report["sass"], report["resources"][hop.ENTRY]
    assert sass["HGMMA"] > 0 and sass["LDL"] == 0 and sass["STL"] == 0, sass
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack_bytes"] == 0, res


@needs_compiler
def test_one_wgmma_over_both_halves_compiles_with_the_plain_programs_wgmma_count():
    from gemmgen.backends.cuda import hopper as hop

    program = joined(hopper(gated(m=2048, n=14336, k=4096)))
    plain = replace(hopper(program.problem), problem=replace(program.problem, epilogue=Epilogue()))
    (sass, res), (plain_sass, _) = [(r["sass"], r["resources"][hop.ENTRY])
                                    for r in (cuda.kernel_report(cuda.compile_program(p)) for p in (program, plain))]
    assert sass["HGMMA"] == plain_sass["HGMMA"] > 0, (sass["HGMMA"], plain_sass["HGMMA"])
    assert sass["LDL"] == 0 and sass["STL"] == 0, sass
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack_bytes"] == 0, res
