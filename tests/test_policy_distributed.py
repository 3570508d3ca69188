"""The policy's evaluation and GRPO's reward over torchrun ranks, on the CPU: ranks as spawned
processes sharing torch.distributed's TCPStore, with the STUB builder and runner of the tuning
tests (times made up from the tile). The work is shared out, a killed rank is survived, the
records and rows are gathered on rank 0, and a second run measures nothing already measured.
One test runs a real GRPO chunk under torchrun on two gloo ranks."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmark_scripts import load_script
from gemmgen.dsl.ir import Problem
from gemmgen.policy import model as pm
from gemmgen.policy.prompt import answer_text
from gemmgen.policy.proposers import HeuristicProposer
from gemmgen.policy.training.reward import BaselinesOnce, measure_rewards, problem_to_json
from gemmgen.tune.distributed import Rank, connect
from gemmgen.tuning_db import Database
from ranks import free_port, launch
from tuning_fakes import FakeBuilder, FakeRunner

pytest.importorskip("torch.distributed")

PROBLEMS = [Problem(m, n, k) for m, n, k in
            [(64, 64, 64), (4096, 4096, 4096), (256, 512, 1024), (1024, 1024, 128), (128, 8192, 512),
             (2048, 256, 2048), (512, 512, 512), (8192, 1024, 1024)]]
BACKENDS = ("triton",)
GATHER_S = 5                    # how long rank 0 waits for a rank that died


class StubPolicy:
    """STUB policy: the heuristic's top k, last first (no model to load in every rank)."""

    version = "stub-1"
    last_stats: dict = {}

    def propose(self, problem, k, *, seed=None):
        return HeuristicProposer(BACKENDS).propose(problem, k)[::-1]


class SlowRunner(FakeRunner):
    """The stub runner, whose baselines take a moment (so every rank gets work) and whose
    `die_on`-th problem kills the process while it is measured."""

    def __init__(self, die_on=0):
        super().__init__()
        self.die_on, self.problems = die_on, 0

    def baselines(self, problem):
        self.problems += 1
        if self.problems == self.die_on:
            os._exit(3)
        time.sleep(0.2)
        return super().baselines(problem)


def _trial_counts(db_path):
    with Database(db_path) as db:
        counts = {}
        for trial in db.trials():
            counts[trial.problem.key] = counts.get(trial.problem.key, 0) + 1
        return counts


# --- the evaluation (benchmarks/policy_eval.py --distributed) ---

def _eval_main(env, die_on, results, db_path, out):
    ev = load_script("policy_eval")
    me = Rank.from_env(env)
    runner = SlowRunner(die_on)
    meta = {"policy_version": StubPolicy.version, "checkpoint": "stub", "backends": list(BACKENDS), "k": 2}
    done = ev.eval_rank(PROBLEMS, me, connect(me, env, timeout_s=60), db_path=Path(db_path), out=Path(out),
                        meta=meta, time_budget_s=600, gather_timeout_s=GATHER_S, policy=StubPolicy(),
                        backends=BACKENDS, k=2, seed=0, builder=FakeBuilder(), runner=BaselinesOnce(runner))
    results.put({**done, "measured": sorted({p.problem.key for p in runner.measured})})


def _evaluate(world, tmp_path, die=None):
    out = launch(_eval_main, world, str(tmp_path / "tuning.sqlite"), str(tmp_path / "eval"), die=die)
    return out, json.loads((tmp_path / "eval" / "policy_eval.json").read_text())


@pytest.mark.parametrize("world", [2, 4])
def test_the_evaluation_is_shared_out_and_one_report_gathered(tmp_path, world):
    out, report = _evaluate(world, tmp_path)
    taken = [i for o in out.values() for i in o["done"]]
    assert sorted(taken) == list(range(len(PROBLEMS)))                        # each problem once
    assert all(out[r]["done"] for r in range(world))                          # every rank worked
    assert out[0]["lost_ranks"] == [] and out[0]["merged"] > 0
    assert sorted(r["problem"] for r in report["rows"]) == sorted(p.key for p in PROBLEMS)
    summary = report["summary"]
    assert summary["problems"] == summary["problems_planned"] == len(PROBLEMS) and summary["ranks"] == world
    assert all(r["candidates"]["policy_b8"] for r in report["rows"])          # every problem evaluated
    assert any(r["db_best"] for r in report["rows"])                          # (the stubs fail some programs)
    for r in range(world):                                                    # each rank's rows are its own problems
        rows = json.loads((tmp_path / "eval" / f"rank{r}" / "policy_eval.json").read_text())["rows"]
        assert [row["problem"] for row in rows] == [PROBLEMS[i].key for i in out[r]["done"]]
    assert set(_trial_counts(tmp_path / "tuning.sqlite")) == {p.key for p in PROBLEMS}   # records gathered
    assert (tmp_path / "eval" / "policy_eval.png").is_file()


def test_a_killed_evaluation_rank_keeps_its_rows_and_a_second_run_finishes(tmp_path):
    out, report = _evaluate(3, tmp_path, die={1: 2})                          # rank 1 dies on its second problem
    assert out[0]["lost_ranks"] == [1] and report["summary"]["lost_ranks"] == [1]
    survivor = json.loads((tmp_path / "eval" / "rank1" / "policy_eval.json").read_text())["rows"]
    assert len(survivor) == 1                                                 # its finished problem ...
    reported = {r["problem"] for r in report["rows"]}
    assert survivor[0]["problem"] in reported                                 # ... is in the report
    missing = {p.key for p in PROBLEMS} - reported
    assert len(missing) == 1 and missing.isdisjoint(_trial_counts(tmp_path / "tuning.sqlite"))
    before = _trial_counts(tmp_path / "tuning.sqlite")
    again, report = _evaluate(2, tmp_path)                                    # the same command again
    assert {key for o in again.values() for key in o["measured"]} == missing  # only what was lost
    assert sorted(r["problem"] for r in report["rows"]) == sorted(p.key for p in PROBLEMS)
    after = _trial_counts(tmp_path / "tuning.sqlite")
    assert {key for key in after if after[key] != before.get(key, 0)} == missing   # nothing measured twice
    assert all(r["db_prior"] == r["db_best"] for r in report["rows"] if r["problem"] not in missing)


