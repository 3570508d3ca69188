"""Malformed and illegal programs: each rejected at the right line:column with a message
that says what to change. Parse errors come from `parse`; the rest from `diagnose`."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemmgen.backends.base import Support
from gemmgen.dsl import ProgramError, ir, parse
from gemmgen.backends import diagnose, validate
from gemmgen.backends import registry
from gemmgen.backends import support as support_module
from gemmgen.dsl.validate import diagnose as language_diagnose


# A valid program in canonical order: statement -> line number is its index + 1.
BASE = {
    "gemm": "gemm 4096x4096x4096 a=row b=col c=row in=f16 acc=f32",
    "epilogue": "epilogue out=f16",
    "backend": "backend triton",
    "tile": "tile 128x256x64",
    "warps": "warps 2x4",
    "instr": "instr auto",
    "cluster": "cluster 1x1",
    "stages": "stages 3",
    "mainloop": "mainloop multistage",
    "scheduler": "scheduler tile",
    "raster": "raster m swizzle=8",
    "smem_swizzle": "smem_swizzle auto",
    "split_k": "split_k 1",
}
LINE = {name: i + 1 for i, name in enumerate(BASE)}
WS = {"tile": "tile 128x256x64", "warps": "warps 8x1", "instr": "instr wgmma 64x256x16",
      "mainloop": "mainloop ws_cooperative", "stages": "stages 4"}


def text(**lines: str) -> str:
    return "".join(lines.get(name, line) + "\n" for name, line in BASE.items())


def test_base_programs_are_valid():
    assert language_diagnose(parse(text())) == []
    assert language_diagnose(parse(text(**WS))) == []


PARSE_ERRORS = [
    # (text, line, column, expected substring)
    ("tiles 128x256x64\n", 1, 1, "unknown statement 'tiles'"),
    ("gemm 1x2x3\ntile 128x256\n", 2, 13, "in `tile`: expected 'x', found the end of the line"),
    ("gemm 1x2\n", 1, 9, "in `gemm`: expected 'x'"),
    ("gemm 4x4x4 a=rows\n", 1, 14, "expected 'row' or 'col', found 'rows'"),
    ("backend tritonx\n", 1, 9, "found 'tritonx'"),
    (text() + "tile 64x64x64\n", 14, 1, "second `tile` statement (the first is on line 4)"),
    ("gemm 1x2x3\n", 1, 1, "the program has no `backend`, `tile`, `warps`, `mainloop` statements"),
    ("", 1, 1, "the program has no `gemm`"),
    ("tile 128x256x64!\n", 1, 16, "found '!'"),
    ("epilogue gelu relu\n", 1, 15, "gives an activation twice (gelu and relu)"),
    ("epilogue bias=k\n", 1, 15, "expected 'm' or 'n', found 'k'"),
    ("split_k 4\n", 1, 1, "split_k 4 needs a reduction: write `split_k 4 workspace`"),
    ("tile 128x256x64 epilogue=128\n", 1, 29, "in `tile`: expected 'x'"),
    ("tile 128x256x64 epilogue 128x128\n", 1, 26, "in `tile`: expected '='"),
    ("split_k 1 atomic\n", 1, 1, "takes no reduction: write `split_k 1`"),
    ("stages x\n", 1, 8, "expected one of 'auto', a whole number, found 'x'"),
    ("gemm 1x2x3 a=row a=col\n", 1, 18, "gives `a=` twice (row and col)"),
    ("warps 2x\n", 1, 9, "expected a whole number, found the end of the line"),
    ("mainloop multi\n", 1, 10, "found 'multi'"),
    ("instr wgmma 64x128\n", 1, 19, "write `instr auto | instr wgmma 64xNx16"),
    ("raster m swizzle 8\n", 1, 18, "expected '=', found '8'"),
    ("epilogue alpha=1.2.3\n", 1, 19, "in `epilogue`"),
    ("gemm 1x2x3 in=f8\n", 1, 15, "expected one of 'f16', 'bf16', 'f32', found 'f8'"),
    ("scheduler round_robin\n", 1, 11, "one of 'tile', 'persistent', 'stream_k'"),
    ("# comment\n\n  cluster 2y1\n", 3, 12, "in `cluster`: expected 'x'"),
    ("epilogue alpha=x\n", 1, 16, "expected a number"),
]


@pytest.mark.parametrize("source,line,column,message", PARSE_ERRORS, ids=[c[3][:30] for c in PARSE_ERRORS])
def test_parse_error_is_located(source, line, column, message):
    with pytest.raises(ProgramError) as info:
        parse(source, filename="k.gemm")
    err = info.value
    assert (err.line, err.column) == (line, column), str(err)
    assert message in err.message
    assert str(err).startswith(f"k.gemm:{line}:{column}: ")
    assert "lark" not in str(err).lower() and "Token" not in str(err) and "__ANON" not in str(err)


ILLEGAL = [
    # (statement lines replaced, statement at fault, expected substring)
    ({"stages": "stages 6"}, "stages",
     "tile 128x256x64 with stages 6 needs 294912 B of shared memory; the limit is 232448 B: use stages <= 4"),
    ({"gemm": "gemm 64x64x64 in=bf16"}, "gemm", "GEMMs with f16 inputs; write in=f16"),
    ({"gemm": "gemm 64x64x64 acc=f16"}, "gemm", "never accumulates in anything but fp32"),
    ({"tile": "tile 128x256x24"}, "tile", "tile_k must be a multiple of 16"),
    ({"warps": "warps 3x4"}, "warps", "warps 3x4 do not divide tile 128x256x64"),
    ({**WS, "tile": "tile 128x192x64", "instr": "instr wgmma 64x128x16"}, "tile",
     "multiple of the instruction's N=128; use instr wgmma 64x192x16"),
    ({"instr": "instr wgmma 128x128x16"}, "instr", "does not exist for fp16"),
    ({"instr": "instr mma 16x16x16"}, "instr", "write `instr mma 16x8x16`"),
    ({**WS, "mainloop": "mainloop ws_pingpong", "warps": "warps 2x2", "tile": "tile 128x128x64",
      "instr": "instr auto"}, "warps", "wgmma runs on warpgroups of 4 warps stacked along M"),
    ({"warps": "warps 16x4", "tile": "tile 256x256x32", "stages": "stages 2"}, "warps",
     "makes 2048 threads per CTA; the limit is 1024"),
    ({"warps": "warps 1x2", "tile": "tile 256x256x32", "stages": "stages 2"}, "tile",
     "holds 1024 fp32 accumulators per thread"),
    ({"warps": "warps 4x4", "tile": "tile 256x256x32", "stages": "stages 2"}, "warps",
     "the register file holds 65536"),
    ({"cluster": "cluster 3x1"}, "cluster", "cluster 3x1 is not legal: each side must be a power of 2"),
    ({"cluster": "cluster 4x4"}, "cluster", "the product at most 8 CTAs"),
    ({"gemm": "gemm 4224x4096x4096", "cluster": "cluster 2x1"}, "cluster",
     "cluster 2x1 must divide the CTA grid of 33x16 tiles"),
    ({"gemm": "gemm 4096x4096x256", "split_k": "split_k 8 workspace"}, "split_k",
     "needs K >= 512 so every slice gets a k-tile; K=256: use split_k <= 4"),
    ({"split_k": "split_k 4 workspace", "scheduler": "scheduler stream_k"}, "split_k",
     "stream_k already splits K"),
    ({"split_k": "split_k 4 atomic", "epilogue": "epilogue gelu out=f32"}, "split_k",
     "gelu would see partial sums: use `split_k 4 unordered` or `split_k 4 workspace`"),
    ({"split_k": "split_k 4 atomic"}, "split_k", "which accumulates in f16"),
    ({"split_k": "split_k 16 cluster"}, "split_k", "a cluster holds at most 8 CTAs: use split_k <= 8 cluster"),
    ({"split_k": "split_k 4 cluster", "cluster": "cluster 2x1"}, "split_k", "takes no cluster along M or N"),
    ({"epilogue": "epilogue alpha=0.0"}, "epilogue", "alpha=0.0 discards the product"),
    ({**WS, "gemm": "gemm 4096x4096x4100 a=row b=col"}, "mainloop",
     "A is row-major, so its contiguous dimension K=4100 must be a multiple of 8 f16 elements; "
     "use mainloop multistage or pad K to 4104"),
    ({**WS, "gemm": "gemm 4096x1001x4096 a=row b=row"}, "mainloop",
     "B is row-major, so its contiguous dimension N=1001"),
    ({"tile": "tile 128x256x32", "smem_swizzle": "smem_swizzle 128"}, "smem_swizzle",
     "A is row-major, so its rows are tile_k=32 elements = 64 B"),
    ({"smem_swizzle": "smem_swizzle 48"}, "smem_swizzle", "smem_swizzle 48 is not a swizzle width"),
    ({"raster": "raster m swizzle=3"}, "raster", "a power of 2 from 1 to 16"),
    ({**WS, "stages": "stages 1"}, "stages", "needs at least 2"),
    ({"tile": "tile 256x256x256", "stages": "stages auto"}, "tile",
     "needs 262144 B of shared memory for even 1 stage(s)"),
    ({"tile": "tile 0x256x64"}, "tile", "has a zero size"),
    ({"gemm": "gemm 0x4096x4096"}, "gemm", "M=0: a dimension is a positive whole number"),
    ({"split_k": "split_k 0 workspace"}, "split_k", "write `split_k 1` for no split"),
]


@pytest.mark.parametrize("lines,statement,message", ILLEGAL, ids=[c[2][:30] for c in ILLEGAL])
def test_illegal_program_is_located(lines, statement, message):
    found = language_diagnose(parse(text(**lines), filename="k.gemm"))
    located = [(d.line, d.column) for d in found if message in d.message]
    assert located, [d.message for d in found]
    assert located[0] == (LINE[statement], 1)


def test_validate_raises_the_first_problem_in_source_order():
    program = parse(text(cluster="cluster 3x1", stages="stages 9"), filename="k.gemm")
    with pytest.raises(ProgramError) as info:
        validate(program, filename="k.gemm")
    assert (info.value.line, info.value.column) == (LINE["cluster"], 1)
    assert str(info.value).startswith(f"k.gemm:{LINE['cluster']}:1: cluster 3x1 is not legal")


def test_program_built_in_code_is_located_at_zero():
    program = dataclasses.replace(parse(text()), spans={}, stages=9)
    (problem, *_) = language_diagnose(program)
    assert (problem.line, problem.column) == (0, 0)
    assert "stages 9" in problem.message


def test_values_outside_the_language_are_reported_not_crashed():
    program = dataclasses.replace(parse(text()), backend="tvm", warps=(0, 4), mainloop="magic")
    messages = [d.message for d in diagnose(program)]
    assert any("unknown backend 'tvm'" in m for m in messages)
    assert any("unknown mainloop 'magic'" in m for m in messages)
    assert any("has no warps along one axis" in m for m in messages)


# -- backend support: a fake backend's SUPPORT --------------------------------------------

def _refuse_big_tiles(program):
    return [("tile", "tiles above 64x64 are not built here")] if program.tile.m > 64 else []


def _broken_rule(program):
    raise RuntimeError("half-written rule")


FAKE = Support(mainloops=frozenset({"multistage"}), schedulers=frozenset({"tile"}),
               instr_kinds=frozenset({None}), split_k_reduces=frozenset({"workspace"}),
               activations=frozenset({"relu"}), bias=False, auto_stages=False,
               extra_rules=(_refuse_big_tiles, _broken_rule))


@pytest.fixture
def fake_support(monkeypatch):
    monkeypatch.setattr(support_module, "backend_support", lambda name: FAKE)


SUPPORT_CASES = [
    ({**WS}, "mainloop", "the triton backend has no mainloop ws_cooperative: use one of multistage"),
    ({"epilogue": "epilogue gelu out=f16"}, "epilogue", "the triton backend cannot fuse gelu: use one of relu"),
    ({"epilogue": "epilogue bias=n out=f16"}, "epilogue", "cannot fuse bias=n"),
    ({"scheduler": "scheduler persistent"}, "scheduler", "has no scheduler persistent"),
    ({"stages": "stages auto"}, "stages", "does not choose stages itself: write `stages N`"),
    ({}, "tile", "the triton backend: tiles above 64x64 are not built here"),
]


@pytest.mark.parametrize("lines,statement,message", SUPPORT_CASES, ids=[c[2][:30] for c in SUPPORT_CASES])
def test_backend_support_is_checked(fake_support, lines, statement, message):
    found = diagnose(parse(text(**lines)))
    located = [(d.line, d.column) for d in found if message in d.message]
    assert located == [(LINE[statement], 1)], [d.message for d in found]


def test_defaulted_statement_points_at_gemm_and_says_so(fake_support):
    source = "".join(line + "\n" for name, line in BASE.items() if name != "stages")
    (problem,) = [d for d in diagnose(parse(source)) if d.statement == "stages"]
    assert (problem.line, problem.column) == (1, 1)
    assert "there is no `stages` line, so its default applies" in problem.message


def test_a_failing_backend_rule_refuses_the_program(fake_support):
    """Validation fails closed: a rule that raises is a located refusal, not a skipped check."""
    found = diagnose(parse(text(tile="tile 64x64x64", warps="warps 2x2")))
    refusals = [d for d in found if "half-written rule" in d.message]
    assert len(refusals) == 1 and refusals[0].statement == "backend"
    assert (refusals[0].line, refusals[0].column) == (LINE["backend"], 1)
    assert "refused rather than built unchecked" in refusals[0].message
    with pytest.raises(ProgramError, match="half-written rule"):
        validate(parse(text(tile="tile 64x64x64", warps="warps 2x2")))


def test_a_backend_that_does_not_import_refuses_the_program(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError("No module named 'cutlass_library'", name="cutlass_library")

    monkeypatch.setattr(registry, "get", missing)
    with pytest.raises(support_module.BackendUnavailable, match="cutlass_library"):
        support_module.backend_support("cuda")
    found = diagnose(parse(text()))
    assert [d.statement for d in found] == ["backend"]
    assert "did not import" in found[0].message and "cutlass_library" in found[0].message
    # The language's own checks do not need the backend.
    assert language_diagnose(parse(text())) == []


def test_the_registry_is_the_languages_list_of_backends():
    """The language names the backends in its grammar; the registry must list the same ones."""
    from gemmgen.dsl.parser import grammar_text

    assert registry.NAMES == ir.BACKENDS
    assert f'BACKEND: {" | ".join(repr(n).replace(chr(39), chr(34)) for n in ir.BACKENDS)}' in grammar_text()


def test_errors_pickle_for_process_pools():
    import pickle

    err = ProgramError("bad", 3, 4, "k.gemm", "tile")
    again = pickle.loads(pickle.dumps(err))
    assert (again.line, again.column, again.message, str(again)) == (3, 4, "bad", "k.gemm:3:4: bad")


def test_the_grammar_constants_match_the_ir():
    from gemmgen.dsl.parser import grammar_text

    grammar = grammar_text()
    for values in (ir.MAINLOOPS, ir.SCHEDULERS, ir.BACKENDS, ir.ACTIVATIONS, ir.DTYPES):
        for value in values:
            assert f'"{value}"' in grammar


_ALPHABET = st.sampled_from(list("0123456789x*=#.-+ \t\n\r!") + ["tile", "gemm", "warps", "row", "auto",
                                                                   "epilogue", "gelu", "split_k", "a", "é"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, max_size=40).map("".join))
def test_any_text_parses_or_raises_a_located_program_error(source):
    try:
        parse(source)
    except ProgramError as err:
        assert err.line >= 1 and err.column >= 1 and err.message
        assert "lark" not in err.message.lower() and "__ANON" not in err.message


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(text()) - 1), st.integers(0, 12), st.text(max_size=3))
def test_mangled_programs_never_crash(at, cut, insert):
    source = text()
    try:
        program = parse(source[:at] + insert + source[at + cut:])
    except ProgramError as err:
        assert err.line >= 1 and err.column >= 1
    else:
        diagnose(program)


def test_every_backend_reads_the_inputs_the_language_accepts():
    """The language refuses inputs other than fp16; no backend's table says otherwise."""
    for name in registry.NAMES:
        assert registry.get(name).SUPPORT.in_dtypes == frozenset(ir.INPUT_DTYPES), name
    found = diagnose(parse(text().replace("in=f16", "in=bf16")))
    assert found and {d.statement for d in found} == {"gemm"} and any("write in=f16" in d.message for d in found)


def test_an_epilogue_alone_parses_as_its_statement_does():
    from gemmgen.dsl import parse_epilogue

    program = parse("\n".join({**BASE, "epilogue": "epilogue gelu bias=n out=bf16 residual"}.values()))
    assert parse_epilogue("gelu bias=n out=bf16 residual") == program.problem.epilogue
    assert parse_epilogue("gate=silu halves=stacked") == ir.Epilogue(gate="silu", halves="stacked")
    with pytest.raises(ProgramError, match=r"<program>:1:\d+: in `epilogue`: expected 'm' or 'n', found 'k'"):
        parse_epilogue("bias=k")
    with pytest.raises(ProgramError, match="gives an activation twice"):
        parse_epilogue("relu gelu")
