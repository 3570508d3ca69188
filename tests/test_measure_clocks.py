"""The clock sampler on CPU, with a stand-in for NVML: what it records, and that timing goes on without it."""
import sys
import types

from gemmgen.measure.clocks import ClockSampler, reason_names


def fake_nvml(clocks, reasons, fail_at=None):
    """A pynvml module whose SM clock and reason mask follow the given sequences."""
    calls = {"n": 0, "shutdown": 0}
    mod = types.SimpleNamespace(NVML_CLOCK_SM=1)
    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    mod.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980

    def clock(h, kind):
        i = calls["n"]
        calls["n"] += 1
        if fail_at is not None and i >= fail_at:
            raise RuntimeError("GPU is lost")
        return clocks[i]

    mod.nvmlDeviceGetClockInfo = clock
    mod.nvmlDeviceGetCurrentClocksEventReasons = lambda h: reasons[calls["n"] - 1]
    return mod, calls


def test_summary_of_a_throttled_session(monkeypatch):
    mod, calls = fake_nvml([1980, 1755, 1700, 1980], [0x0, 0x4, 0x4 | 0x1, 0x0])
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    sampler = ClockSampler(0)
    for _ in range(4):
        sampler.sample()
    sampler.close()
    s = sampler.summary()
    assert (s["samples"], s["sm_mhz_min"], s["sm_mhz_max"], s["max_sm_mhz"]) == (4, 1700, 1980, 1980)
    assert s["sm_mhz_median"] == (1755 + 1980) / 2
    assert s["below_max_fraction"] == 0.5
    assert s["reasons"] == ["sw_power_cap"]          # idle between samples is not a reason
    assert calls["shutdown"] == 1


def test_without_nvml_or_when_it_fails_timing_gets_a_reason_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)      # import pynvml -> ImportError
    sampler = ClockSampler(0)
    sampler.sample()
    assert sampler.summary() == {"error": "pynvml not installed"}
    mod, _ = fake_nvml([1980], [0], fail_at=1)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    sampler = ClockSampler(0)
    sampler.sample(), sampler.sample(), sampler.sample()  # the second read fails; sampling stops
    s = sampler.summary()
    assert s["samples"] == 1 and s["sm_mhz_min"] == 1980 and "GPU is lost" in s["error"]


def test_reason_names():
    assert reason_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert reason_names(0x10000) == ["0x10000"]


def test_nvml_index_follows_cuda_visible_devices(monkeypatch):
    """Two tuning processes, one per GPU, each see their GPU as CUDA device 0; NVML does not."""
    from gemmgen.measure.clocks import nvml_index
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_index(0) == 0 and nvml_index(1) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert nvml_index(0) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 2")
    assert (nvml_index(0), nvml_index(1)) == (3, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8d1a0a4e")      # a UUID: left as CUDA numbers it
    assert nvml_index(0) == 0
