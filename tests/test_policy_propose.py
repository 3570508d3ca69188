"""The shipped policy as a Proposer and as `gemmgen propose`: valid, distinct, reproducible programs."""
import pytest

from gemmgen.cli import main
from gemmgen.dsl import parse
from gemmgen.backends import validate
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.errors import GemmgenError
from gemmgen.policy.lm_proposer import PolicyProposer, answer_logprobs
from gemmgen.policy.model import CHECKPOINT_DIR, read_meta
from gemmgen.policy.prompt import answer_text, prompt_text
from gemmgen.policy.proposers import HeuristicProposer, Proposer, get_proposer

PROBLEMS = [Problem(4096, 11008, 4096, b_major="col", epilogue=Epilogue(bias="n", activation="gelu")),
            Problem(33, 4096, 4096), Problem(2048, 2048, 512)]


@pytest.fixture(scope="module")
def proposer():
    import torch

    torch.set_num_threads(1)
    return get_proposer("policy")


def test_the_shipped_checkpoint_is_small_and_described():
    files = list(CHECKPOINT_DIR.iterdir())
    assert sum(f.stat().st_size for f in files) < 10 * 2**20
    meta = read_meta(CHECKPOINT_DIR)
    assert meta["stage"] in ("sft", "grpo") and meta["model"]["parameters"] < 5_000_000
    assert "not measurements" in meta["data_note"]


def test_registered_as_a_proposer(proposer):
    assert isinstance(proposer, PolicyProposer) and isinstance(proposer, Proposer)
    assert proposer.name == "policy" and proposer.version


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key)
def test_proposes_valid_distinct_programs_for_the_problem(proposer, problem):
    programs = proposer.propose(problem, 4, seed=1)
    assert programs, proposer.last_stats
    assert len(set(programs)) == len(programs)
    for program in programs:
        assert program.problem == problem
        validate(program)


def test_same_seed_same_programs_and_greedy_first(proposer):
    a = proposer.propose(PROBLEMS[2], 3, seed=5)
    b = proposer.propose(PROBLEMS[2], 3, seed=5)
    assert a == b
    c = proposer.propose(PROBLEMS[2], 3, seed=6)
    assert a[0] == c[0]          # the greedy answer does not depend on the seed


def test_backends_filter(proposer):
    only = PolicyProposer(backends=("triton",), model=proposer._model, tokenizer=proposer._tokenizer)
    for program in only.propose(PROBLEMS[1], 3, seed=2):
        assert program.backend == "triton"


def test_propose_command_prints_parseable_programs(capsys):
    assert main(["propose", "--shape", "1024x4096x4096", "--b-major", "col", "-k", "3", "--stats"]) == 0
    out = capsys.readouterr().out
    chunks = [c for c in out.split("# program ") if c.strip() and not c.startswith("#")]
    assert 1 <= len(chunks) <= 3
    for chunk in chunks:
        program = parse(chunk.split("\n", 1)[1].split("# samples")[0])
        assert (program.problem.m, program.problem.n, program.problem.k) == (1024, 4096, 4096)
        assert program.problem.b_major == "col"
    assert "# samples:" in out


def test_propose_command_errors_are_one_line(capsys):
    assert main(["propose", "--shape", "12x", "-k", "2"]) == 2
    assert "MxNxK" in capsys.readouterr().err
    assert main(["propose", "--shape", "64x64x64", "--checkpoint", "/nonexistent/policy"]) == 2
    assert "no policy checkpoint" in capsys.readouterr().err


def test_plugs_into_the_tuning_loop(proposer):
    from tuning_fakes import FakeBuilder, FakeRunner

    from gemmgen.tune import tune
    from gemmgen.tuning_db import Database

    runner = FakeRunner()
    with Database(":memory:") as db:
        report = tune([PROBLEMS[2]], proposer=proposer, builder=FakeBuilder(), runner=runner, db=db, budget=4,
                      progress=False)
        assert report.recorded >= 1 and report.shapes_done == 1
        trials = list(db.trials(PROBLEMS[2].key))
        assert all(t.proposer == "policy" and t.proposer_version == proposer.version for t in trials)
        again = tune([PROBLEMS[2]], proposer=proposer, builder=FakeBuilder(), runner=runner, db=db, budget=4,
                     progress=False)
        assert again.recorded == 0                     # same seed, same programs: nothing re-timed


