"""Hypothesis strategies for DSL programs, shared by every room's tests.

`programs()` draws any Program the grammar can express (valid or not: zero tiles,
illegal clusters, odd floats); `valid_programs()` draws programs that pass
`gemmgen.dsl.validate`, built the way a kernel engineer would (warps and
instruction tiling the tile, stages that fit, legal clusters), restricted to
what each backend's SUPPORT accepts, then filtered through `diagnose`.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from gemmgen.dsl import ir
from gemmgen.backends import diagnose
from gemmgen.dsl import resources as res
from gemmgen.dsl.ir import Epilogue, Instr, Problem, Program, Tile
from gemmgen.backends.support import backend_support

_small = st.integers(min_value=0, max_value=1 << 20)
_dim = st.none() | st.integers(min_value=0, max_value=1 << 40)
_float = st.floats(allow_nan=False, allow_infinity=False)


def epilogues(out_dtypes=ir.DTYPES) -> st.SearchStrategy[Epilogue]:
    return st.builds(
        Epilogue,
        alpha=_float, beta=_float,
        bias=st.sampled_from((None, "m", "n")),
        activation=st.sampled_from((None, *ir.ACTIVATIONS)),
        residual=st.booleans(),
        out_dtype=st.sampled_from(tuple(out_dtypes)),
    )


def problems() -> st.SearchStrategy[Problem]:
    return st.builds(
        Problem, m=_dim, n=_dim, k=_dim,
        a_major=st.sampled_from(ir.MAJORS), b_major=st.sampled_from(ir.MAJORS),
        c_major=st.sampled_from(ir.MAJORS), in_dtype=st.sampled_from(ir.DTYPES),
        acc_dtype=st.sampled_from(ir.DTYPES), epilogue=epilogues(),
    )


@st.composite
def _split_k(draw) -> tuple[int, str]:
    n = draw(_small)
    return (1, "workspace") if n == 1 else (n, draw(st.sampled_from(ir.SPLIT_K_REDUCES)))


@st.composite
def programs(draw) -> Program:
    """Any program the grammar can express; `parse(to_text(p)) == p` must hold for each."""
    pair = st.tuples(_small, _small)
    instr = draw(st.none() | st.builds(Instr, kind=st.sampled_from(("wgmma", "mma")), m=_small, n=_small, k=_small))
    split_k, reduce = draw(_split_k())
    return Program(
        problem=draw(problems()), backend=draw(st.sampled_from(ir.BACKENDS)),
        tile=draw(st.builds(Tile, _small, _small, _small)), warps=draw(pair),
        mainloop=draw(st.sampled_from(ir.MAINLOOPS)), instr=instr, cluster=draw(pair),
        stages=draw(st.none() | _small), scheduler=draw(st.sampled_from(ir.SCHEDULERS)),
        raster=draw(st.sampled_from(("m", "n"))), swizzle=draw(_small),
        smem_swizzle=draw(st.none() | _small), split_k=split_k, split_k_reduce=reduce,
        epilogue_tile=draw(st.none() | pair),
    )


# -- valid programs -------------------------------------------------------------------

def _sorted(values):
    return sorted(values, key=lambda v: (v is None, str(v)))


@st.composite
def _geometry(draw, mainloop: str, instr_kinds) -> tuple[Tile, tuple[int, int], object]:
    """A tile, warps and instruction that tile each other exactly, within the register file."""
    tile_k = draw(st.sampled_from((16, 32, 64, 128)))
    if mainloop in res.WS_MAINLOOPS:
        groups_m, groups_n = draw(st.sampled_from(
            ((2, 1), (1, 2)) if mainloop == "ws_cooperative" else ((1, 1),)))
        rows = draw(st.sampled_from((64, 128)))           # per warpgroup
        cols = draw(st.sampled_from((64, 128, 256) if rows == 64 else (64, 128)))
        tile = Tile(groups_m * rows, groups_n * cols, tile_k)
        warps = (4 * groups_m, groups_n)
        if "wgmma" in instr_kinds and draw(st.booleans()) or None not in instr_kinds:
            instr = Instr("wgmma", 64, draw(st.sampled_from([n for n in (64, 128, 256) if cols % n == 0])), 16)
        else:
            instr = None
        return tile, warps, instr
    wm, wn = draw(st.sampled_from(((1, 4), (2, 2), (4, 1), (2, 4), (4, 2), (1, 8), (8, 1), (4, 4))))
    warp_m = draw(st.sampled_from((16, 32, 64)))
    warp_n = draw(st.sampled_from((16, 32, 64)))
    tile = Tile(wm * warp_m, wn * warp_n, tile_k)
    if "mma" in instr_kinds and draw(st.booleans()) or None not in instr_kinds:
        instr = Instr("mma", 16, 8, 16)
    else:
        instr = None
    return tile, (wm, wn), instr


@st.composite
def _valid_candidate(draw, backends) -> Program:
    backend = draw(st.sampled_from(tuple(backends)))
    support = backend_support(backend)
    allow = (lambda name, default: getattr(support, name) if support is not None else default)
    mainloop = draw(st.sampled_from(_sorted(set(allow("mainloops", ir.MAINLOOPS)) & set(ir.MAINLOOPS))))
    tile, warps, instr = draw(_geometry(mainloop, allow("instr_kinds", {None, "mma", "wgmma"})))
    scheduler = draw(st.sampled_from(_sorted(set(allow("schedulers", ir.SCHEDULERS)) & set(ir.SCHEDULERS))))
    max_cluster = min(8, allow("max_cluster", 8))
    cluster = draw(st.sampled_from([(a, b) for a in (1, 2, 4, 8) for b in (1, 2, 4, 8) if a * b <= max_cluster]))

    out_dtype = draw(st.sampled_from(_sorted(allow("out_dtypes", {"f16"}))))
    activation = draw(st.sampled_from(_sorted({None} | set(allow("activations", ir.ACTIVATIONS)))))
    split_k, reduce = 1, "workspace"
    if scheduler != "stream_k" and draw(st.booleans()):
        reduces = set(allow("split_k_reduces", ir.SPLIT_K_REDUCES))
        if activation or out_dtype != "f32":
            reduces.discard("atomic")
        if reduces:
            split_k, reduce = draw(st.sampled_from((2, 3, 4, 8))), draw(st.sampled_from(_sorted(reduces)))
    epilogue = Epilogue(
        alpha=draw(st.sampled_from((1.0, 0.5, 2.0, -1.0, 1e-3))),
        beta=draw(st.sampled_from((0.0, 1.0, -0.5))) if allow("beta", True) else 0.0,
        bias=draw(st.sampled_from((None, "m", "n"))) if allow("bias", True) else None,
        activation=activation,
        residual=draw(st.booleans()) if allow("residual", True) else False,
        out_dtype=out_dtype,
    )
    majors = [draw(st.sampled_from(_sorted(allow(f"majors_{x}", ir.MAJORS)))) for x in "abc"]
    if draw(st.booleans()):
        m = n = k = None
    else:
        def extent(tile_size: int, multiple: int) -> int:
            tiles = multiple * draw(st.integers(1, 8))
            return tiles * tile_size - 8 * draw(st.integers(0, tile_size // 8 - 1))
        m, n = extent(tile.m, cluster[0]), extent(tile.n, cluster[1])
        k = split_k * tile.k * draw(st.integers(1, 16)) + 8 * draw(st.integers(0, 3))
    problem = Problem(m, n, k, *majors, in_dtype="f16", acc_dtype="f32", epilogue=epilogue)
    program = Program(problem=problem, backend=backend, tile=tile, warps=warps, mainloop=mainloop,
                      instr=instr, cluster=cluster, scheduler=scheduler,
                      raster=draw(st.sampled_from(("m", "n"))), swizzle=draw(st.sampled_from((1, 2, 4, 8, 16))),
                      split_k=split_k, split_k_reduce=reduce)
    fit = res.max_stages(program)
    stage_choices = [s for s in range(res.min_stages(program), min(fit, 6) + 1)]
    if allow("auto_stages", True) or not stage_choices:
        stage_choices.append(None)
    rows = (tile.k if majors[0] == "row" else tile.m, tile.n if majors[1] == "row" else tile.k)
    swizzles = [s for s in allow("smem_swizzles", (None, 0, 32, 64, 128))
                if not s or all(2 * extent % s == 0 for extent in rows)]
    return replace(program, stages=draw(st.sampled_from(_sorted(stage_choices))),
                   smem_swizzle=draw(st.sampled_from(_sorted(swizzles))))


def valid_programs(backends=ir.BACKENDS) -> st.SearchStrategy[Program]:
    """Programs that pass `diagnose` (hardware, problem and the backends' SUPPORT)."""
    return _valid_candidate(backends).filter(lambda p: not diagnose(p))

