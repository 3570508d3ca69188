"""The isolated runner survives kernels that hang, abort, segfault or raise (CPU jobs, short limits)."""
import multiprocessing
import pickle

import pytest

import planted
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


def _alive(pid: int) -> bool:
    """Running (a zombie left for an init that does not reap counts as gone)."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def test_timeout_kills_the_workers_whole_process_group(tmp_path):
    """A hung job's grandchild (a process the kernel started) is gone after the timeout."""
    import os
    import signal
    import time

    pid_file = tmp_path / "grandchild.pid"
    with Runner(gpu=False, timeout_s=30) as runner:
        r = runner.run(Job("spawns", planted.spawns_and_hangs, (str(pid_file),), timeout_s=3))
    assert r.status == "timeout"
    pid = int(pid_file.read_text())
    try:
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"the hung job's grandchild {pid} outlived the timeout"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _cuda_visible() -> bool:
    import torch
    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda_visible(), reason="needs a machine without a GPU")
def test_a_gpu_worker_that_cannot_start_cuda_says_why_in_one_error(capfd):
    """Without a GPU (or a CUDA build of torch) a GPU worker reports what failed instead of
    dying with a traceback of its own; the run gets one MeasureError that says so."""
    with Runner(gpu=True, timeout_s=30) as runner:
        with pytest.raises(MeasureError, match="could not start CUDA .*needs an NVIDIA Hopper GPU"):
            runner.run(Job("k", planted.returns))
    assert "Traceback" not in capfd.readouterr().err


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


def test_a_fresh_job_takes_the_standby_that_has_run_nothing():
    with Runner(gpu=False, timeout_s=30, standby=True) as runner:
        runner.start_soon()
        runner.ready(standby=True)
        first = [runner.run(Job("count", planted.counts_jobs)).value for _ in range(2)]
        fresh = runner.run(Job("count", planted.counts_jobs), fresh=True).value
        after = runner.run(Job("count", planted.counts_jobs)).value
        again = runner.run(Job("count", planted.counts_jobs), fresh=True).value
        pids = {first[0][0], fresh[0], again[0]}
    assert [n for _, n in first] == [1, 2] and first[0][0] == first[1][0]
    assert fresh[1] == 1 and after == (fresh[0], 2)           # the standby became the worker
    assert again[1] == 1 and len(pids) == 3                   # and a new standby was started
    assert not any(_alive(pid) for pid in pids)               # close ends them all
    assert runner.restarts == 0


def test_a_runner_without_a_standby_starts_a_worker_for_a_fresh_job():
    with Runner(gpu=False, timeout_s=30) as runner:
        before = runner.run(Job("count", planted.counts_jobs)).value
        fresh = runner.run(Job("count", planted.counts_jobs), fresh=True).value
    assert fresh[1] == 1 and fresh[0] != before[0]


@pytest.fixture
def started(monkeypatch):
    """Every worker process the runner starts, in order (its `_Started` records itself here)."""
    from gemmgen.measure import worker

    made = []

    class Counted(worker._Started):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(worker, "_Started", Counted)
    return made


def test_a_worker_started_ahead_serves_a_first_fresh_job_and_none_is_left(started):
    with Runner(gpu=False, timeout_s=30, standby=True) as runner:
        runner.start_soon()
        fresh = runner.run(Job("count", planted.counts_jobs), fresh=True).value
        again = runner.run(Job("count", planted.counts_jobs), fresh=True).value
    assert fresh[1] == again[1] == 1 and fresh[0] != again[0]
    assert len(started) == 3          # the two started ahead served both; one standby after them
    assert not _alive(fresh[0]) and not _alive(again[0])
    assert not [p for p in multiprocessing.active_children() if p.name == "gemmgen-worker"]   # no spare left


def test_standbys_start_together_and_are_replaced_once_all_are_taken(started):
    with Runner(gpu=False, timeout_s=30, standby=3) as runner:
        runner.start_soon()
        runner.ready(standby=True)
        assert len(started) == 4 and all(s.said_ready for s in started)    # the worker and 3 standbys
        fresh = [runner.run(Job("count", planted.counts_jobs), fresh=True).value for _ in range(3)]
        assert len(started) == 7                   # the third took the last standby: 3 more started
        runner.ready(standby=True)
        pids = {pid for pid, _ in fresh}
    assert [n for _, n in fresh] == [1, 1, 1] and len(pids) == 3        # each on a worker that ran nothing
    assert pids == {s.proc.pid for s in started[1:4]}                     # the standbys started first
    assert not [p for p in multiprocessing.active_children() if p.name == "gemmgen-worker"]


