"""The tuning loop end to end on CPU, with a fake builder and runner injected; the proposers."""
from dataclasses import replace

import pytest

from gemmgen.backends import validate
from gemmgen.dsl.ir import Problem
from gemmgen.policy.proposers import (HeuristicProposer, ProposerError, RandomProposer, estimated_seconds,
                                      get_proposer, present_backends, register_proposer)
from gemmgen.tune import tune
from gemmgen.tuning_db import Database
from tuning_fakes import TEST_GPU, FakeBuilder, FakeRunner, ListProposer

PROBLEMS = [Problem(1024, 1024, 1024), Problem(2048, 512, 4096), Problem(4096, 4096, 512)]
VARIANTS = [((128, 128, 64), 4),    # ok: 0.25 ms
            ((128, 256, 64), 3),    # ok and fastest: 0.167 ms
            ((64, 64, 64), 4),      # ok: 0.5 ms
            ((128, 128, 32), 4),    # build fails (planted)
            ((64, 128, 64), 2),     # the worker crashes (planted)
            ((128, 64, 64), 5),     # fails its check (planted)
            ((512, 512, 64), 4)]    # invalid: Triton tiles stop at 256, registers overflow


def _run(db, runner=None, builder=None, **kwargs):
    runner = runner or FakeRunner()
    report = tune(PROBLEMS, proposer=ListProposer(VARIANTS), builder=builder or FakeBuilder(), runner=runner,
                  db=db, budget=len(VARIANTS), progress=False, **kwargs)
    return report, runner


