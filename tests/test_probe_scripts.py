"""The probe scripts (sessions 14-15) on CPU: their pure parts, their plots from the committed
results, and their refusal to run without a GPU (the measurements themselves ran on the H200)."""
import json

import pytest
import torch

from gemmgen import dsl

from benchmark_scripts import BENCHMARKS, load_script

RESULTS = BENCHMARKS / "results"


def test_swiglu_probe_interleaves_gate_and_up_blocks():
    script = load_script("swiglu_probe")
    n, k, bn = 8, 3, 2
    wg = torch.arange(n * k, dtype=torch.float32).view(n, k)
    wu = -wg - 1
    joined = script.interleave(wg, wu, bn)
    assert joined.shape == (2 * n, k)
    for j in range(n // bn):                     # block j: bn gate rows, then bn up rows
        assert torch.equal(joined[2 * j * bn:(2 * j + 1) * bn], wg[j * bn:(j + 1) * bn])
        assert torch.equal(joined[(2 * j + 1) * bn:(2 * j + 2) * bn], wu[j * bn:(j + 1) * bn])
    # what the kernel's epilogue undoes: split each 2*bn block of the product into gate and up
    x = torch.randn(5, k)
    acc = (x @ joined.t()).view(5, n // bn, 2, bn)
    assert torch.allclose(acc[:, :, 0].reshape(5, n), x @ wg.t())
    assert torch.allclose(acc[:, :, 1].reshape(5, n), x @ wu.t())


def test_swiglu_probe_redraws_its_plot_and_refuses_to_run_without_a_gpu(tmp_path):
    script = load_script("swiglu_probe")
    rows = json.loads((RESULTS / "swiglu_probe" / "kernels.json").read_text())["rows"]
    assert {r["m"] for r in rows} == {2048, 4096}
    assert all("inductor" in r["median_ms"] for r in rows)
    script.plot(rows, tmp_path / "swiglu_probe.png")
    assert (tmp_path / "swiglu_probe.png").stat().st_size > 10_000
    model = json.loads((RESULTS / "swiglu_probe" / "model.json").read_text())["model"]
    assert {r["case"] for r in model} == {"prefill_b1_s2048", "prefill_b8_s512"}
    if not torch.cuda.is_available():
        assert script.main(["--out", str(tmp_path / "run")]) == 2


def test_anchor_programs_are_valid_and_bound_to_the_anchors():
    programs = sorted((RESULTS / "anchor_turns" / "programs").glob("*.gemm"))
    assert len(programs) == 8
    for path in programs:
        program = dsl.parse(path.read_text())
        assert dsl.diagnose(program) == [], path.name
        p = program.problem
        assert p.m == p.n == p.k and p.m in (4096, 8192), path.name
        assert program.backend in ("cutlass", "cuda")


def test_anchor_turns_redraws_its_plot_and_refuses_to_run_without_a_gpu(tmp_path):
    script = load_script("anchor_turns")
    shapes = json.loads((RESULTS / "anchor_turns" / "results.json").read_text())["shapes"]
    assert [s["shape"] for s in shapes] == ["4096x4096x4096", "8192x8192x8192"]
    for s in shapes:
        assert s["variants"]["torch"]["median_ms"] > 0
        assert all(v["passed"] for n, v in s["variants"].items() if not n.startswith("torch"))
    script.plot(shapes, tmp_path / "anchor_turns.png")
    assert (tmp_path / "anchor_turns.png").stat().st_size > 10_000
    if not torch.cuda.is_available():
        program = next((RESULTS / "anchor_turns" / "programs").glob("*.gemm"))
        assert script.main(["--out", str(tmp_path / "run"), str(program)]) == 2


def test_anchor_turns_refuses_a_shape_generic_program(tmp_path, capsys, monkeypatch):
    script = load_script("anchor_turns")
    path = tmp_path / "generic.gemm"
    path.write_text("gemm *x64x64 a=row b=row\nbackend triton\ntile 64x64x32\nwarps 2x2\nmainloop multistage\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)    # reach the program check on CPU
    assert script.main(["--out", str(tmp_path / "run"), str(path)]) == 2
    assert "must give M, N and K" in capsys.readouterr().err


def test_anchor_turns_expands_run_time_swizzles_and_refuses_bad_ones(tmp_path, capsys, monkeypatch):
    script = load_script("anchor_turns")
    path = RESULTS / "anchor_pairs" / "programs" / "cutlass_pingpong_4096.gemm"
    program = dsl.parse(path.read_text())
    variants = script.with_swizzles("pp", program, "m8, m4,n1")
    assert [n for n, _ in variants] == ["pp", "pp_m4", "pp_n1"]      # m8 is the program itself
    assert (variants[2][1].raster, variants[2][1].swizzle) == ("n", 1)
    assert len({v for _, v in variants}) == 3
    with pytest.raises(ValueError, match="raster"):
        script.with_swizzles("pp", program, "x4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)    # reach the argument check on CPU
    assert script.main(["--out", str(tmp_path / "run"), "--swizzles", "m", str(path)]) == 2
    assert "--swizzles 'm'" in capsys.readouterr().err


def test_anchor_turns_pairs_protocol_keeps_a_failed_variant_as_its_row(monkeypatch):
    script = load_script("anchor_turns")
    args = script.parse_args(["--out", "unused", "--protocol", "pairs", "--repeats", "4", "p.gemm"])

    def pair_ms(fn, torch_fn, problem, seed):
        if fn == "broken":
            raise RuntimeError("floor violation")
        return (0.9, 1.0) if fn == "fast" else (1.0, 1.0)

    monkeypatch.setattr(script, "pair_ms", pair_ms)
    problem = dsl.parse((RESULTS / "anchor_pairs" / "programs" / "cutlass_pingpong_4096.gemm").read_text()).problem
    variants = {"torch": "t", "torch (control)": "t", "fast": "fast", "broken": "broken"}
    rows = script.measure_pairs(problem, variants, {}, args)["variants"]
    assert rows["fast"]["vs_torch_median_ratio"][1] == pytest.approx(1 / 0.9, rel=1e-3)
    assert rows["torch (control)"]["vs_torch_median_ratio"][1] == pytest.approx(1.0)
    assert "median_ms" not in rows["broken"] and rows["broken"]["failures"] == ["timing: floor violation"]
    recorded = json.loads((RESULTS / "anchor_pairs" / "pairs" / "results.json").read_text())["shapes"][0]
    assert recorded["variants"]["torch (control)"]["vs_torch_median_ratio"][0] <= 1.0
