"""benchmarks/read_ceiling.py on CPU: its arguments, and the CTA-limited reader builds for sm_90a
with 16-byte loads, UNROLL blocks a step."""
import pytest

from benchmark_scripts import load_script


@pytest.mark.parametrize("argv, words", [
    (["--ctas", "x"], "--ctas takes counts like 32,64"),
    (["--ctas", "32", "--weights", "4096"], "weights as NxK"),
    (["--ctas", "0"], "must be positive"),
])
def test_bad_cta_counts_and_weights_are_one_line(tmp_path, argv, words):
    with pytest.raises(SystemExit) as exit_:
        load_script("read_ceiling").main(argv + ["--out", str(tmp_path)])
    assert words in str(exit_.value.code)


def test_without_a_gpu_it_says_so(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        load_script("read_ceiling").main(["--ctas", "32", "--out", str(tmp_path)])
    assert "needs an NVIDIA Hopper GPU" in str(exit_.value.code)


@pytest.mark.parametrize("unroll", [1, 4])
def test_the_strided_reader_compiles_for_sm90a_with_its_loads_unrolled(unroll):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = load_script("read_ceiling")._strided_sum()
    # as the launch specializes a weight's pointers and size: 16-byte aligned, divisible by 16
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    source = ASTSource(kernel, {"src": "*fp16", "dst": "*fp32", "n": "i32", "BLOCK": "constexpr",
                                "UNROLL": "constexpr"}, constexprs={"BLOCK": 2048, "UNROLL": unroll},
                       attrs=aligned)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = compiled.asm["ptx"]
    # 2048 halves on 128 threads: 16 a thread, two 16-byte loads, per block in flight
    assert ptx.count("ld.global") == 2 * unroll
    assert "evict_first" in ptx
