"""The Triton backend on CPU: support and refusals, lowering, AOT compile to sm_90a, the cache,
the search space, and the generated kernels' numbers under Triton's interpreter."""
from __future__ import annotations

import pytest
from dataclasses import replace

pytest.importorskip("triton")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from gemmgen import backends, dsl  # noqa: E402
from gemmgen.backends import build as builds  # noqa: E402
from gemmgen.backends import triton as tb  # noqa: E402
from gemmgen.backends.triton import compiler as triton_compiler  # noqa: E402
from gemmgen.backends.base import BackendError  # noqa: E402
from gemmgen.cache import CACHE_ENV  # noqa: E402
from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile  # noqa: E402

from strategies import valid_programs  # noqa: E402


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    # One cache per session: examples built by one test are hits in the next.
    root = tmp_path_factory.getbasetemp() / "gemmgen-cache"
    monkeypatch.setenv(CACHE_ENV, str(root))
    return root


def program(m=256, n=256, k=256, *, a="row", b="row", c="row", tile=(128, 128, 64), warps=(8, 1),
            epilogue=Epilogue(), **kw) -> Program:
    problem = Problem(m, n, k, a_major=a, b_major=b, c_major=c, epilogue=epilogue)
    return Program(problem=problem, backend="triton", tile=Tile(*tile), warps=warps, mainloop="multistage", **kw)


def triton_examples():
    return {name: path for name, path in dsl.examples().items() if name.startswith("triton")}


def text_of(p: Program) -> str:
    return dsl.to_text(p)


# -- support: what the validator refuses, located ----------------------------------------------

