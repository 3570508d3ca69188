"""benchmarks/inductor_compare.py on CPU: its problems exist in the layer set, and what it
compiles with inductor writes the product into the caller's `out` (the GPU run is the benchmark)."""
import pytest

from benchmark_scripts import load_script
from gemmgen.policy.training.data import heldout_widths
from gemmgen.dsl.ir import Epilogue, Problem

torch = pytest.importorskip("torch")


def test_every_problem_is_a_held_out_layer_of_the_set():
    script = load_script("inductor_compare")
    shapes = script.layer_shapes(script.PROBLEMS)
    assert len(shapes) == len(script.PROBLEMS) == 12
    assert sum((n, k) in heldout_widths() for _, (m, n, k) in shapes) >= 8


def test_the_compiled_product_lands_in_out_and_its_first_call_is_timed():
    script = load_script("inductor_compare")
    torch._dynamo.reset()
    fn, _ = script.inductor_kernel("default")
    problem = Problem(16, 48, 32, b_major="col", in_dtype="f32", epilogue=Epilogue(out_dtype="f32"))   # CPU: fp32
    assert script.first_call_s(fn, problem, "cpu") > 0
    from gemmgen.runtime.tensors import operands
    (a, b, out), _ = operands(problem, 1, "cpu")
    assert fn(a, b, out).data_ptr() == out.data_ptr()
    assert torch.allclose(out, a @ b, atol=1e-4)
