"""On the H200: the speedup reward over real builds and the isolated worker (bounded: one small
problem, two Triton programs, about half a minute)."""
import math

import pytest

from gemmgen.dsl.ir import Problem
from gemmgen.policy.prompt import answer_text
from gemmgen.policy.proposers import HeuristicProposer
from gemmgen.policy.training.reward import FAILED_REWARD, INVALID_REWARD, SpeedupReward, problem_to_json


@pytest.mark.gpu
def test_speedup_reward_on_the_gpu(tmp_path):
    from gemmgen.tune.adapters import PoolBuilder, WorkerRunner
    from gemmgen.tuning_db import Database

    problem = Problem(1024, 1024, 1024)
    programs = HeuristicProposer(("triton",)).propose(problem, 2)
    assert programs
    answers = [answer_text(p) for p in programs] + ["backend triton\n"]
    keys = [problem_to_json(problem)] * len(answers)
    with Database(tmp_path / "t.sqlite") as db, WorkerRunner(baselines=("torch", "lt_heuristic")) as runner:
        reward = SpeedupReward(PoolBuilder(), runner, db)
        first = reward(["p"] * len(answers), answers, problem=keys, complete=[True] * (len(answers) - 1) + [False])
        assert first[-1] == INVALID_REWARD
        for r in first[:-1]:
            assert r == FAILED_REWARD or (math.isfinite(r) and -3 < r < 1.5)   # log speedup: sane range
        assert reward.measured == len(programs)
        again = reward(["p"] * len(answers), answers, problem=keys)
        assert again[:-1] == first[:-1] and reward.measured == len(programs)   # read back, never re-timed
