"""CPU tests of the CUTLASS backend: lowering, build keys, refusals, the search space,
and one real nvcc build of one instance to a library that loads (no GPU needed)."""
from __future__ import annotations

import ctypes
import csv
import re
from dataclasses import replace
from pathlib import Path

import pytest

from gemmgen.backends import cutlass
from gemmgen.backends.cutlass.emit import instance_spec, runtime_args
from gemmgen.dsl import ProgramError, examples, parse, to_text
from gemmgen.backends import diagnose, validate
from gemmgen.dsl.ir import Epilogue, Instr, Problem, Program, Tile

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "benchmarks" / "shapes" / "cudal2_sample100.csv"


def _program(problem=None, **kw) -> Program:
    defaults = dict(backend="cutlass", tile=Tile(128, 256, 64), warps=(8, 1), mainloop="ws_cooperative",
                    scheduler="persistent")
    defaults.update(kw)
    return Program(problem=problem or Problem(4096, 4096, 4096, "row", "col"), **defaults)


def _collective(text: str, which: str) -> str:
    """The text of the epilogue or mainloop CollectiveBuilder instantiation."""
    m = re.search(rf"_{which} =\s*typename (.*?)>::CollectiveOp;", text, re.S)
    assert m, f"no {which} collective in the source"
    return m.group(1)


CUTLASS_EXAMPLES = {name: path for name, path in examples().items()
                    if parse(path.read_text(), filename=name).backend == "cutlass"}


def test_there_are_cutlass_examples():
    assert len(CUTLASS_EXAMPLES) >= 3


@pytest.mark.parametrize("name", sorted(CUTLASS_EXAMPLES))
def test_every_cutlass_example_validates_and_lowers(name):
    program = validate(parse(CUTLASS_EXAMPLES[name].read_text(), filename=name))
    source = cutlass.lower(program)
    t = program.tile
    mainloop = _collective(source.text, "mainloop")
    assert f"cute::Shape<cute::_{t.m}, cute::_{t.n}, cute::_{t.k}>" in mainloop
    assert f"cute::Shape<cute::_{program.cluster[0]}, cute::_{program.cluster[1]}, cute::_1>" in mainloop
    if program.scheduler == "tile":  # the non-persistent kernel: its tile scheduler is void
        assert re.search(r"cutlass::gemm::KernelTmaWarpSpecialized\s*>::CollectiveOp", source.text)
        assert re.search(r"_epilogue,\s*void>;", source.text)
    else:
        schedule = {"ws_cooperative": "KernelTmaWarpSpecializedCooperative",
                    "ws_pingpong": "KernelTmaWarpSpecializedPingpong"}[program.mainloop]
        assert f"cutlass::gemm::{schedule}" in mainloop
        scheduler = "StreamKScheduler" if program.scheduler == "stream_k" else "PersistentScheduler"
        assert f"cutlass::gemm::{scheduler}>" in source.text
    if program.stages is None:
        assert "StageCountAutoCarveout" in mainloop
    else:
        assert f"StageCount<{program.stages}>" in mainloop
    assert 'extern "C" int gg_run(' in source.text
    assert source.entry == "gg_run"


def test_tile_is_per_cta_and_cluster_multiplies_the_grid():
    # The SM90 builders read TileShape as one CTA's tile; a 2x1 cluster must not double it.
    text = cutlass.lower(_program(cluster=(2, 1))).text
    for which in ("mainloop", "epilogue"):
        body = _collective(text, which)
        assert "cute::Shape<cute::_128, cute::_256, cute::_64>" in body
        assert "cute::Shape<cute::_256, cute::_256" not in body
        assert "cute::Shape<cute::_2, cute::_1, cute::_1>" in body


@pytest.mark.parametrize("a_major,b_major,layout_a,layout_b", [
    ("row", "col", "RowMajor", "ColumnMajor"),    # x @ W.T
    ("row", "row", "RowMajor", "RowMajor"),
    ("col", "row", "ColumnMajor", "RowMajor"),
    ("col", "col", "ColumnMajor", "ColumnMajor"),
])
def test_majors_map_to_cutlass_layouts(a_major, b_major, layout_a, layout_b):
    text = cutlass.lower(_program(Problem(None, None, None, a_major, b_major))).text
    mainloop = _collective(text, "mainloop")
    element_layouts = re.findall(r"cutlass::half_t, cutlass::layout::(\w+), 8", mainloop)
    assert element_layouts == [layout_a, layout_b]


