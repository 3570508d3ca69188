"""GPU tests of the CUTLASS backend (on the H200: pytest -m gpu tests/test_backend_cutlass_gpu.py).

Every program is checked by the harness (gemmgen.measure.check: random normal inputs,
NaN-poisoned output, guard bands, fp64 reference, fp16-accumulation probe) inside the
isolated worker (gemmgen.measure.Runner), so a hang fails one test after 120 s instead
of stopping the run. The instances (about 25) are built first, in parallel on every core:
the file takes about 4 minutes on 16 cores from a cold cache, about one from a warm one.
`-k narrow` builds only the 6 instances of the narrow-tile, one-tile-per-CTA and 128x64
split-K cases, `-k wide_n` only the 3 of the 128x192 tile, `-k sliced` the 6 of `split_k N
workspace`, `-k persistent_grid` the 2 of `scheduler persistent N`, `-k epilogue_tile` the 9 of
`tile ... epilogue=MxN` (7 of them the sample's wide-epilogue builds).
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile

pytestmark = pytest.mark.gpu


def _program(problem, tile=(128, 256, 64), mainloop="ws_cooperative", cluster=(1, 1), scheduler="persistent",
             **kw) -> Program:
    warps = (8, 1) if mainloop == "ws_cooperative" else (4, 1)
    return Program(problem=problem, backend="cutlass", tile=Tile(*tile), warps=warps, mainloop=mainloop,
                   cluster=cluster, scheduler=scheduler, **kw)


EPILOGUES = (
    Epilogue(alpha=0.5, beta=0.75),
    Epilogue(bias="n", activation="gelu"),
    Epilogue(bias="m", activation="relu"),
    Epilogue(activation="silu", alpha=2.0),
    Epilogue(residual=True),
    Epilogue(bias="n", residual=True, alpha=1.5),
    Epilogue(bias="n", activation="gelu", residual=True),
    Epilogue(activation="relu", residual=True),
)
MAJORS = (("row", "col"), ("row", "row"), ("col", "row"), ("col", "col"))
# (M, N, K): aligned, unaligned M (never a leading dimension for a=row), odd tile remainders, long K.
SHAPES = ((512, 512, 512), (999, 1000, 1000), (129, 264, 72), (4096, 4096, 4096), (256, 128, 8192))


def _aligned(shape, a_major, b_major) -> bool:
    m, n, k = shape
    return (k if a_major == "row" else m) % 8 == 0 and (n if b_major == "row" else k) % 8 == 0 and n % 8 == 0


EPILOGUE_CASES = [(e, _program(Problem(None, None, None, "row", "col", epilogue=e), tile=(128, 128, 64)),
                   (999, 1000, 1000)) for e in EPILOGUES]
MAJOR_CASES = [(majors, _program(Problem(None, None, None, *majors)), shape)
               for majors in MAJORS for shape in ((999, 1000, 1000), (512, 512, 512)) if _aligned(shape, *majors)]
SCHEDULE_CASES = [
    _program(Problem(None, None, None, "row", "col"), cluster=(2, 1)),
    _program(Problem(None, None, None, "row", "col"), tile=(256, 128, 64), cluster=(1, 2)),
    _program(Problem(None, None, None, "row", "col"), tile=(64, 256, 64), mainloop="ws_pingpong", cluster=(1, 2)),
    _program(Problem(None, None, None, "row", "col"), tile=(128, 128, 64), mainloop="ws_pingpong", cluster=(2, 1)),
    _program(Problem(None, None, None, "row", "col"), tile=(128, 128, 64), scheduler="stream_k"),
    _program(Problem(None, None, None, "row", "col"), tile=(128, 128, 64), scheduler="persistent", split_k=4,
             split_k_reduce="unordered", raster="n", swizzle=2),
    _program(Problem(None, None, None, "row", "col"), tile=(128, 256, 64), stages=4, swizzle=8),
]


def _valid_schedule_cases():
    from gemmgen.backends import diagnose
    return [(i, shape) for i, p in enumerate(SCHEDULE_CASES) for shape in SHAPES if not diagnose(p.bind(shape))]


SCHEDULE_SHAPE_CASES = _valid_schedule_cases()


def _random_cases(count: int, seed: int = 5):
    """Random (program from the CUTLASS space, shape) pairs: the library the benchmark builds."""
    from gemmgen.backends import cutlass
    from gemmgen.backends import diagnose

    rng = random.Random(seed)
    out = []
    while len(out) < count:
        m, n, k = rng.choice((64, 200, 999, 1024, 2048)), 8 * rng.randint(8, 384), 8 * rng.randint(8, 1024)
        problem = Problem(m, n, k, "row", "row")
        programs = [p for p in cutlass.space(problem)[:12] if not diagnose(p)]
        if programs:
            out.append(rng.choice(programs))
    return out


RANDOM_CASES = _random_cases(10)


def _all_programs():
    programs = [p.bind(s) for _, p, s in EPILOGUE_CASES] + [p.bind(s) for _, p, s in MAJOR_CASES]
    programs += [SCHEDULE_CASES[i].bind(s) for i, s in SCHEDULE_SHAPE_CASES]
    return programs + RANDOM_CASES


def _built(programs) -> dict:
    """Source digest -> artifact for every program's build, built in parallel on every core."""
    from gemmgen.backends import cutlass
    from gemmgen.backends.build import build_many

    sources = {}
    for p in programs:
        s = cutlass.lower(p)
        sources.setdefault(s.digest, s)
    results = build_many(list(sources.values()), jobs=None)
    failed = [str(r) for r in results if isinstance(r, Exception)]
    assert not failed, failed[0]
    return dict(zip(sources, results))


