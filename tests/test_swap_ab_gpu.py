"""GPU tests of `swap_ab` programs, x @ W.T computed as (W x^T)^T, and of the column-major
output they write through (on the H200: pytest -m gpu tests/test_swap_ab_gpu.py).

Every program is built through `gemmgen.backends.lower` and loaded through `backends.load`,
as gemmgen.compile and the tuning loop do, and judged by the harness (gemmgen.measure.check)
on the caller's problem at M = 1, 3, 17 and 100, on aligned and unaligned N and K, with each
epilogue.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile
from gemmgen.dsl.resources import max_stages
from gpu_programs import EPILOGUES, assert_passes, build_all

pytestmark = pytest.mark.gpu

MS = (1, 3, 17, 100)
WIDTHS = ((4096, 4096), (2999, 4097), (1000, 77))
CONFIGS = [  # (scheduler, tile M, tile K, stages); tile N from M
    ("tile", 64, 128, 6),
    ("stream_k", 128, 64, 6),
    ("tile", 128, 32, 3),
]


def _program(shape, config, epilogue=Epilogue(), a="row", b="col", swap=True) -> Program:
    scheduler, bm, bk, stages = config
    m = shape[0] or 16
    cols = max(16, 1 << (m - 1).bit_length())
    p = Program(problem=Problem(*shape, a_major=a, b_major=b, epilogue=epilogue), backend="triton",
                tile=Tile(bm, cols, bk), warps=(4, 1), mainloop="multistage", stages=stages,
                scheduler=scheduler, raster="n", swizzle=8, swap_ab=swap)
    return replace(p, stages=min(stages, max_stages(p.computed)))     # a wide tile N (M = 100) takes fewer


def _cases() -> list[Program]:
    from gemmgen.backends import diagnose

    out = []
    for m in MS:
        for n, k in WIDTHS:
            out += [_program((m, n, k), config) for config in CONFIGS
                    if config[0] != "stream_k" or k >= 4 * config[2]]
    out += [_program((17, 2999, 4097), CONFIGS[0], e) for e in EPILOGUES]
    out += [_program((100, 4096, 4096), CONFIGS[1], e) for e in EPILOGUES]
    out += [_program((3, 3000, 1000), CONFIGS[0], Epilogue(bias="n"), a="col", b="row")]
    # the column-major output itself, written by an unswapped program
    out += [replace(_program((m, 1000, 77), CONFIGS[2], e, swap=False),
                    problem=Problem(m, 1000, 77, c_major="col", b_major="col", epilogue=e))
            for m in (17, 100) for e in EPILOGUES[2:4]]
    found = [diagnose(p) for p in out if diagnose(p)]
    assert not found, found[0]
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def artifacts():
    return build_all(CASES)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_swap_ab_programs_pass_the_harness(index, artifacts):
    assert_passes(CASES[index], artifacts[CASES[index]], seed=4321)


def test_a_shape_generic_swap_ab_program_serves_every_m():
    from gemmgen import backends
    from gemmgen.measure import check

    generic = _program((None, 4096, 4096), CONFIGS[0], Epilogue(bias="n"))
    source = backends.lower(generic)
    fn = backends.load(backends.get("triton").build(source), generic)
    for m in (1, 3, 16):
        result = check(fn, generic.bind((m, 4096, 4096)).problem, seed=m)
        assert result.passed, (m, result.failures)