@pytest.mark.parametrize("epilogue,expect", [
    # alpha 1, nothing else: the accumulator converted, no multiply (InstanceSpec.unscaled)
    (Epilogue(), ["Sm90EVT<cutlass::epilogue::fusion::Sm90Compute<cutlass::epilogue::thread::Identity, "
                  "cutlass::half_t, float,", "Sm90AccFetch>", "void, cutlass::layout::RowMajor, 0,"]),
    (Epilogue(alpha=2.0), ["fusion::LinearCombination<", "void,\n"]),
    (Epilogue(alpha=2.0, beta=0.5), ["fusion::LinearCombination<", "cutlass::half_t,\n      float\n"]),
    (Epilogue(bias="n", activation="gelu"),
     ["LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU, cutlass::half_t, float, cutlass::half_t, void"]),
    (Epilogue(bias="m"), ["LinCombPerRowBias<cutlass::half_t, float, cutlass::half_t, void, float, 1>"]),
    (Epilogue(activation="relu"), ["LinCombEltAct<cutlass::epilogue::thread::ReLu"]),
    (Epilogue(bias="n", residual=True),  # residual = C with beta 1, added before any activation
     ["LinCombPerColBias<cutlass::half_t, float, cutlass::half_t, cutlass::half_t, float, 8>"]),
    (Epilogue(bias="n", activation="silu", residual=True),  # act(...) + residual: a visitor tree
     ["Sm90Compute<cutlass::plus, cutlass::half_t, float,", "Sm90Compute<cutlass::epilogue::thread::SiLu",
      "Sm90RowBroadcast<0", "Sm90SrcFetch<cutlass::half_t>"]),
])
def test_epilogues_map_to_fusion_operations(epilogue, expect):
    text = cutlass.lower(_program(Problem(None, None, None, "row", "col", epilogue=epilogue))).text
    body = _collective(text, "epilogue")
    for fragment in expect:
        assert fragment in body, (fragment, body)


def test_only_the_plain_epilogue_at_alpha_1_is_built_unscaled():
    """The alpha-free build takes no alpha: its wrapper sets no epilogue scalars, its spec says so
    (and only there, so the digests of other builds stay as they were), and alpha 2 is a
    different build that scales."""
    from gemmgen.backends.cutlass.emit import instance_spec

    plain = _program(Problem(None, None, None, "row", "col"))
    scaled = _program(Problem(None, None, None, "row", "col", epilogue=Epilogue(alpha=2.0)))
    assert instance_spec(plain).unscaled and instance_spec(plain).as_meta["unscaled"] is True
    assert not instance_spec(scaled).unscaled and "unscaled" not in instance_spec(scaled).as_meta
    assert cutlass.build_key(plain) != cutlass.build_key(scaled)
    text = cutlass.lower(plain).text
    assert "(void)alpha; (void)beta;" in text and "args.epilogue.thread.alpha" not in text
    assert "args.epilogue.thread.alpha = alpha;" in cutlass.lower(scaled).text
    for epilogue in (Epilogue(bias="n"), Epilogue(activation="relu"), Epilogue(residual=True), Epilogue(beta=0.5)):
        assert not instance_spec(_program(Problem(None, None, None, "row", "col", epilogue=epilogue))).unscaled
    sliced = _program(Problem(None, None, None, "row", "row"), tile=Tile(64, 128, 64), mainloop="ws_pingpong",
                      warps=(4, 1), scheduler="tile", split_k=4, split_k_reduce="workspace")
    assert not instance_spec(sliced).unscaled      # its GEMM writes fp32 partials; the reduce applies alpha