@pytest.fixture(scope="module")
def artifacts():
    return _built(_all_programs())


def _group_artifacts(name: str, programs: list):
    """A module fixture `name` that builds only `programs`, apart from the module's other
    instances, so that `-k` on its group (narrow, wide_n, epilogue_tile, sliced) builds no more."""
    @pytest.fixture(scope="module", name=name)
    def built():
        return _built(programs)
    return built


def _check(program, artifacts, runner):
    from gemmgen.backends import cutlass
    from gemmgen.backends import validate
    from gemmgen.measure import Job

    validate(program)
    job = Job(program.problem.key, cutlass.load, (artifacts[cutlass.lower(program).digest], program),
              program.problem, check=True, mode=None, seed=1234)
    result = runner.run(job)
    assert result.ok, (program, result.status, result.message)
    return result


@pytest.mark.parametrize("index", range(len(EPILOGUE_CASES)))
def test_each_epilogue(index, artifacts, runner):
    _, program, shape = EPILOGUE_CASES[index]
    _check(program.bind(shape), artifacts, runner)


@pytest.mark.parametrize("index", range(len(MAJOR_CASES)))
def test_both_majors(index, artifacts, runner):
    _, program, shape = MAJOR_CASES[index]
    _check(program.bind(shape), artifacts, runner)


@pytest.mark.parametrize("index,shape", SCHEDULE_SHAPE_CASES)
def test_schedules_clusters_and_splits(index, shape, artifacts, runner):
    _check(SCHEDULE_CASES[index].bind(shape), artifacts, runner)


@pytest.mark.parametrize("index", range(len(RANDOM_CASES)))
def test_random_space_programs(index, artifacts, runner):
    _check(RANDOM_CASES[index], artifacts, runner)


def test_one_build_serves_runtime_variants(runner):
    """Raster, swizzle and splits change per call, not per build; all give right answers.

    Stream-K and split-K (`scheduler persistent` with `split_k 3 unordered`) are two
    decompositions of one stream-K tile scheduler, chosen per call. The test builds its one instance
    itself, so `-k runtime_variants` runs it without building the module's other 24."""
    from gemmgen.backends import cutlass
    from gemmgen.backends.build import build_many
    from gemmgen.backends import diagnose

    base = SCHEDULE_CASES[4].bind((2048, 2048, 4096))
    variants = [replace(base, raster=r, swizzle=s, split_k=k, split_k_reduce="unordered" if k > 1 else "workspace",
                        scheduler="stream_k" if k == 1 else "persistent")
                for r in "mn" for s in (1, 4) for k in (1, 3)]
    assert all(diagnose(v) == [] for v in variants)
    assert len({cutlass.build_key(v) for v in variants}) == 1
    sources = {cutlass.lower(v).digest: cutlass.lower(v) for v in variants}
    assert len(sources) == 1
    (artifact,) = build_many(list(sources.values()), jobs=1)
    assert not isinstance(artifact, Exception), artifact
    for v in variants:
        _check(v, {digest: artifact for digest in sources}, runner)