REFUSED = {
    "cluster 2x1": ("cluster 1x1", "cluster 2x1"),
    "instr wgmma": ("instr auto", "instr wgmma 64x128x16"),
    "ws_pingpong": ("mainloop multistage", "mainloop ws_pingpong"),
    "ws_cooperative": ("warps 4x1\ninstr auto\ncluster 1x1\nstages 4\nmainloop multistage",
                       "warps 8x1\ninstr auto\ncluster 1x1\nstages 4\nmainloop ws_cooperative"),
    "smem_swizzle": ("smem_swizzle auto", "smem_swizzle 128"),
    "persistent unaligned": ("gemm 4096x4096x4096 a=row b=row c=row in=f16 acc=f32\nepilogue out=f16\n"
                             "backend triton\ntile 128x128x64\nwarps 4x1\ninstr auto\ncluster 1x1\nstages 4\n"
                             "mainloop multistage\nscheduler tile",
                             "gemm 4096x4096x77 a=row b=row c=row in=f16 acc=f32\nepilogue out=f16\n"
                             "backend triton\ntile 128x128x64\nwarps 4x1\ninstr auto\ncluster 1x1\nstages 4\n"
                             "mainloop multistage\nscheduler persistent"),
    "tile not a power of two": ("tile 128x128x64", "tile 128x96x64"),
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_unsupported_features_are_refused_by_the_validator_with_a_location(what):
    base = (triton_examples()["triton_generic"].read_text()
            .replace("gemm *x*x*", "gemm 4096x4096x4096").replace("warps 2x2", "warps 4x1"))
    backends.validate(dsl.parse(base))
    old, new = REFUSED[what]
    text = base.replace(old, new)
    assert text != base
    with pytest.raises(dsl.ProgramError) as info:
        backends.validate(dsl.parse(text, filename="k.gemm"), filename="k.gemm")
    err = info.value
    assert err.line > 0 and err.column > 0
    assert str(err).startswith("k.gemm:")
    assert err.message and ("triton" in err.message or "Triton" in err.message)


def test_support_lists_what_triton_can_do():
    s = tb.SUPPORT
    assert s.mainloops == {"multistage", "direct"}     # direct: tests/test_backend_triton_direct.py
    assert s.schedulers == {"tile", "persistent", "stream_k"}
    assert s.split_k_reduces == {"workspace", "unordered", "atomic"}
    assert s.max_cluster == 1 and s.instr_kinds == {None}
    assert s.activations == {"relu", "gelu", "silu"}


# -- lowering ------------------------------------------------------------------------------------

@pytest.mark.parametrize("tiles, k_tiles", [(1, 4), (32, 32), (150, 2), (33, 1000), (500, 7), (7, 5)])
def test_stream_k_shares_out_every_iteration_once(tiles, k_tiles):
    """The host's grid and the kernel's arithmetic: each iteration has one CTA, at most one wave of
    CTAs, and a CTA's partial tiles are only its first and its last (its two workspace slots)."""
    from gemmgen.backends.triton.stream_k import CTA_CAP, work_split, workspace_words

    grid = {"block_m": 16, "block_n": 32, "block_k": 64, "cta_cap": CTA_CAP}
    m, n, k = 16 * tiles, 32, 64 * k_tiles
    got_tiles, per, ctas = work_split(grid, m, n, k)
    assert got_tiles == tiles and ctas <= CTA_CAP
    owner = [c for c in range(ctas) for _ in range(c * per, min((c + 1) * per, tiles * k_tiles))]
    assert len(owner) == tiles * k_tiles and owner == sorted(owner)
    for c in range(ctas):
        begin, end = c * per, min((c + 1) * per, tiles * k_tiles)
        for tile in range(begin // k_tiles, (end - 1) // k_tiles + 1):
            whole = begin <= tile * k_tiles and end >= (tile + 1) * k_tiles
            assert whole or tile in (begin // k_tiles, (end - 1) // k_tiles)
            # the kernel's contributors of a tile: the CTAs whose ranges meet it
            first, last = tile * k_tiles // per, ((tile + 1) * k_tiles - 1) // per
            assert first <= c <= last and owner[tile * k_tiles] == first and owner[(tile + 1) * k_tiles - 1] == last
    assert workspace_words(grid, m, n, k) == ctas * 2 * 16 * 32 + tiles


def test_lower_is_pure_readable_and_keeps_majors_in_strides():
    p = program(4096, 11008, 4096, b="col", tile=(128, 256, 64), warps=(2, 4), stages=3, swizzle=8,
                epilogue=Epilogue(bias="n", activation="gelu"))
    s1, s2 = tb.lower(p), tb.lower(p)
    assert s1 == s2 and s1.digest == s2.digest
    text = s1.text
    assert text.count("@triton.jit") == 3          # tile_coords, epilogue, the kernel
    assert "tl.dot(a, b, acc, out_dtype=tl.float32)" in text
    assert "tl.math.erf" in text and "bias_ptr + offs_n" in text
    # x @ W.T: B is read K-contiguous through its own strides, with no transpose copy.
    assert "b_ptr + offs_k[:, None] + cols_b[None, :] * stride_b" in text
    kernel = s1.meta["kernels"][0]
    assert kernel["constexprs"]["BLOCK_N"] == 256 and kernel["constexprs"]["GROUP"] == 8
    assert kernel["num_warps"] == 8 and kernel["num_stages"] == 3
    assert kernel["constexprs"]["EVEN_K"] is True
    compile(text, "<lowered>", "exec")


def test_generic_program_takes_shape_at_runtime():
    p = program(None, None, None)
    src = tb.lower(p)
    kernel = src.meta["kernels"][0]
    roles = [role for _, _, role in kernel["params"]]
    assert {"M", "N", "K"} <= set(roles)
    assert kernel["constexprs"]["EVEN_K"] is False
    assert set(kernel["assumed"]) >= {"M", "N", "K"}
    assert src.meta["shape"] is None


def test_split_k_lowers_a_second_kernel_that_reduces_in_order():
    ws = tb.lower(program(64, 64, 4096, split_k=4, tile=(64, 64, 64), warps=(4, 1)))
    names = [k["name"] for k in ws.meta["kernels"]]
    assert len(names) == 2 and names[1].endswith("_reduce")
    assert "tl.static_range(SPLIT_K)" in ws.text
    atomic = tb.lower(program(64, 64, 4096, split_k=4, split_k_reduce="atomic", tile=(64, 64, 64), warps=(4, 1),
                              epilogue=Epilogue(out_dtype="f32")))
    assert "tl.atomic_add" in atomic.text and "tl.atomic_xchg(ws" in atomic.text
    # `unordered`: the same fp32 buffer, and the epilogue after it, so f16 out and an activation are fine
    unordered = backends.validate(program(64, 64, 4096, split_k=4, split_k_reduce="unordered", tile=(64, 64, 64),
                                     warps=(4, 1), epilogue=Epilogue(activation="gelu")))
    lowered = tb.lower(unordered)
    assert "tl.atomic_add" in lowered.text and lowered.meta["split_k_reduce"] == "unordered"
    # the finalize takes each sum with an atomic exchange: a plain load read sums the atomics
    # had not yet added in, on the H200 (docs/backends.md, "Split-K")
    assert "tl.atomic_xchg(ws.to(tl.pointer_type(tl.int32))" in lowered.text and "tl.load(ws" not in lowered.text
    with pytest.raises(Exception, match="gelu would see partial sums"):
        backends.validate(replace(unordered, split_k_reduce="atomic"))


def test_persistent_lowers_to_tma_descriptors():
    src = tb.lower(program(8192, 8192, 8192, b="col", scheduler="persistent", tile=(128, 256, 64), stages=3))
    kernel = src.meta["kernels"][0]
    types = dict((n, t) for n, t, _ in kernel["params"])
    assert types["a_desc"] == "tensordesc<fp16[128, 64]>"
    assert types["b_desc"] == "tensordesc<fp16[256, 64]>"
    assert "flatten=True" in src.text and "b_desc.load([off_n, k * BLOCK_K]).T" in src.text
    # Aligned output rows: the epilogue stores two half tiles through a TMA descriptor.
    assert types["out_desc"] == "tensordesc<fp16[128, 128]>" and "out_desc.store(" in src.text
    unaligned = tb.lower(program(8192, 8190, 8192, scheduler="persistent", tile=(128, 256, 64), stages=3))
    assert "out_desc" not in unaligned.text and "tl.store(out_ptr" in unaligned.text


# -- building ------------------------------------------------------------------------------------

def _sass_facts(artifact) -> str:
    from pathlib import Path

    return "\n".join(p.read_text() for p in Path(artifact.path).glob("*.ptx"))


@pytest.mark.parametrize("name", sorted(triton_examples()))
def test_every_triton_example_lowers_and_compiles_to_sm_90a(name):
    p = backends.validate(dsl.parse(triton_examples()[name].read_text(), filename=name))
    art = tb.build(backends.lower(p))
    p = p.computed                                    # what the PTX computes (swap_ab: the transposed problem)
    assert art.backend == "triton" and art.meta["arch"] == "sm_90a"
    for k in art.meta["kernels"]:
        assert k["cubin"][:4] == b"\x7fELF"
        assert k["metadata"]["target"]["arch"] == 90
    ptx = _sass_facts(art)
    assert ".target sm_90a" in ptx
    if p.mainloop == "direct":   # FMA on CUDA cores: no tensor-core instruction at all
        assert "mma" not in ptx and "fma.rn.f32" in ptx
    elif p.tile.m >= 64:    # Triton's wgmma needs 64 rows a warpgroup; a thinner tile is mma.sync's
        assert "wgmma.mma_async" in ptx or name == "triton_split_k"
    else:
        assert "mma.sync.aligned" in ptx and "wgmma" not in ptx
    if p.scheduler == "stream_k":   # the ticket: an acq_rel atomic after a CTA barrier
        assert "atom.global.gpu.acq_rel.add" in ptx and "bar.sync" in ptx
    if p.scheduler == "persistent":
        assert "cp.async.bulk.tensor" in ptx        # TMA loads


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(valid_programs(backends=("triton",)))
def test_valid_programs_compile(p):
    art = tb.build(tb.lower(p))
    assert all(k["metadata"]["shared"] <= dsl.SM90A.max_smem_per_block for k in art.meta["kernels"])


def test_second_build_is_a_cache_hit(monkeypatch):
    p = backends.validate(dsl.parse(triton_examples()["triton_split_k"].read_text()))
    first = tb.build(tb.lower(p))

    def no_compile(*a, **k):
        raise AssertionError("compiled again despite a cached artifact")

    monkeypatch.setattr(triton_compiler, "compile_kernels", no_compile)
    again = tb.build(tb.lower(p))
    assert again.key == first.key and again.meta["kernels"][0]["cubin"] == first.meta["kernels"][0]["cubin"]


def test_build_many_compiles_in_parallel_and_reports_failures():
    good = program(512, 512, 512, tile=(64, 128, 64), warps=(4, 1), stages=3)
    # Past the validator on purpose: 6 stages of 256x128x128 cannot fit in shared memory.
    bad = program(512, 512, 512, tile=(256, 128, 128), warps=(8, 1), stages=6)
    results = builds.build_many([tb.lower(good), tb.lower(bad)], jobs=2)
    assert not isinstance(results[0], BackendError)
    assert isinstance(results[1], BackendError)
    assert "shared memory" in str(results[1]) or "triton" in str(results[1])


# -- the search space ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(64, 64, 12288), (4096, 4096, 4096), (1000, 3000, 77), (64, 4096, 2048),
                                   (1, 4096, 4096)])
def test_space_is_valid_pruned_and_ordered(shape):
    problem = Problem(*shape, b_major="col" if shape[0] <= 128 else "row")
    cands = tb.space(problem)
    assert 1 <= len(cands) <= 60 and len(set(cands)) == len(cands)
    for c in cands:
        assert not backends.diagnose(c), (c, backends.diagnose(c))
    m, n, k = shape
    if m <= 128:   # no tile taller (swap_ab: wider) than M needs; stream-K offered where K is long
        plain = [c for c in cands if not c.swap_ab]
        assert all(c.tile.m <= max(64, 16 * -(-m // 16)) for c in plain)
        assert m > 16 or all(c.tile.m == 16 for c in plain if c.tile.m < 64)
        assert k < 4 * 128 or any(c.scheduler == "stream_k" for c in cands)
        swapped = [c for c in cands if c.swap_ab and c.mainloop != "direct"]   # direct: its own test file
        assert (len(swapped) >= 3) == (m <= 64) and all(c.tile.n == max(16, 1 << (m - 1).bit_length())
                                                       for c in swapped)
        assert any(c.swap_ab for c in cands[:4]) == (m <= 64)      # measured early within a small budget
    if k % 8:
        assert all(c.scheduler == "tile" for c in cands)
    if m * n <= 64 * 64 and k >= 4096:
        assert any(c.split_k > 1 or c.scheduler == "stream_k" for c in cands[:12])
    if m >= 4096 and n >= 4096:
        assert cands[0].tile.m * cands[0].tile.n >= 128 * 256 and cands[0].scheduler == "persistent"


def test_stream_k_past_small_m_only_where_the_last_wave_is_part_full():
    from gemmgen.backends.triton.search_space import LARGE_M_STREAM_K, partial_last_wave

    assert partial_last_wave(100) and partial_last_wave(160) and not partial_last_wave(264)
    assert not partial_last_wave(250) and not partial_last_wave(1000)      # 250: the last wave is 118 of 132
    part_full = tb.space(Problem(1280, 4096, 4096, b_major="col"))       # 128x256 tiles: 160
    streamed = [p for p in part_full if p.scheduler == "stream_k"]
    assert 1 <= len(streamed) <= LARGE_M_STREAM_K and part_full[0].scheduler != "stream_k"
    assert not any(p.scheduler == "stream_k" for p in tb.space(Problem(4096, 4096, 4096)))


@pytest.mark.parametrize("n, rows", [(4096, 64), (8192, 64), (9216, 128), (14336, 128), (18944, 64),
                                     (28672, 128)])
def test_swapped_tiles_go_by_the_weight_rows_an_sm_takes_on(n, rows):
    # 9216 rows: 144 tiles of 64 rows take 2 waves of 132 SMs, 72 of 128 one: 128 rows an SM
    # either way, and the 128-row tile, with half the CTAs, leads; 18944: 3 x 64 against 2 x 128
    head = [p for p in tb.space(Problem(8, n, 4096, b_major="col")) if p.swap_ab and p.scheduler == "tile"]
    assert [p.tile.m for p in head[:2]] == [rows, 192 - rows]


def test_space_for_generic_problem():
    cands = tb.space(Problem(None, None, None))
    assert cands and all(not backends.diagnose(c) for c in cands)


# -- numbers: the generated text run by Triton's interpreter -----------------------------------

def _operands(p: Program, m, n, k, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    pr, e = p.problem, p.problem.epilogue
    a = torch.randn(m, k, generator=g) if pr.a_major == "row" else torch.randn(k, m, generator=g).t()
    cols = n * (2 if e.gate else 1)          # a gated B: the gate half, then the up half
    b = torch.randn(k, cols, generator=g) if pr.b_major == "row" else torch.randn(cols, k, generator=g).t()
    odt = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}[e.out_dtype]

    def like_out(fill=None):   # an M x N matrix laid out as the output (c=row or c=col)
        t = torch.randn(m, n, generator=g) if fill is None else torch.full((m, n), fill)
        return (t if pr.c_major == "row" else t.t().contiguous().t()).to(odt)

    extra = {}
    if e.bias:
        extra["bias"] = torch.randn(n if e.bias == "n" else m, generator=g).to(odt)
    if e.residual:
        extra["residual"] = like_out()
    if e.beta:
        extra["c"] = like_out()
    return a.half(), b.half(), like_out(float("nan")), extra


def _reference(p: Program, a, b, extra):
    import torch
    import torch.nn.functional as F

    e = p.problem.epilogue
    acc = e.alpha * (a.double() @ b.double())
    act = {"relu": torch.relu, "gelu": F.gelu, "silu": F.silu, None: lambda x: x}
    if e.gate:                                   # halves=stacked
        n = acc.shape[1] // 2
        return act[e.gate](acc[:, :n]) * acc[:, n:]
    if e.beta:
        acc = acc + e.beta * extra["c"].double()
    if e.bias == "n":
        acc = acc + extra["bias"].double()[None, :]
    elif e.bias == "m":
        acc = acc + extra["bias"].double()[:, None]
    acc = {"relu": torch.relu, "gelu": F.gelu, "silu": F.silu, None: lambda x: x}[e.activation](acc)
    if e.residual:
        acc = acc + extra["residual"].double()
    return acc


INTERPRETED = [
    # (program, shape it runs at): unaligned shapes, both majors, every epilogue piece, each kernel shape
    (program(37, 45, 77, b="col", tile=(32, 32, 16), warps=(4, 1),
             epilogue=Epilogue(alpha=2.0, beta=0.5, bias="n", activation="gelu", residual=True)), None),
    (program(33, 40, 50, a="col", tile=(16, 32, 16), warps=(4, 1), raster="n", swizzle=2,
             epilogue=Epilogue(bias="m", activation="silu")), None),
    (program(40, 48, 96, tile=(32, 16, 16), warps=(4, 1), split_k=3, epilogue=Epilogue(activation="relu")), None),
    (program(40, 48, 96, tile=(32, 32, 16), warps=(4, 1), split_k=2, split_k_reduce="atomic",
             epilogue=Epilogue(alpha=0.5, out_dtype="f32")), None),
    (program(40, 48, 96, b="col", tile=(32, 32, 16), warps=(4, 1), split_k=3, split_k_reduce="unordered",
             epilogue=Epilogue(bias="n", activation="gelu")), None),
    (program(40, 48, 96, b="col", tile=(32, 32, 32), warps=(4, 1), scheduler="persistent", swizzle=2), None),
    (program(48, 40, 88, a="col", tile=(32, 16, 16), warps=(4, 1), scheduler="persistent", split_k=2,
             raster="n", swizzle=2, epilogue=Epilogue(bias="n", residual=True)), None),
    (program(37, 64, 72, b="col", tile=(32, 32, 16), warps=(4, 1), scheduler="persistent",
             epilogue=Epilogue(alpha=1.5, beta=0.5, bias="n", activation="silu", residual=True, out_dtype="f32")),
     None),
    (program(None, None, None, tile=(32, 32, 16), warps=(4, 1)), (33, 50, 70)),
    # stream-K: every tile split over CTAs (one k-iteration each); whole tiles beside partial ones
    # (80x960x32 in 16x32x16 tiles: 150 tiles x 2 k-tiles over 100 CTAs of 3); M below one tile
    (program(40, 48, 96, b="col", tile=(32, 32, 16), warps=(2, 2), scheduler="stream_k",
             epilogue=Epilogue(bias="n", activation="relu")), None),
    (program(80, 960, 32, b="col", tile=(16, 32, 16), warps=(1, 4), scheduler="stream_k",
             epilogue=Epilogue(alpha=1.5, beta=0.5, residual=True)), None),
    (program(3, 100, 200, b="col", tile=(16, 32, 16), warps=(1, 4), scheduler="stream_k"), None),
    (program(None, None, None, a="col", tile=(16, 32, 16), warps=(1, 4), scheduler="stream_k"), (17, 60, 90)),
    # column-major output (what a swap_ab program computes into), through every store path
    (program(37, 45, 77, b="col", c="col", tile=(32, 32, 16), warps=(4, 1),
             epilogue=Epilogue(alpha=2.0, beta=0.5, bias="m", activation="gelu", residual=True)), None),
    (program(40, 48, 96, c="col", tile=(32, 16, 16), warps=(4, 1), split_k=3, epilogue=Epilogue(bias="n")), None),
    (program(80, 72, 32, b="col", c="col", tile=(16, 32, 16), warps=(1, 4), scheduler="stream_k",
             epilogue=Epilogue(beta=0.5, residual=True, out_dtype="f32")), None),
]

# swap_ab: x @ W.T at small M as C^T = W x^T, run through backends.load's SwappedLauncher
SWAPPED = [
    (program(3, 100, 72, b="col", tile=(64, 16, 16), warps=(4, 1), swap_ab=True,
             epilogue=Epilogue(alpha=2.0, beta=0.5, bias="n", activation="silu", residual=True)), None),
    (program(17, 60, 90, b="col", tile=(16, 32, 16), warps=(1, 4), scheduler="stream_k", swap_ab=True,
             epilogue=Epilogue(bias="n", activation="relu")), None),
    (program(None, None, None, b="col", tile=(64, 16, 16), warps=(4, 1), swap_ab=True), (1, 48, 40)),
]


def test_generated_kernels_compute_the_right_numbers_under_the_interpreter():
    from gemmgen.backends.triton.launch import interpret_many

    cases, refs = [], []
    for i, (p, shape) in enumerate(INTERPRETED):
        m, n, k = shape or (p.problem.m, p.problem.n, p.problem.k)
        a, b, out, extra = _operands(p.bind((m, n, k)), m, n, k, seed=i)
        cases.append((tb.lower(p), p, dict(a=a, b=b, out=out, **{x: extra.get(x) for x in ("bias", "residual", "c")}),
                      None, None))
        refs.append(_reference(p, a, b, extra))
    outs = interpret_many(cases)
    for (p, _), out, ref in zip(INTERPRETED, outs, refs):
        assert not out.isnan().any(), p
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 2e-3, (p, err)


GATED = [   # out = gate(A B_gate) * (A B_up), B = [B_gate B_up]: both majors, unaligned, a generic one
    (program(37, 45, 77, b="col", tile=(32, 32, 16), warps=(2, 2),
             epilogue=Epilogue(gate="silu", halves="stacked")), None),
    (program(40, 48, 96, tile=(32, 16, 16), warps=(2, 2), epilogue=Epilogue(gate="gelu", halves="stacked")), None),
    (program(3, 100, 72, b="col", tile=(16, 32, 16), warps=(1, 4),
             epilogue=Epilogue(gate="relu", halves="stacked", out_dtype="f32")), None),
    (program(None, None, None, b="col", tile=(32, 32, 16), warps=(2, 2),
             epilogue=Epilogue(gate="silu", halves="stacked")), (17, 60, 90)),
]


def test_gated_programs_compute_act_gate_times_up_under_the_interpreter():
    from gemmgen.backends.triton.launch import interpret_many

    cases, refs = [], []
    for i, (p, shape) in enumerate(GATED):
        assert not backends.diagnose(p), backends.diagnose(p)
        m, n, k = shape or (p.problem.m, p.problem.n, p.problem.k)
        a, b, out, extra = _operands(p.bind((m, n, k)), m, n, k, seed=200 + i)
        assert b.shape == (k, 2 * n)
        cases.append((tb.lower(p), p, dict(a=a, b=b, out=out, bias=None, residual=None, c=None), None, None))
        refs.append(_reference(p, a, b, extra))
    outs = interpret_many(cases)
    for (p, _), out, ref in zip(GATED, outs, refs):
        assert out.shape == ref.shape and not out.isnan().any(), p
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 2e-3, (p, err)


def test_gated_epilogue_parses_validates_and_is_refused_where_it_cannot_run():
    text = ("gemm 16x14336x4096 a=row b=col c=row in=f16 acc=f32\n"
            "epilogue gate=silu halves=stacked out=f16\nbackend triton\ntile 64x64x64\nwarps 4x1\n"
            "mainloop multistage\n")
    p = dsl.parse(text)
    assert p.problem.epilogue == Epilogue(gate="silu", halves="stacked") and dsl.parse(dsl.to_text(p)) == p
    assert p.problem.b_cols == 2 * 14336 and p.problem.flops == 2 * 16 * 2 * 14336 * 4096
    assert "gate_silu_stacked" in p.problem.key and not backends.diagnose(p)

    def refused(old, new):
        return [(d.statement, d.message) for d in backends.diagnose(dsl.parse(text.replace(old, new)))]

    assert any("halves=stacked" in m for _, m in refused(" halves=stacked", ""))
    assert any("takes no bias" in m for _, m in refused("gate=silu", "gate=silu bias=n"))
    assert any(s == "scheduler" for s, _ in refused("mainloop multistage", "mainloop multistage\nscheduler stream_k"))
    # 128x128 over 4 warps: 128 registers a thread for one accumulator, 256 for gate and up
    assert any("256 fp32 accumulators (gate and up)" in m for _, m in refused("tile 64x64x64", "tile 128x128x64"))
    assert any(s == "swap_ab" for s, _ in refused("mainloop multistage", "mainloop multistage\nswap_ab"))
    assert any("cannot fuse gate=silu" in m
               for _, m in refused("backend triton\ntile 64x64x64\nwarps 4x1\nmainloop multistage",
                                   "backend cutlass\ntile 128x64x64\nwarps 4x1\nmainloop ws_cooperative"))
    [result] = builds.build_many([tb.lower(p)], jobs=1)        # compiles for sm_90a
    assert not isinstance(result, Exception), result


def assert_swapped_programs_compute(cases, seed: int) -> None:
    """Each (swap_ab program, shape it runs at or None) under Triton's interpreter: its launcher
    hands the kernel B^T, A^T and out^T (views: nothing is copied), and the kernel of the
    transposed problem writes the caller's row-major out, matching the fp64 reference."""
    from gemmgen.backends.swap import SwappedLauncher
    from gemmgen.backends.triton.launch import interpret_many

    runs, refs = [], []
    for i, (p, shape) in enumerate(cases):
        assert not backends.diagnose(p), p
        m, n, k = shape or (p.problem.m, p.problem.n, p.problem.k)
        a, b, out, extra = _operands(p.bind((m, n, k)), m, n, k, seed=seed + i)
        calls = []
        SwappedLauncher(lambda *args, **kw: calls.append((args, kw)))(a, b, out, **extra)
        (a_t, b_t, out_t), kw = calls[0]
        assert a_t.data_ptr() == b.data_ptr() and b_t.data_ptr() == a.data_ptr() and out_t.data_ptr() == out.data_ptr()
        alpha, beta = kw.pop("alpha"), kw.pop("beta")
        runs.append((backends.lower(p), p.computed, dict(a=a_t, b=b_t, out=out_t, **kw), alpha, beta))
        refs.append(_reference(p, a, b, extra))
    for (p, _), out_t, ref in zip(cases, interpret_many(runs), refs):
        out = out_t.t()
        assert out.shape == ref.shape and not out.isnan().any(), p
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 2e-3, (p, err)


def test_swap_ab_programs_compute_x_at_w_transposed_under_the_interpreter():
    assert_swapped_programs_compute(SWAPPED, seed=100)


def test_swap_ab_lowers_the_transposed_problem_and_refuses_what_it_cannot_write():
    p = program(16, 4096, 4096, b="col", tile=(64, 16, 64), warps=(4, 1), swap_ab=True,
                epilogue=Epilogue(bias="n"))
    assert p.computed.problem == Problem(4096, 16, 4096, a_major="row", b_major="col", c_major="col",
                                         epilogue=Epilogue(bias="m"))
    assert dsl.parse(dsl.to_text(p)) == p and "swap_ab" in dsl.to_text(p)
    assert "swap_ab" not in dsl.to_text(replace(p, swap_ab=False))      # other programs' text is unchanged
    text = backends.lower(p).text
    assert "C col-major" in text and "offs_n[None, :] * stride_om" in text
    with pytest.raises(BackendError, match="backends.lower"):
        tb.lower(p)                                  # the backend alone would compute the wrong problem
    [found] = backends.diagnose(dsl.parse(dsl.to_text(replace(p, scheduler="persistent"))))
    assert found.statement == "gemm" and found.line == 1
    assert "with swap_ab the kernel computes C^T = B^T A^T (4096x16x4096" in found.message
    assert "persistent writes its output row-major" in found.message
    cutlass = replace(p, backend="cutlass", tile=Tile(128, 64, 64), warps=(4, 1))
    assert any("c=col" in d.message for d in backends.diagnose(cutlass))


def test_swap_ab_program_compiles_for_sm_90a():
    p = program(16, 4096, 4096, b="col", tile=(64, 16, 128), warps=(4, 1), scheduler="stream_k", stages=4,
                swap_ab=True)
    [result] = builds.build_many([backends.lower(p)], jobs=1)
    assert not isinstance(result, Exception), result