def test_runtime_choices_share_one_build():
    base = _program(Problem(4096, 4096, 4096, "row", "col", epilogue=Epilogue(alpha=0.5)), scheduler="stream_k")
    key = cutlass.build_key(base)
    split = replace(base, split_k=4, split_k_reduce="unordered")
    variants = [replace(base, raster="n"), replace(base, swizzle=8), split, base.bind((1000, 3000, 512)),
                replace(base, problem=replace(base.problem, epilogue=Epilogue(alpha=3.0)))]
    assert {cutlass.build_key(v) for v in variants} == {key}
    assert runtime_args(split).splits == 4
    assert runtime_args(replace(base, raster="n")) != runtime_args(base)
    # Build-time choices do change the key.
    for other in (replace(base, cluster=(2, 1)), replace(base, stages=4), replace(base, scheduler="persistent"),
                  replace(base, problem=replace(base.problem, epilogue=Epilogue(beta=1.0))),
                  replace(base, problem=replace(base.problem, epilogue=Epilogue()))):   # alpha 1: unscaled
        assert cutlass.build_key(other) != key


def test_a_persistent_grid_on_fewer_sms_is_a_runtime_choice_of_the_same_build():
    base = _program(Problem(4096, 4096, 4096, "row", "row"), cluster=(2, 1), raster="n", swizzle=8)
    fewer = replace(base, grid_sms=128)
    assert cutlass.build_key(fewer) == cutlass.build_key(base)
    assert (runtime_args(base).grid_sms, runtime_args(fewer).grid_sms) == (0, 128)
    text = cutlass.lower(base).text
    assert "grid_sms / 2;" in text and 'extern "C" int gg_grid_sms(' in text     # the cluster's CTAs
    assert "grid_sms / 1;" in cutlass.lower(replace(base, cluster=(1, 1))).text
    assert "scheduler persistent 128\n" in to_text(fewer) and parse(to_text(fewer)) == fewer


def test_only_the_cutlass_backend_takes_an_sm_count():
    triton = parse(examples()["triton_split_k"].read_text())
    program = replace(triton, scheduler="persistent", split_k=1, grid_sms=128)
    assert any(d.statement == "scheduler" and "sizes its own grid" in d.message for d in diagnose(program))


@pytest.mark.parametrize("program,phrase", [
    (_program(scheduler="stream_k", grid_sms=128), "sizes a persistent grid"),
    (_program(split_k=4, split_k_reduce="unordered", grid_sms=128), "stream-K scheduler"),
    (_program(cluster=(2, 1), grid_sms=127), "whole clusters of 2"),
    (_program(grid_sms=133), "from 1 to 132"),
    (_program(grid_sms=0), "from 1 to 132"),
])
def test_grid_sms_refusals_say_why(program, phrase):
    assert any(d.statement == "scheduler" and phrase in d.message for d in diagnose(program)), diagnose(program)


def test_the_space_times_the_balanced_grid_where_the_last_round_is_partial():
    from gemmgen.backends.cutlass.search_space import balanced_grid_sms, space

    def grid(shape, **kw):
        return balanced_grid_sms(_program(Problem(*shape, "row", "col"), **kw))

    assert grid((4096, 4096, 4096), raster="n", swizzle=8) == 128               # 512 tiles: 4 rounds
    assert grid((4096, 4096, 4096), cluster=(2, 1), raster="n", swizzle=8) == 128
    assert grid((8192, 8192, 8192), swizzle=8) == 128                           # 2,048: 16 rounds
    assert grid((1024, 1024, 1024)) is None                                     # one round
    assert grid((None, None, None)) is None                                     # shape-generic: no tiles yet
    assert grid((4224, 4096, 4096)) is None                                     # 33 x 16 = 528: 4 rounds of 132
    # Padded to the swizzle's band: 16 x 44 tiles count as 16 x 48 = 768, 6 rounds of 128.
    assert grid((2048, 11264, 2048), swizzle=8) == 128
    programs = space(Problem(4096, 4096, 4096, "row", "row"))
    balanced = [p for p in programs if p.grid_sms]
    assert balanced and all(not diagnose(p) and p.scheduler == "persistent" for p in balanced)
    assert all(replace(p, grid_sms=None) in programs for p in balanced if p not in programs[2:4])   # beside its twin
    assert programs[1] == replace(programs[0], grid_sms=128)                  # the best's twin timed second
    assert programs[2] == replace(programs[1], raster="n" if programs[1].raster == "m" else "m")   # and across
    assert programs[0].cluster == (2, 1) and programs[3] == replace(programs[2], cluster=(1, 1))   # and unclustered
    assert balanced[:3] == programs[1:4]
    assert len(set(programs)) == len(programs)
    assert not any(p.grid_sms for p in space(Problem(1024, 1024, 1024, "row", "row"))[:2])
    from gemmgen.dsl.facts import facts

    whole = _program(Problem(4096, 4096, 4096, "row", "row"))
    assert (facts(whole).grid, facts(replace(whole, grid_sms=128)).grid) == (132, 128)
    assert facts(whole).wave_efficiency == facts(replace(whole, grid_sms=128)).wave_efficiency   # same rounds


