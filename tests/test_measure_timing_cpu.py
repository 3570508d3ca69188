"""The CUPTI attribution and the timing bookkeeping, with stand-in profiler events (no GPU)."""
import math

import pytest
from torch.autograd import DeviceType

from gemmgen.dsl.ir import Problem
from gemmgen.measure.errors import FloorViolation, MeasureError
from gemmgen.measure import timing
from gemmgen.measure.timing import TimingOptions, _Entry, _summarise, attribute_activities


class Ev:
    """Just the accessors attribute_activities reads from a raw kineto event."""

    def __init__(self, name, device, start, end, corr=0, linked=0, kind=None, annotation=False):
        self._v = dict(name=name, device=device, start=start, end=end, corr=corr, linked=linked)
        self._kind, self._ann = kind, annotation

    def name(self): return self._v["name"]
    def device_type(self): return self._v["device"]
    def start_ns(self): return self._v["start"]
    def end_ns(self): return self._v["end"]
    def duration_ns(self): return self._v["end"] - self._v["start"]
    def correlation_id(self): return self._v["corr"]
    def linked_correlation_id(self): return self._v["linked"]
    def is_user_annotation(self): return self._ann
    def activity_type(self): return self._kind or ("kernel" if self._v["device"] != DeviceType.CPU else "cpu_op")


CPU, GPU = DeviceType.CPU, DeviceType.CUDA


def trace():
    """Three calls, each after a flush: call 0 (aten::mm -> gemm kernel, and kineto's GPU-side
    annotation span), call 1 (a library launch with no torch op: linked id 0, plus a memset
    from inside the range), call 0 again (launched nothing)."""
    return [
        Ev("aten::empty", CPU, 0, 1, corr=20),
        Ev("stray_fill_kernel", GPU, 5, 8, linked=20),                  # outside every range: ignored
        Ev("gemmgen.flush", CPU, 1, 10, corr=11),
        Ev("aten::zero_", CPU, 1, 10, corr=1),
        Ev("aten::fill_", CPU, 1, 9, corr=2),
        Ev("cudaLaunchKernel", CPU, 2, 4, corr=900, linked=2),
        Ev("fill_kernel", GPU, 20, 60, linked=2),                       # flush: a marker
        Ev("gemmgen.call.0", CPU, 100, 200, corr=3),
        Ev("aten::mm", CPU, 110, 190, corr=4),
        Ev("gemm_kernel", GPU, 300, 340, linked=4),
        Ev("gemmgen.call.0", GPU, 300, 340, linked=3, kind="gpu_user_annotation", annotation=True),
        Ev("gemmgen.flush", CPU, 210, 221, corr=12),
        Ev("aten::zero_", CPU, 210, 220, corr=5),
        Ev("fill_kernel", GPU, 350, 390, linked=5),
        Ev("gemmgen.call.1", CPU, 230, 260, corr=6),
        Ev("cuLaunchKernelEx", CPU, 235, 240, corr=5, kind="cuda_driver"),  # CUPTI's numbering: ignored
        Ev("cudaLaunchKernelExC", CPU, 241, 245, corr=2),
        Ev("cublasLt_kernel", GPU, 400, 470, linked=0),                 # placed by GPU time
        Ev("Memset (Device)", GPU, 470, 475, linked=6, kind="gpu_memset"),
        Ev("Stream Sync", GPU, 480, 490, linked=6, kind="cuda_sync"),
        Ev("gemmgen.flush", CPU, 265, 269, corr=13),
        Ev("aten::zero_", CPU, 265, 268, corr=7),
        Ev("fill_kernel", GPU, 500, 540, linked=7),
        Ev("gemmgen.call.0", CPU, 270, 280, corr=8),
    ]


def test_each_call_gets_exactly_its_own_gpu_work():
    calls = attribute_activities(trace())
    assert calls[0] == [[("gemm_kernel", 40)], []]
    assert calls[1] == [[("cublasLt_kernel", 70), ("Memset (Device)", 5)]]


def test_unplaceable_library_launches_are_an_error():
    events = [e for e in trace() if e.name() != "fill_kernel" or e.start_ns() != 500]
    with pytest.raises(MeasureError, match="cannot place"):
        attribute_activities(events)