class _Timing:
    def __init__(self, ms):
        self.ms = ms
        self.samples_ms = (ms,) * 12

    def to_dict(self):
        return {"device_ms": self.ms}


def _planted_kernel():
    return lambda *args, **kwargs: None


def test_reference_is_timed_in_the_same_session_as_the_kernel(monkeypatch):
    """Job.reference: the worker times the kernel and the baseline together, interleaved."""
    from gemmgen.dsl.ir import Problem
    from gemmgen.measure import worker
    from gemmgen.measure.comparison import REPLICATE_NOISE
    from gemmgen.measure.errors import FloorViolation

    sessions = []

    def fake_time_many(kernels, mode, options=None):
        sessions.append(([name for name, _, _ in kernels], mode))
        return answers.pop(0)

    monkeypatch.setattr(worker, "time_many", fake_time_many)
    job = Job("k", _planted_kernel, problem=Problem(256, 256, 256), check=False, mode="server", reference="torch")
    answers = [{"kernel": _Timing(1.0), "reference": _Timing(1.5)},
               {"kernel": _Timing(1.0), "reference": MeasureError("torch: no kernel was recorded")},
               {"kernel": FloorViolation("faster than the floor"), "reference": _Timing(1.5)}]
    r = worker._execute(job)
    assert sessions == [(["kernel", "reference"], "server")]
    assert r.ok and r.reference_timing == {"device_ms": 1.5}
    assert r.timing == {"device_ms": 1.0, "speedup_noise": REPLICATE_NOISE}   # 12 steady paired rounds
    r = worker._execute(job)                       # a reference that fails costs the reference only
    assert r.ok and r.reference_timing == {"error": "torch: no kernel was recorded"}
    r = worker._execute(job)                       # the kernel's own failure is the trial's
    assert r.status == "error" and "FloorViolation" in r.message
    plain = worker._execute(Job("k", _planted_kernel, problem=Problem(256, 256, 256), check=False, mode=None,
                                reference="torch"))
    assert plain.ok and plain.timing is None and plain.reference_timing is None and len(sessions) == 3


def test_a_worker_whose_parent_left_while_it_started_exits_quietly():
    """A standby ended before it said ready finds its pipe closed: it exits with status 0, no
    BrokenPipeError traceback in the tuning log."""
    from gemmgen.measure.worker import _serve

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(theirs, False))
    proc.start()
    theirs.close()
    ours.close()            # before the child, still starting its interpreter, says ready
    proc.join(60)
    assert proc.exitcode == 0


class _GonePipe:
    """A worker's end of the pipe after its parent was killed: `fail_on` raises on that call."""

    def __init__(self, jobs, fail_on, error):
        self.jobs, self.fail_on, self.error, self.sent = list(jobs), fail_on, error, []

    def recv(self):
        if self.fail_on == "recv" and not self.jobs:
            raise self.error
        return self.jobs.pop(0)

    def send(self, message):
        if self.fail_on == "send":
            raise self.error
        self.sent.append(message)


@pytest.mark.parametrize("fail_on, error", [("recv", ConnectionResetError(104, "reset by peer")),
                                            ("recv", EOFError()), ("send", BrokenPipeError(32, "broken pipe"))])
def test_a_worker_whose_parent_is_gone_leaves_quietly(fail_on, error, capsys):
    from gemmgen.measure.worker import _serve_jobs

    pipe = _GonePipe([Job(planted.returns.__name__, planted.returns)], fail_on, error)
    _serve_jobs(pipe)                  # returns: no traceback, no exception
    assert capsys.readouterr().err == ""
    assert [r.status for r, _ in pipe.sent] == (["ok"] if fail_on == "recv" else [])


@pytest.mark.parametrize("reserved, emptied", [(3 << 30, True), (1 << 30, False)])
def test_a_worker_hands_back_a_large_jobs_cached_memory(monkeypatch, reserved, emptied):
    from types import SimpleNamespace

    from gemmgen.measure import worker

    calls = []
    cuda = SimpleNamespace(is_initialized=lambda: True, memory_reserved=lambda: reserved,
                           empty_cache=lambda: calls.append("empty_cache"))
    monkeypatch.setitem(worker.sys.modules, "torch", SimpleNamespace(cuda=cuda))
    worker.hand_back_cached_memory()
    assert calls == (["empty_cache"] if emptied else [])