def _findings(program):
    return [(d.statement, d.message) for d in diagnose(program)]


@pytest.mark.parametrize("program,statement,phrase", [
    (_program(tile=Tile(64, 128, 64), warps=(4, 1)), "tile", "multiple of 128"),
    (_program(mainloop="ws_pingpong", warps=(4, 1), tile=Tile(64, 128, 64), scheduler="stream_k"),
     "scheduler", "no stream-K"),
    (_program(scheduler="stream_k", cluster=(2, 1)), "cluster", "unsafe"),
    (_program(split_k=4, split_k_reduce="unordered", cluster=(1, 2)), "cluster", "unsafe"),
    (_program(mainloop="ws_pingpong", warps=(4, 1), tile=Tile(128, 256, 64)), "tile", "accumulators"),
    (_program(warps=(4, 2)), "warps", "warps 8x1"),
    (_program(instr=Instr("wgmma", 64, 128, 16)), "instr", "wgmma 64x256x16"),
    (_program(swizzle=16), "swizzle", "power of two"),
    (_program(stages=6), "stages", "shared memory"),
    (_program(Problem(4096, 4096, 4096, epilogue=Epilogue(beta=1.0, residual=True))), "epilogue", "one source"),
    (_program(Problem(1000, 1001, 1000, "row", "row")), "problem", "N=1001"),
    (_program(Problem(1000, 1000, 1001, "row", "col")), "problem", "K=1001"),
    (_program(epilogue_tile=(64, 128)), "epilogue_tile", "tile 128x256x64 epilogue=128x128"),
    (_program(epilogue_tile=(128, 96)), "epilogue_tile", "32, 64, 128 columns"),
    (_program(mainloop="ws_pingpong", warps=(4, 1), tile=Tile(128, 128, 64), epilogue_tile=(128, 64)),
     "epilogue_tile", "of 64 rows"),
    (_program(split_k=2, split_k_reduce="workspace", epilogue_tile=(128, 128)), "epilogue_tile", "split-K"),
    (_program(Problem(1024, 1024, 128, "row", "row"), mainloop="ws_pingpong", warps=(4, 1), tile=Tile(64, 16, 64),
              scheduler="tile", epilogue_tile=(64, 32)), "epilogue_tile", "narrower than any epilogue sub-tile"),
    (_program(stages=4, epilogue_tile=(128, 128)), "stages", "use stages 3"),
])
def test_refusals_are_located_and_say_why(program, statement, phrase):
    # The backend's rule says why; the validator refuses the program (the DSL's own
    # checks may speak first for what every backend shares, such as TMA alignment).
    from gemmgen.backends.cutlass.rules import RULES
    mine = [(field, message) for rule in RULES for field, message in rule(program)]
    assert any(field == statement and phrase in m for field, m in mine), mine
    assert _findings(program)


def test_one_tile_per_cta_is_pingpongs_non_persistent_kernel_and_refused_for_cooperative():
    found = _findings(_program(scheduler="tile"))
    assert any(s == "scheduler" and "always persistent" in m for s, m in found), found
    one = _program(Problem(64, 64, 64, "row", "row"), mainloop="ws_pingpong", warps=(4, 1), tile=Tile(64, 16, 64),
                   scheduler="tile")
    assert _findings(one) == []
    text = cutlass.lower(one).text
    # The plain warp-specialized schedule (not Pingpong/Cooperative) with the default (void) tile
    # scheduler: CUTLASS's non-persistent kernel, a grid of one CTA per tile.
    assert re.search(r"cutlass::gemm::KernelTmaWarpSpecialized\s*>::CollectiveOp", text)
    assert re.search(r"_epilogue,\s*void>;", text) and "Pingpong" not in text
    assert cutlass.build_key(one) != cutlass.build_key(replace(one, scheduler="persistent"))


