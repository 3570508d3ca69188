"""GPU tests of the direct mainloops, mostly as `x @ W.T` under swap_ab (on the H200: pytest -m
gpu tests/test_direct_gpu.py): the raw CUDA family (operands straight into mma.sync registers,
K split over CTAs) and Triton's (FMA over row-contiguous K steps).

Every program is built through `gemmgen.backends.lower`, loaded through `backends.load` and
judged by the harness (gemmgen.measure.check) on the caller's problem at M = 1, 3, 17 and 100, on
aligned and unaligned N and K (K a multiple of 8, the family's 16-byte loads), with each
epilogue, one and several K slices (summed in arrival order or across a cluster), and unswapped
(C row-major) too.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from gemmgen.dsl.ir import Epilogue, Instr, Problem, Program, Tile
from gpu_programs import EPILOGUES, assert_passes, build_all

pytestmark = pytest.mark.gpu

MS = (1, 3, 17, 100)
WIDTHS = ((4096, 4096), (2999, 4104), (1000, 72))
CONFIGS = [  # (rows a warp, warps along M, tile K, stages, split_k)
    (16, 4, 64, 4, 4),
    (32, 2, 64, 2, 1),
    (16, 1, 32, 8, 3),
]
CLUSTER_CONFIGS = [  # the same, K's slices summed across a cluster (`split_k S cluster`)
    (16, 4, 64, 4, 4, "cluster"),
    (16, 1, 32, 8, 8, "cluster"),
]


def _program(shape, config, epilogue=Epilogue(), swap=True) -> Program:
    rows, warps_m, tk, stages, split, *way = config
    m = shape[0] or 16
    cols = min(128, max(8, 1 << (m - 1).bit_length()))
    warps_n = max(1, cols // 16)             # two n8 blocks a warp
    warps_m = max(1, min(warps_m, 8 // warps_n))
    split = max(1, min(split, shape[2] // tk))   # every slice at least one whole k tile
    return Program(problem=Problem(*shape, a_major="row", b_major="col", epilogue=epilogue), backend="cuda",
                   tile=Tile(rows * warps_m, cols, tk), warps=(warps_m, warps_n), mainloop="direct",
                   instr=Instr("mma", 16, 8, 16), stages=stages, scheduler="tile", split_k=split,
                   split_k_reduce=(way or ["unordered"])[0] if split > 1 else "workspace", swap_ab=swap)


def _unswapped(m, n, k, epilogue) -> Program:
    """x (M x K) as A, the weight as B: the batch on mma's M side, C row-major."""
    return Program(problem=Problem(m, n, k, a_major="row", b_major="col", epilogue=epilogue), backend="cuda",
                   tile=Tile(16, 32, 64), warps=(1, 2), mainloop="direct", instr=Instr("mma", 16, 8, 16),
                   stages=2, scheduler="tile")


def _cases() -> list[Program]:
    from gemmgen.backends import diagnose

    out = []
    for m in MS:
        for n, k in WIDTHS:
            out += [_program((m, n, k), config) for config in CONFIGS + CLUSTER_CONFIGS]
    out += [_program((17, 2999, 4104), CONFIGS[0], e) for e in EPILOGUES]
    out += [_program((3, 2999, 4104), CLUSTER_CONFIGS[1], e) for e in EPILOGUES]
    out += [_program((100, 1000, 72), CONFIGS[1], e) for e in EPILOGUES]
    out += [_program((1, 4096, 4096), CONFIGS[2], e) for e in EPILOGUES]
    out += [_unswapped(m, 1000, 72, e) for m in (3, 100) for e in EPILOGUES[:4]]
    found = [diagnose(p) for p in out if diagnose(p)]
    assert not found, found[0]
    return out


