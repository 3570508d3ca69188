"""benchmarks/gpu_main.py: a GPU benchmark that cannot run ends with one line, never a traceback."""
import pytest

from benchmark_scripts import load_script
from gemmgen.errors import NoGPUError


def _fails_with(exc):
    def main(argv=None):
        raise exc
    return main


def test_gemmgen_s_own_error_is_one_line(capsys):
    assert load_script("gpu_main").run_main(_fails_with(NoGPUError("timing"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: timing needs an NVIDIA Hopper GPU" in err


def test_without_a_gpu_any_failure_reads_as_the_missing_gpu(capsys, monkeypatch):
    script = load_script("gpu_main")
    monkeypatch.setattr(script, "gpu_present", lambda: False)
    assert script.run_main(_fails_with(AssertionError("Torch not compiled with CUDA enabled"))) == 2
    err = capsys.readouterr().err
    assert "none is visible here" in err and "Torch not compiled with CUDA enabled" in err


def test_with_a_gpu_other_failures_propagate_in_full(monkeypatch):
    script = load_script("gpu_main")
    monkeypatch.setattr(script, "gpu_present", lambda: True)
    with pytest.raises(ZeroDivisionError):
        script.run_main(_fails_with(ZeroDivisionError("a bug")))


def test_a_script_that_runs_returns_its_status():
    assert load_script("gpu_main").run_main(lambda argv=None: 0) == 0