@pytest.mark.parametrize("tile,mainloop,ok", [
    ((64, 16, 64), "ws_pingpong", True), ((64, 32, 64), "ws_pingpong", True),
    ((128, 32, 64), "ws_pingpong", False), ((128, 16, 64), "ws_cooperative", False),
    ((64, 48, 64), "ws_pingpong", False),
])
def test_narrow_tiles_are_64_row_pingpong_only(tile, mainloop, ok):
    warps = (8, 1) if mainloop == "ws_cooperative" else (4, 1)
    program = _program(Problem(256, 256, 256, "row", "row"), tile=Tile(*tile), mainloop=mainloop, warps=warps)
    found = [m for s, m in _findings(program) if s == "tile"]
    assert (found == []) == ok, found


def test_refusal_in_text_points_at_the_line():
    text = CUTLASS_EXAMPLES["cutlass_stream_k"].read_text().replace("cluster 1x1", "cluster 2x1")
    program = parse(text, filename="k.gemm")
    (d,) = [d for d in diagnose(program) if "unsafe" in d.message]
    assert text.splitlines()[d.line - 1].startswith("cluster")


def test_unaligned_m_is_fine_when_it_is_not_a_leading_dimension():
    assert _findings(_program(Problem(1000, 1000, 1000, "row", "col"))) == []
    assert _findings(_program(Problem(999, 1000, 1000, "row", "col"))) == []


def _sample_shapes():
    with open(SAMPLE) as f:
        return [tuple(int(r[k]) for k in ("M", "N", "K")) for r in csv.DictReader(f)]


def test_space_is_valid_small_and_reuses_builds_across_shapes():
    specs = set()
    for shape in _sample_shapes():  # all TMA-aligned for a=row, b=row
        programs = cutlass.space(Problem(*shape, "row", "row"))
        assert programs, shape
        for p in programs[:12]:
            assert diagnose(p) == [], (shape, p)
        per_shape = {instance_spec(p) for p in programs}
        assert per_shape <= {instance_spec(p) for p in cutlass.library(Problem(*shape, "row", "row"))}
        specs |= per_shape
    assert 10 <= len(specs) <= 60  # one library for the whole benchmark


def test_space_orders_big_tiles_first_on_big_shapes_and_splits_on_thin_ones():
    big = cutlass.space(Problem(8192, 8192, 8192))[0]
    assert big.tile.m * big.tile.n >= 128 * 256
    thin = cutlass.space(Problem(128, 128, 16384))[:3]
    assert all(p.scheduler == "stream_k" or p.split_k > 1 for p in thin)


def test_space_puts_the_one_wave_128x192_tile_first_where_wider_and_narrower_tiles_quantize_badly():
    """256 x 12288: 128x256 tiles leave 36 SMs idle, 128x128 run 1.45 waves, 128x192 one wave."""
    first = cutlass.space(Problem(256, 12288, 2048, "row", "row"))[0]
    assert (first.mainloop, first.tile.m, first.tile.n) == ("ws_cooperative", 128, 192)
    body = cutlass.lower(first).text
    assert "cute::Shape<cute::_128, cute::_192, cute::_64>" in body


def test_space_of_unsupported_problem_is_empty_rather_than_wrong():
    assert cutlass.space(Problem(1000, 1001, 1000, "row", "row")) == []  # N not 16-byte aligned
    assert cutlass.space(Problem(1024, 1024, 1024, c_major="col")) == []
    assert cutlass.space(Problem(1024, 1024, 1024, in_dtype="bf16")) == []


# ------------------------------------------------------------------ one real build


