"""The GPU's clock while a timing session runs, so two sessions can be compared fairly.

Kernels timed in one session are interleaved, so they share one clock state; two sessions
need not. On the H200, torch.matmul measured 10-16 % slower in one worker session than in
another minutes later, and a sustained load can lower the SM
clock (power or thermal). `ClockSampler` reads NVML once per round of the timed loop,
while the GPU is still working on it, and summarises: SM clock (min, median, max MHz), the
fraction of samples below the maximum clock, and the clock-event reasons seen (power cap,
thermal, ...). Without NVML (`pynvml` from nvidia-ml-py) it records nothing.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from gemmgen.measure.numerics import median

#: NVML clock-event reason bits worth naming (nvmlClocksEventReason*; the same values as the
#: older nvmlClocksThrottleReason* names).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def nvml_index(cuda_index: int) -> int:
    """NVML numbers every GPU of the host and ignores CUDA_VISIBLE_DEVICES, which CUDA honours:
    with CUDA_VISIBLE_DEVICES=1, CUDA's device 0 is NVML's device 1. Entries that are not
    numbers (UUIDs, MIG names) are left as CUDA numbers them."""
    entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if cuda_index < len(entries) and all(e.isdigit() for e in entries):
        return int(entries[cuda_index])
    return cuda_index


def reason_names(mask: int) -> list[str]:
    """The named bits of an NVML clock-event reason mask (unknown bits as hex)."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return names + ([hex(rest)] if rest else [])


class ClockSampler:
    """SM clock and clock-event reasons of one GPU, sampled on demand (cheap: no sync)."""

    def __init__(self, device_index: int = 0):
        self.samples: list[tuple[int, int]] = []     # (SM MHz, reason mask)
        self.max_mhz: Optional[int] = None
        self.error: Optional[str] = None
        self._nvml = self._handle = None
        try:
            import pynvml
        except ImportError:
            self.error = "pynvml not installed"
            return
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self.max_mhz = pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM)
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - timing goes on without clocks
            self.error = f"NVML: {exc}"

    def sample(self) -> None:
        if self._nvml is None:
            return
        nvml = self._nvml
        try:
            mhz = nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM)
            get_reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                           or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
            self.samples.append((int(mhz), int(get_reasons(self._handle))))
        except Exception as exc:  # noqa: BLE001
            self.error, self._nvml = f"NVML: {exc}", None

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nvml = None

    def summary(self) -> dict[str, Any]:
        """What the samples say; {} when nothing was sampled (the reason under 'error')."""
        if not self.samples:
            return {"error": self.error} if self.error else {}
        mhz = sorted(m for m, _ in self.samples)
        mask = 0
        for _, reasons in self.samples:
            mask |= reasons
        # gpu_idle is left out: the GPU may idle for a moment between two rounds of the loop.
        out: dict[str, Any] = {"samples": len(mhz), "sm_mhz_min": mhz[0], "sm_mhz_median": median(mhz),
                               "sm_mhz_max": mhz[-1], "reasons": reason_names(mask & ~0x1)}
        if self.max_mhz:
            out["max_sm_mhz"] = self.max_mhz
            out["below_max_fraction"] = round(sum(m < self.max_mhz for m in mhz) / len(mhz), 4)
        if self.error:
            out["error"] = self.error             # sampling stopped part way
        return out
