"""Parsing, printing and the round trip: examples, hypothesis programs, the docs' code blocks."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from gemmgen.dsl import ProgramError, examples, ir, parse, to_text
from gemmgen.backends import diagnose, validate
from gemmgen.dsl.parser import parse_with_comments
from gemmgen.dsl.printer import to_text_with_comments
from strategies import programs, valid_programs

# a backend still being written may have a rule that fails; the validator skips it with a warning

EXAMPLES = examples()
DOCS = Path(__file__).resolve().parent.parent / "docs" / "dsl.md"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_parses_validates_and_round_trips(name):
    text = EXAMPLES[name].read_text()
    program = parse(text, filename=name)
    assert validate(program) is program
    assert parse(to_text(program)) == program
    # the examples are canonical apart from their comments
    assert to_text_with_comments(*parse_with_comments(text)) == text


def test_examples_cover_every_schedule_kind():
    programs = [parse(path.read_text()) for path in EXAMPLES.values()]
    assert {p.mainloop for p in programs} == set(ir.MAINLOOPS)
    assert {p.scheduler for p in programs} == set(ir.SCHEDULERS)
    assert {p.backend for p in programs} == set(ir.BACKENDS)
    assert any(p.split_k > 1 for p in programs)
    assert any(not p.problem.is_bound for p in programs)
    assert any(p.problem.b_major == "col" and p.problem.epilogue.bias == "n"
               and p.problem.epilogue.activation == "gelu" for p in programs)
    kinds = {(p.backend, p.instr.kind if p.instr else None) for p in programs}
    assert {("cuda", "mma"), ("cuda", "wgmma"), ("cutlass", "wgmma")} <= kinds
    assert any(p.cluster != (1, 1) for p in programs)


@settings(max_examples=200, deadline=None)
@given(programs())
def test_every_expressible_program_round_trips(program):
    text = to_text(program)
    assert parse(text) == program
    assert to_text(parse(text)) == text
    for d in diagnose(parse(text)):  # any program can be diagnosed, each finding located
        assert d.line >= 1 and d.message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(valid_programs())
def test_valid_programs_round_trip_and_stay_valid(program):
    again = parse(to_text(program))
    assert again == program
    assert diagnose(again) == []


MINIMAL = """\
mainloop multistage   # statements in any order
warps 2x2
tile 128x128x32
backend triton
gemm 1024x512x256
"""


def test_defaults_and_any_order():
    p = parse(MINIMAL)
    assert p == ir.Program(problem=ir.Problem(1024, 512, 256), backend="triton", tile=ir.Tile(128, 128, 32),
                           warps=(2, 2), mainloop="multistage")
    assert to_text(p).splitlines() == [
        "gemm 1024x512x256 a=row b=row c=row in=f16 acc=f32", "epilogue out=f16", "backend triton",
        "tile 128x128x32", "warps 2x2", "instr auto", "cluster 1x1", "stages auto", "mainloop multistage",
        "scheduler tile", "raster m swizzle=1", "smem_swizzle auto", "split_k 1"]
    assert p.spans == {"mainloop": (1, 1), "warps": (2, 1), "tile": (3, 1), "backend": (4, 1), "gemm": (5, 1)}


def test_options_in_any_order_print_canonically():
    p = parse(MINIMAL.replace("gemm 1024x512x256", "gemm *x512x* acc=f32 c=col b=col")
              + "epilogue out=f32 residual silu bias=m beta=0.25 alpha=1.5\n")
    assert to_text(p).splitlines()[:2] == [
        "gemm *x512x* a=row b=col c=col in=f16 acc=f32",
        "epilogue alpha=1.5 beta=0.25 bias=m silu residual out=f32"]


@pytest.mark.parametrize("value", [1.5, 0.1, 1e-05, -2.0, 3.0000000000000004, 1e+300, 5e-324])
def test_floats_print_short_and_exact(value):
    p = parse(MINIMAL + f"epilogue alpha={value!r}\n")
    assert f"alpha={value!r}" in to_text(p)
    assert parse(to_text(p)).problem.epilogue.alpha == value


def test_fmt_keeps_comments_with_their_statements():
    text = "# header\nwarps 2x2  # two by two\n" + MINIMAL.replace("warps 2x2\n", "") + "# footer\n"
    out = to_text_with_comments(*parse_with_comments(text)).splitlines()
    assert out[0] == "# header"
    assert "warps 2x2  # two by two" in out
    assert out[-1] == "# footer"
    assert out.index("warps 2x2  # two by two") == out.index("tile 128x128x32") + 1


def test_bind_makes_a_generic_program_concrete():
    p = parse(EXAMPLES["triton_generic"].read_text())
    assert not p.problem.is_bound
    q = p.bind((4096, 4096, 4096))
    assert q.problem.is_bound and to_text(q).startswith("gemm 4096x4096x4096 ")
    assert parse(to_text(q)) == q


def _doc_blocks() -> list[str]:
    return re.findall(r"```gemm\n(.*?)```", DOCS.read_text(), flags=re.S) if DOCS.exists() else []


def _complete(fragment: str) -> str:
    """A statement example plus whichever required statements it lacks."""
    text = fragment
    for line in MINIMAL.splitlines():
        keyword = line.split()[0]
        if not re.search(rf"^\s*{keyword}\b", fragment, flags=re.M):
            text += line + "\n"
    return text


def test_docs_have_gemm_blocks():
    assert len(_doc_blocks()) >= 10


@pytest.mark.parametrize("block", _doc_blocks(), ids=lambda b: b.strip().splitlines()[0][:40])
def test_docs_gemm_blocks_are_real(block):
    """Each ```gemm block of docs/dsl.md: a whole program validates; a statement example
    parses once completed; a block whose first line is `# error: TEXT` fails with TEXT."""
    first = block.strip().splitlines()[0]
    if first.startswith("# error:"):
        expected = first.split(":", 1)[1].strip()
        with pytest.raises(ProgramError) as info:
            validate(parse(_complete(block)))
        assert expected in str(info.value)
    elif re.search(r"^gemm ", block, flags=re.M) and re.search(r"^backend ", block, flags=re.M):
        validate(parse(block))
    else:
        parse(_complete(block))