@pytest.mark.slow  # about 2 minutes of one core each (runs in CI all the same)
@pytest.mark.parametrize("program,threads", [
    (_program(Problem(None, None, None, "row", "col"), mainloop="ws_pingpong", warps=(4, 1), tile=Tile(64, 128, 64)),
     384),
    # split_k N workspace: the GEMM (one producer and one consumer warpgroup) and the reduce kernel
    (_program(Problem(None, None, None, "row", "col", epilogue=Epilogue(bias="n", activation="gelu")),
              mainloop="ws_pingpong", warps=(4, 1), tile=Tile(64, 64, 64), scheduler="tile", split_k=8,
              split_k_reduce="workspace"), 256),
])
def test_one_nvcc_build_gives_a_loadable_library(tmp_path, monkeypatch, program, threads):
    import shutil
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    monkeypatch.setenv("GEMMGEN_CACHE_DIR", str(tmp_path))
    artifact = cutlass.build(cutlass.lower(program))
    lib = ctypes.CDLL(artifact.path)
    for symbol in ("gg_initialize", "gg_run", "gg_workspace_size"):
        assert hasattr(lib, symbol)
    assert artifact.meta["threads"] == threads
    assert 2 <= artifact.meta["stages"] and artifact.meta["smem_bytes"] <= 232448
    assert artifact.meta["spec"] == instance_spec(program).as_meta
    # Nothing spills; the second build of the same source is a cache hit.
    assert all(r["spill_stores"] == 0 for r in artifact.meta["resources"].values())
    assert cutlass.build(cutlass.lower(program)).path == artifact.path


def test_unordered_split_k_is_a_runtime_reduction_mode_of_the_stream_k_build():
    """`split_k N unordered` asks CUTLASS's stream-K scheduler for its nondeterministic
    reduction; the split count is a runtime argument of the stream-K build, and any epilogue
    is allowed: the final split applies it to the fp32 sum."""
    problem = Problem(256, 128, 8192, "row", "col", epilogue=Epilogue(bias="n", activation="gelu"))
    unordered = _program(problem, tile=Tile(128, 128, 64), split_k=16, split_k_reduce="unordered")
    assert validate(unordered) == unordered
    assert cutlass.build_key(unordered) == cutlass.build_key(replace(unordered, split_k=4))
    assert cutlass.build_key(unordered) == cutlass.build_key(replace(unordered, split_k=1, scheduler="stream_k"))
    assert runtime_args(unordered).reduction == 1
    assert runtime_args(replace(unordered, split_k=1, scheduler="stream_k")).reduction == 0
    text = cutlass.lower(unordered).text
    assert "args.scheduler.reduction_mode =" in text and "ReductionMode>(reduction)" in text
    assert "int decomposition,\n                      int reduction, int grid_sms, void* workspace" in text
    atomic = replace(unordered, split_k_reduce="atomic")
    assert any("cannot reduce split-K by atomic" in m for _, m in _findings(atomic))


def _sliced(problem, tile=Tile(64, 64, 64), split=8, scheduler="tile") -> Program:
    return _program(problem, mainloop="ws_pingpong", warps=(4, 1), tile=tile, scheduler=scheduler, split_k=split,
                    split_k_reduce="workspace")


def test_workspace_split_k_is_k_slices_of_a_batched_gemm_and_a_reduce_kernel():
    """`split_k N workspace`: one build per tile and epilogue (the slice count is a runtime
    argument) whose GEMM writes fp32 partials with no epilogue, and whose reduce kernel sums
    the slices in order and applies the program's epilogue (common.cuh, as the raw CUDA
    backend does)."""
    problem = Problem(256, 128, 8192, "row", "col", epilogue=Epilogue(bias="n", activation="gelu"))
    program = _sliced(problem)
    assert validate(program) == program
    spec = instance_spec(program)
    assert spec.partials and spec.tile_scheduler == "tile" and spec.activation == "gelu"
    assert cutlass.build_key(program) == cutlass.build_key(replace(program, split_k=32))
    assert cutlass.build_key(program) != cutlass.build_key(replace(program, split_k=1))
    assert runtime_args(program).splits == 8 and runtime_args(program).reduction == 0
    text = cutlass.lower(program).text
    assert "args.problem_shape = {m, n, k / splits, splits};" in text
    assert "__global__ void splitk_reduce" in text and "#define ACT_GELU 1" in text and "#define BIAS_N 1" in text
    # The GEMM itself has no epilogue: fp32 D, no C, plain linear combination.
    assert "cutlass::epilogue::fusion::LinCombPerColBiasEltAct" not in text
    assert "float, float, void" in text or "float,\n" in text
    # The builds from before keep their sources and metadata (and so their cache keys).
    plain = cutlass.lower(replace(program, split_k=1))
    assert "gg_reduce" not in plain.text and "partials" not in plain.meta["spec"]