@pytest.mark.parametrize("chunk", [1, 2, 8])
def test_loop_records_every_trial_with_its_outcome(tmp_path, chunk):
    db = Database(tmp_path / "t.sqlite")
    builder = FakeBuilder()
    report, runner = _run(db, builder=builder, build_chunk=chunk)
    assert builder.calls == -(-len(PROBLEMS) // chunk)       # one pool start per chunk of shapes
    assert report.shapes_done == 3 and report.recorded == 21
    assert dict(report.statuses) == {"ok": 9, "build_failed": 3, "run_failed": 3, "check_failed": 3, "invalid": 3}
    assert runner.baseline_calls == 3                       # baselines measured once per shape, same run
    for problem in PROBLEMS:
        trials = list(db.trials(problem.key))
        assert len(trials) == 7
        by_status = {t.status: t for t in trials}
        assert "planted failure" in by_status["build_failed"].build_msg
        assert "illegal memory access" in by_status["run_failed"].check_msg
        assert by_status["check_failed"].max_rel_err == 0.3
        assert "tile" in by_status["invalid"].build_msg  # the validator's message is kept
        ok = [t for t in trials if t.status == "ok"]
        assert all(set(t.baselines) == {"torch", "cublaslt_auto"} for t in ok)
        assert all(t.proposer == "list" and t.check_seed is not None for t in ok)
        winner = db.winner(problem, TEST_GPU.name)
        assert "tile 128x256x64" in winner.program


def test_resume_skips_what_was_measured(tmp_path):
    db = Database(tmp_path / "t.sqlite")
    with pytest.raises(KeyboardInterrupt):
        _run(db, FakeRunner(stop_after=7))                   # Ctrl-C during the second shape
    recorded = len(list(db.trials()))
    assert recorded == 7 + 3            # shape 1 whole; shape 2: the invalid one and 2 measured
    report, runner = _run(db)
    assert report.recorded == 21 - recorded
    assert report.skipped == recorded
    assert len(list(db.trials())) == 21
    again, runner = _run(db)
    assert again.recorded == 0 and again.skipped == 21 and runner.measured == [] and runner.baseline_calls == 0


def test_on_shape_runs_once_per_shape_after_its_trials_are_recorded(tmp_path):
    db = Database(tmp_path / "t.sqlite")
    seen = []
    _run(db, build_chunk=2, on_shape=lambda p: seen.append((p, len(list(db.trials(p.key))))))
    assert seen == [(p, 7) for p in PROBLEMS]
    seen.clear()
    _run(db, on_shape=lambda p: seen.append((p, len(list(db.trials(p.key))))))
    assert seen == [(p, 7) for p in PROBLEMS]          # a shape with nothing left to measure still reports


def test_time_budget_stops_between_trials(tmp_path):
    db = Database(tmp_path / "t.sqlite")
    report, _ = _run(db, time_budget_s=0.0)
    assert report.stopped_by_time and report.recorded == 0


def test_random_proposer_is_valid_seeded_and_diverse():
    proposer = RandomProposer(backends=("triton",))
    problem = Problem(1024, 2048, 4096)
    programs = proposer.propose(problem, 6, seed=3)
    assert len(programs) == 6 and len(set(programs)) == 6
    for p in programs:
        validate(p)
        assert p.problem == problem and p.backend == "triton"
    assert proposer.propose(problem, 6, seed=3) == programs
    assert proposer.propose(problem, 6, seed=4) != programs


def test_heuristic_proposer_ranks_the_backend_spaces():
    problem = Problem(4096, 4096, 4096)
    present = [m.NAME for m in present_backends()]
    if not present:
        pytest.skip("no backend module with a space() yet")
    try:
        ranked = HeuristicProposer().ranked(problem)
    except ModuleNotFoundError as exc:
        pytest.skip(f"a backend's space is not written yet ({exc.name})")
    assert ranked and len(set(ranked)) == len(ranked)
    for p in ranked:
        validate(p)
    assert HeuristicProposer().propose(problem, 3) == ranked[:3]
    assert {p.backend for p in ranked[:len(present)]} == {p.backend for p in ranked}  # backends interleave


def test_estimate_prefers_full_waves_and_big_tiles():
    from tuning_fakes import triton_program

    problem = Problem(4096, 4096, 4096)
    big, small = triton_program(problem, (128, 256, 64), 3), triton_program(problem, (32, 32, 64), 3)
    assert estimated_seconds(big) < estimated_seconds(small)
    assert estimated_seconds(big) >= problem.flops / 989e12


def test_small_problems_rank_one_launch_pointer_kernels_first():
    # measured on the H200 (shipped database): under 2 GFLOP the best `scheduler tile` program
    # beat the best persistent one on all 25 problems timed with both, and split-K's second
    # launch lost at 64x64x256; the first sweep never tried a tile-scheduler program there
    problem = Problem(64, 64, 256)
    first = HeuristicProposer(("triton",)).propose(problem, 4)
    assert [(p.scheduler, p.split_k) for p in first] == [("tile", 1)] * 4
    from tuning_fakes import triton_program

    one_tile = triton_program(problem, (64, 64, 64), 3)
    assert estimated_seconds(replace(one_tile, scheduler="persistent")) > estimated_seconds(one_tile)
    assert estimated_seconds(replace(one_tile, split_k=2)) > estimated_seconds(one_tile)


def test_proposer_registry():
    assert get_proposer("random", backends=("triton",)).name == "random"
    with pytest.raises(ProposerError, match="heuristic"):
        get_proposer("nonsense")
    register_proposer("test-list", lambda **kw: ListProposer([]))
    assert get_proposer("test-list").name == "list"


def test_worker_results_map_to_trial_outcomes():
    from gemmgen.measure.worker import TrialResult
    from gemmgen.tune.adapters import measurement_from

    check = {"passed": True, "max_rel_err": 1e-3, "bound": 4e-3, "seed": 99, "failures": []}
    ok = measurement_from(TrialResult("k", "ok", check=check,
                                      timing={"device_ms": 0.5, "spread": 0.02, "host_ms": 0.51}))
    assert (ok.check_passed, ok.device_ms, ok.spread, ok.seed, ok.failure) == (True, 0.5, 0.02, 99, "")
    assert ok.reference is None                     # no torch.matmul timed alongside
    paired = measurement_from(TrialResult("k", "ok", check=check,
                                          timing={"device_ms": 0.5, "spread": 0.02, "speedup_noise": 0.019},
                                          reference_timing={"device_ms": 0.55, "spread": 0.01}))
    assert (paired.reference.device_ms, paired.reference.spread, paired.noise) == (0.55, 0.01, 0.019)
    assert measurement_from(TrialResult("k", "ok", check=check, timing={"device_ms": 0.5, "spread": 0.02},
                                        reference_timing={"error": "cuBLAS failed"})).reference is None
    bad = measurement_from(TrialResult("k", "failed_check", "main: rel err 0.2 > 0.004",
                                       check=dict(check, passed=False, max_rel_err=0.2)))
    assert bad.check_passed is False and bad.max_rel_err == 0.2 and "0.2" in bad.check_msg
    for status in ("timeout", "crash", "error"):
        m = measurement_from(TrialResult("k", status, "what happened"))
        assert m.failure.startswith(status) and m.device_ms is None
    floor = measurement_from(TrialResult("k", "error", "FloorViolation: below the physical floor", check=check))
    assert floor.failure and floor.check_passed  # checked right, timed impossibly fast: not a winner


def test_torch_timed_in_the_candidates_session_is_one_more_baseline(tmp_path):
    """A candidate that beats the tuning process's baselines but not torch.matmul timed beside it
    in its own worker session (the GPU ran slower there) is not a winner."""
    from dataclasses import dataclass, replace as dc_replace

    from gemmgen.tuning_db.records import SAME_SESSION_BASELINE
    from gemmgen.tuning_db import BaselineTime

    @dataclass
    class SlowSessionRunner(FakeRunner):
        def measure(self, program, artifact, *, seed=None):
            m = super().measure(program, artifact, seed=seed)
            if m.device_ms is None:
                return m
            return dc_replace(m, reference=BaselineTime(m.device_ms * 0.9, 0.01), noise=0.019)  # torch 10 % faster

    db = Database(tmp_path / "t.sqlite")
    tune(PROBLEMS[:1], proposer=ListProposer(VARIANTS[:2]), builder=FakeBuilder(), runner=SlowSessionRunner(),
         db=db, budget=2, progress=False)
    trials = [t for t in db.trials(PROBLEMS[0].key)]
    assert len(trials) == 2 and all(SAME_SESSION_BASELINE in t.baselines for t in trials)
    assert all(t.best_baseline[0] == SAME_SESSION_BASELINE for t in trials)
    assert all(t.noise == 0.019 for t in trials)     # the paired noise is recorded with the trial
    assert all(t.device_ms < 0.98 for t in trials)   # faster than the tuning process's baselines ...
    assert db.winner(PROBLEMS[0], TEST_GPU.name) is None   # ... not than torch.matmul beside it
