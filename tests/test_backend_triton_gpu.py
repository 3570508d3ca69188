"""GPU tests of the Triton backend (on the H200: pytest -m gpu tests/test_backend_triton_gpu.py, ~2 min).

Every kernel is judged by the harness (gemmgen.measure.check: fresh normal inputs,
NaN-poisoned output, guard bands, fp64 reference, fp16-accumulation probe).
All programs are built in parallel first (build_many), then checked one by one.
"""
from __future__ import annotations

import random
import time

import pytest

from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile
from gpu_programs import EPILOGUES as FUSED_EPILOGUES
from gpu_programs import assert_passes, build_all

pytestmark = pytest.mark.gpu

SHAPES = [(1, 3000, 77), (7, 256, 4096), (1000, 3000, 77), (1000, 1000, 1000), (128, 64, 8192),
          (4096, 4096, 512), (333, 3000, 256), (64, 64, 64)]
CONFIGS = [  # (tile, warps, stages, scheduler, split_k, reduce)
    ((128, 128, 64), (8, 1), 4, "tile", 1, "workspace"),
    ((64, 128, 64), (4, 1), 4, "tile", 1, "workspace"),
    ((128, 256, 64), (8, 1), 3, "tile", 1, "workspace"),
    ((128, 256, 64), (8, 1), 3, "persistent", 1, "workspace"),
    ((128, 128, 64), (8, 1), 4, "persistent", 1, "workspace"),
    ((64, 64, 128), (4, 1), 3, "tile", 4, "workspace"),
    ((64, 64, 64), (4, 1), 3, "persistent", 2, "workspace"),
    ((64, 128, 32), (4, 1), 4, "tile", 2, "atomic"),
]
EPILOGUES = [Epilogue(), *FUSED_EPILOGUES]


def _program(shape, majors, epilogue, config) -> Program:
    tile, warps, stages, scheduler, split, reduce = config
    if reduce == "atomic" and (epilogue.activation or epilogue.out_dtype != "f32"):
        reduce = "workspace"
    problem = Problem(*shape, a_major=majors[0], b_major=majors[1], epilogue=epilogue)
    return Program(problem=problem, backend="triton", tile=Tile(*tile), warps=warps, mainloop="multistage",
                   stages=stages, scheduler=scheduler, raster=random.Random(str(shape)).choice("mn"), swizzle=8,
                   split_k=split, split_k_reduce=reduce)


def _valid(programs):
    from gemmgen.backends import diagnose
    return [p for p in programs if not diagnose(p)]


def _random_programs(count: int, seed: int = 7):
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        p = _program(rng.choice(SHAPES), (rng.choice(("row", "col")), rng.choice(("row", "col"))),
                     rng.choice(EPILOGUES), rng.choice(CONFIGS))
        if _valid([p]) and p not in out:
            out.append(p)
    return out


RANDOM = _random_programs(28)
# Every epilogue on an unaligned x @ W.T (b col) and on an aligned persistent kernel.
EPILOGUE_CASES = _valid([_program((1000, 3000, 77), ("row", "col"), e, CONFIGS[0]) for e in EPILOGUES]
                        + [_program((512, 1024, 512), ("row", "col"), e, CONFIGS[4]) for e in EPILOGUES])
ALL = RANDOM + EPILOGUE_CASES


@pytest.fixture(scope="module")
def artifacts():
    return build_all(ALL)


@pytest.mark.parametrize("index", range(len(RANDOM)))
def test_random_programs_pass_the_harness(index, artifacts):
    assert_passes(RANDOM[index], artifacts[RANDOM[index]])


@pytest.mark.parametrize("index", range(len(EPILOGUE_CASES)))
def test_each_epilogue(index, artifacts):
    assert_passes(EPILOGUE_CASES[index], artifacts[EPILOGUE_CASES[index]])


def test_generic_program_runs_aligned_and_unaligned_shapes():
    """One shape-generic build serves many shapes; unaligned calls use the unhinted fallback build."""
    from gemmgen.backends import triton as tb

    generic = _program((None, None, None), ("row", "col"), Epilogue(bias="n"), CONFIGS[1])
    art = tb.build(tb.lower(generic))
    fn = tb.load(art, generic)
    from gemmgen.measure import check
    for shape in [(256, 512, 1024), (7, 3000, 77), (1000, 1000, 1000), (1, 64, 64)]:
        result = check(fn, generic.bind(shape).problem, seed=5)
        assert result.passed, (shape, result.failures)