def _triton(m, n, k, epilogue=Epilogue()) -> Program:
    cols = min(16, 1 << max(0, (m - 1).bit_length()))
    return Program(problem=Problem(m, n, k, a_major="row", b_major="col", epilogue=epilogue), backend="triton",
                   tile=Tile(16, cols, max(64, 1024 // cols)), warps=(8, 1), mainloop="direct",
                   scheduler="tile", swap_ab=True)


def _triton_cases() -> list[Program]:
    from gemmgen.backends import diagnose

    from gemmgen.backends.triton.search_space import direct_head

    out = [_triton(m, n, k) for m in MS for n, k in WIDTHS]
    out += [_triton(m, 2999, 4104, e) for m in (1, 3) for e in EPILOGUES]
    # the space's own direct programs at a batch of one and two, unaligned N and K
    out += direct_head(Problem(1, 2999, 4104, a_major="row", b_major="col"))
    out += direct_head(Problem(2, 2999, 4104, a_major="row", b_major="col"))
    out += direct_head(Problem(4, 999, 4104, a_major="row", b_major="col"))   # a CTA a batch column
    # a ring of 2 and 3 K steps in flight (tile N 1: a CTA a batch column), with each epilogue:
    # an uneven last step, and K shorter than the ring
    ring = dict(tile=Tile(8, 1, 1024), warps=(4, 1), stages=2)
    out += [replace(_triton(m, 2999, 4104, e), **ring) for m in (1, 3) for e in EPILOGUES]
    out += [replace(_triton(m, 1000, 72, e), tile=Tile(8, 1, 64), warps=(2, 1), stages=3) for m in (1, 17)
            for e in EPILOGUES]
    found = [diagnose(p) for p in out if diagnose(p)]
    assert not found, found[0]
    return out


CASES = _cases() + _triton_cases()


@pytest.fixture(scope="module")
def artifacts():
    return build_all(CASES)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_direct_programs_pass_the_harness(index, artifacts):
    assert_passes(CASES[index], artifacts[CASES[index]], seed=2718)


def test_split_k_workspace_is_left_clean_between_calls(artifacts):
    """The last CTA of each tile zeroes its sums: calls on new inputs never see old partials."""
    import torch

    program = CASES[0]   # M = 1, split over 4 CTAs
    from gemmgen import backends
    fn = backends.load(artifacts[program], program)
    m, n, k = program.problem.m, program.problem.n, program.problem.k
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(m, k, device="cuda", generator=g).half()
        w = torch.randn(n, k, device="cuda", generator=g).half()
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        fn(a, w.t(), out)
        want = (a.double() @ w.double().t())
        assert torch.allclose(out.double(), want, rtol=2e-2, atol=0.5), seed


def test_a_cluster_split_gives_the_same_bits_every_call(artifacts):
    """The cluster sums its slices in slice order: unlike arrival order, every call on the same
    inputs stores the same bits."""
    import torch

    from gemmgen import backends
    program = next(p for p in CASES if p.split_k_reduce == "cluster" and p.split_k == 8)
    fn = backends.load(artifacts[program], program)
    m, n, k = program.problem.m, program.problem.n, program.problem.k
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(m, k, device="cuda", generator=g).half()
    w = torch.randn(n, k, device="cuda", generator=g).half()
    outs = []
    for _ in range(4):
        outs.append(torch.empty(m, n, device="cuda", dtype=torch.float16))
        fn(a, w.t(), outs[-1])
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert torch.allclose(outs[0].double(), a.double() @ w.double().t(), rtol=2e-2, atol=0.5)


def test_a_shape_generic_direct_program_serves_every_m():
    from gemmgen import backends
    from gemmgen.measure import check

    generic = _program((None, 4096, 4096), CONFIGS[0], Epilogue(bias="n"))
    fn = backends.load(backends.get("cuda").build(backends.lower(generic)), generic)
    for m in (1, 3, 16):
        result = check(fn, generic.bind((m, 4096, 4096)).problem, seed=m)
        assert result.passed, (m, result.failures)


def test_compile_serves_the_shipped_direct_winner_and_it_is_right(shipped_gpu):
    """gemmgen.compile reads the shipped record of 1x1024x4096 (a k/v projection of Llama-3-8B
    at one token): a swap_ab direct program, measured faster than every library call."""
    import torch

    import gemmgen
    from gemmgen.compile import clear_cache
    from gemmgen.measure import check

    from gemmgen.dsl.ir import Problem
    from gemmgen.tuning_db import shipped_database

    wanted = Problem(1, 1024, 4096, b_major="col")
    if wanted not in {w.problem for w in shipped_database().winners(shipped_gpu)}:
        pytest.skip(f"the shipped records hold no winner of {wanted.key} on {shipped_gpu}")   # an H100's
    clear_cache()
    kernel = gemmgen.compile((1, 1024, 4096), b_major="col")
    assert kernel.ir is not None and kernel.ir.mainloop == "direct" and kernel.ir.swap_ab, kernel.describe()
    problem = kernel.problem
    assert check(lambda a, b, out, **kw: kernel(a, b, out=out, **kw), problem, seed=5).passed
    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.float16)
    want = x.double() @ w.double().t()
    assert torch.allclose(kernel(x, w.t()).double(), want, rtol=2e-2, atol=0.25)
