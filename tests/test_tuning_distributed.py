"""Distributed tuning on the CPU: ranks as processes sharing torch.distributed's TCPStore, with the
stub runner and builder of the tune loop's tests; work shared out, a killed rank survived,
records gathered, and a second run finishing what was left."""
import os
import time

import pytest

from gemmgen.dsl.ir import Problem
from gemmgen.tune.distributed import DistributedError, Rank, connect, cost_order, pin_gpu, run_rank, tune_one_with
from gemmgen.tuning_db import Database
from ranks import launch
from tuning_fakes import FakeBuilder, FakeRunner, ListProposer

pytest.importorskip("torch.distributed")

PROBLEMS = [Problem(m, n, k) for m, n, k in
            [(64, 64, 64), (4096, 4096, 4096), (256, 512, 1024), (1024, 1024, 128), (128, 8192, 512),
             (2048, 256, 2048), (512, 512, 512), (8192, 1024, 1024), (96, 96, 4096), (1536, 768, 256)]]
VARIANTS = [((64, 64, 64), 3), ((128, 64, 64), 4)]


def _rank_main(env, die_on, results, db_path):
    me = Rank.from_env(env)
    store = connect(me, env, timeout_s=60)
    inner = tune_one_with(proposer=ListProposer(VARIANTS), builder=FakeBuilder(), runner=FakeRunner(),
                          budget=2, time_budget_s=None)
    count = [0]

    def tune_one(problem, db):
        count[0] += 1
        if count[0] == die_on:
            os._exit(3)                       # killed while measuring this problem
        time.sleep(0.2)                       # a trial takes time: the other ranks take the next ones
        return inner(problem, db)

    results.put(run_rank(PROBLEMS, me, store, db_path=db_path, tune_one=tune_one, gather_timeout_s=20))


def _launch(world, db_path, die=None):
    """Run `world` ranks; `die`: {rank: nth problem}, exits mid-problem. Rank 0's summary and
    every rank's list of problems."""
    return launch(_rank_main, world, str(db_path), die=die)


def _trial_counts(db_path):
    with Database(db_path) as db:
        counts = {}
        for trial in db.trials():
            counts[trial.problem.key] = counts.get(trial.problem.key, 0) + 1
        return counts


def _tuned(db_path):
    with Database(db_path) as db:
        return {t.problem.key for t in db.trials()}


@pytest.mark.parametrize("world", [2, 4])
def test_the_problems_are_shared_out_and_gathered(tmp_path, world):
    db_path = tmp_path / "tuning.sqlite"
    out = _launch(world, db_path)
    taken = [key for o in out.values() for key in o["problems"]]
    assert sorted(taken) == sorted(p.key for p in PROBLEMS)                  # each problem once
    assert all(out[r]["problems"] for r in range(world))                     # every rank worked
    assert out[0]["lost_ranks"] == [] and out[0]["merged"] > 0
    assert _tuned(db_path) == {p.key for p in PROBLEMS}
    # the most expensive problems are taken first, one by each rank
    firsts = {o["problems"][0] for o in out.values()}
    assert firsts == {p.key for p in cost_order(PROBLEMS)[:world]}


def test_a_killed_rank_loses_only_its_problem_and_a_second_run_finishes(tmp_path):
    db_path = tmp_path / "tuning.sqlite"
    out = _launch(3, db_path, die={1: 2})                # rank 1 dies on its second problem
    assert out[0]["lost_ranks"] == [1]
    finished = {key for o in out.values() for key in o["problems"]}
    gathered = _tuned(db_path)
    missing = {p.key for p in PROBLEMS} - gathered
    assert len(missing) == 1 and not missing & finished                     # only the one in flight
    before = _trial_counts(db_path)
    again = _launch(2, db_path)                                              # the same command again
    assert _tuned(db_path) == {p.key for p in PROBLEMS} and again[0]["lost_ranks"] == []
    after = _trial_counts(db_path)
    assert {key for key in after if after[key] != before.get(key, 0)} == missing   # nothing measured twice


def test_a_launch_without_torchrun_says_how_to_start_one():
    with pytest.raises(DistributedError, match="torchrun --nproc-per-node"):
        Rank.from_env({"RANK": "0"})


def test_each_rank_sees_its_own_gpu_only():
    env = {}
    pin_gpu(Rank(5, 8, 1, 4), env)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    pin_gpu(Rank(1, 2, 1, 2), env)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"                               # NVML's 3, not CUDA's 1
    with pytest.raises(DistributedError, match="has no GPU"):
        pin_gpu(Rank(2, 3, 2, 3), {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert Rank(0, 4, 0, 4).cores(16) == 4


def test_the_command_outside_torchrun_refuses_before_anything_is_created(tmp_path, capsys, monkeypatch):
    from gemmgen.cli import main

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n64,64,64\n")
    assert main(["tune", "--shapes", str(shapes), "--distributed", "--db", str(tmp_path / "t.sqlite")]) == 2
    assert "torchrun --nproc-per-node" in capsys.readouterr().err
    assert not (tmp_path / "t.sqlite").exists()