@pytest.mark.parametrize("program,phrase", [
    (_sliced(Problem(256, 128, 8200, "row", "col"), split=8), "K=8200 allows 5, 25, 41"),
    (_sliced(Problem(256, 128, 8192, "row", "col"), split=8, scheduler="stream_k"), "batched GEMM"),
])
def test_workspace_split_k_refusals_say_why(program, phrase):
    from gemmgen.backends.cutlass.rules import RULES
    messages = [m for rule in RULES for _, m in rule(program)]
    assert any(phrase in m for m in messages), messages


def test_the_epilogue_tile_is_a_build_choice_written_into_the_collective():
    base = _program(Problem(4096, 16384, 64, "row", "row"))
    wide = replace(base, epilogue_tile=(128, 128))
    assert validate(wide) and cutlass.build_key(wide) != cutlass.build_key(base)
    text = cutlass.lower(wide).text
    epilogue = _collective(text, "epilogue")
    assert "cute::Shape<cute::_128, cute::_128>" in epilogue and "EpilogueTileAuto" not in text
    assert "EpilogueTileAuto" in _collective(cutlass.lower(base).text, "epilogue")
    # The automatic epilogue keeps the spec (and so the digest) it had before the option existed.
    assert "epilogue_tile" not in instance_spec(base).as_meta
    assert instance_spec(wide).as_meta["epilogue_tile"] == [128, 128]
    assert "epilogue=" not in to_text(base) and "tile 128x256x64 epilogue=128x128\n" in to_text(wide)
    assert parse(to_text(wide)) == wide
    # The shared-memory model counts the wider sub-tile: a ring of 4 no longer fits 128x256x64.
    from gemmgen.dsl.resources import max_stages
    assert (max_stages(base), max_stages(wide)) == (4, 3)


def test_only_the_cutlass_backend_takes_an_epilogue_tile():
    for name in ("triton_split_k", "cuda_ws_cooperative"):
        program = replace(parse(examples()[name].read_text()), epilogue_tile=(128, 128))
        assert any(d.statement == "tile" and "chooses how its epilogue stores" in d.message
                   for d in diagnose(program)), diagnose(program)
    text = re.sub(r"^tile (\S+)$", r"tile \1 epilogue=64x32", CUTLASS_EXAMPLES["cutlass_stream_k"].read_text(),
                  flags=re.M)
    with pytest.raises(ProgramError) as err:
        validate(parse(text, filename="x.gemm"), filename="x.gemm")
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("tile "))
    assert re.search(rf"x\.gemm:{line}:1: .*128 rows", str(err.value)), str(err.value)


def test_the_space_offers_the_wide_epilogue_where_the_store_is_the_work():
    from gemmgen.backends.cutlass.search_space import WIDE_EPILOGUE, library, space

    short = space(Problem(4096, 16384, 64, "row", "row"))
    assert short[0].epilogue_tile == (128, 128) and all(not diagnose(p) for p in short)
    # The wide sub-tile replaces the automatic one of the persistent 1x1 builds (no twins to
    # crowd the timed candidates); other clusters keep the automatic epilogue.
    assert replace(short[0], epilogue_tile=None) not in short
    builds = library(Problem(16384, 4096, 128, "row", "row"))
    assert len(builds) == len(library(Problem(4096, 4096, 4096, "row", "row")))
    wide = [p for p in builds if p.epilogue_tile]
    assert {(p.mainloop, p.tile.m, p.tile.n) for p in wide} == set(WIDE_EPILOGUE)
    assert all(p.cluster == (1, 1) and p.scheduler == "persistent" for p in wide)
    assert not any(p.cluster == (1, 1) and p.scheduler == "persistent" and not p.epilogue_tile
                   and (p.mainloop, p.tile.m, p.tile.n) in WIDE_EPILOGUE for p in builds)
    assert any(p.cluster != (1, 1) for p in space(Problem(8192, 512, 128, "row", "row"))[:16])
    # Long K, small outputs and shape-generic problems keep the automatic epilogue only.
    for problem in (Problem(4096, 4096, 4096, "row", "row"), Problem(4096, 4096, 320, "row", "row"),
                    Problem(256, 256, 64, "row", "row"), Problem(None, None, None, "row", "row")):
        assert not any(p.epilogue_tile for p in space(problem)), problem
