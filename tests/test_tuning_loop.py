"""The tuning loop end to end on CPU, with a fake builder and runner injected; the proposers."""
import re
from dataclasses import dataclass, field, replace
from dataclasses import replace as dc_replace

import pytest

from gemmgen.backends import validate
from gemmgen.dsl.ir import Problem
from gemmgen.backends.ranking import estimated_seconds
from gemmgen.policy.proposers import (HeuristicProposer, ProposerError, RandomProposer,
                                      get_proposer, present_backends, register_proposer)
from gemmgen.measure.comparison import speedup_lower_bound
from gemmgen.tune import SELECTION_BASELINE, Measurement, tune
from gemmgen.tuning_db import BaselineTime, Database
from gemmgen.tuning_db.records import SAME_SESSION_BASELINE
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


def test_the_report_says_where_the_time_went(tmp_path):
    import time

    class SlowBaselines(FakeRunner):
        def baselines(self, problem):
            time.sleep(0.1)
            return super().baselines(problem)

    report, _ = _run(Database(tmp_path / "t.sqlite"), runner=SlowBaselines())
    assert set(report.phase_s) == {"proposals", "waiting for builds", "baselines", "trials", "confirmations"}
    assert 0.3 <= report.phase_s["baselines"] <= report.wall_s
    assert sum(report.phase_s.values()) <= report.wall_s + 0.05
    assert re.search(r" s \(.*baselines 0\.[3-9]", report.summary())     # parts under 0.05 s are left out


def test_a_problem_whose_baselines_cannot_be_timed_is_a_failure_and_the_loop_goes_on(tmp_path):
    """Out of GPU memory at one problem (an LM head's baselines) is reported for that problem;
    its trials are not measured against fewer baselines, and the next problems are tuned."""
    from gemmgen.measure.errors import MeasureError

    class OutOfMemoryAtOne(FakeRunner):
        def baselines(self, problem):
            if problem == PROBLEMS[1]:
                raise MeasureError(f"{problem.key}: out of GPU memory while timing the baselines")
            return super().baselines(problem)

    db = Database(tmp_path / "t.sqlite")
    report, runner = _run(db, runner=OutOfMemoryAtOne())
    assert [key for key, _ in report.failures] == [PROBLEMS[1].key]
    assert "out of GPU memory" in report.summary()
    assert not [t for t in db.trials(PROBLEMS[1].key) if t.status == "ok"]
    assert all(runner_p.problem != PROBLEMS[1] for runner_p in runner.measured)
    assert [t for t in db.trials(PROBLEMS[2].key) if t.status == "ok"]
    assert report.shapes_done == 2


def test_a_runner_that_starts_workers_is_waited_for_before_the_baselines(tmp_path):
    import time

    class Starting(FakeRunner):
        waits = 0

        def ready(self):
            assert self.baseline_calls == self.waits          # before each shape's baselines
            self.waits += 1
            time.sleep(0.1 if self.waits == 1 else 0)        # the first start takes time

    report, runner = _run(Database(tmp_path / "t.sqlite"), runner=Starting())
    assert runner.waits == runner.baseline_calls == 3
    assert 0.1 <= report.phase_s["starting workers"] < report.wall_s
    assert "starting workers 0.1" in report.summary()


def test_the_workers_start_is_not_spent_from_the_time_budget(tmp_path):
    """A process starts its workers once and keeps them: a budget shorter than that start still
    measures trials."""
    import time

    class SlowStart(FakeRunner):
        started = False

        def ready(self):
            if not self.started:
                time.sleep(0.5)
                self.started = True

    report, runner = _run(Database(tmp_path / "t.sqlite"), runner=SlowStart(), time_budget_s=0.3)
    assert report.phase_s["starting workers"] >= 0.5 and runner.measured
    assert report.shapes_done == 3 and not report.stopped_by_time


