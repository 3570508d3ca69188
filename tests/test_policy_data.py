"""The held-out split is fixed and never trained on; prompts state the problem and the hardware."""
from gemmgen.dsl import parse
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.policy import data
from gemmgen.policy.prompt import HARDWARE_LINE, answer_statements, prompt_text


def test_heldout_is_a_fixed_fifth_of_the_grid_plus_the_offgrid_five():
    grid = data.grid_shapes()
    assert len(grid) == 1000
    held = [s for s in grid if data.is_heldout_shape(*s)]
    assert 150 <= len(held) <= 250
    assert held == [s for s in grid if data.is_heldout_shape(*s)]          # a pure function of the shape
    problems = data.heldout_problems()
    offgrid = [p for p in problems if p.n == 11008 and p.k == 4096 and p.b_major == "col"]
    assert sorted(p.m for p in offgrid) == [1, 7, 33, 1000, 3000]


def test_no_training_problem_is_held_out():
    problems = data.training_problems(offgrid=200)
    assert problems and not any(data.is_heldout(p) for p in problems)
    shapes = {(p.m, p.n, p.k) for p in problems}
    assert len(shapes) > 900
    assert {p.b_major for p in problems} == {"row", "col"}
    assert len({p.epilogue for p in problems}) > 3


def test_the_prompt_states_problem_and_hardware_and_parses_as_dsl():
    problem = Problem(1000, 11008, 4096, b_major="col", epilogue=Epilogue(bias="n", activation="silu"))
    text = prompt_text(problem)
    assert text.startswith(HARDWARE_LINE) and "sm_90a" in text and "132" in text
    assert "gemm 1000x11008x4096 a=row b=col" in text and "bias=n silu" in text
    assert "m=10 n=13 k=12" in text
    answer = "".join(f"{line}\n" for line in ("backend triton", "tile 128x128x64", "warps 2x2", "instr auto",
                                              "cluster 1x1", "stages 3", "mainloop multistage", "scheduler tile",
                                              "raster m swizzle=8", "smem_swizzle auto", "split_k 1"))
    assert [line.split()[0] for line in answer.splitlines()] == list(answer_statements())
    assert parse(text + answer).problem == problem
