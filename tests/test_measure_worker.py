"""The isolated runner survives kernels that hang, abort, segfault or raise (CPU jobs, short limits)."""
import pickle

import pytest

from gemmgen.measure import planted
from gemmgen.measure.errors import MeasureError
from gemmgen.measure.worker import Job, Runner, TrialResult


def test_runner_survives_hang_crash_and_exception():
    with Runner(gpu=False, timeout_s=1.5) as runner:
        results = [runner.run(Job(load.__name__, load)) for load in
                   (planted.returns, planted.sleeps_forever, planted.aborts, planted.segfaults,
                    planted.raises, planted.returns)]
        statuses = [r.status for r in results]
        assert statuses == ["ok", "timeout", "crash", "crash", "error", "ok"]
        assert "SIGABRT" in results[2].message and results[2].exitcode == -6
        assert "SIGSEGV" in results[3].message
        assert "planted failure" in results[4].message
        assert results[1].wall_s >= 1.4
        assert runner.restarts == 3          # hang, abort, segfault each cost one worker


def test_job_timeout_overrides_the_runner_default():
    with Runner(gpu=False, timeout_s=60) as runner:
        r = runner.run(Job("hang", planted.sleeps_forever, timeout_s=0.5))
        assert r.status == "timeout" and "0.5 s" in r.message


def test_unpicklable_job_is_a_clear_error():
    with Runner(gpu=False, timeout_s=5) as runner:
        with pytest.raises(MeasureError, match="module-level function"):
            runner.run(Job("lambda", lambda: (lambda: None)))


def test_results_are_plain_picklable_data():
    r = TrialResult("x", "ok", check={"passed": True}, timing={"device_ms": 1.0})
    assert pickle.loads(pickle.dumps(r)) == r and r.ok


def test_plain_job_returns_its_value():
    with Runner(gpu=False, timeout_s=20) as runner:
        r = runner.run(Job("value", planted.returns_value, (21,)))
        assert r.ok and r.value == {"answer": 42}
        r = runner.run(Job("unpicklable", planted.returns_value, (None,)))
        assert r.ok and r.value is None and "cannot be sent back" in r.message
