"""Grammar-constrained decoding: every sample of an untrained model parses."""
import re

import pytest

from gemmgen.dsl import ProgramError, parse
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.policy.constrained import GrammarSampler, decoding_grammar, sample
from gemmgen.policy.model import new_small_model
from gemmgen.policy.prompt import answer_statements, program_from_answer, prompt_text
from gemmgen.policy.tokenizer import train_tokenizer

PROBLEMS = [Problem(4096, 11008, 4096, b_major="col", epilogue=Epilogue(bias="n", activation="gelu")),
            Problem(7, 4096, 4096), Problem(1000, 3000, 77, a_major="col")]


@pytest.fixture(scope="module")
def untrained():
    import torch

    torch.set_num_threads(1)
    tokenizer = train_tokenizer()
    model = new_small_model(tokenizer, seed=1)   # random init: no training at all
    return model, tokenizer, GrammarSampler(tokenizer, model.config.vocab_size)


def test_decoding_grammar_is_the_dsl_grammar_with_a_fixed_order():
    text = decoding_grammar()
    assert re.search(r"^start: backend _NL tile _NL", text, re.M)
    assert "%ignore COMMENT" in text and 'tile: "tile" INT "x" INT "x" INT' in text
    assert text.count("\nstart:") == 1 and "split_k:" in text


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.key)
def test_every_sample_of_an_untrained_model_parses(untrained, problem):
    model, tokenizer, sampler = untrained
    samples = sample(model, tokenizer, sampler, prompt_text(problem), 20 if problem is PROBLEMS[0] else 8, seed=3)
    for s in samples:
        assert s.complete, s.text
        program = program_from_answer(problem, s.text)       # raises if it does not parse
        assert program.problem == problem
        lines = s.text.splitlines()
        assert len(lines) == len(answer_statements())
        assert all(line.startswith(name) for line, name in zip(lines, answer_statements()))
        assert len(s.token_ids) == len(s.logprobs) and all(lp <= 0 for lp in s.logprobs)
        assert s.token_ids[-1] == tokenizer.eos_token_id


def test_samples_differ_and_seeds_repeat(untrained):
    model, tokenizer, sampler = untrained
    prompt = prompt_text(PROBLEMS[1])
    a = sample(model, tokenizer, sampler, prompt, 6, seed=11)
    b = sample(model, tokenizer, sampler, prompt, 6, seed=11)
    assert [s.text for s in a] == [s.text for s in b]
    assert len({s.text for s in a}) > 1


def test_a_sampler_for_some_backends_writes_only_those(untrained):
    from gemmgen.errors import GemmgenError

    model, tokenizer, _ = untrained
    assert re.search(r'^BACKEND: "cutlass" \| "triton"$', decoding_grammar(("triton", "cutlass")), re.M)
    with pytest.raises(GemmgenError, match="no backend named tritn; the DSL's backends are"):
        decoding_grammar(("tritn",))
    sampler = GrammarSampler(tokenizer, model.config.vocab_size, backends=["cuda"])
    samples = sample(model, tokenizer, sampler, prompt_text(PROBLEMS[1]), 8, seed=5)
    assert samples and all(s.text.startswith("backend cuda\n") for s in samples if s.complete)


def test_the_full_grammar_would_accept_what_the_narrowed_one_refuses():
    # The narrowing is of order and split_k only: a reordered program still parses in the DSL,
    # and the parser itself refuses `split_k 4` without a reduction (what the narrowing prevents).
    problem = PROBLEMS[1]
    with pytest.raises(ProgramError):
        parse(prompt_text(problem) + "backend triton\ntile 64x64x64\nwarps 2x2\nmainloop multistage\nsplit_k 4\n")
