"""The environment record kept with every result: GPU, clocks, power, driver, versions.

NVML (nvidia-ml-py's `pynvml`) when importable, else `nvidia-smi --query-gpu`; library
versions from package metadata, so nothing heavy is imported. Works without a GPU
(the GPU fields are then absent), so records made anywhere have the same shape.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import shutil
import subprocess
from typing import Any, Optional

from gemmgen.measure.clocks import nvml_index

PACKAGES = ("torch", "triton", "nvmath-python", "nvidia-cutlass", "cuda-bindings", "nvidia-ml-py", "gemmgen")
SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.draw", "power.limit", "temperature.gpu", "pstate")


def package_versions() -> dict[str, Optional[str]]:
    versions: dict[str, Optional[str]] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _from_nvml(index: int) -> Optional[dict[str, Any]]:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(h)
        driver = pynvml.nvmlSystemGetDriverVersion()
        rec = {
            "name": name.decode() if isinstance(name, bytes) else name,
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "max_mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "pstate": f"P{pynvml.nvmlDeviceGetPerformanceState(h)}",
            "source": "nvml",
        }
        pynvml.nvmlShutdown()
        return rec
    except Exception as exc:  # noqa: BLE001 - a record with a reason beats no record
        return {"source": "nvml", "error": str(exc)}


def parse_smi_line(line: str) -> dict[str, Any]:
    """One csv line of `nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits`."""
    keys = ("name", "driver", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz", "max_mem_clock_mhz",
            "power_w", "power_limit_w", "temperature_c", "pstate")
    rec: dict[str, Any] = {"source": "nvidia-smi"}
    for key, raw in zip(keys, (v.strip() for v in line.split(","))):
        try:
            rec[key] = float(raw) if key not in ("name", "driver", "pstate") else raw
        except ValueError:
            rec[key] = raw   # "[N/A]" and the like, kept verbatim
    return rec


def _from_smi(index: int) -> Optional[dict[str, Any]]:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        text = subprocess.run(
            ["nvidia-smi", "-i", str(index), f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        return {"source": "nvidia-smi", "error": str(exc)}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return parse_smi_line(lines[0]) if lines else None


def gpu_record(index: int = 0) -> Optional[dict[str, Any]]:
    """Clocks and power now (call it next to the measurement) of CUDA device `index`; None
    without a GPU."""
    index = nvml_index(index)
    return _from_nvml(index) or _from_smi(index)


def torch_record() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    rec: dict[str, Any] = {"torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        rec.update({
            "device_name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "memory_bytes": props.total_memory,
        })
    return rec


def environment(index: int = 0) -> dict[str, Any]:
    """Everything a reader needs to trust or reproduce a time."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "versions": package_versions(),
        "torch": torch_record(),
        "gpu": gpu_record(index),
    }