def test_rank_mode_returns_the_spaces_k_most_likely_programs(proposer):
    ranker = PolicyProposer(backends=("triton",), mode="rank", model=proposer._model, tokenizer=proposer._tokenizer)
    problem = PROBLEMS[1]
    space = HeuristicProposer(("triton",)).ranked(problem)
    picked = ranker.propose(problem, 8)
    assert len(picked) == 8 == len(set(picked)) and set(picked) <= set(space)
    scores = dict(zip(space, answer_logprobs(proposer._model, proposer._tokenizer, prompt_text(problem),
                                             [answer_text(p) for p in space])))
    assert [scores[p] for p in picked] == sorted((scores[p] for p in picked), reverse=True)
    assert min(scores[p] for p in picked) >= max(s for p, s in scores.items() if p not in picked)
    assert ranker.last_stats == {"space": len(space), "scored": len(space)}
    assert ranker.version == proposer.version + "+rank"      # records say how a program was proposed
    assert ranker._sampler is None                           # ranking needs no grammar (nor llguidance)


def test_blend_mode_keeps_the_heuristics_first_half_then_the_models_ranking(proposer):
    shared = dict(backends=("triton",), model=proposer._model, tokenizer=proposer._tokenizer)
    blender, ranker = PolicyProposer(mode="blend", **shared), PolicyProposer(mode="rank", **shared)
    problem = PROBLEMS[1]
    space = HeuristicProposer(("triton",)).ranked(problem)
    picked = blender.propose(problem, 8)
    assert picked[:4] == space[:4] and len(picked) == 8 == len(set(picked))
    ranked = ranker.propose(problem, len(space))
    assert picked[4:] == [p for p in ranked if p not in space[:4]][:4]
    assert blender.propose(problem, 1) == ranked[:1]          # best-of-1 is the model's choice
    assert blender.version == proposer.version + "+blend"


def test_answer_scores_do_not_depend_on_batching(proposer):
    problem = PROBLEMS[0]
    answers = [answer_text(p) for p in HeuristicProposer(("triton",)).ranked(problem)[:6]]
    assert len({len(a) for a in answers}) > 1          # unequal lengths, so the batch pads
    together = answer_logprobs(proposer._model, proposer._tokenizer, prompt_text(problem), answers)
    alone = [answer_logprobs(proposer._model, proposer._tokenizer, prompt_text(problem), [a], batch=1)[0]
             for a in answers]
    assert together == pytest.approx(alone, abs=1e-4)
    assert all(s < 0 for s in together)


def test_unknown_mode_is_refused():
    with pytest.raises(GemmgenError, match="sample, rank, blend"):
        PolicyProposer(mode="best")


def test_propose_command_rank_mode(capsys):
    assert main(["propose", "--shape", "16x4096x4096", "--b-major", "col", "-k", "3", "--mode", "rank",
                 "--backends", "triton", "--stats"]) == 0
    out = capsys.readouterr().out
    assert out.count("# program ") == 3 and "# samples: space " in out
    assert main(["propose", "--shape", "16x4096x4096", "--proposer", "heuristic", "--mode", "rank"]) == 2
    assert "--mode chooses how the policy proposes" in capsys.readouterr().err


def test_tune_takes_the_policys_mode_and_refuses_it_for_other_proposers(tmp_path, capsys, monkeypatch):
    import gemmgen.cli.tune as tune_cli

    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n128,128,128\n")
    args = ["tune", "--shapes", str(shapes), "--db", str(tmp_path / "t.sqlite"), "--policy-mode", "blend"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--policy-mode chooses how the policy proposes" in err and len(err.strip().splitlines()) == 1
    made = []
    monkeypatch.setattr(tune_cli, "proposer_for", lambda name, **kw: made.append((name, kw)) or None)
    main(args + ["--proposer", "policy"])             # then stops: no GPU here
    assert made and made[0][0] == "policy" and made[0][1]["mode"] == "blend"
    assert not (tmp_path / "t.sqlite").exists()