def test_persistent_grid_on_fewer_sms(runner):
    """`scheduler persistent N` runs the persistent grid on N SMs, a run-time choice of the same
    build: 4096^3 in 128x256 tiles on 128 SMs is 4 tiles a CTA. The products pass the harness's
    check. `-k persistent_grid` builds only its two instances."""
    from gemmgen.backends import cutlass
    from gemmgen.backends.cutlass.search_space import balanced_grid_sms

    wholes = [_program(Problem(None, None, None, "row", "row"), cluster=cluster, raster="n",
                       swizzle=8).bind((4096, 4096, 4096)) for cluster in ((1, 1), (2, 1))]
    artifacts = _built(wholes)
    for whole in wholes:
        fewer = replace(whole, grid_sms=balanced_grid_sms(whole))
        assert fewer.grid_sms == 128 and cutlass.build_key(fewer) == cutlass.build_key(whole)
        grid = cutlass.load(artifacts[cutlass.lower(whole).digest], whole)._lib.gg_grid_sms
        assert grid(4096, 4096, 4096, 8, 1, 0) == 132 and grid(4096, 4096, 4096, 8, 1, 128) == 128
        assert grid(4096, 4096, 4096, 8, 1, 200) == 132            # never more than the GPU has
        _check(fewer, artifacts, runner)
        _check(replace(fewer, grid_sms=120).bind((2048, 11264, 2048)), artifacts, runner)


# Narrow tiles, one tile per CTA (`scheduler tile`) and the 128x64 split-K tile: the small-problem
# builds, over every major, several epilogues, partial tiles in M and N, and long K.
NARROW_CASES = [
    _program(Problem(None, None, None, "row", "col"), tile=(64, 16, 64), mainloop="ws_pingpong", scheduler="tile"),
    _program(Problem(None, None, None, "row", "row", epilogue=Epilogue(bias="n", activation="gelu")),
             tile=(64, 32, 64), mainloop="ws_pingpong"),
    _program(Problem(None, None, None, "col", "row", epilogue=Epilogue(residual=True, alpha=0.5)),
             tile=(64, 64, 64), mainloop="ws_pingpong", scheduler="tile"),
    _program(Problem(None, None, None, "col", "col", epilogue=Epilogue(bias="m", activation="silu")),
             tile=(64, 32, 64), mainloop="ws_pingpong", scheduler="tile"),
    _program(Problem(None, None, None, "row", "col", epilogue=Epilogue(alpha=0.5, beta=0.75)),
             tile=(128, 128, 64), mainloop="ws_pingpong", scheduler="tile"),
    _program(Problem(None, None, None, "row", "row", epilogue=Epilogue(bias="n", activation="relu")),
             tile=(128, 64, 64), scheduler="persistent", split_k=8, split_k_reduce="unordered"),
]
NARROW_SHAPES = ((129, 264, 72), (1000, 1000, 1000), (64, 40, 12288), (1024, 8, 512))


def _valid_narrow_cases():
    from gemmgen.backends import diagnose
    return [(i, shape) for i, p in enumerate(NARROW_CASES) for shape in NARROW_SHAPES
            if not diagnose(p.bind(shape))]


NARROW_SHAPE_CASES = _valid_narrow_cases()


narrow_artifacts = _group_artifacts("narrow_artifacts", [NARROW_CASES[i].bind(s) for i, s in NARROW_SHAPE_CASES])


