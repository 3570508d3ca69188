"""On the H200: a correct kernel passes, each planted cheat fails for its reason, the timer is
sane and cannot be fooled, a hung or faulting kernel costs one trial, the baselines run.

Run: python -m pytest -q -m gpu tests/test_measure_gpu.py   (about 2-3 minutes)
"""
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from gemmgen.dsl.ir import Epilogue, Problem  # noqa: E402
from gemmgen.measure import check, time, time_many  # noqa: E402
from gemmgen.measure.errors import MeasureError  # noqa: E402
from gemmgen.measure.timing import TimingOptions  # noqa: E402

P = Problem(512, 384, 2048)
BIG = Problem(4096, 4096, 4096)
FAST = TimingOptions(min_reps=20, max_reps=50, host_reps=10)


def matmul(a, b, out, **_):
    torch.matmul(a, b, out=out)


def failures(fn, problem=P):
    r = check(fn, problem)
    assert not r.passed, "a planted cheat passed the check"
    return " | ".join(r.failures)


# ---- checks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("problem", [
    P, Problem(1000, 333, 777, a_major="col", b_major="col"), Problem(128, 4096, 64, c_major="col"),
])
def test_correct_kernel_passes(problem):
    r = check(matmul, problem)
    assert r.passed, r.failures
    assert r.max_rel_err < r.bound / 3


def test_correct_epilogue_kernel_passes():
    from gemmgen.measure.baselines import make
    p = Problem(256, 512, 1024, b_major="col",
                epilogue=Epilogue(alpha=0.5, beta=1.0, bias="n", activation="gelu", residual=True))
    for name in ("torch", "lt_heuristic"):
        k = make(name, p)
        r = check(k.fn, k.problem)
        assert r.passed, (name, r.failures)


def test_fp16_accumulation_in_torch_chunks_fails():
    def fn(a, b, out, **_):
        acc = torch.zeros(out.shape, dtype=torch.float16, device=out.device)
        for k0 in range(0, a.shape[1], 64):
            acc += a[:, k0:k0 + 64] @ b[k0:k0 + 64]     # fp16 += fp16: the sum lives in fp16
        out.copy_(acc)
    assert "precision" in failures(fn)


def test_fp16_accumulation_on_tensor_cores_fails():
    from planted_gpu import matmul_f16_acc
    assert "precision" in failures(matmul_f16_acc)


def test_unwritten_output_fails():
    def fn(a, b, out, **_):
        torch.matmul(a[:-16], b, out=out[:-16])          # the last 16 rows never stored
    assert "not written" in failures(fn)


def test_out_of_bounds_write_fails():
    def fn(a, b, out, **_):
        torch.matmul(a, b, out=out)
        out.as_strided((out.numel() + 64,), (1,), out.storage_offset())[-64:].zero_()
    assert "out-of-bounds" in failures(fn)


def test_modified_input_fails():
    def fn(a, b, out, **_):
        torch.matmul(a, b, out=out)
        b.add_(1.0)
    assert "input B modified" in failures(fn)


def test_work_on_an_unordered_side_stream_fails():
    side = torch.cuda.Stream()

    def fn(a, b, out, **_):
        with torch.cuda.stream(side):                   # runs now, before the inputs arrive
            torch.matmul(a, b, out=out)
    assert failures(fn)


def test_work_on_a_side_stream_not_joined_back_fails():
    side = torch.cuda.Stream()

    def fn(a, b, out, **_):
        side.wait_stream(torch.cuda.current_stream())   # ordered after the inputs...
        with torch.cuda.stream(side):
            torch.matmul(a, b, out=out)                 # ...but the caller's stream never waits for it
    text = failures(fn, BIG)
    assert "another stream" in text or "not written" in text


def test_constant_output_fails():
    assert "same for two different input sets" in failures(lambda a, b, out, **_: out.fill_(0.5))


def test_kernel_that_raises_fails():
    def fn(a, b, out, **_):
        raise RuntimeError("no config for this shape")
    assert "no config" in failures(fn)


# ---- timing ---------------------------------------------------------------------------------

def test_timing_is_sane_for_a_large_gemm():
    t = time(matmul, BIG, "offline", options=FAST)
    tflops = BIG.flops / (t.device_ms * 1e-3) / 1e12
    assert 300 < tflops < 989, t
    assert t.floor_ms < t.device_ms < t.host_ms * 1.5 and t.spread < 0.5
    assert any("gemm" in k.lower() or "nvjet" in k.lower() or "sm90" in k for k in t.kernels), t.kernels
    # the SM clock during the loop (NVML; nvidia-ml-py is in the GPU image)
    assert t.clocks["samples"] >= 1 and 0 < t.clocks["sm_mhz_min"] <= t.clocks["sm_mhz_max"], t.clocks


def test_cupti_and_event_timers_agree_on_one_stream():
    import dataclasses
    cupti = time(matmul, BIG, "offline", options=FAST)
    events = time(matmul, BIG, "offline", options=dataclasses.replace(FAST, timer="events"))
    assert events.timer == "events" and cupti.timer == "cupti"
    assert events.device_ms == pytest.approx(cupti.device_ms, rel=0.1), (cupti, events)


def test_flush_is_not_counted_and_warm_is_not_slower():
    cold = time(matmul, Problem(64, 64, 64), "offline", options=FAST)
    warm = time(matmul, Problem(64, 64, 64), "warm", options=FAST)
    assert cold.device_ms < 0.02 and warm.device_ms < 0.02      # a 128 MiB fill takes ~40 us
    assert warm.device_ms <= cold.device_ms * 1.2


