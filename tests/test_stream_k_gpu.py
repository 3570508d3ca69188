"""GPU tests of the Triton stream-K kernel (`scheduler stream_k`), the small-M `x @ W.T` kernel
(on the H200: pytest -m gpu tests/test_stream_k_gpu.py).

Every program is judged by the harness (gemmgen.measure.check) at M = 1, 3, 17 and 100, on
aligned and unaligned N and K, with each epilogue; then calls are repeated to show that the
tile counters reset themselves (a counter left behind would corrupt the next call) and that
the fix-up's K-order sum gives the same bits every call.
"""
from __future__ import annotations

import pytest

from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile
from gpu_programs import EPILOGUES, assert_passes, build_all

pytestmark = pytest.mark.gpu

MS = (1, 3, 17, 100)
WIDTHS = ((4096, 4096), (2999, 4097), (1000, 77))
CONFIGS = [  # (tile, warps, stages)
    ((16, 128, 128), (1, 4), 4),
    ((32, 64, 64), (2, 2), 6),
    ((128, 64, 64), (4, 1), 3),
]


def _program(shape, config, epilogue=Epilogue(), a="row", b="col") -> Program:
    tile, warps, stages = config
    return Program(problem=Problem(*shape, a_major=a, b_major=b, epilogue=epilogue), backend="triton",
                   tile=Tile(*tile), warps=warps, mainloop="multistage", stages=stages, scheduler="stream_k",
                   raster="n", swizzle=8)


def _cases() -> list[Program]:
    from gemmgen.backends import diagnose

    out = []
    for m in MS:
        for n, k in WIDTHS:
            out += [_program((m, n, k), config) for config in CONFIGS]
    out += [_program((17, 2999, 4097), CONFIGS[0], e) for e in EPILOGUES]
    out += [_program((100, 4096, 4096), CONFIGS[2], e) for e in EPILOGUES]
    out += [_program((100, 3000, 1000), CONFIGS[1], Epilogue(bias="n"), a="col", b="row")]
    # past small M, where the last wave of one CTA a tile is part full (160 tiles on 132 SMs)
    out += [_program((1280, 4096, 4096), ((128, 256, 64), (8, 1), 3), Epilogue(bias="n", activation="silu"))]
    valid = [p for p in out if not diagnose(p)]
    assert len(valid) == len(out), [diagnose(p) for p in out if diagnose(p)][0]
    return valid


CASES = _cases()


@pytest.fixture(scope="module")
def artifacts():
    return build_all(CASES)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_stream_k_programs_pass_the_harness(index, artifacts):
    assert_passes(CASES[index], artifacts[CASES[index]], seed=4321)


@pytest.mark.parametrize("shape, config", [((1, 4096, 4096), CONFIGS[0]), ((100, 2999, 4097), CONFIGS[2]),
                                           ((17, 1000, 77), CONFIGS[1])])
def test_repeated_calls_give_the_same_bits(shape, config):
    """Forty calls on one stream, then on a second stream: every output equal to the first, bit for bit."""
    import torch

    from gemmgen.backends import triton as tb

    p = _program(shape, config)
    fn = tb.load(tb.build(tb.lower(p)), p)
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen)
    first = fn(a, w.t(), torch.empty(m, n, device="cuda", dtype=torch.float16)).clone()
    ref = a.double() @ w.double().t()
    assert ((first.double() - ref).norm() / ref.norm()).item() < 2e-3
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            for _ in range(40):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
                fn(a, w.t(), out)
                assert torch.equal(out, first)
    torch.cuda.synchronize()


def test_a_shape_generic_stream_k_program_serves_every_m():
    from gemmgen.backends import triton as tb
    from gemmgen.measure import check

    generic = _program((None, 4096, 4096), CONFIGS[1], Epilogue(bias="n"))
    fn = tb.load(tb.build(tb.lower(generic)), generic)
    for m in (1, 3, 17, 64, 100, 128):
        result = check(fn, generic.bind((m, 4096, 4096)).problem, seed=m)
        assert result.passed, (m, result.failures)