@pytest.mark.parametrize("index,shape", NARROW_SHAPE_CASES)
def test_narrow_tiles_and_one_tile_per_cta(index, shape, narrow_artifacts, runner):
    _check(NARROW_CASES[index].bind(shape), narrow_artifacts, runner)


# The 128x192 cooperative tile: persistent and stream-K builds of the sample's
# layout, on one full wave (256 x 12288: 128 tiles), partial tiles in M and N, and split-K.
WIDE_N_CASES = [
    (_program(Problem(None, None, None, "row", "row"), tile=(128, 192, 64)), (256, 12288, 2048)),
    (_program(Problem(None, None, None, "row", "row"), tile=(128, 192, 64)), (999, 1000, 1000)),
    (_program(Problem(None, None, None, "row", "row"), tile=(128, 192, 64), cluster=(1, 2)), (129, 264, 72)),
    (_program(Problem(None, None, None, "row", "row"), tile=(128, 192, 64), scheduler="stream_k"), (1000, 1000, 1000)),
    (_program(Problem(None, None, None, "row", "row"), tile=(128, 192, 64), split_k=4,
              split_k_reduce="unordered"), (256, 384, 8192)),
]


wide_n_artifacts = _group_artifacts("wide_n_artifacts", [p.bind(s) for p, s in WIDE_N_CASES])


@pytest.mark.parametrize("index", range(len(WIDE_N_CASES)))
def test_wide_n_tile_192(index, wide_n_artifacts, runner):
    program, shape = WIDE_N_CASES[index]
    _check(program.bind(shape), wide_n_artifacts, runner)


# `tile ... epilogue=MxN`: every wide-epilogue build the space offers, at short-K
# shapes with partial tiles in M, N and K, and two fused epilogues through the wider sub-tile.
def _wide_epilogue_cases():
    from gemmgen.backends.cutlass.search_space import WIDE_EPILOGUE

    shapes = ((4096, 2048, 64), (1000, 1000, 136), (264, 4104, 200))
    cases = [(_program(Problem(None, None, None, "row", "row"), tile=(tm, tn, 64), mainloop=mainloop,
                       epilogue_tile=wide), shapes[i % len(shapes)])
             for i, ((mainloop, tm, tn), wide) in enumerate(sorted(WIDE_EPILOGUE.items()))]
    cases.append((_program(Problem(None, None, None, "row", "col", epilogue=Epilogue(bias="n", activation="gelu")),
                           epilogue_tile=(128, 128)), (999, 1000, 128)))
    cases.append((_program(Problem(None, None, None, "row", "row", epilogue=Epilogue(residual=True, alpha=0.5)),
                           tile=(128, 128, 64), mainloop="ws_pingpong", epilogue_tile=(64, 128)), (2048, 1000, 64)))
    return cases


WIDE_EPILOGUE_CASES = _wide_epilogue_cases()


wide_epilogue_artifacts = _group_artifacts("wide_epilogue_artifacts", [p.bind(s) for p, s in WIDE_EPILOGUE_CASES])


@pytest.mark.parametrize("index", range(len(WIDE_EPILOGUE_CASES)))
def test_epilogue_tile(index, wide_epilogue_artifacts, runner):
    program, shape = WIDE_EPILOGUE_CASES[index]
    _check(program.bind(shape), wide_epilogue_artifacts, runner)


# `split_k N workspace`: K slices of a batched GEMM into fp32 partials and a reduce
# kernel with the epilogue; every epilogue kind, three majors, partial tiles, slice counts that
# leave a partial last k-tile (1000 / 5 = 200), and three tile widths.
def _sliced(problem, tile=(64, 64, 64)):
    return _program(problem, tile=tile, mainloop="ws_pingpong", scheduler="tile", split_k=2,
                    split_k_reduce="workspace")


