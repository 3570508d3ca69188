"""CPU tests of `split_k S cluster` in the raw CUDA TMA family (ws_cooperative) and the multistage
family: one CTA a tile's K slice, the S slices of a tile one cluster summing their partials
through distributed shared memory, in one launch. Programs lower with the slice count and the
parked partial tile counted in shared memory, compile for sm_90a with cluster barriers and no
spills, store C^T under swap_ab (c=col), and what the template cannot build is refused with what
to write instead. The numbers are checked on the GPU: tests/test_backend_cuda_gpu.py
(`-k split_k`).
"""
from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from cuda_backend_cases import define, hopper, multistage
from gemmgen.backends import cuda, diagnose, lower
from gemmgen.backends.cuda import hopper as hop
from gemmgen.backends.cuda import multistage as ms
from gemmgen.backends.cuda.compile import nvrtc_usable
from gemmgen.dsl.ir import CLUSTER_REDUCE, Epilogue, Problem, Program

needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None and not nvrtc_usable(),
                                    reason="needs nvcc or NVRTC to compile CUDA C")


def _split(m=64, n=4096, k=4096, *, tile=(128, 64, 64), warps=(8, 1), split=4, stages=6, swap=False,
           epilogue=Epilogue(), reduce=CLUSTER_REDUCE, **options) -> Program:
    program = hopper(Problem(m, n, k, b_major="col", epilogue=epilogue), tile=tile, warps=warps, stages=stages,
                     scheduler="tile")
    return replace(program, split_k=split, split_k_reduce=reduce, swap_ab=swap, **options)


def _multistage_split(m=8, n=1024, k=4096, *, tile=(16, 64, 128), warps=(1, 4), stages=4, split=8,
                      wgmma=False, epilogue=Epilogue(), **options) -> Program:
    program = multistage(Problem(m, n, k, b_major="col", epilogue=epilogue), tile=tile, warps=warps,
                         stages=stages, split_k=split, reduce=CLUSTER_REDUCE, swizzle=4, wgmma=wgmma)
    return replace(program, **options)


def test_a_split_program_lowers_with_its_slices_and_its_parked_partial():
    program = _split()
    assert diagnose(program) == []
    text = lower(program).text
    assert define(text, "SPLIT_K") == "4" and define(text, "STORE_T") == "0"
    # the partial tile, row by row with padded rows, is the shared memory beside the ring
    assert hop.partial_bytes(program) == 128 * (64 + hop.PARTIAL_PAD) * 4
    plain = replace(program, split_k=1, split_k_reduce="workspace")
    assert hop.smem_bytes(program) - hop.smem_bytes(plain) == hop.partial_bytes(program)
    assert define(lower(plain).text, "SPLIT_K") == "1" and hop.partial_bytes(plain) == 0
    # one CTA a (tile, slice): the grid's z is the slice, and a cluster the slices of a tile
    geo = hop.geometry(program)
    assert geo.split_k == 4 and not geo.persistent and hop.grid_size(geo, 64, 4096, 4096) == 64


def test_under_swap_ab_the_sum_stores_the_transpose_with_the_callers_bias_axis():
    """C^T = W x^T: the weight's rows are the tile's M; the partial is parked column by column so
    the sum walks along the caller's rows, and the bias runs along the stored columns (N)."""
    program = _split(16, tile=(128, 32, 64), swap=True, epilogue=Epilogue(bias="n"))
    assert diagnose(program) == []
    computed = program.computed
    assert computed.problem.c_major == "col"
    text = lower(program).text
    assert define(text, "STORE_T") == "1" and define(text, "BIAS_N") == "1" and define(text, "BIAS_M") == "0"
    assert hop.partial_bytes(computed) == 32 * (128 + hop.PARTIAL_PAD) * 4