def _entry(device_us, problem=Problem(4096, 4096, 4096)):
    e = _Entry("k", None, problem, (), {})
    e.device_us = device_us
    e.host_s = [1e-4] * 5
    return e


def test_summary_median_and_spread():
    t = _summarise(_entry([1000.0 + i for i in range(11)]), "offline", TimingOptions())
    assert t.device_ms == pytest.approx(1.005) and t.reps == 11
    assert t.device_p10_ms == pytest.approx(1.001) and t.device_p90_ms == pytest.approx(1.009)
    assert t.spread == pytest.approx(0.008 / 1.005) and t.host_ms == pytest.approx(0.1)
    assert t.fraction_of_floor == pytest.approx(Problem(4096, 4096, 4096).floor_s * 1e3 / 1.005)


def test_samples_keep_round_order_for_pairing_and_stay_out_of_the_dict():
    t = _summarise(_entry([1003.0, 1001.0, 1002.0] * 4), "offline", TimingOptions())
    assert t.samples_ms[:3] == pytest.approx((1.003, 1.001, 1.002)) and len(t.samples_ms) == 12
    assert "samples_ms" not in t.to_dict() and "samples_ms" not in repr(t)


def test_time_under_the_floor_is_refused():
    floor_us = Problem(4096, 4096, 4096).floor_s * 1e6
    with pytest.raises(FloorViolation, match="below the physical floor"):
        _summarise(_entry([floor_us * 0.5] * 9), "offline", TimingOptions())
    ok = _summarise(_entry([floor_us * 0.5] * 9), "offline", TimingOptions(check_floor=False))
    assert math.isclose(ok.device_ms, floor_us * 0.5e-3)


def test_no_recorded_gpu_work_is_an_error_not_a_zero():
    with pytest.raises(MeasureError, match="no GPU work"):
        _summarise(_entry([0.0, 0.0]), "offline", TimingOptions())
    with pytest.raises(MeasureError, match="no GPU work"):
        _summarise(_entry([]), "offline", TimingOptions())


def test_a_lost_profiler_record_costs_a_second_run_not_the_batch(monkeypatch):
    """attribute_activities fails when the profiler lost one flush marker; the batch is profiled
    again, and only after PROFILE_ATTEMPTS failures does every kernel of it carry the error."""
    import contextlib
    import types

    import torch.profiler

    class Profile(contextlib.AbstractContextManager):
        profiler = types.SimpleNamespace(kineto_results=types.SimpleNamespace(events=lambda: []))

        def __exit__(self, *exc):
            return None

    runs, outcomes = [], []
    monkeypatch.setattr(torch.profiler, "profile", lambda **kw: Profile())
    monkeypatch.setattr(timing, "_schedule", lambda *a: runs.append(1))

    def attribute(events):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(timing, "attribute_activities", attribute)
    lost = MeasureError("cannot place 7801 GPU activities launched outside torch ops: 4199 flush markers for 4200 calls")

    entry = _entry([])
    outcomes[:] = [lost, {0: [[("gemm", 40_000)], [("gemm", 42_000)]]}]
    timing._profile_device([entry], "offline", TimingOptions(), None, lambda: None)
    assert len(runs) == 2 and entry.error is None and entry.device_us == [40.0, 42.0]

    runs.clear()
    entry = _entry([])
    outcomes[:] = [lost] * timing.PROFILE_ATTEMPTS
    timing._profile_device([entry], "offline", TimingOptions(), None, lambda: None)
    assert len(runs) == timing.PROFILE_ATTEMPTS and entry.error is lost and entry.device_us == []


def test_the_flush_reads_its_buffer_unless_asked_to_write():
    """A reading flush leaves the L2 clean; a writing one leaves dirty lines that a memory-bound
    kernel would write back inside its own time (docs/measure.md). A typo is refused."""
    import torch

    reading = timing.flusher(TimingOptions(flush_bytes=4096), "cpu")
    assert int(reading()) == 0                          # a sum over the (zeroed) buffer: a read
    writing = timing.flusher(TimingOptions(flush_bytes=4096, flush="write"), "cpu")
    assert isinstance(writing(), torch.Tensor)
    with pytest.raises(ValueError, match="flush='dirty'"):
        timing.flusher(TimingOptions(flush_bytes=4096, flush="dirty"), "cpu")