def test_side_stream_work_still_counts():
    side = torch.cuda.Stream()

    def fn(a, b, out, **_):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.matmul(a, b, out=out)
        torch.cuda.current_stream().wait_stream(side)
    r = time_many([("direct", matmul, BIG), ("side", fn, BIG)], "offline", options=FAST)
    assert r["side"].device_ms == pytest.approx(r["direct"].device_ms, rel=0.2)


def test_the_same_kernel_twice_is_within_its_own_speedup_noise():
    """The noise the never-slower rule allows (gemmgen.measure.comparison) covers a kernel
    timed against itself, interleaved in one session."""
    from gemmgen.measure.comparison import speedup_noise
    r = time_many([("one", matmul, BIG), ("two", matmul, BIG)], "offline", options=FAST)
    noise = speedup_noise(r["one"].samples_ms, r["two"].samples_ms)
    assert noise is not None and noise < 0.05
    assert abs(r["two"].device_ms / r["one"].device_ms - 1) <= noise


def test_time_under_the_floor_raises():
    """A 2 us kernel pretending to be a 137 GFLOP GEMM. The checked timed calls see its output
    unwritten before the floor sees its time; either refusal keeps it from a recorded time
    (the floor rule alone is tested on CPU, test_measure_timing_cpu.py)."""
    def fn(a, b, out, **_):
        out.view(-1)[:1].zero_()
    with pytest.raises(MeasureError, match="below the physical floor|not written"):
        time(fn, BIG, "offline", options=FAST)


def test_no_gpu_work_raises():
    with pytest.raises(MeasureError, match="no GPU work|not written"):
        time(lambda a, b, out, **_: None, P, "offline", options=FAST)


def test_server_mode_records_gaps_in_host_time():
    t = time(matmul, P, "server", options=TimingOptions(min_reps=10, host_reps=10, mean_gap_s=2e-3))
    assert t.mode == "server" and t.reps == 10 and t.host_ms > t.device_ms


def test_library_launches_outside_torch_ops_are_counted():
    from gemmgen.measure.baselines import make
    r = time_many([("torch", matmul, BIG), ("lt", make("lt_heuristic", BIG).fn, BIG)], "offline", options=FAST)
    assert r["lt"].device_ms == pytest.approx(r["torch"].device_ms, rel=0.3), r


# ---- isolation ------------------------------------------------------------------------------

def test_hung_and_faulting_kernels_cost_one_trial_each():
    import planted
    from gemmgen.measure.worker import Job, Runner

    small = Problem(256, 256, 256)
    opts = TimingOptions(min_reps=10, max_reps=10, host_reps=5)
    with Runner(timeout_s=60) as runner:
        hung = runner.run(Job("spin", planted.spins_on_gpu, problem=small, timing=opts, timeout_s=25))
        fault = runner.run(Job("poke", planted.faults_on_gpu, problem=small, timing=opts))
        fine = runner.run(Job("torch", planted.torch_matmul, problem=small, timing=opts))
    assert hung.status == "timeout", hung
    assert fault.status in ("crash", "failed_check") and fault.status != "ok", fault
    assert fault.status == "crash", fault        # the context was poisoned: the worker retired
    assert fine.status == "ok", fine
    assert fine.check["passed"] and fine.timing["device_ms"] > 0
    assert runner.restarts >= 2


# ---- baselines ------------------------------------------------------------------------------

def test_baselines_check_and_time_sanely():
    from gemmgen.measure.baselines import expand, make

    for problem in (Problem(4096, 4096, 4096), Problem(128, 4096, 1024)):
        kernels = [make(n, problem, timing_options=FAST) for n in expand(["torch", "cublas", "lt_heuristic", "lt_autotune"])]
        for k in kernels:
            r = check(k.fn, k.problem)
            assert r.passed, (k.name, r.failures)
        times = time_many([(k.name, k.fn, k.problem) for k in kernels], "offline", options=FAST)
        for name, t in times.items():
            assert not isinstance(t, Exception), (name, t)
            assert problem.floor_s * 1e3 < t.device_ms < 50 * problem.floor_s * 1e3 + 0.02, (name, t)
        base = times["torch"].device_ms
        assert all(0.5 < base / t.device_ms < 2.0 for t in times.values()), times
        auto = next(k for k in kernels if k.name == "lt_autotune")
        assert auto.notes["n_algorithms"] >= 1 and auto.notes["chosen_index"] >= 0
        print(problem.key, {n: round(t.device_ms, 4) for n, t in times.items()}, "n_algorithms", auto.notes["n_algorithms"])


def test_bench_end_to_end(tmp_path):
    import json

    from gemmgen.cli import main

    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,layout\n256,512,1024,nn\n1024,1024,1024,nt\n")
    out = tmp_path / "run"
    assert main(["bench", "--shapes", str(shapes), "--out", str(out), "--baselines", "torch,cublas,lt_heuristic",
                 "--reps", "10", "--max-reps", "20", "--no-progress"]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["summary"]["n_shapes"] == 2 and doc["meta"]["environment"]["gpu"] is not None
    assert {r["name"] for r in doc["rows"]} == {"torch", "cublas_nn", "cublas_tn", "cublas", "lt_heuristic"}
    assert all(r["passed"] and r["device_ms"] > 0 for r in doc["rows"]), [r["message"] for r in doc["rows"]]
    assert (out / "speedup.png").exists() and (out / "buckets.png").exists()