# --- GRPO's reward (gemmgen.policy.training.reward.measure_rewards) ---

def _answers(problem):
    return [answer_text(p) for p in HeuristicProposer(BACKENDS).propose(problem, 2)]


def _reward_main(env, die_on, results, db_path):
    """A rank's trainer, as trl runs it: two steps, each scoring this rank's own prompts."""
    me = Rank.from_env(env)
    runner = SlowRunner()

    def train(reward):
        rewards = []
        for step in range(2):
            if step + 1 == die_on:                    # killed in this step (rank 0, which serves
                time.sleep(1.0)                           # the store, once every rank is past the start)
                os._exit(3)
            problem = PROBLEMS[(2 * me.rank + step) % len(PROBLEMS)]
            answers = _answers(problem)
            rewards.append(reward(["p"] * len(answers), answers, problem=[problem_to_json(problem)] * len(answers)))
        return rewards

    rewards, reward, gathered = measure_rewards(train, db_path=Path(db_path), builder=FakeBuilder(), runner=runner,
                                                rank=me, store=connect(me, env, timeout_s=60),
                                                gather_timeout_s=GATHER_S)
    results.put({**gathered, "rewards": rewards, "measured": reward.measured,
                 "timed": sorted({p.problem.key for p in runner.measured})})


def _own_problems(rank, steps=2):
    return {PROBLEMS[(2 * rank + step) % len(PROBLEMS)].key for step in range(steps)}


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_measures_its_own_rollouts_and_rank_0_gathers_them(tmp_path, world):
    db_path = tmp_path / "tuning.sqlite"
    out = launch(_reward_main, world, str(db_path))
    assert all(out[r]["measured"] > 0 for r in range(world))                  # G ranks measure G batches
    assert out[0]["lost_ranks"] == [] and set(out[0]["ranks"]) == set(range(world))
    counts = _trial_counts(db_path)
    assert set(counts) == set().union(*(_own_problems(r) for r in range(world)))
    assert sum(counts.values()) == sum(s["measured"] for s in out[0]["ranks"].values())
    for r in range(world):                                                    # each rank's own database: its problems
        with Database(db_path.with_name(f"{db_path.name}.rank{r}.sqlite")) as db:
            assert {t.problem.key for t in db.trials()} == _own_problems(r)


def test_ranks_stopped_mid_training_keep_their_steps_for_the_next_run(tmp_path):
    """torchrun stops every rank when one fails, so no rank 0 gathers: the next run does first."""
    db_path = tmp_path / "tuning.sqlite"
    launch(_reward_main, 3, str(db_path), die={0: 2, 1: 2, 2: 2})            # all stopped in the second step
    assert _trial_counts(db_path) == {}                                       # nothing gathered ...
    out = launch(_reward_main, 3, str(db_path))                               # ... until the same run again
    for r in range(3):
        second = PROBLEMS[(2 * r + 1) % len(PROBLEMS)].key
        assert out[r]["timed"] == [second]                                    # the first step's is read back
    counts = _trial_counts(db_path)
    assert set(counts) == set().union(*(_own_problems(r) for r in range(3)))
    assert not list(tmp_path.glob("*.jsonl"))                                 # every export gathered
    again = launch(_reward_main, 3, str(db_path))                             # and once more: nothing to measure
    assert all(again[r]["timed"] == [] and again[r]["rewards"] == out[r]["rewards"] for r in range(3))
    assert _trial_counts(db_path) == counts


# --- a real GRPO chunk on two ranks ---

def test_a_grpo_chunk_on_two_ranks_gathers_both_ranks_rollouts(tmp_path):
    pytest.importorskip("trl")
    db_path, out = tmp_path / "tuning.sqlite", tmp_path / "grpo"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), str(Path(__file__).with_name("grpo_rank_stub.py")), "--distributed",
               "--out", str(out), "--db", str(db_path), "--max-steps", "1", "--problems", "4",
               "--prompts-per-step", "2", "--generations", "4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    meta = pm.read_meta(out)["grpo"]
    assert meta["ranks"] == 2 and meta["lost_ranks"] == [] and meta["steps"] == 1
    ranks = []
    for r in range(2):
        with Database(db_path.with_name(f"{db_path.name}.rank{r}.sqlite")) as db:
            ranks.append({t.program for t in db.trials()})
    assert all(ranks) and ranks[0] != ranks[1]                                # each rank measured its own
    with Database(db_path) as db:
        assert {t.program for t in db.trials()} == ranks[0] | ranks[1]
        assert db.stats()["trials"] == meta["measured_pairs"]


def test_the_scripts_refuse_distributed_outside_torchrun(monkeypatch):
    from gemmgen.tune.distributed import DistributedError

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(DistributedError, match="torchrun --nproc-per-node G benchmarks/policy_eval.py"):
        load_script("policy_eval").main(["--out", "/nonexistent/x", "--distributed"])
    with pytest.raises(DistributedError, match="torchrun --nproc-per-node G benchmarks/policy_grpo.py"):
        load_script("policy_grpo").main(["--out", "/nonexistent/x", "--distributed"])
