"""One supervised and one GRPO step on a tiny model; the speedup reward over stub measurements.

The measurements here are stubs (StubBuilder / StubTileRunner: times made up from the
tile size) and so is `stub_reward_big_tiles`: the one place a made-up reward is right,
to test the training plumbing without a GPU.
"""
import math

import pytest

from gemmgen.dsl import to_text
from gemmgen.dsl.ir import Problem
from gemmgen.policy.training import data
from gemmgen.policy.model import SmallConfig, new_small_model
from gemmgen.policy.training.reward import (FAILED_REWARD, INVALID_REWARD, SpeedupReward, problem_from_json,
                                   problem_to_json)
from gemmgen.policy.prompt import answer_text, prompt_text
from gemmgen.policy.tokenizer import train_tokenizer
from gemmgen.tune import BuildOutcome, Measurement
from gemmgen.tuning_db import BaselineTime, Database, Device

TINY = SmallConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2)
PROBLEMS = [Problem(256, 512, 1024), Problem(4096, 4096, 4096, b_major="col")]


@pytest.fixture(scope="module")
def tokenizer():
    import torch

    torch.set_num_threads(1)
    return train_tokenizer()


@pytest.fixture(scope="module")
def teacher_programs():
    return data.heuristic_examples(PROBLEMS, top=3)


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _changed(before, model):
    return any(not (before[k] == v).all() for k, v in model.state_dict().items())


def test_one_supervised_step_changes_the_weights(tokenizer, teacher_programs, tmp_path):
    from gemmgen.policy.training.sft import SFTSettings, run_sft

    model = new_small_model(tokenizer, TINY)
    before = _snapshot(model)
    rows = list(data.supervised_rows(teacher_programs))
    assert rows[0]["prompt"] == prompt_text(teacher_programs[0].problem)
    trainer = run_sft(model, tokenizer, rows, tmp_path, SFTSettings(max_steps=1, batch_size=4, warmup_steps=0,
                                                                     logging_steps=1, save_steps=100))
    assert trainer.state.global_step == 1
    assert _changed(before, model)
    assert any("loss" in row and math.isfinite(row["loss"]) for row in trainer.state.log_history)
    assert (tmp_path / "curves" / "sft.json").is_file() and (tmp_path / "curves" / "sft.png").is_file()


def test_preference_steps_make_the_faster_answer_likelier(tokenizer, teacher_programs, tmp_path):
    from gemmgen.policy.lm_proposer import answer_logprobs
    from gemmgen.policy.training.dpo import DPOSettings, run_dpo

    model = new_small_model(tokenizer, TINY, seed=3)
    before = _snapshot(model)
    by_problem = {}
    for program in teacher_programs:
        by_problem.setdefault(program.problem, []).append(program)
    pairs = [(programs[0], programs[-1]) for programs in by_problem.values()]
    rows = list(data.preference_rows(pairs))

    def margins():
        return [float(fast - slow) for row in rows
                for fast, slow in [answer_logprobs(model, tokenizer, row["prompt"], [row["chosen"], row["rejected"]])]]

    start = margins()
    trainer = run_dpo(model, tokenizer, rows, tmp_path, DPOSettings(max_steps=3, batch_size=2, warmup_steps=0,
                                                                     learning_rate=1e-2, logging_steps=1,
                                                                     save_steps=100))
    assert trainer.state.global_step == 3
    assert _changed(before, model)
    assert all(after > first for after, first in zip(margins(), start)), (start, margins())
    logged = [row for row in trainer.state.log_history if "rewards/margins" in row]
    assert logged and all(math.isfinite(row["loss"]) for row in logged)
    assert (tmp_path / "curves" / "dpo.json").is_file() and (tmp_path / "curves" / "dpo.png").is_file()


def test_preference_training_says_what_to_do_without_pairs(tmp_path, capsys):
    from gemmgen.policy.training.dpo import main

    with Database(tmp_path / "empty.sqlite"):
        pass
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path / "p"), "--db", str(tmp_path / "empty.sqlite")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "no training problem with two checked programs" in err and "gemmgen tune" in err
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path / "p"), "--min-gain", "1"])
    assert stop.value.code == 2 and "--min-gain must exceed 1" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def stub_reward_big_tiles(prompts, completions, **kwargs):
    """STUB reward (tests only): the tile's M+N over 256; nothing measured."""
    rewards = []
    for text in completions:
        tile = next((line.split()[1] for line in text.splitlines() if line.startswith("tile ")), "0x0x0")
        try:
            m, n, _ = (int(x) for x in tile.split("x"))
            rewards.append((m + n) / 256)
        except ValueError:
            rewards.append(INVALID_REWARD)
    return rewards


