"""benchmarks/search_common.py: how one program's report entry becomes a row's status."""
from benchmark_scripts import load_script

outcome = load_script("search_common").entry_outcome


def test_a_timing_error_after_a_passed_check_is_not_a_failed_check():
    entry = {"check": {"passed": True, "failures": []}, "timing": {"error": "CUDA error: launch timed out"}}
    assert outcome(entry, object()) == ("timing_failed", "CUDA error: launch timed out")


def test_each_outcome_keeps_its_reason():
    assert outcome({}, RuntimeError("nvcc: error")) == ("build_failed", "nvcc: error")
    assert outcome({"check": {"passed": True}, "timing": {"device_ms": 0.02}}, object()) == ("ok", "")
    failed = {"check": {"passed": False, "failures": ["max rel err 0.3 > 0.004", "fp16 accumulation"]}}
    assert outcome(failed, object()) == ("failed_check", "max rel err 0.3 > 0.004; fp16 accumulation")
    assert outcome({}, object()) == ("not_run", "")
