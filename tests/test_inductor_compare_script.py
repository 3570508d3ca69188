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


def test_a_failure_part_way_keeps_what_was_measured_and_its_database_goes(tmp_path, monkeypatch):
    """Rows are saved after every problem, and the working database's folder is removed at exit."""
    import atexit
    import json
    from pathlib import Path
    from types import SimpleNamespace

    import gemmgen
    from gemmgen.errors import GemmgenError

    script = load_script("inductor_compare")
    first = script.layer_shapes(script.PROBLEMS)[0][1]

    def fake_compile(shape, **kwargs):
        if shape != first:
            raise GemmgenError("stand-in failure at the second problem")
        return SimpleNamespace(fn=None, problem=SimpleNamespace(key="k", m=shape[0], n=shape[1], k=shape[2]),
                               provenance=SimpleNamespace(summary="a program"))

    monkeypatch.setattr(gemmgen, "compile", fake_compile)
    monkeypatch.setattr(script, "first_call_s", lambda fn, problem, device="cuda": 1.0)
    monkeypatch.setattr(script, "inductor_kernel", lambda mode="": (None, None))
    monkeypatch.setattr(script, "side_by_side", lambda kernels, problem: (
        {"inductor": 1.2, "gemmgen": 1.0, "torch": 1.1}, {}))
    at_exit = []
    monkeypatch.setattr(atexit, "register", lambda fn, *args: at_exit.append((fn, args)))
    with pytest.raises(GemmgenError):
        script.main(["--out", str(tmp_path)])
    saved = json.loads((tmp_path / "inductor_compare.json").read_text())
    assert len(saved["rows"]) == 1 and saved["summary"]["gemmgen_x_inductor"] == pytest.approx(1.2)
    [(remove, (work, _))] = at_exit
    assert Path(work).is_dir()
    remove(work, True)
    assert not Path(work).exists()
