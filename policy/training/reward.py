"""The RL reward: measured speedup, through the tuning loop, cached in the tuning database.

    reward = log(best baseline time / kernel time)      for a program that passed its check
           = FAILED_REWARD (-2)                         build failed, check failed, hung or crashed
           = INVALID_REWARD (-2)                        no parse (unfinished) or the validator refuses
           = None                                       a backend this run does not measure (e.g. CUTLASS,
                                                        whose nvcc builds take a minute, in a short chunk):
                                                        trl then gives that completion no advantage

"Best baseline" is the fastest of the baselines the runner timed in the same run
(torch.matmul, cuBLAS NN/TN, cuBLASLt heuristic and autotuned). Measuring goes
through `gemmgen.tune.tune` with the answers as a fixed proposal: the loop's
builder (CPU pool) and runner (isolated GPU worker) do the work and record every
trial, and a (problem, program) pair the database already holds for this GPU is
read back instead of timed again. Baselines are timed once per problem per run.

On G GPUs (torchrun, trl's data parallelism) every rank scores its own completions on its own
GPU, into its own database, and rank 0 gathers them at the end (`measure_rewards`): G ranks
measure G times as many rollouts.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, TypeVar

from gemmgen.dsl import to_text
from gemmgen.dsl.ir import Epilogue, Problem, Program
from gemmgen.policy.constrained import Sample
from gemmgen.policy.lm_proposer import judge

from gemmgen.tune import tune
from gemmgen.tune.distributed import GATHER_TIMEOUT_S, Rank, finish, seed_rank
from gemmgen.tuning_db import Database
from gemmgen.tuning_db.exchange import export

INVALID_REWARD = -2.0
FAILED_REWARD = -2.0
T = TypeVar("T")


def problem_to_json(problem: Problem) -> str:
    return json.dumps(asdict(problem), sort_keys=True)


def problem_from_json(text: str) -> Problem:
    fields = json.loads(text)
    return Problem(**{**fields, "epilogue": Epilogue(**fields["epilogue"])})


def reward_of(trial) -> float:
    """The reward one recorded trial earns (module docstring)."""
    best = trial.best_baseline
    if trial.status != "ok" or not trial.check_passed or not trial.device_ms or best is None:
        return FAILED_REWARD
    return math.log(best[1].device_ms / trial.device_ms)


class FixedProposal:
    """A proposer that proposes exactly the given programs per problem (how answers enter the tuning loop)."""

    def __init__(self, programs: Mapping[str, Sequence[Program]], name: str = "policy", version: str = ""):
        self.programs = {key: list(progs) for key, progs in programs.items()}
        self.name = name
        self.version = version

    def propose(self, problem: Problem, k: int, *, seed: Optional[int] = None) -> list[Program]:
        return self.programs.get(problem.key, [])[:k]


class BaselinesOnce:
    """A runner whose baselines are timed once per problem and reused (they do not change in a run)."""

    def __init__(self, runner):
        self.runner = runner
        self.device = runner.device
        self._baselines: dict[str, Mapping] = {}

    def baselines(self, problem: Problem):
        if problem.key not in self._baselines:
            self._baselines[problem.key] = dict(self.runner.baselines(problem))
        return self._baselines[problem.key]

    def measure(self, program, artifact, *, seed=None):
        return self.runner.measure(program, artifact, seed=seed)


class SpeedupReward:
    """A trl reward function: (prompts, completions, problem=[json], ...) -> rewards."""

    __name__ = "speedup"

    def __init__(self, builder, runner, db, *, proposer_version: str = "", log: Optional[list] = None,
                 backends: Optional[Sequence[str]] = None, export_to: Optional[Path] = None):
        """`export_to`: a file the database is exported to after every call that measured
        something (a rank's export, which is what is gathered if the rank dies)."""
        self.builder = builder
        self.export_to = export_to
        self.backends = tuple(backends) if backends else None
        self.runner = BaselinesOnce(runner)
        self.db = db
        self.proposer_version = proposer_version
        self.log = log if log is not None else []
        self.measured = 0
        self.reused = 0

    def _recorded(self, problem: Problem) -> dict[str, object]:
        """program text -> its latest trial on this GPU."""
        return {t.program: t for t in self.db.trials(problem.key, self.runner.device.name)}

    def _judge(self, problem: Problem, text: str, done: bool) -> tuple[Optional[Program], bool]:
        """(valid program or None, whether this run scores it at all)."""
        outcome, program = judge(problem, Sample(text, (), (), bool(done)))
        if program is not None and self.backends and program.backend not in self.backends:
            return None, False
        return (program if outcome == "ok" else None), True

    def score(self, items: Sequence[tuple[Problem, str, bool]]) -> list[Optional[float]]:
        """Rewards of (problem, answer, finished) items; new pairs measured in one tuning-loop call."""

        judged = [self._judge(problem, text, done) for problem, text, done in items]
        problems = list(dict.fromkeys(problem for problem, _, _ in items))
        known = {p.key: self._recorded(p) for p in problems}
        fresh: dict[str, list[Program]] = {}
        for (problem, _, _), (program, _) in zip(items, judged):
            if program is not None and to_text(program) not in known[problem.key]:
                bucket = fresh.setdefault(problem.key, [])
                if program not in bucket:
                    bucket.append(program)
        if fresh:
            todo = [p for p in problems if p.key in fresh]
            tune(todo, proposer=FixedProposal(fresh, version=self.proposer_version), builder=self.builder,
                 runner=self.runner, db=self.db, budget=max(len(v) for v in fresh.values()), progress=False)
            known.update({p.key: self._recorded(p) for p in todo})
            if self.export_to is not None:
                export(self.db, self.export_to)
        n_fresh = sum(len(v) for v in fresh.values())
        self.measured += n_fresh
        self.reused += sum(1 for program, _ in judged if program is not None) - n_fresh
        rewards: list[Optional[float]] = []
        for (problem, _, _), (program, scored) in zip(items, judged):
            if not scored:
                rewards.append(None)
            elif program is None:
                rewards.append(INVALID_REWARD)
            else:
                trial = known[problem.key].get(to_text(program))
                rewards.append(FAILED_REWARD if trial is None else reward_of(trial))
        return rewards

    def __call__(self, prompts, completions, problem=None, complete=None, **kwargs) -> list[Optional[float]]:
        if problem is None:
            raise ValueError("the dataset needs a 'problem' column (problem_to_json) for the speedup reward")
        complete = complete if complete is not None else [True] * len(completions)
        problems = {key: problem_from_json(key) for key in set(problem)}
        rewards = self.score([(problems[key], text, done) for key, text, done in zip(problem, completions, complete)])
        self.log.append({"rewards": rewards, "measured": self.measured, "reused": self.reused})
        return rewards


def measure_rewards(train: Callable[[SpeedupReward], T], *, db_path: Path, builder, runner,
                    rank: Optional[Rank] = None, store=None, gather_timeout_s: float = GATHER_TIMEOUT_S,
                    **reward_options) -> tuple[T, SpeedupReward, dict]:
    """`train(reward)` with a speedup reward that records into `db_path`; on a rank of a torchrun
    launch (`rank`, `store`: gemmgen.tune.distributed), into the rank's own database instead,
    seeded from `db_path` and exported after every measuring call, and rank 0 gathers every
    rank's records into `db_path` once every rank has trained (a rank that died: up to its last
    export). Returns (what `train` returned, the reward, what was gathered: {} off torchrun; on
    rank 0 `gather`'s dict, whose "ranks" hold each rank's measured and reused counts)."""
    if rank is None:
        with Database(db_path) as db:
            reward = SpeedupReward(builder, runner, db, **reward_options)
            return train(reward), reward, {}
    own_db, own_export = seed_rank(rank, store, db_path)
    with Database(own_db) as db:
        reward = SpeedupReward(builder, runner, db, export_to=own_export, **reward_options)
        result = train(reward)
        export(db, own_export)
    counts = {"rank": rank.rank, "measured": reward.measured, "reused": reward.reused}
    return result, reward, finish(rank, store, db_path, counts, gather_timeout_s)
