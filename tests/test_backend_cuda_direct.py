"""CPU tests of the raw CUDA backend's direct family: its programs lower and compile for sm_90a
with mma.sync fed by plain 16-byte loads (no shared-memory ring, no spills), its rules refuse
what the template cannot build with located messages, and the search space offers it only
where it can win (a small batch of `x @ W.T`)."""
from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from gemmgen.backends import cuda, diagnose, lower
from gemmgen.backends.cuda import direct
from gemmgen.backends.cuda.compile import nvrtc_usable
from gemmgen.backends.cuda.search_space import DIRECT_MAX_M, direct_programs, space
from gemmgen.dsl import parse, to_text
from gemmgen.dsl.ir import Epilogue, Instr, Problem, Program, Tile

needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None and not nvrtc_usable(),
                                    reason="needs nvcc or NVRTC to compile CUDA C")


def _program(m=1, n=4096, k=4096, *, tile=(64, 8, 64), warps=(4, 1), stages=4, split=4, swap=True,
             epilogue=Epilogue(), a="row", b="col", reduce="unordered") -> Program:
    return Program(problem=Problem(m, n, k, a_major=a, b_major=b, epilogue=epilogue), backend="cuda",
                   tile=Tile(*tile), warps=warps, mainloop="direct", instr=Instr("mma", 16, 8, 16), stages=stages,
                   scheduler="tile", split_k=split, split_k_reduce=reduce if split > 1 else "workspace",
                   swap_ab=swap)


@needs_compiler
@pytest.mark.parametrize("program", [
    _program(),
    _program(16, 14336, 4096, tile=(32, 16, 32), warps=(2, 1), stages=8, split=1),
    _program(3, 2999, 4104, tile=(128, 8, 128), warps=(8, 1), stages=2, split=8,
             epilogue=Epilogue(alpha=2.0, beta=0.5, bias="n", activation="gelu", residual=True)),
    _program(100, 1000, 72, tile=(16, 32, 32), warps=(1, 2), stages=2, split=1, swap=False),
    _program(reduce="cluster", split=8),
    _program(3, 2999, 4104, tile=(128, 16, 64), warps=(8, 1), stages=2, split=4, reduce="cluster",
             epilogue=Epilogue(alpha=2.0, beta=0.5, bias="n", activation="gelu", residual=True)),
], ids=["decode", "batch16", "every_epilogue", "unswapped", "cluster_decode", "cluster_every_epilogue"])
def test_direct_programs_compile_to_mma_from_plain_loads(program):
    assert diagnose(program) == []
    artifact = cuda.build(lower(program))
    report = cuda.kernel_report(artifact)
    sass, res = report["sass"], report["resources"][direct.ENTRY]
    assert sass["HMMA"] > 0 and sass["LDSM"] == 0 and sass["LDGSTS"] == 0 and sass["HGMMA"] == 0
    assert sass["LDL"] == 0 and sass["STL"] == 0
    assert res["spill_stores"] == 0 and res["stack_bytes"] == 0


def test_swap_ab_stores_the_transpose_with_the_callers_bias_axis():
    """Under swap_ab the kernel computes C^T (c=col) and stores it as the caller's row-major C,
    so its epilogue's bias runs along the stored matrix's columns, the caller's N."""
    program = _program(epilogue=Epilogue(bias="n"))
    assert "#define STORE_T 1" in " ".join(lower(program).text.split())
    defines = direct.defines(program.computed)
    assert defines["STORE_T"] == 1 and defines["BIAS_N"] == 1 and defines["BIAS_M"] == 0
    unswapped = direct.defines(_program(swap=False, epilogue=Epilogue(bias="n")))
    assert unswapped["STORE_T"] == 0 and unswapped["BIAS_N"] == 1


@pytest.mark.parametrize("change, field, words", [
    (dict(a="col"), "gemm", "a=row b=col"),
    (dict(k=4100), "gemm", "multiple of 8"),
    (dict(stages=8, tile=(64, 8, 128)), "stages", "registers a thread"),
    (dict(tile=(64, 8, 48)), "tile", "32, 64 or 128"),
    (dict(warps=(3, 1), tile=(48, 8, 64)), "warps", "1, 2, 4 or 8 warps"),
    (dict(tile=(64, 64, 64), warps=(1, 1), stages=1), "tile", "fp32 accumulators"),
])
def test_direct_rules_refuse_what_the_template_cannot_build(change, field, words):
    program = _program(**change)
    found = [d for d in diagnose(program) if words in d.message]
    assert found and found[0].statement == field, diagnose(program)


def test_direct_split_k_takes_the_one_launch_reduction_with_a_located_message():
    text = to_text(_program()).replace("split_k 4 unordered", "split_k 4 workspace")
    found = diagnose(parse(text))
    assert found and "split_k 4 unordered" in found[0].message and found[0].line > 0