SLICED_CASES = [
    (_sliced(Problem(None, None, None, "row", "row")), (64, 64, 12288), 8),
    (_sliced(Problem(None, None, None, "row", "row")), (129, 264, 1024), 4),
    (_sliced(Problem(None, None, None, "row", "row")), (1000, 1000, 1000), 5),
    (_sliced(Problem(None, None, None, "row", "col", epilogue=Epilogue(bias="n", activation="gelu"))),
     (256, 128, 8192), 16),
    (_sliced(Problem(None, None, None, "row", "col", epilogue=Epilogue(bias="n", activation="gelu"))),
     (999, 1000, 2048), 4),
    (_sliced(Problem(None, None, None, "row", "row", epilogue=Epilogue(residual=True, alpha=0.5))),
     (129, 264, 4096), 8),
    (_sliced(Problem(None, None, None, "col", "row", epilogue=Epilogue(alpha=0.5, beta=0.75))),
     (256, 264, 4096), 4),
    (_sliced(Problem(None, None, None, "row", "row"), tile=(64, 32, 64)), (64, 2048, 16384), 16),
    (_sliced(Problem(None, None, None, "row", "row"), tile=(64, 128, 64)), (512, 256, 16384), 8),
]


sliced_artifacts = _group_artifacts("sliced_artifacts", [p.bind(s) for p, s, _ in SLICED_CASES])


@pytest.mark.parametrize("index", range(len(SLICED_CASES)))
def test_sliced_split_k(index, sliced_artifacts, runner):
    program, shape, split = SLICED_CASES[index]
    _check(replace(program, split_k=split).bind(shape), sliced_artifacts, runner)


def test_sliced_split_k_refuses_a_k_that_does_not_cut_evenly(sliced_artifacts):
    import torch

    from gemmgen.backends import cutlass
    from gemmgen.errors import GemmgenError

    program = replace(SLICED_CASES[0][0], split_k=8).bind((64, 64, 12288))
    fn = cutlass.load(sliced_artifacts[cutlass.lower(program).digest], program)
    a = torch.randn(64, 1000, device="cuda", dtype=torch.float16)       # 1000 / 8 = 125: not a multiple of 8
    b = torch.randn(1000, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(GemmgenError, match="split_k slices"):
        fn(a, b, torch.empty(64, 64, device="cuda", dtype=torch.float16))


def _hammer(artifact, program):
    """A worker job: 200 back-to-back stream-K launches, then one sync and a check."""
    def run():
        import torch

        from gemmgen.backends import cutlass

        fn = cutlass.load(artifact, program)
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16).t()
        out = torch.empty(4096, 4096, device="cuda", dtype=torch.float16)
        for _ in range(200):
            fn(a, b, out)
        torch.cuda.synchronize()
        ref = a.float() @ b.float()
        err = float((out.float() - ref).norm() / ref.norm())
        if not err < 1e-2:
            raise AssertionError(f"relative error {err:.3g} after 200 launches")
    return run


def test_repeated_stream_k_launches_do_not_hang(artifacts, runner):
    """Stream-K barriers are re-zeroed per launch: 200 back-to-back calls finish and stay right."""
    from gemmgen.backends import cutlass
    from gemmgen.measure import Job

    program = SCHEDULE_CASES[4].bind((4096, 4096, 4096))
    result = runner.run(Job("stream-k x200", _hammer, (artifacts[cutlass.lower(program).digest], program),
                            timeout_s=60))
    assert result.ok, (result.status, result.message)


def test_bad_operands_are_refused_with_a_clear_error(artifacts):
    import torch

    from gemmgen.backends import cutlass
    from gemmgen.errors import GemmgenError

    program = MAJOR_CASES[0][1].bind((512, 512, 512))  # a=row, b=col
    fn = cutlass.load(artifacts[cutlass.lower(program).digest], program)
    a = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    out = torch.empty(512, 512, device="cuda", dtype=torch.float16)
    with pytest.raises(GemmgenError, match="col-major"):
        fn(a, torch.randn(512, 512, device="cuda", dtype=torch.float16), out)  # b row-major, program says col
    with pytest.raises(GemmgenError, match="beta"):
        fn(a, a.t(), out, beta=1.0)
    with pytest.raises(GemmgenError, match="unscaled"):     # the plain epilogue at alpha 1 has no alpha
        fn(a, a.t(), out, alpha=2.0)
