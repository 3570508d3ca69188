"""CPU tests of `scheduler stream_k` in the raw CUDA TMA family (ws_cooperative), and of its C^T
store (c=col, swap_ab's `x @ W.T` with the weight's rows on wgmma's M side).

One wave of CTAs deals out the (tile, k tile) iterations evenly; the CTA that began a tile adds the
partials of the CTAs that finished it, read from a workspace slot per CTA once that CTA's flag is
up. Programs lower with their stream-K and transposed-store switches, launch one wave with at least
STREAM_K_MIN_ITERS k tiles a CTA, compile for sm_90a with the flag's release and acquire and no
spills, and what the template cannot build is refused with what to write instead. The numbers
are checked on the GPU: tests/test_backend_cuda_gpu.py (`-k tma_stream_k`).
"""
from __future__ import annotations

import ctypes
import shutil
from dataclasses import replace

import pytest

from cuda_backend_cases import define, hopper
from gemmgen.backends import cuda, diagnose, lower
from gemmgen.backends.cuda import hopper as hop
from gemmgen.backends.cuda.compile import nvrtc_usable, sass
from gemmgen.backends.cuda.launch import STREAM_K_MIN_ITERS
from gemmgen.dsl.ir import CLUSTER_REDUCE, Epilogue, Problem, Program

needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None and not nvrtc_usable(),
                                    reason="needs nvcc or NVRTC to compile CUDA C")


def _stream_k(m=64, n=4096, k=4096, *, tile=(128, 64, 64), stages=8, swap=True, epilogue=Epilogue(),
              b="col", **options) -> Program:
    program = hopper(Problem(m, n, k, b_major=b, epilogue=epilogue), tile=tile, stages=stages, scheduler="stream_k",
                     swizzle=1)
    return replace(program, swap_ab=swap, **options)


def test_a_swapped_stream_k_program_lowers_with_both_switches_and_the_callers_bias_axis():
    program = _stream_k(epilogue=Epilogue(bias="n"))
    assert diagnose(program) == []
    computed = program.computed                 # C^T = W x^T: 4096 x 64, stored transposed
    assert (computed.problem.m, computed.problem.n, computed.problem.c_major) == (4096, 64, "col")
    text = lower(program).text
    assert define(text, "STREAM_K") == "1" and define(text, "STORE_T") == "1"
    assert define(text, "BIAS_N") == "1" and define(text, "BIAS_M") == "0"   # the caller's N: x @ W.T + b
    plain = replace(program, scheduler="persistent", swap_ab=False)
    assert define(lower(plain).text, "STREAM_K") == "0" and define(lower(plain).text, "STORE_T") == "0"
    # no shared memory beyond the persistent program's: the partials go through global memory
    assert hop.smem_bytes(computed) == hop.smem_bytes(replace(computed, scheduler="persistent"))


def test_one_wave_of_ctas_shares_the_iterations_and_a_partial_tile_each():
    geo = hop.geometry(_stream_k().computed)
    assert geo.stream_k and not geo.persistent and geo.acc_floats == 128 * 64
    # 32 tiles of 128 weight rows x 64 k tiles: every SM, 15-16 k tiles each
    assert hop.grid_size(geo, 4096, 64, 4096, sms=132) == 132
    # 8 tiles x 4 k tiles: one CTA per STREAM_K_MIN_ITERS k tiles
    assert hop.grid_size(geo, 1024, 64, 256, sms=132) == 8 * 4 // STREAM_K_MIN_ITERS
    assert hop.grid_size(geo, 128, 64, 64, sms=132) == 1


def test_the_launch_arguments_match_the_kernels_struct():
    """`struct ProblemArgs { int M, N, K; float* workspace; unsigned* counters; }` under STREAM_K."""
    fields = {name: getattr(hop.StreamKProblemArgs, name).offset for name in ("M", "N", "K", "workspace", "counters")}
    assert fields == {"M": 0, "N": 4, "K": 8, "workspace": 16, "counters": 24}
    assert ctypes.sizeof(hop.StreamKProblemArgs) == 32 and ctypes.sizeof(hop.ProblemArgs) == 12


# (program, statement, words): each refusal says what to write instead
REFUSED = [
    (lambda: _stream_k(mainloop="ws_pingpong", warps=(4, 1), swap=False), "scheduler", "mainloop ws_cooperative"),
    (lambda: _stream_k(cluster=(2, 1), swap=False), "scheduler", "write `cluster 1x1`"),
    (lambda: _stream_k(split_k=2, split_k_reduce=CLUSTER_REDUCE, swap=False), "split_k", "split_k 2"),
    (lambda: _stream_k(m=512, n=4096, swap=False, tile=(128, 128, 64), stages=4,
                       epilogue=Epilogue(gate="silu", halves="stacked")), "scheduler", "`scheduler persistent`"),
    # C^T: ws_cooperative stores it, ping-pong does not
    (lambda: replace(_stream_k(), scheduler="persistent", mainloop="ws_pingpong", warps=(4, 1)), "gemm",
     "write c=row"),
]


@pytest.mark.parametrize("make, statement, words", REFUSED, ids=range(len(REFUSED)))
def test_what_stream_k_cannot_build_is_refused_with_what_to_write(make, statement, words):
    found = [(d.statement, d.message) for d in diagnose(make())]
    assert any(s == statement and words in m for s, m in found), found


def test_a_gated_product_is_not_stored_transposed():
    gated = hopper(Problem(4096, 64, 4096, b_major="col", c_major="col",
                           epilogue=Epilogue(gate="silu", halves="stacked")), tile=(128, 64, 64))
    assert any(s == "gemm" and "gated epilogue stores C row-major" in m for s, m in hop.rules(gated))


@needs_compiler
@pytest.mark.parametrize("program", [
    _stream_k(),
    _stream_k(3, 1000, 4104, tile=(128, 32, 64),
              epilogue=Epilogue(alpha=2.0, beta=0.5, bias="n", activation="gelu", residual=True)),
    _stream_k(1000, 2056, 4104, tile=(128, 128, 64), stages=4, swap=False, b="row",
              epilogue=Epilogue(bias="n", out_dtype="bf16")),
], ids=["swap", "swap_every_epilogue", "plain_b_row"])
def test_a_stream_k_program_compiles_with_the_flag_hand_off_and_no_spills(program):
    artifact = cuda.build(lower(program))
    report = cuda.kernel_report(artifact)
    counts, res = report["sass"], report["resources"][hop.ENTRY]
    assert counts["HGMMA"] > 0 and counts["UTMALDG"] > 0
    assert counts["LDL"] == 0 and counts["STL"] == 0
    assert res["spill_stores"] == 0 and res["stack_bytes"] == 0
    code = sass(artifact.data)
    # a flag raised with release and read with acquire, at GPU scope; partials moved 16 bytes at a time
    assert "STG.E.STRONG.GPU" in code and "LDG.E.STRONG.GPU" in code
    assert "STG.E.128.STRONG.GPU" in code and "LDG.E.128.STRONG.GPU" in code
    persistent = cuda.build(lower(replace(program, scheduler="persistent")))
    assert "LDG.E.STRONG.GPU" not in sass(persistent.data)