def test_later_waits_for_workers_are_spent_from_the_time_budget(tmp_path):
    """Only a run's first wait for its workers is free: a standby started again after each
    confirmation is waited for inside the budget, so the run stops once those waits use it up."""
    import time

    class RestartingStandby(FakeRunner):
        def ready(self):
            time.sleep(0.2)

    report, _ = _run(Database(tmp_path / "t.sqlite"), runner=RestartingStandby(), time_budget_s=0.3)
    assert report.stopped_by_time and report.shapes_done < 3
    assert report.phase_s["starting workers"] >= 0.4


def test_resume_skips_what_was_measured(tmp_path):
    db = Database(tmp_path / "t.sqlite")
    with pytest.raises(KeyboardInterrupt):
        # Ctrl-C during the second shape: shape 1 takes 6 measurements (5 candidates, and the
        # fastest of its 3 would-be winners again; the others are not faster when selected than
        # that one confirmed), shape 2 then 3 before its crashing candidate
        _run(db, FakeRunner(stop_after=9))
    recorded = len(list(db.trials()))
    # shape 1 whole; shape 2: the invalid one and the failed build; its 3 would-be winners,
    # not yet confirmed, are lost and measured again
    assert recorded == 7 + 2
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


def test_a_gated_program_is_estimated_as_the_product_over_both_halves():
    """`tile` counts output columns; a gated tile multiplies 2 x tile N columns of B (gate and up),
    so the prior charges it the plain tile's work over B's 2N columns, never less than the peak."""
    from gemmgen.dsl.ir import Epilogue
    from tuning_fakes import triton_program

    gated = Problem(4096, 14336, 4096, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked"))
    joined = Problem(4096, 2 * 14336, 4096, b_major="col")
    tile = (128, 128, 64)
    assert estimated_seconds(triton_program(gated, tile, 3)) >= gated.flops / 989e12
    assert estimated_seconds(triton_program(gated, tile, 3)) == pytest.approx(
        estimated_seconds(triton_program(joined, (128, 256, 64), 3)), rel=0.01)


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


def test_a_grid_of_few_ctas_streams_at_what_its_sms_pull():
    """16 CTAs read a 2 x 4096 x 4096 weight through 16 SMs: at most 16 x the hardware's per-SM
    rate, however high DRAM's peak (the records measured such grids at 61-81 GB/s a CTA)."""
    from gemmgen.backends import ranking
    from gemmgen.dsl.hardware import SM90A
    from tuning_fakes import triton_program

    problem = Problem(16, 4096, 4096)
    few = triton_program(problem, (16, 256, 64), 3)       # 16 CTAs
    many = triton_program(problem, (16, 32, 64), 3)       # 128 CTAs
    assert estimated_seconds(few) >= problem.bytes / (16 * SM90A.sm_load_bytes_per_s)
    assert estimated_seconds(many) < estimated_seconds(few)
    assert estimated_seconds(few, sm_load_bytes_per_s=float("inf")) == pytest.approx(
        problem.bytes / SM90A.peak_bytes_per_s + ranking.LAUNCH_S, rel=0.05)


def test_split_k_is_charged_what_its_backend_s_sum_costs():
    from gemmgen.backends import ranking
    from tuning_fakes import triton_program

    problem = Problem(64, 64, 8192)
    one = triton_program(problem, (64, 64, 64), 3)
    for reduce in ("workspace", "unordered"):
        split = replace(one, split_k=4, split_k_reduce=reduce)
        # a backend and reduction without a measured cost pays one more launch
        assert estimated_seconds(split) - estimated_seconds(split, split_reduce_s={}) == pytest.approx(
            ranking.SPLIT_REDUCE_S[("triton", reduce)] - ranking.REDUCE_LAUNCH_S)
        partials = 4 * 64 * 64 * 4 * (2 if reduce == "workspace" else 1)
        assert estimated_seconds(split) - estimated_seconds(split, split_reduce_s={("triton", reduce): 0.0}) == \
            pytest.approx(ranking.SPLIT_REDUCE_S[("triton", reduce)])
        assert estimated_seconds(split) > ranking.SPLIT_REDUCE_S[("triton", reduce)] + partials / ranking.PEAK_BYTES_PER_S


def test_a_cluster_sum_moves_no_partials_through_dram():
    from gemmgen.backends import ranking
    from gemmgen.dsl import parse

    text = """gemm 1x1024x4096 a=row b=col c=row in=f16 acc=f32
epilogue out=f16
backend cuda
tile 16x8x64
warps 1x1
instr mma 16x8x16
stages 4
mainloop direct
split_k 8 unordered
swap_ab
"""
    arrival, cluster = parse(text), parse(text.replace("8 unordered", "8 cluster"))
    partial_bytes = 8 * 1024 * 1 * 4
    assert ranking.SPLIT_REDUCE_S[("cuda", "cluster")] == ranking.SPLIT_REDUCE_S[("cuda", "unordered")]
    assert estimated_seconds(arrival) - estimated_seconds(cluster) == pytest.approx(
        partial_bytes / ranking.PEAK_BYTES_PER_S)


def test_a_backend_s_families_near_its_best_take_turns():
    """At a few rows of a small weight the prior cannot tell raw CUDA's direct programs from its
    split multistage ones: both are proposed early."""
    problem = Problem(8, 1024, 4096, b_major="col")
    first = HeuristicProposer(("cuda",)).propose(problem, 4)
    assert [p.mainloop for p in first] == ["multistage", "direct"] * 2
    # a family estimated more than FAMILY_NEAR x the best comes after all the near ones
    far = HeuristicProposer(("cuda",), estimate=lambda p: 1.0 if p.mainloop == "multistage" else 2.0).ranked(problem)
    families = [p.mainloop for p in far]
    assert families == sorted(families, key=lambda f: f != "multistage") and "direct" in families


def test_the_heuristic_takes_another_estimate():
    problem = Problem(1024, 1024, 1024)
    shipped = HeuristicProposer(("triton",)).ranked(problem)
    by_size = HeuristicProposer(("triton",), estimate=lambda p: p.tile.m * p.tile.n).ranked(problem)
    assert set(by_size) == set(shipped)
    assert by_size[0].tile.m * by_size[0].tile.n == min(p.tile.m * p.tile.n for p in shipped)


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


# ---- winners that hold up: a would-be winner is measured again and judged by the loop --------

@dataclass
class ConfirmingRunner(FakeRunner):
    """Measures in the 'selection' session as FakeRunner does, with torch.matmul beside it at
    1.0 ms; `confirm` (a fresh worker) gives the times in `again` (kernel ms by tile, torch ms)."""

    again: dict = field(default_factory=dict)
    confirmed: list = field(default_factory=list)
    check_fails_again: bool = False

    def measure(self, program, artifact, *, seed=None):
        m = super().measure(program, artifact, seed=seed)
        if m.device_ms is None:
            return m
        return dc_replace(m, reference=BaselineTime(1.0, 0.01), noise=0.02)

    def confirm(self, program, artifact):
        self.confirmed.append(program)
        if self.check_fails_again:
            return Measurement(check_passed=False, check_msg="mantissa: 12 of 4096 elements off", seed=5)
        kernel_ms, torch_ms = self.again[program.tile.m, program.tile.n]
        return Measurement(check_passed=True, max_rel_err=1e-3, err_bound=4e-3, seed=6, device_ms=kernel_ms,
                           spread=0.01, host_ms=kernel_ms, reference=BaselineTime(torch_ms, 0.01), noise=0.02)


FAST_TWO = [((128, 128, 64), 4), ((128, 256, 64), 3)]    # 0.25 ms and 0.167 ms when selected


def _tune_one(db, runner, variants=FAST_TWO):
    tune(PROBLEMS[:1], proposer=ListProposer(variants), builder=FakeBuilder(), runner=runner, db=db,
         budget=len(variants), progress=False)
    return {t.program: t for t in db.trials(PROBLEMS[0].key)}


def test_a_would_be_winner_that_does_not_hold_up_in_a_fresh_worker_is_not_a_winner(tmp_path):
    """The winner's curse: 0.167 ms when selected, but 1.0 ms beside torch at 1.01 ms in a
    fresh worker; the lower bound of that speedup (1.01 / 1.0 / 1.02) is under 1."""
    db = Database(tmp_path / "t.sqlite")
    runner = ConfirmingRunner(again={(128, 128): (0.99, 1.0), (128, 256): (1.0, 1.01)})
    trials = _tune_one(db, runner)
    assert len(runner.confirmed) == 2                       # both would have won when selected
    assert db.winner(PROBLEMS[0], TEST_GPU.name) is None
    for t in trials.values():
        assert t.status == "ok" and t.device_ms in (0.99, 1.0)       # the confirmation is what is recorded
        assert t.baselines[SELECTION_BASELINE].device_ms == 1.0       # torch beside the selection, kept
        assert t.baselines[SAME_SESSION_BASELINE].device_ms in (1.0, 1.01)
        assert "not a winner" in t.check_msg and not t.beats_baseline()


def test_a_winner_confirmed_in_a_fresh_worker_wins_with_its_second_time(tmp_path):
    db = Database(tmp_path / "t.sqlite")
    runner = ConfirmingRunner(again={(128, 128): (0.5, 1.0), (128, 256): (0.97, 1.0)})
    trials = _tune_one(db, runner)
    winner = db.winner(PROBLEMS[0], TEST_GPU.name)
    assert winner is not None and "tile 128x128x64" in winner.program     # 2.0x, not the 0.167 ms one
    assert winner.device_ms == 0.5 and winner.noise == 0.02 and SELECTION_BASELINE in winner.baselines
    fell = next(t for t in trials.values() if "tile 128x256x64" in t.program)
    assert fell.device_ms == 0.97 and not fell.beats_baseline()        # 1.0 / 0.97 / 1.02 < 1


def test_a_would_be_winner_slower_than_a_confirmed_one_is_not_confirmed_and_cannot_serve(tmp_path):
    """Each confirmation waits for a fresh worker (seconds on a GPU); one that could not change
    what serves is skipped: the first candidate holds up at 3.92x, the next two read 3.92x and
    2.94x when selected, are recorded as selected, say why, and rank below it in the winners view."""
    db = Database(tmp_path / "t.sqlite")
    runner = ConfirmingRunner(again={(128, 256): (0.25, 1.0)})
    trials = _tune_one(db, runner, [((128, 256, 64), 3), ((128, 128, 64), 4), ((64, 128, 64), 4)])
    assert [(p.tile.m, p.tile.n) for p in runner.confirmed] == [(128, 256)]
    winner = db.winner(PROBLEMS[0], TEST_GPU.name)
    assert "tile 128x256x64" in winner.program and winner.speedup == pytest.approx(3.92)   # 0.98 / 0.25
    skipped = sorted((t for t in trials.values() if "tile 128x256x64" not in t.program), key=lambda t: -t.speedup)
    assert [round(t.speedup, 2) for t in skipped] == [3.92, 2.94]
    for t in skipped:
        assert t.beats_baseline() and SELECTION_BASELINE not in t.baselines
        assert "not confirmed" in t.check_msg and "3.920x of a winner confirmed" in t.check_msg


def test_a_time_budget_ending_within_a_shape_still_confirms_its_would_be_winners(tmp_path):
    """The budget stops new trials, not confirmations: the two measured would-be winners are
    recorded, the faster confirmed (the other reads no faster when selected), the third
    candidate not measured."""
    import time

    @dataclass
    class SlowRunner(ConfirmingRunner):
        def measure(self, program, artifact, *, seed=None):
            time.sleep(0.2)
            return super().measure(program, artifact, seed=seed)

    db = Database(tmp_path / "t.sqlite")
    runner = SlowRunner(again={(128, 256): (0.25, 1.0)})
    report = tune(PROBLEMS[:1], proposer=ListProposer(FAST_TWO + [((64, 64, 64), 4)]), builder=FakeBuilder(),
                  runner=runner, db=db, budget=3, time_budget_s=0.3, progress=False)
    assert report.stopped_by_time and report.shapes_done == 0
    trials = {t.program: t for t in db.trials(PROBLEMS[0].key)}
    assert len(trials) == 2 and not any("tile 64x64x64" in p for p in trials)
    assert [(p.tile.m, p.tile.n) for p in runner.confirmed] == [(128, 256)]
    assert "tile 128x256x64" in db.winner(PROBLEMS[0], TEST_GPU.name).program


def test_a_candidate_failing_its_confirmation_check_is_recorded_as_failed(tmp_path):
    db = Database(tmp_path / "t.sqlite")
    trials = _tune_one(db, ConfirmingRunner(check_fails_again=True))
    assert {t.status for t in trials.values()} == {"check_failed"}
    assert all("confirmation in a fresh worker" in t.check_msg for t in trials.values())
    assert db.winner(PROBLEMS[0], TEST_GPU.name) is None


def test_only_would_be_winners_are_measured_again(tmp_path):
    db = Database(tmp_path / "t.sqlite")

    @dataclass
    class SlowRunner(ConfirmingRunner):
        def measure(self, program, artifact, *, seed=None):
            m = super().measure(program, artifact, seed=seed)
            return m if m.device_ms is None else dc_replace(m, device_ms=2.0)   # slower than every baseline

    runner = SlowRunner()
    trials = _tune_one(db, runner)
    assert runner.confirmed == [] and len(trials) == 2 and all(t.device_ms == 2.0 for t in trials.values())


def test_runners_without_confirm_are_asked_to_measure_again(tmp_path):
    db = Database(tmp_path / "t.sqlite")
    runner = FakeRunner()
    _tune_one(db, runner)
    # two candidates, and the faster measured again (the other's selection speedup is not above
    # that one's confirmed speedup, so it is not)
    assert len(runner.measured) == 3 and runner.measured[-1].tile.n == 256
    assert db.winner(PROBLEMS[0], TEST_GPU.name) is not None


def test_speedup_lower_bound_is_the_winners_rule():
    assert speedup_lower_bound(0.5, 1.0, 0.02) == pytest.approx(2.0 / 1.02)
    assert speedup_lower_bound(1.0, 1.01, 0.02) < 1 < speedup_lower_bound(1.0, 1.03, 0.02)
    assert speedup_lower_bound(None, 1.0, 0.02) is None and speedup_lower_bound(1.0, 1.0, None) is None


def test_a_build_failure_the_builder_retries_is_not_recorded(tmp_path, monkeypatch):
    """A failed build counts as measured only once the builder gave up on it (BuildFailed.final):
    a first failure may be transient, so the next run builds and measures it again."""
    import gemmgen.tune.adapters as adapters
    from gemmgen.backends.build import BuildFailed

    proposer = ListProposer([((64, 64, 64), 3)])
    problem = Problem(256, 256, 256)
    for final in (False, True):
        monkeypatch.setattr(adapters, "build_many",
                            lambda sources, **kw: [BuildFailed("nvcc crashed", final=final) for _ in sources])
        (outcome,) = adapters.PoolBuilder(jobs=1).build_many(proposer.propose(problem, 1))
        assert outcome.retry is (not final) and "nvcc crashed" in outcome.error

        class Builder:
            def build_many(self, programs):
                return [outcome for _ in programs]

        db = Database(tmp_path / f"t{final}.sqlite")
        report = tune([problem], proposer=proposer, builder=Builder(), runner=FakeRunner(), db=db,
                      budget=1, progress=False)
        assert [t.status for t in db.trials()] == (["build_failed"] if final else [])
        assert any("retried in a later run" in why for _, why in report.failures) is (not final)