def test_persistent_descriptors_follow_new_pointers():
    """The TMA descriptor cache is keyed by pointer: fresh tensors each call still give right answers."""
    import torch

    from gemmgen.backends import triton as tb

    p = _program((512, 768, 256), ("row", "col"), Epilogue(), CONFIGS[4])
    fn = tb.load(tb.build(tb.lower(p)), p)
    for i in range(3):
        a = torch.randn(512, 256, device="cuda", dtype=torch.float16)
        w = torch.randn(768, 256, device="cuda", dtype=torch.float16)
        out = torch.empty(512, 768, device="cuda", dtype=torch.float16)
        fn(a, w.t(), out)
        ref = (a.float() @ w.float().t())
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_bound_program_refuses_another_shape():
    import torch

    from gemmgen.backends import triton as tb
    from gemmgen.backends.base import BackendError

    p = _program((256, 256, 256), ("row", "row"), Epilogue(), CONFIGS[1])
    fn = tb.load(tb.build(tb.lower(p)), p)
    a = torch.randn(128, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    with pytest.raises(BackendError, match="bound"):
        fn(a, b, torch.empty(128, 256, device="cuda", dtype=torch.float16))


def _host_us(fn, calls: int = 2000) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def test_host_overhead_of_a_tiny_gemm_is_no_worse_than_torch_matmul():
    """Host-inclusive time per call of 64x64x64 (launch-bound): ours against torch.matmul."""
    import torch

    from gemmgen.backends import triton as tb

    p = _program((64, 64, 64), ("row", "row"), Epilogue(), ((64, 64, 64), (4, 1), 2, "tile", 1, "workspace"))
    fn = tb.load(tb.build(tb.lower(p)), p)
    a = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    out = torch.empty(64, 64, device="cuda", dtype=torch.float16)
    ours = _host_us(lambda: fn(a, b, out))
    theirs = _host_us(lambda: torch.matmul(a, b, out=out))
    print(f"\nhost-inclusive per call, 64x64x64: gemmgen triton {ours:.2f} us, torch.matmul {theirs:.2f} us")
    assert ours <= theirs * 1.10 + 0.5, (ours, theirs)


def test_jit_fallback_launcher_passes_the_harness(monkeypatch, artifacts):
    """GEMMGEN_TRITON_LAUNCH=jit runs the same kernels through Triton's JIT (the escape hatch)."""
    monkeypatch.setenv("GEMMGEN_TRITON_LAUNCH", "jit")
    for p in (EPILOGUE_CASES[4], EPILOGUE_CASES[-1], RANDOM[0]):
        assert_passes(p, artifacts[p])


@pytest.mark.parametrize("tile, warps, split", [((128, 128, 64), (8, 1), 2), ((64, 64, 128), (4, 1), 16)])
def test_arrival_order_split_k_is_right_on_every_call(tile, warps, split):
    """Sums added in arrival order stay right call after call. The first of these programs lost
    up to 0.6 % of its outputs in 12 of 12 calls while the finalize read the buffer with a plain
    load (H200, 2026-11-30); a single check, three calls, could pass it."""
    import torch

    from gemmgen.backends import triton as tb

    m, n, k = (1024, 2048, 12288) if split == 2 else (64, 64, 4096)
    problem = Problem(m, n, k)
    p = Program(problem=problem, backend="triton", tile=Tile(*tile), warps=warps, mainloop="multistage",
                stages=3, scheduler="tile", raster="n", swizzle=8, split_k=split, split_k_reduce="unordered")
    fn = tb.load(tb.build(tb.lower(p)), p)
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=gen)
    ref = a.float() @ b.float()
    wrong = []
    for _ in range(24):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        fn(a, b, out)
        torch.cuda.synchronize()
        wrong.append(int(((out.float() - ref).abs() > 0.02 * ref.abs() + 0.5).sum()))
    assert wrong == [0] * 24, f"wrong elements per call: {wrong}"
