"""GPU tests of the raw CUDA backend (run on the H200: pytest -m gpu tests/test_backend_cuda_gpu.py).

Every program is checked by the harness (gemmgen.measure.check: random normal
inputs, NaN-poisoned output, guard bands, fp64 reference, fp16-accumulation
probe). Programs build in parallel first so the whole file stays near 2 minutes.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from gemmgen.dsl.ir import CLUSTER_REDUCE, Epilogue, Problem

from cuda_backend_cases import WGMMA_CONFIGS, hopper, multistage, random_multistage

pytestmark = pytest.mark.gpu


def _valid(programs):
    from gemmgen.backends import cuda
    from gemmgen.backends import diagnose
    keep = []
    for p in programs:
        errors = [d for d in diagnose(p) if getattr(d, "severity", "error") == "error"]
        if not errors and not cuda._family_rules(p):
            keep.append(p)
    return keep


def _build_all(programs):
    from gemmgen.backends import lower
    from gemmgen.backends.build import build_many
    assert _valid(programs) == list(programs), "a listed program is refused by the language or the backend"
    results = build_many([lower(p) for p in programs], jobs=16)
    failed = [str(r) for r in results if isinstance(r, Exception)]
    assert not failed, failed[0]
    return results


def _check(program, artifact, runner):
    from gemmgen.backends import load
    from gemmgen.measure import Job

    # seed None: fresh random inputs; the result's check record names the seed (swap_ab programs
    # go through backends.load, which hands the kernel the transposed views)
    result = runner.run(Job(program.problem.key, load, (artifact, program), program.problem,
                            check=True, mode=None, seed=None))
    assert result.ok, (program, result.status, result.message, result.check)
    return result


def _same_bits_three_times(fn, p):
    """Calls `fn` three times on one set of random inputs for problem `p` (every major, bias
    axis and epilogue operand) and asserts the outputs are equal bit for bit; returns the
    inputs' device (the key of a launcher's workspace)."""
    import torch
    e = p.epilogue

    def operand(rows, cols, major, dtype=torch.float16):
        return torch.randn(cols, rows, device="cuda", dtype=dtype).T if major == "col" else \
            torch.randn(rows, cols, device="cuda", dtype=dtype)

    a, b = operand(p.m, p.k, p.a_major), operand(p.k, p.n, p.b_major)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}.get(e.out_dtype, torch.float16)
    extra = {"bias": torch.randn(p.m if e.bias == "m" else p.n, device="cuda", dtype=dtype)} if e.bias else {}
    if e.residual:
        extra["residual"] = torch.randn(p.m, p.n, device="cuda", dtype=dtype)
    if e.beta:
        extra["c"] = torch.randn(p.m, p.n, device="cuda", dtype=dtype)
    outs = []
    for _ in range(3):
        out = torch.full((p.m, p.n), float("nan"), device="cuda", dtype=dtype)
        fn(a, b, out, **extra)
        outs.append(out)
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    return a.device


MULTISTAGE = _valid(random_multistage(32) + random_multistage(24, seed=7, configs=WGMMA_CONFIGS, wgmma=True))


@pytest.fixture(scope="module")
def multistage_artifacts():
    return _build_all(MULTISTAGE)


@pytest.mark.parametrize("index", range(len(MULTISTAGE)))
def test_multistage_random_programs(index, multistage_artifacts, runner):
    _check(MULTISTAGE[index], multistage_artifacts[index], runner)


def test_multistage_fp32_accumulation_over_long_k():
    """All-ones over K=8192: an fp16 accumulator stalls at 2048, ours must give K exactly."""
    import torch
    from gemmgen.backends import cuda
    program = multistage(Problem(128, 256, 8192, b_major="col", epilogue=Epilogue()))
    fn = cuda.load(cuda.compile_program(program), program)
    a = torch.ones(128, 8192, dtype=torch.float16, device="cuda")
    b = torch.ones(256, 8192, dtype=torch.float16, device="cuda").T
    out = torch.full((128, 256), float("nan"), dtype=torch.float16, device="cuda")
    fn(a, b, out)
    torch.cuda.synchronize()
    assert torch.all(out == 8192.0)


def test_multistage_same_launcher_many_shapes_and_no_sync():
    """A generic (M, N, K = *) program runs any shape; repeated calls need no host sync."""
    import torch
    from gemmgen.backends import cuda
    program = multistage(Problem(None, None, None, b_major="col", epilogue=Epilogue(bias="n")), split_k=2)
    fn = cuda.load(cuda.compile_program(program), program)
    for m, n, k in ((33, 65, 128), (300, 17, 1024), (1024, 1024, 64)):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        for _ in range(3):
            fn(a, w.T, out, bias=bias)
        ref = (a.double() @ w.double().T + bias.double())
        err = (out.double() - ref).norm() / ref.norm()
        assert err < 2e-3, (m, n, k, float(err))


def test_multistage_small_ring_gets_every_cta_its_registers_allow():
    """The launcher asks for the largest shared-memory carveout, so that a small ring gets every
    CTA its registers allow: a 72 KB ring leaves room for three (228 KB an SM, 1 KB of it
    reserved per CTA), so the registers set the count."""
    from gemmgen.backends import cuda
    from gemmgen.backends.cuda import launch as cuda_launch, multistage as ms
    program = multistage(Problem(512, 2048, 2048, epilogue=Epilogue()), tile=(64, 128, 64), stages=3)
    artifact = cuda.compile_program(program)
    fn = cuda.load(artifact, program)
    geo = ms.geometry(program)
    regs = artifact.meta["resources"][ms.ENTRY]["registers"]
    per_warp = -(-regs * 32 // 256) * 256                 # registers are handed out 256 a warp
    by_registers = 65536 // (per_warp * geo.threads // 32)
    assert geo.smem == 72 * 1024 and by_registers >= 2, (regs, by_registers)
    assert cuda_launch.resident_ctas(fn.funcs[ms.ENTRY], geo.threads, geo.smem) == min(3, by_registers)


def test_a_ring_of_exactly_48_kb_beside_a_static_flag_launches(runner):
    """A 48 KB ring (3 stages of 32x32x128) in the arrival-order kernel, whose last-CTA flag is
    static shared memory: together past the 48 KB a function gets without opting in, so the
    loader raises its limit (without it the launch fails with CUDA_ERROR_INVALID_VALUE)."""
    from gemmgen.backends import cuda
    from gemmgen.backends.cuda import multistage as ms
    program = multistage(Problem(17, 1000, 4104, b_major="col", epilogue=Epilogue(bias="n")),
                         tile=(32, 32, 128), warps=(2, 2), stages=3, split_k=16, reduce="unordered")
    artifact = cuda.compile_program(program)
    assert ms.geometry(program).smem == 48 * 1024
    assert artifact.meta["resources"][ms.ENTRY]["smem_static"] > 0
    _check(program, artifact, runner)


# Persistent CTAs that each walk several tiles, across unaligned edges, both majors.
PERSISTENT = [
    multistage(Problem(4097, 2055, 72, b_major="col", epilogue=Epilogue(bias="n", activation="gelu")),
               tile=(64, 64, 32), warps=(2, 2), stages=4, scheduler="persistent"),
    multistage(Problem(3000, 5000, 64, epilogue=Epilogue(residual=True)),
               tile=(128, 128, 64), warps=(2, 2), stages=3, scheduler="persistent"),
    multistage(Problem(8192, 2048, 128, a_major="col", epilogue=Epilogue(out_dtype="bf16")),
               tile=(256, 128, 64), warps=(4, 2), stages=2, scheduler="persistent", raster="n", swizzle=4),
    multistage(Problem(8200, 2047, 200, a_major="col", b_major="col", epilogue=Epilogue(bias="n")),
               tile=(128, 256, 64), warps=(8, 1), stages=4, scheduler="persistent", wgmma=True),
]


@pytest.mark.parametrize("index", range(len(PERSISTENT)))
def test_multistage_persistent_ctas_walk_many_tiles(index, runner):
    """The launch holds one wave of CTAs (what the SMs hold at once), fewer than the tiles, so
    each CTA's ring runs on into its next tiles; every output element is still right."""
    from gemmgen.backends import cuda
    from gemmgen.backends.cuda import multistage as ms
    program = PERSISTENT[index]
    artifact = cuda.compile_program(program)
    fn = cuda.load(artifact, program)
    p = program.problem
    tiles = -(-p.m // program.tile.m) * -(-p.n // program.tile.n)
    assert fn.wave and ms.grid_size(fn.geo, p.m, p.n, p.k, fn.wave) == fn.wave < tiles / 2, (fn.wave, tiles)
    _check(program, artifact, runner)


# Stream-K: one wave of CTAs shares the (tile, k tile) iterations, so most tiles are begun by
# one CTA and finished by the next ones. A CTA over several tiles and unaligned edges; tiles
# shared by two or three CTAs; tiles over eight or nine CTAs (the first adds the others' partials).
STREAM_K = [
    multistage(Problem(4097, 2055, 2048, b_major="col", epilogue=Epilogue(residual=True)),
               tile=(64, 128, 64), warps=(2, 2), stages=3, scheduler="stream_k"),
    multistage(Problem(1000, 1000, 4096, b_major="col", epilogue=Epilogue(bias="n", activation="gelu")),
               tile=(64, 64, 64), warps=(2, 2), stages=4, scheduler="stream_k"),
    multistage(Problem(72, 136, 2112, a_major="col", epilogue=Epilogue(out_dtype="bf16")),
               tile=(32, 32, 64), warps=(2, 2), stages=4, scheduler="stream_k", swizzle=4),
    multistage(Problem(1000, 2056, 4104, b_major="row", epilogue=Epilogue(bias="n", residual=True)),
               tile=(128, 128, 64), warps=(8, 1), stages=4, scheduler="stream_k", wgmma=True),
]


@pytest.mark.parametrize("index", range(len(STREAM_K)))
def test_multistage_stream_k_ctas_finish_each_others_tiles(index, runner):
    """Passes the harness's checks, gives the same bits call after call (a tile's partials are
    added in K order), and leaves every CTA's flag at zero."""
    from gemmgen.backends import cuda
    from gemmgen.backends.cuda import multistage as ms
    program = STREAM_K[index]
    artifact = cuda.compile_program(program)
    _check(program, artifact, runner)
    fn = cuda.load(artifact, program)
    p = program.problem
    iterations = ms.iteration_count(fn.geo, p.m, p.n, p.k)
    grid = ms.grid_size(fn.geo, p.m, p.n, p.k, fn.wave)
    assert iterations % grid, (iterations, grid)          # shares end inside tiles
    device = _same_bits_three_times(fn, p)
    _, flags = fn._workspace(p.m, p.n, device)
    assert int(flags.count_nonzero()) == 0


# Both majors; TMA needs the contiguous dimension of each operand to be a multiple of 8.
HOPPER_SHAPES = ((4096, 4096, 4096, "row", "col"), (1000, 1000, 1000, "row", "row"),
                 (129, 263, 520, "row", "col"), (776, 1000, 264, "col", "row"), (512, 384, 1024, "col", "col"))


def _hopper_cases():
    cases = []
    for i, (m, n, k, am, bm) in enumerate(HOPPER_SHAPES):
        epi = (Epilogue(), Epilogue(bias="n", activation="gelu"), Epilogue(residual=True, alpha=0.5, beta=0.5),
               Epilogue(bias="m", activation="silu", out_dtype="f32"))[i % 4]
        pr = Problem(m, n, k, a_major=am, b_major=bm, epilogue=epi)
        cases += [hopper(pr), hopper(pr, tile=(128, 256, 64), stages=3),
                  hopper(pr, tile=(256, 128, 64), stages=3, raster="n", scheduler="tile"),
                  hopper(pr, cluster=(2, 1), stages=5),
                  hopper(pr, mainloop="ws_pingpong", warps=(4, 1), stages=4, swizzle=4),
                  hopper(pr, mainloop="ws_pingpong", warps=(4, 1), stages=5),
                  hopper(pr, tile=(64, 256, 64), mainloop="ws_pingpong", warps=(4, 1), cluster=(2, 1))]
    return _valid(cases)


HOPPER = _hopper_cases()


@pytest.fixture(scope="module")
def hopper_artifacts():
    return _build_all(HOPPER)


@pytest.mark.parametrize("index", range(len(HOPPER)))
def test_hopper_programs(index, hopper_artifacts, runner):
    _check(HOPPER[index], hopper_artifacts[index], runner)


# ws_cooperative stores C^T (c=col) under every scheduler: swapped persistent and one-tile-a-CTA
# programs, with a 2-CTA cluster too, at unaligned N and K and a few epilogues.
HOPPER_SWAPPED = [replace(program, swap_ab=True) for program in (
    hopper(Problem(17, 1000, 4104, b_major="col", epilogue=Epilogue(residual=True, alpha=0.5, beta=0.5)),
           tile=(128, 32, 64), stages=8),
    hopper(Problem(100, 4096, 4104, b_major="col", epilogue=Epilogue(bias="n", activation="gelu")),
           tile=(128, 128, 64), cluster=(2, 1), scheduler="tile"),
    hopper(Problem(64, 6144, 520, b_major="row", epilogue=Epilogue(bias="m", out_dtype="f32")),
           tile=(128, 64, 64), stages=6),
)]


@pytest.mark.parametrize("index", range(len(HOPPER_SWAPPED)))
def test_hopper_swapped_programs_store_the_transpose(index, runner):
    program = HOPPER_SWAPPED[index]
    _check(program, _build_all([program])[0], runner)


# One consumer warpgroup a tile (`warps 4x1`): 64-row tiles, so a skinny weight gets twice the CTAs
# of 128-row ones. Swapped (`x @ W.T`) at M = 1, 3, 17, 100, unaligned N and K, both majors of the
# weight, every epilogue kind, persistent and one tile a CTA, a 2-CTA cluster, 2 K slices; and
# unswapped with A column-major.
ONE_CONSUMER = [replace(program, swap_ab=swap) for program, swap in (
    (hopper(Problem(1, 4096, 4096, b_major="col"), tile=(64, 16, 64), warps=(4, 1), stages=12), True),
    (hopper(Problem(3, 1000, 4104, b_major="col", epilogue=Epilogue(bias="n", activation="gelu")),
            tile=(64, 16, 64), warps=(4, 1), stages=10, scheduler="tile"), True),
    (hopper(Problem(17, 1000, 4104, b_major="col", epilogue=Epilogue(residual=True, alpha=0.5, beta=0.5)),
            tile=(64, 32, 64), warps=(4, 1), stages=8), True),
    (hopper(Problem(100, 4096, 520, b_major="row", epilogue=Epilogue(bias="m", activation="silu",
                                                                       out_dtype="f32")),
            tile=(64, 128, 64), warps=(4, 1), stages=6, cluster=(2, 1)), True),
    (hopper(Problem(776, 1000, 264, a_major="col", b_major="row", epilogue=Epilogue(out_dtype="bf16")),
            tile=(64, 128, 64), warps=(4, 1)), False),
)] + [replace(hopper(Problem(32, 4096, 4104, b_major="col", epilogue=Epilogue(bias="n")), tile=(64, 32, 64),
                     warps=(4, 1), stages=8, scheduler="tile"),
              split_k=2, split_k_reduce=CLUSTER_REDUCE, swap_ab=True)]


@pytest.mark.parametrize("index", range(len(ONE_CONSUMER)))
def test_hopper_one_consumer_programs(index, runner):
    program = ONE_CONSUMER[index]
    _check(program, _build_all([program])[0], runner)


def test_one_consumer_rings_that_fit_twice_get_two_ctas_an_sm():
    """The kernel built for two CTAs an SM (`hopper.ctas_per_sm`) gets them from the driver: its
    registers and its ring both leave room for a second CTA."""
    from gemmgen.backends import cuda
    from gemmgen.backends.cuda import hopper as ws, launch as cuda_launch

    twos = [p.computed for p in ONE_CONSUMER if ws.ctas_per_sm(p.computed) == 2]
    assert len(twos) >= 2
    for program in twos:
        fn = cuda.load(cuda.compile_program(program), program)
        geo = ws.geometry(program)
        assert cuda_launch.resident_ctas(fn.fn, geo.threads, geo.smem) == 2, program


def _split(problem, tile, warps, split, stages=4, b="col", swap=False):
    """`split_k S cluster` in the TMA family: one CTA a tile's K slice, the S slices of a tile one
    cluster summing their partials through distributed shared memory; with `swap`, C^T = W x^T
    (the tile's M is the weight's rows, its N the batch) stored transposed."""
    program = hopper(replace(problem, b_major=b), tile=tile, warps=warps, stages=stages, scheduler="tile")
    return replace(program, split_k=split, split_k_reduce=CLUSTER_REDUCE, swap_ab=swap)


# Skinny products (what it is for): M = 1, 3, 17, 64, 100, 128, a last short k tile (K = 4104, 520),
# both majors of B, tiles of 64 and 128 rows, 2-8 slices, every epilogue kind.
SPLIT = [
    _split(Problem(1, 4096, 4096), (128, 64, 64), (8, 1), 4, 6),
    _split(Problem(3, 1000, 4104, epilogue=Epilogue(bias="n", activation="gelu")), (64, 128, 64), (4, 2), 8),
    _split(Problem(17, 1000, 4104, epilogue=Epilogue(residual=True, alpha=0.5, beta=0.5)), (128, 64, 64), (8, 1), 2),
    _split(Problem(100, 4096, 4104, epilogue=Epilogue(bias="m", activation="silu", out_dtype="f32")),
           (128, 128, 64), (8, 1), 4),
    _split(Problem(128, 6144, 4096, epilogue=Epilogue(out_dtype="bf16")), (64, 128, 64), (4, 2), 4, 6, b="row"),
    _split(Problem(64, 1000, 520, epilogue=Epilogue(bias="n", residual=True)), (128, 64, 64), (8, 1), 8, 3, b="row"),
    # swap_ab (`x @ W.T`: W, N x K, is the computed A): every epilogue kind, unaligned M and N
    _split(Problem(1, 4096, 4096), (128, 32, 64), (8, 1), 4, 6, swap=True),
    _split(Problem(3, 1000, 4104, epilogue=Epilogue(bias="n", activation="gelu")), (128, 32, 64), (8, 1), 8,
           swap=True),
    _split(Problem(17, 1000, 4104, epilogue=Epilogue(residual=True, alpha=0.5, beta=0.5)), (128, 32, 64), (8, 1),
           2, swap=True),
    _split(Problem(100, 4096, 4104, epilogue=Epilogue(bias="m", activation="silu", out_dtype="f32")),
           (128, 128, 64), (8, 1), 4, swap=True),
    _split(Problem(64, 6144, 4096, epilogue=Epilogue(out_dtype="bf16")), (128, 64, 64), (8, 1), 4, 6, swap=True),
]


def _multistage_split(problem, tile, warps, split, stages=4, b="col", wgmma=False):
    """`split_k S cluster` in the multistage family: each slice parks its fp32 partial tile in its
    ring, and the slices of a tile, one cluster, sum them in slice order."""
    return multistage(replace(problem, b_major=b), tile=tile, warps=warps, stages=stages, split_k=split,
                      reduce=CLUSTER_REDUCE, swizzle=4, wgmma=wgmma)


# The narrow-weight shapes it is for and beyond: M = 1, 3, 17, 100, 128, unaligned N and a last
# short k tile (K = 4104, 520), both majors of B, 2-8 slices, every epilogue kind, tiles of 16-128
# rows, wgmma, and a 128x128 tile whose 64 KB partial is larger than its ring.
MULTISTAGE_SPLIT = [
    _multistage_split(Problem(1, 1024, 4096), (16, 64, 128), (1, 4), 8),
    _multistage_split(Problem(3, 1000, 4104, epilogue=Epilogue(bias="n", activation="gelu")), (32, 32, 128),
                      (2, 2), 8, stages=3),
    _multistage_split(Problem(17, 1000, 4104, epilogue=Epilogue(residual=True, alpha=0.5, beta=0.5)),
                      (32, 32, 128), (2, 2), 6),
    _multistage_split(Problem(100, 512, 4104, epilogue=Epilogue(bias="m", activation="silu", out_dtype="f32")),
                      (64, 64, 64), (4, 1), 6, stages=8, wgmma=True),
    _multistage_split(Problem(128, 1000, 520, epilogue=Epilogue(out_dtype="bf16", bias="n", residual=True)),
                      (128, 128, 32), (2, 2), 4, stages=2, b="row"),
    _multistage_split(Problem(17, 1024, 3584, epilogue=Epilogue(bias="n", activation="relu")), (16, 64, 128),
                      (1, 4), 2, b="row"),
]


# `split_k S cluster` in both families that sum across a cluster (the direct family's are in
# tests/test_direct_gpu.py), built together and checked one by one.
CLUSTER_SPLIT = SPLIT + MULTISTAGE_SPLIT


@pytest.fixture(scope="module")
def split_artifacts():
    return _build_all(CLUSTER_SPLIT)


@pytest.mark.parametrize("index", range(len(CLUSTER_SPLIT)))
def test_split_k_cluster_programs(index, split_artifacts, runner):
    _check(CLUSTER_SPLIT[index], split_artifacts[index], runner)


def _tma_stream_k(problem, tile, stages=6, b="col", swap=True):
    """`scheduler stream_k` in the TMA family: one wave of CTAs shares the (tile, k tile)
    iterations; with `swap`, C^T = W x^T (the tile's M is the weight's rows, its N the batch)
    stored transposed."""
    program = hopper(replace(problem, b_major=b), tile=tile, stages=stages, scheduler="stream_k", swizzle=1)
    return replace(program, swap_ab=swap)


# Skinny products under swap_ab at M = 1, 3, 17, 64, 100, 128 (tiles shared by two CTAs or more,
# unaligned N, a last short k tile, both majors of the weight, every epilogue kind), and unswapped
# products whose CTAs walk several tiles across unaligned edges.
TMA_STREAM_K = [
    _tma_stream_k(Problem(1, 4096, 4096), (128, 16, 64), 8),
    _tma_stream_k(Problem(3, 1000, 4104, epilogue=Epilogue(bias="n", activation="gelu")), (128, 32, 64), 8),
    _tma_stream_k(Problem(17, 1000, 4104, epilogue=Epilogue(residual=True, alpha=0.5, beta=0.5)), (128, 32, 64)),
    _tma_stream_k(Problem(100, 4096, 4104, epilogue=Epilogue(bias="m", activation="silu", out_dtype="f32")),
                  (128, 128, 64), 4),
    _tma_stream_k(Problem(128, 14336, 4096, epilogue=Epilogue(out_dtype="bf16")), (128, 128, 64), 4),
    _tma_stream_k(Problem(64, 1000, 520, epilogue=Epilogue(bias="n", residual=True)), (128, 64, 64), 6, b="row"),
    _tma_stream_k(Problem(1000, 1000, 4104, epilogue=Epilogue(bias="n", activation="relu")), (128, 128, 64), 4,
                  swap=False),
    _tma_stream_k(Problem(129, 264, 520, epilogue=Epilogue(residual=True)), (128, 128, 64), 4, b="row", swap=False),
    _tma_stream_k(Problem(4097, 2056, 2048, epilogue=Epilogue(alpha=0.5, beta=0.5)), (128, 256, 64), 3,
                  swap=False),
]


def _hands_off(program, sms):
    """Some CTA's share begins inside a tile: the partial hand-off runs."""
    from gemmgen.backends.cuda import hopper as hop
    computed = program.computed.problem
    k_tiles = -(-computed.k // hop.BK)
    total = -(-computed.m // program.tile.m) * -(-computed.n // program.tile.n) * k_tiles
    grid = hop.grid_size(hop.geometry(program.computed), computed.m, computed.n, computed.k, sms)
    return any((c * total // grid) % k_tiles for c in range(grid))


@pytest.fixture(scope="module")
def tma_stream_k_artifacts():
    return _build_all(TMA_STREAM_K)


@pytest.mark.parametrize("index", range(len(TMA_STREAM_K)))
def test_hopper_tma_stream_k_programs(index, tma_stream_k_artifacts, runner):
    """Passes the harness's checks, gives the same bits call after call (a tile's partials are
    added in K order), and leaves every CTA's flag at zero."""
    from gemmgen.backends import load
    program, artifact = TMA_STREAM_K[index], tma_stream_k_artifacts[index]
    _check(program, artifact, runner)
    fn = load(artifact, program)
    inner = fn.inner if program.swap_ab else fn
    assert _hands_off(program, inner.sms)
    _, flags = inner._workspace(_same_bits_three_times(fn, program.problem))
    assert int(flags.count_nonzero()) == 0
