"""The DSL tokenizer: exact round trip on every example, programs of ~50-120 tokens, whole-word tokens."""
from pathlib import Path

import pytest

from gemmgen.dsl import parse, to_text
from gemmgen.policy.prompt import answer_text, program_from_answer, prompt_text
from gemmgen.policy.tokenizer import DECISION_NUMBERS, grammar_words, is_dsl_tokenizer, train_tokenizer

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "dsl" / "examples").glob("*.gemm"))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


def test_examples_exist():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_round_trip_on_every_example(tokenizer, path):
    text = path.read_text()
    for candidate in (text, to_text(parse(text))):
        ids = tokenizer.encode(candidate, add_special_tokens=False)
        assert tokenizer.decode(ids) == candidate
        assert tokenizer.unk_token_id not in ids


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_a_canonical_program_is_short(tokenizer, path):
    program = parse(path.read_text())
    n = len(tokenizer.encode(to_text(program), add_special_tokens=False))
    assert 50 <= n <= 120, n


def test_prompt_plus_answer_is_the_program(tokenizer):
    program = parse(EXAMPLES[0].read_text())
    prompt, answer = prompt_text(program.problem), answer_text(program)
    assert program_from_answer(program.problem, answer) == program
    # Tokens of the whole are the tokens of the parts: training and sampling see the same ids.
    both = tokenizer.encode(prompt + answer, add_special_tokens=False)
    assert both == tokenizer.encode(prompt, add_special_tokens=False) + tokenizer.encode(answer, add_special_tokens=False)


def _assert_words_and_decision_numbers_are_single_tokens(tokenizer):
    vocab = tokenizer.get_vocab()
    for word in grammar_words():
        assert word in vocab and " " + word in vocab, word
    for n in DECISION_NUMBERS:
        assert str(n) in vocab and f" {n}" in vocab, n


def test_words_and_decision_numbers_are_single_tokens(tokenizer):
    _assert_words_and_decision_numbers_are_single_tokens(tokenizer)


def test_the_shipped_tokenizer_knows_every_word_of_todays_grammar():
    """A word added to the grammar after the shipped policy was trained (as `unordered` was)
    would reach the model letter by letter: retrain the tokenizer and the policy with it."""
    from gemmgen.policy.model import CHECKPOINT_DIR
    from gemmgen.policy.tokenizer import load_tokenizer

    _assert_words_and_decision_numbers_are_single_tokens(load_tokenizer(str(CHECKPOINT_DIR)))


def test_unseen_numbers_still_round_trip(tokenizer):
    text = "gemm 12345x99991x7 a=row b=col c=row in=f16 acc=f32\n"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_the_tokenizer_knows_itself(tokenizer, tmp_path):
    assert is_dsl_tokenizer(tokenizer)
    tokenizer.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path)
    assert is_dsl_tokenizer(again)
    text = EXAMPLES[0].read_text()
    assert again.encode(text) == tokenizer.encode(text)


def test_a_new_grammar_word_joins_a_trained_policy_without_moving_any_token():
    import torch

    from gemmgen.policy.model import extend_vocabulary, load_policy

    model, tokenizer = load_policy()
    before = tokenizer.get_vocab()
    text = "tile 64x16x128\nsplit_k 1\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :, :len(before)]
    assert extend_vocabulary(model, tokenizer, ["zz_word"]) == ["zz_word", " zz_word"]
    after = tokenizer.get_vocab()
    assert all(after[t] == i for t, i in before.items())
    assert len(tokenizer.encode("\nzz_word", add_special_tokens=False)) == 2
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)
    with torch.no_grad():
        again = model(torch.tensor([ids])).logits[0]
    assert torch.equal(again[:, :len(before)], logits)          # the policy's choices are unchanged
    assert torch.all(again[:, len(before):] == 0)                # the new word is not favoured
    assert extend_vocabulary(model, tokenizer, ["zz_word"]) == []