# (program, statement, words): each refusal says what to write instead
REFUSED = [
    (lambda: _split(reduce="workspace"), "split_k", "write `split_k 4 cluster`"),
    (lambda: _split(reduce="unordered"), "split_k", "write `split_k 4 cluster`"),
    (lambda: _split(scheduler="persistent"), "split_k", "write `scheduler tile`"),
    (lambda: _split(mainloop="ws_pingpong", warps=(4, 1)), "split_k",
     "mainloops direct, multistage, ws_cooperative"),
    (lambda: _split(split=16), "split_k", "at most 8 CTAs"),
    (lambda: _split(cluster=(2, 1)), "split_k", "write `cluster 1x1`"),
    (lambda: _split(k=256, split=8), "split_k", "every slice gets a k-tile"),
    (lambda: replace(_split(n=4096), problem=Problem(64, 4096, 4096, b_major="col",
                                                     epilogue=Epilogue(gate="silu", halves="stacked"))),
     "split_k", "a gated epilogue needs a tile's whole K sum"),
    # C^T (c=col): ws_cooperative stores it, ping-pong does not
    (lambda: replace(_split(swap=True, tile=(128, 64, 64)), split_k=1, split_k_reduce="workspace",
                     mainloop="ws_pingpong", warps=(4, 1)), "gemm", "write c=row"),
    # the multistage family's cluster sum
    (lambda: _multistage_split(split=16), "split_k", "at most 8 CTAs"),
    (lambda: _multistage_split(scheduler="persistent"), "scheduler", "write `scheduler tile`"),
    (lambda: _multistage_split(cluster=(2, 1)), "split_k", "write `cluster 1x1`"),
    (lambda: _multistage_split(epilogue=Epilogue(gate="silu", halves="stacked")), "split_k",
     "needs the whole K sum in one CTA"),
]


@pytest.mark.parametrize("make, statement, words", REFUSED, ids=range(len(REFUSED)))
def test_what_the_split_sum_cannot_build_is_refused_with_what_to_write(make, statement, words):
    found = [(d.statement, d.message) for d in diagnose(make())]
    assert any(s == statement and words in m for s, m in found), found


@needs_compiler
@pytest.mark.parametrize("program", [
    _split(),
    _split(3, 1000, 4104, tile=(128, 32, 64), split=8, swap=True,
           epilogue=Epilogue(alpha=2.0, beta=0.5, bias="n", activation="gelu", residual=True)),
], ids=["split", "swap_every_epilogue"])
def test_a_split_program_compiles_with_cluster_barriers_and_no_spills(program):
    report = cuda.kernel_report(cuda.build(lower(program)))
    sass, res = report["sass"], report["resources"][hop.ENTRY]
    assert sass["HGMMA"] > 0 and sass["UCGABAR_ARV"] == 2   # parked, then read by the peers
    assert sass["LDL"] == 0 and sass["STL"] == 0
    assert res["spill_stores"] == 0 and res["stack_bytes"] == 0
    plain = replace(program, split_k=1, split_k_reduce="workspace", swap_ab=False)
    assert cuda.kernel_report(cuda.build(lower(plain)))["sass"]["UCGABAR_ARV"] == 0


def test_a_multistage_split_sums_across_its_cluster_in_one_launch():
    """No workspace and no second kernel: each slice parks its fp32 partial tile in its ring,
    which is made at least that large."""
    program = _multistage_split()
    assert diagnose(program) == []
    text = lower(program).text
    assert define(text, "SPLIT_CLUSTER") == "1" and define(text, "SPLIT_ATOMIC") == "0"
    assert ms.entries(program) == (ms.ENTRY,)
    geo = ms.geometry(program)
    assert geo.cluster_split and geo.split_k == 8 and not geo.atomic
    assert ms.smem_bytes(program) == 4 * (16 + 64) * 128 * 2        # the ring holds the 4 KB partial
    wide = _multistage_split(128, 128, tile=(128, 128, 32), warps=(2, 2), stages=2)
    assert ms.partial_bytes(wide) == 128 * 128 * 4 > 2 * (128 + 128) * 32 * 2
    assert ms.smem_bytes(wide) == ms.partial_bytes(wide)             # the partial sets the size
    workspace = replace(program, split_k_reduce="workspace")
    assert define(lower(workspace).text, "SPLIT_CLUSTER") == "0"
    assert ms.entries(workspace) == (ms.ENTRY, ms.REDUCE_ENTRY) and ms.partial_bytes(workspace) == 0


@needs_compiler
@pytest.mark.parametrize("program", [
    _multistage_split(),
    _multistage_split(17, 1000, 4104, tile=(32, 32, 128), warps=(2, 2), split=6,
                      epilogue=Epilogue(alpha=2.0, beta=0.5, bias="n", activation="gelu", residual=True)),
    _multistage_split(tile=(64, 64, 64), warps=(4, 1), stages=8, split=6, wgmma=True),
], ids=["mma", "mma_every_epilogue", "wgmma"])
def test_a_multistage_split_compiles_with_cluster_barriers_and_no_workspace(program):
    report = cuda.kernel_report(cuda.build(lower(program)))
    sass, res = report["sass"], report["resources"][ms.ENTRY]
    assert sass["UCGABAR_ARV"] == 2 and sass["ATOMG"] == 0   # parked, then read by the peers
    assert sass["LDL"] == 0 and sass["STL"] == 0
    assert res["spill_stores"] == 0 and res["stack_bytes"] == 0
    assert set(report["resources"]) == {ms.ENTRY}               # no reduce kernel
