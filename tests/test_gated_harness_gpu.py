"""The harness on gated problems, on the H200 (pytest -m gpu tests/test_gated_harness_gpu.py):
gemmgen.measure.check passes the Triton gated programs and every baseline's unfused form (the
product over the joined B, then gate * up as torch ops) at unaligned shapes, refuses a program of
the plain product served in the gated one's place, and times both side by side."""
from __future__ import annotations

import functools

import pytest

from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile
from gpu_programs import assert_passes, build_all

pytestmark = pytest.mark.gpu

SHAPES = ((1, 4096, 4096), (17, 2999, 4097), (100, 1000, 77), (300, 14336, 4096))
GATES = ("silu", "gelu", "relu")


def _problem(shape, gate="silu", b="col") -> Problem:
    return Problem(*shape, b_major=b, epilogue=Epilogue(gate=gate, halves="stacked"))


def _program(problem: Problem) -> Program:
    return Program(problem=problem, backend="triton", tile=Tile(64, 64, 64), warps=(4, 1), mainloop="multistage",
                   stages=3, raster="n", swizzle=8)


CASES = [_problem(s) for s in SHAPES] + [_problem((17, 2999, 4097), g, b) for g in GATES[1:] for b in ("row", "col")]


@functools.lru_cache(maxsize=1)
def _artifacts() -> dict:
    return build_all([_program(p) for p in CASES])


@pytest.mark.parametrize("index", range(len(CASES)))
def test_the_harness_passes_gated_programs(index):
    program = _program(CASES[index])
    assert_passes(program, _artifacts()[program])


@pytest.mark.parametrize("name", ["torch", "cublas_nn", "cublas_tn", "lt_heuristic"])
@pytest.mark.parametrize("shape", [(100, 1000, 77), (300, 4096, 1024)])
def test_the_harness_passes_every_unfused_baseline(name, shape):
    """At shapes where the libraries sum in fp32: at 17x5998x4097 (small M, long K) every baseline
    failed the elementwise bound by one element a case on the H200 (error ~35 fp16 ulps of the
    result, as when split-K partials far larger than the result are added in fp16: torch's default
    allows it, and cuBLASLt may reduce in the output type), which the fp32 promise refuses."""
    from gemmgen.measure import check
    from gemmgen.measure.baselines import make

    kernel = make(name, _problem(shape))
    result = check(kernel.fn, kernel.problem, seed=99)
    assert result.passed, (name, result.failures)
    assert "gate_tail" in kernel.notes


def test_a_plain_product_in_place_of_the_gated_one_fails():
    """The up half alone, as a kernel that forgot the gate would write it."""
    import torch

    from gemmgen.measure import check

    problem = _problem((17, 2999, 4097))

    def forgot_the_gate(a, b, out, **_):
        torch.matmul(a, b[:, problem.n:], out=out)

    result = check(forgot_the_gate, problem, seed=5)
    assert not result.passed and any("elementwise bound" in f for f in result.failures), result.failures


def test_gated_program_and_baseline_time_side_by_side():
    from gemmgen import backends
    from gemmgen.measure.baselines import make
    from gemmgen.measure.timing import time_many

    problem = CASES[3]
    program = _program(problem)
    fused = backends.load(_artifacts()[program], program)
    base = make("torch", problem)
    timings = time_many([("gemmgen", fused, problem), ("torch", base.fn, base.problem)], "offline")
    assert not [t for t in timings.values() if isinstance(t, Exception)], timings
    assert all(t.device_ms > 0 for t in timings.values())