def test_one_grpo_step_with_a_stub_reward(tokenizer, tmp_path):
    from gemmgen.policy.training.grpo import GRPOSettings, run_grpo

    model = new_small_model(tokenizer, TINY, seed=2)
    before = _snapshot(model)
    settings = GRPOSettings(max_steps=1, prompts_per_step=2, generations=4, learning_rate=1e-2, save_steps=100)
    trainer = run_grpo(model, tokenizer, PROBLEMS, stub_reward_big_tiles, tmp_path, settings)
    assert trainer.state.global_step == 1
    logged = [row for row in trainer.state.log_history if "reward" in row]
    assert logged and logged[0]["reward_std"] > 0          # distinct rewards, so a real gradient
    assert _changed(before, model)
    assert (tmp_path / "curves" / "grpo.json").is_file() and (tmp_path / "curves" / "grpo.png").is_file()


class StubBuilder:
    """STUB: builds nothing; tile K of 16 'fails to compile'."""

    def build_many(self, programs):
        return [BuildOutcome(p, error="stub build failure") if p.tile.k == 16 else BuildOutcome(p, artifact="stub")
                for p in programs]


class StubTileRunner:
    """STUB: a time from the tile size (bigger is faster); baselines 1 ms."""

    device = Device("Stub GPU", "9.0", 132)

    def __init__(self):
        self.measured = []

    def baselines(self, problem):
        return {"torch": BaselineTime(1.0, 0.01), "lt_autotune": BaselineTime(0.9, 0.01)}

    def measure(self, program, artifact, *, seed=None):
        self.measured.append(program)
        ms = 128.0 / (program.tile.m + program.tile.n)
        return Measurement(check_passed=True, max_rel_err=1e-3, err_bound=4e-3, seed=1, device_ms=ms, spread=0.01)


def test_speedup_reward_measures_each_pair_once_and_penalises_bad_answers(teacher_programs):
    runner = StubTileRunner()
    with Database(":memory:") as db:
        reward = SpeedupReward(StubBuilder(), runner, db)
        problem = PROBLEMS[0]
        good = [p for p in teacher_programs if p.problem == problem][:2]
        answers = [answer_text(p) for p in good] + ["backend triton\n", answer_text(good[0])]
        keys = [problem_to_json(problem)] * len(answers)
        first = reward(["p"] * len(answers), answers, problem=keys, complete=[True, True, False, True])
        for value, program in zip(first, good):
            expected = math.log(0.9 / (128.0 / (program.tile.m + program.tile.n)))
            assert value == pytest.approx(expected) if program.tile.k != 16 else value == FAILED_REWARD
        assert first[2] == INVALID_REWARD and first[3] == first[0]
        assert len(runner.measured) == len({to_text(p) for p in good if p.tile.k != 16})
        again = reward(["p"] * 2, answers[:2], problem=keys[:2])
        assert again == first[:2]
        assert len(runner.measured) == len({to_text(p) for p in good if p.tile.k != 16})   # read back, not re-timed
        assert {t.program for t in db.trials(problem.key, "Stub GPU")} == {to_text(p) for p in good}


def test_problems_travel_through_the_dataset_intact():
    for problem in PROBLEMS + [Problem(3, 5, 7, epilogue=data.EPILOGUE_VARIANTS[-1])]:
        assert problem_from_json(problem_to_json(problem)) == problem


def test_a_retrain_names_the_added_words_its_answers_taught():
    from gemmgen.policy.training.sft import words_trained

    rows = [{"prompt": "gemm 1x4096x4096 ...", "completion": "backend triton\nmainloop direct\nsplit_k 1"},
            {"prompt": "epilogue out=f16 gate=silu halves", "completion": "backend cuda\nswap_ab\n"}]
    added = ["swap_ab", " swap_ab", "gate", " gate", "direct", " direct", "stacked", " stacked"]
    assert words_trained(rows, added) == ["direct", "swap_ab"]     # `gate` is in a prompt only
    assert words_trained(rows[:1], ["swap"]) == []                 # whole words, not pieces
