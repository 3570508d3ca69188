"""benchmarks/read_ceiling.py on CPU: its arguments, both modes end to end with the GPU parts
stubbed, and the CTA-limited reader builds for sm_90a with 16-byte loads, UNROLL blocks a step."""
import json

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


@pytest.fixture
def stubbed_gpu(monkeypatch):
    """read_ceiling with its GPU parts stubbed: CUDA "present", weights on the CPU, no flush, and
    each reader's time the number the stub reader returns."""
    torch = pytest.importorskip("torch")
    from gemmgen.measure import timing

    script = load_script("read_ceiling")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(timing, "flusher", lambda options, device: lambda: None)
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, dtype=None: real_randn(*shape, dtype=dtype))
    monkeypatch.setattr(script, "device_us", lambda fn, flush: fn())
    return script


def test_cta_reads_write_the_fastest_reader_per_weight_and_count(tmp_path, monkeypatch, stubbed_gpu):
    """The --ctas flow end to end with the GPU parts stubbed: one row per weight and CTA count,
    the fastest reader's time, its rate a CTA, and the table beside the JSON."""
    script = stubbed_gpu
    # each stub reader returns its own time: 10 us at 32 CTAs, halved at 64, 1 us more unrolled 16

    def readers(w, ctas):
        return {f"b2048 u{u} w8": (lambda u=u: 320.0 / ctas + (1.0 if u == 16 else 0.0)) for u in (8, 16)}

    monkeypatch.setattr(script, "strided_readers", readers)
    assert script.main(["--ctas", "32,64", "--weights", "1024x2048", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "read_by_ctas.json").read_text())["rows"]
    assert [(r["n"], r["k"], r["ctas"], r["best"], r["device_us"]) for r in rows] == [
        (1024, 2048, 32, "b2048 u8 w8", 10.0), (1024, 2048, 64, "b2048 u8 w8", 5.0)]
    assert rows[0]["gb_per_s_per_cta"] == pytest.approx(2 * 1024 * 2048 / 10.0 / 1e3 / 32)
    assert len((tmp_path / "ctas.txt").read_text().splitlines()) == 3


def test_weight_reads_write_one_row_per_distinct_weight(tmp_path, monkeypatch, stubbed_gpu):
    """The default flow with the GPU parts stubbed: each distinct weight of the shapes file read
    once, the fastest reader kept, read_ceiling.json and table.txt written."""
    script = stubbed_gpu
    monkeypatch.setattr(script, "readers", lambda w: {"slow": lambda: 9.0, "fast": lambda: w.numel() / 1e6})
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,layout\n1,1024,2048,nt\n8,1024,2048,nt\n1,512,512,nt\n")
    assert script.main(["--shapes", str(shapes), "--part", "all", "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "read_ceiling.json").read_text())["rows"]
    assert [(r["n"], r["k"], r["best"]) for r in rows] == [(512, 512, "fast"), (1024, 2048, "fast")]
    assert rows[1]["device_us"] == pytest.approx(1024 * 2048 / 1e6)
    assert len((tmp_path / "out" / "table.txt").read_text().splitlines()) == 3
