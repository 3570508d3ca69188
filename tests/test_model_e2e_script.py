"""benchmarks/model_e2e.py on CPU: tiny models run end to end in two parts (eager and inductor
default), merge into one results.json and one summary.json of the issue's form; the pure pieces
(comparisons, merge, summary, kernel classes) on made-up data. The GPU run is the benchmark."""
import json
import random

import pytest

from benchmark_scripts import load_script

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def script():
    return load_script("model_e2e")


def tiny_run(script, out, cases, variants="eager,default", device="cpu"):
    argv = ["--out", str(out), "--tiny", "--device", device, "--models", "llama3_8b_4l", "--cases", cases,
            "--variants", variants, "--repeats", "10", "--prefill-iters", "1", "--decode-iters", "2", "--no-profile"]
    return script.main(argv)


def test_two_partial_cpu_runs_merge_into_one_result_and_summary(script, tmp_path):
    torch._dynamo.reset()
    assert tiny_run(script, tmp_path, "prefill_8x512") == 0
    assert tiny_run(script, tmp_path, "decode_b1") == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["id"] for r in results["runs"]] == [0, 1] and results["tiny"] is True
    cases = results["models"]["llama3_8b_4l"]["cases"]
    assert set(cases) == {"prefill_8x512", "decode_b1"}
    assert cases["prefill_8x512"]["run"] == 0 and cases["decode_b1"]["run"] == 1
    assert cases["decode_b1"]["shape"] == {"kind": "decode", "batch": 1, "kv_tokens": 16, "logits": "all"}
    for record in cases.values():
        assert record["failing"] == {}
        for name in ("eager", "default"):
            row = record["variants"][name]
            assert row["passed"] and row["max_rel_err"] < 2e-2 and len(row["times_ms"]) == 10
            assert row["device_ms"] > 0 and "compile_s" in row
        assert record["variants"]["default"]["vs_default"] is None     # no ratio against itself
        assert record["comparisons"]["gemmgen_vs_default"]["ratio"] is None    # gemmgen was not run: said why
        assert "not run" in record["comparisons"]["gemmgen_vs_default"]["why"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"gpu", "date", "command", "models"}
    assert summary["command"].count("benchmarks/model_e2e.py") == 2       # both parts
    entry = summary["models"]["llama3_8b_4l"]["prefill_8x512"]
    assert {"gemmgen_vs_default", "gemmgen_vs_default_ci95", "gemmgen_vs_max_autotune",
            "gemmgen_vs_max_autotune_ci95"} <= set(entry)
    assert list(summary["models"]["llama3_8b_4l"]) == ["prefill_8x512", "decode_b1"]    # the order
    assert (tmp_path / "model_e2e.png").stat().st_size > 0


def test_a_tiny_results_file_refuses_a_full_size_part(script, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"benchmark": "model_e2e", "tiny": True, "runs": [],
                                                       "models": {}}))
    with pytest.raises(SystemExit, match="another --out"):
        script.load_results(tmp_path / "results.json", tiny=False)


def test_bad_names_say_what_to_choose(script, capsys):
    with pytest.raises(SystemExit):
        script.parse_args(["--out", "x", "--cases", "prefill_1x4096"])
    assert "choose from prefill_1x2048" in capsys.readouterr().err


def timed(ms, drift):
    return {"device_ms": ms, "times_ms": [ms * d for d in drift], "passed": True}


def made_up_case(script, kind, gain):
    rng = random.Random(1)
    drift = [1 + 0.05 * rng.random() for _ in range(15)]
    names = ("gemmgen", "default", "max-autotune") if kind == "prefill" else (
        "gemmgen+graphs", "default+graphs", "max-autotune+graphs")
    rows = {names[0]: timed(1.0, drift), names[1]: timed(gain, drift),
            names[2]: {"variant": names[2], "skipped": "--skip-max-autotune"}}
    return {"shape": {}, "variants": rows, "failing": {}, "comparisons": script.comparisons(kind, rows)}


def test_ratios_are_medians_of_one_run_with_intervals_and_decode_compares_graphs(script):
    prefill = made_up_case(script, "prefill", 1.10)["comparisons"]
    assert prefill["gemmgen_vs_default"]["ratio"] == pytest.approx(1.10, abs=1e-3)
    lo, hi = prefill["gemmgen_vs_default"]["ci95"]
    assert lo <= 1.10 <= hi
    assert prefill["gemmgen_vs_max_autotune"]["ratio"] is None
    assert "--skip-max-autotune" in prefill["gemmgen_vs_max_autotune"]["why"]
    decode = made_up_case(script, "decode", 1.3)["comparisons"]
    assert decode["gemmgen_vs_default"]["variant"] == "gemmgen+graphs"
    assert decode["gemmgen_vs_default"]["reference"] == "default+graphs"