def test_a_cluster_split_sums_in_shared_memory_with_no_workspace():
    program = _program(reduce="cluster", split=8)
    assert diagnose(program) == []
    defines = direct.defines(program.computed)
    assert defines["SPLIT_CLUSTER"] == 1 and defines["SPLIT_K"] == 8
    assert direct.defines(_program().computed)["SPLIT_CLUSTER"] == 0
    geometry = direct.geometry(program.computed)
    assert geometry.cluster_split and not direct.geometry(_program().computed).cluster_split


@needs_compiler
def test_a_cluster_split_compiles_to_cluster_barriers_and_no_atomics():
    artifact = cuda.build(lower(_program(reduce="cluster", split=8)))
    report = cuda.kernel_report(artifact)
    sass, res = report["sass"], report["resources"][direct.ENTRY]
    assert sass["HMMA"] > 0 and sass["LDL"] == 0 and sass["STL"] == 0 and res["spill_stores"] == 0
    assert res["smem_static"] == 64 * 8 * 4           # one fp32 partial tile, no counter
    assert sass["ATOMG"] == 0 and sass["UCGABAR_ARV"] == 2       # parked, then read by the peers
    arrival = cuda.kernel_report(cuda.build(lower(_program())))["sass"]
    assert arrival["ATOMG"] > 0 and arrival["UCGABAR_ARV"] == 0


@pytest.mark.parametrize("change, words", [
    (dict(split=16), "a cluster holds at most 8 CTAs"),
    (dict(cluster=(2, 1)), "write `cluster 1x1`"),
    (dict(mainloop="ws_pingpong", swap_ab=False, tile=Tile(128, 64, 64), warps=(4, 1), stages=4,
          instr=Instr("wgmma", 64, 64, 16), smem_swizzle=128),
     "in mainloops direct, multistage, ws_cooperative"),
    (dict(backend="triton", mainloop="multistage", tile=Tile(64, 64, 64), warps=(2, 2), stages=3, instr=None),
     "cannot reduce split-K by cluster"),
])
def test_a_cluster_split_is_refused_where_it_cannot_run(change, words):
    change = dict(change)
    program = _program(reduce="cluster", split=change.pop("split", 4), swap=change.pop("swap_ab", True))
    found = [d for d in diagnose(replace(program, **change)) if words in d.message]
    assert found and found[0].statement == "split_k", diagnose(replace(program, **change))


def test_space_alternates_the_two_ways_of_summing_k_slices_the_clusters_first():
    progs = direct_programs(Problem(8, 1024, 4096, b_major="col"))
    ways = [p.split_k_reduce for p in progs[:6]]
    assert ways == ["cluster", "unordered"] * 3
    assert all(p.split_k <= 8 for p in progs if p.split_k_reduce == "cluster")


def test_other_cuda_families_still_refuse_a_column_major_output():
    program = replace(_program(), mainloop="multistage", swap_ab=True, tile=Tile(64, 64, 64), warps=(2, 2),
                      stages=3, split_k=1, split_k_reduce="workspace")
    assert any("writes row-major outputs only" in d.message for d in diagnose(program))


def test_space_offers_direct_programs_only_for_a_small_batch_of_x_at_w_t():
    small = Problem(4, 4096, 4096, b_major="col")
    progs = direct_programs(small)
    assert progs and all(p.swap_ab and p.mainloop == "direct" and not diagnose(p.bind(small)) for p in progs)
    first = space(small)
    assert first[0].mainloop == "direct" and sum(p.mainloop == "direct" for p in first) == len(first) // 2
    assert direct_programs(Problem(DIRECT_MAX_M + 1, 4096, 4096, b_major="col")) == []
    assert direct_programs(Problem(4, 4096, 4096)) == []                       # b=row: W is not K-contiguous
    assert direct_programs(Problem(4, 4096, 4096, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked"))) == []


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (8, 1024, 4096), (16, 512, 3584)])
def test_space_ranks_a_grid_of_a_few_ctas_an_sm_first(shape):
    # about 2 CTAs an SM for a cluster sum (32-row tiles, 256 CTAs, led on the H100's small
    # weights), about 4 for an arrival-order one
    problem = Problem(*shape, b_major="col")
    progs = direct_programs(problem)
    for best, sms_worth in ((progs[0], 2), (progs[1], 4)):
        c = best.bind(problem).computed
        ctas = -(-c.problem.m // best.tile.m) * -(-c.problem.n // best.tile.n) * best.split_k
        assert (best.split_k_reduce == "cluster") == (sms_worth == 2)
        assert 132 * sms_worth / 2 <= ctas <= 132 * sms_worth * 2, (best, ctas)