def test_a_case_measured_again_replaces_the_old_one_whole(script):
    results = {"benchmark": "model_e2e", "tiny": False, "runs": [], "models": {}}
    run0 = {"id": 0, "command": "part one", "date": "d0", "gpu": "H200"}
    run1 = {"id": 1, "command": "part two", "date": "d1", "gpu": "H200"}
    script.merge(results, run0, "qwen2_5_7b_4l", {}, "decode_b8", made_up_case(script, "decode", 1.2))
    script.merge(results, run0, "qwen2_5_7b_4l", {}, "prefill_1x2048", made_up_case(script, "prefill", 1.1))
    script.merge(results, run1, "qwen2_5_7b_4l", {}, "decode_b8", made_up_case(script, "decode", 1.5))
    summary = script.summary(results)
    case = summary["models"]["qwen2_5_7b_4l"]
    assert list(case) == ["prefill_1x2048", "decode_b8"]
    assert case["decode_b8"]["gemmgen_vs_default"] == pytest.approx(1.5, abs=1e-3)
    assert summary["command"] == "part one && part two" and summary["date"] == "d1"


def test_kernels_are_classed_gemm_attention_pointwise_or_other():
    from benchmark_scripts import load_script as load

    timing = load("compile_timing")
    assert timing.kernel_class("fmha_cutlassF_f16_aligned_64x64_rf_sm80") == "attention"
    assert timing.kernel_class("triton_poi_fused_add_mm_3") == "pointwise"
    assert timing.kernel_class("triton_red_fused__to_copy_mean_pow_1") == "pointwise"
    assert timing.kernel_class("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN") == "gemm"
    assert timing.kernel_class("triton_tem_fused_mm_0") == "gemm"
    assert timing.kernel_class("Memcpy DtoD") == "other"
    assert timing.kernel_class("void splitKreduce_kernel<32, 16, int, float, __half>") == "gemm"
    assert timing.kernel_class("gemm_multistage") == timing.kernel_class("splitk_reduce") == "gemm"
    assert timing.kernel_class("void at::native::vectorized_elementwise_kernel<4>") == "pointwise"
    split = timing.kernel_split([("nvjet_a", 0.0, 60.0), ("triton_poi_b", 70.0, 80.0), ("flash_c", 80.0, 100.0),
                                 ("memset", 130.0, 140.0)], calls=1)
    assert (split["gemm_ms"], split["pointwise_ms"], split["attention_ms"], split["other_ms"]) == (0.06, 0.01, 0.02, 0.01)
    assert split["idle_share"] == pytest.approx(40 / 140, abs=1e-4) and split["gaps_20us"] == 1
    assert [(k["kernel"], k["launches"], k["ms"]) for k in split["top_kernels"][:2]] == [("nvjet_a", 1, 0.06),
                                                                                         ("flash_c", 1, 0.02)]


@pytest.mark.gpu
def test_every_variant_runs_and_passes_on_the_gpu(script, tmp_path):
    """Tiny models on CUDA, all eight variants, a prefill and a decode case."""
    torch._dynamo.reset()
    status = tiny_run(script, tmp_path, "prefill_8x512,decode_b8", variants=",".join(v.name for v in script.VARIANTS),
                      device="cuda")
    summary = json.loads((tmp_path / "summary.json").read_text())
    results = json.loads((tmp_path / "results.json").read_text())
    assert status == 0, results["models"]["llama3_8b_4l"]["cases"]
    for case in ("prefill_8x512", "decode_b8"):
        entry = summary["models"]["llama3_8b_4l"][case]
        assert entry["gemmgen_vs_default"] > 0 and entry["gemmgen_vs_max_autotune"] > 0
        assert entry["gemmgen_vs_default_ci95"] is not None


def test_the_budget_drops_max_autotune_before_it_drops_a_case(script):
    plan = script.case_plan
    assert plan(0, 540, True, {True: None, False: None}) == "all"             # nothing measured yet
    assert plan(400, 540, True, {True: 200, False: 60}) == "no-max-autotune"
    assert plan(300, 540, True, {True: None, False: 60}) == "all"             # 60 + the guess fits
    assert plan(500, 540, True, {True: 200, False: 60}) == "none"
    assert plan(500, 540, False, {True: None, False: 30}) == "no-max-autotune"
    assert plan(280, 540, False, {True: 400, False: None}) == "no-max-autotune"     # 400 s less the guess
