"""A tokenizer made for the DSL: BPE over its lexemes, so a program is ~60-120 tokens.

The pre-tokenizer cuts text into lexemes the way the grammar does: a run of digits,
a run of letters and underscores, or one punctuation character, each with the one
space before it if there is one (as GPT-2 does), or else one whitespace character. BPE (Hugging Face `tokenizers`) then merges characters inside a lexeme,
trained on every word the language has (its keywords, taken from the grammar file)
and every number a program's decisions use, so those are single tokens; any other
number or word still encodes, as pieces. The decoder concatenates pieces, so
`decode(encode(text)) == text` for any ASCII text: the round trip is exact.
"""
from __future__ import annotations

import json
import re
import string
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.dsl.parser import grammar_text
from gemmgen.policy.prompt import prompt_text

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)

# One lexeme, with the space before it: digits | letters/underscores | one other char;
# else one whitespace char.
LEXEME_PATTERN = r" ?[0-9]+| ?[A-Za-z_]+| ?[^\sA-Za-z0-9_]|\s"

# Numbers that must be single tokens: every value a decision can take (tile sizes,
# warps, instruction shapes, stages, swizzles, split-K) and the usual problem sizes.
DECISION_NUMBERS = tuple(range(0, 513)) + tuple(2 ** i for i in range(10, 17))
COMMON_SIZES = (768, 1000, 1024, 1536, 2000, 2048, 3000, 3072, 4096, 5120, 6144, 8192,
                11008, 12288, 14336, 16384, 28672, 32768, 65536)


def grammar_words() -> list[str]:
    """Every keyword and enumerated value of the DSL, read from its grammar file."""

    text = grammar_text()
    words = set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', text))
    return sorted(w for word in words for w in re.findall(r"[A-Za-z_]+", word))


def seed_corpus(extra_texts: Iterable[str] = ()) -> list[str]:
    """What the BPE merges are learned from: the language's words, numbers, and texts."""

    numbers = [str(n) for n in sorted(set(DECISION_NUMBERS + COMMON_SIZES))]
    words = grammar_words()
    # Each word and number both with and without the space before it.
    lines = [" " + " ".join(words), "\n".join(words), " " + " ".join(numbers), "x".join(numbers)]
    lines.append(prompt_text(Problem(4096, 4096, 4096, epilogue=Epilogue(bias="n", activation="gelu"))))
    lines.extend(extra_texts)
    return lines


def train_tokenizer(extra_texts: Iterable[str] = ()):
    """A fresh DSL tokenizer as a transformers `PreTrainedTokenizerFast`."""
    # Deferred: tokenizers (optional, heavy to import).
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(LEXEME_PATTERN), behavior="isolated")
    core.decoder = decoders.Fuse()
    alphabet = sorted(set(string.printable) - set("\x0b\x0c\r"))
    trainer = trainers.BpeTrainer(
        vocab_size=4096, min_frequency=1, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet, show_progress=False)
    core.train_from_iterator(seed_corpus(extra_texts), trainer=trainer)
    return wrap(core)


def wrap(core):
    # Deferred: transformers (optional, heavy to import).
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        clean_up_tokenization_spaces=False, model_max_length=512)


@lru_cache(maxsize=4)
def load_tokenizer(path: str):
    """The tokenizer saved beside a checkpoint (tokenizer.json)."""
    # Deferred: transformers (optional, heavy to import).
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(Path(path)), clean_up_tokenization_spaces=False)


def is_dsl_tokenizer(tokenizer) -> bool:
    """True for a tokenizer built here (numbers are whole tokens, lexemes never merge)."""

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    return (pre.get("pattern") or {}).get("Regex") == LEXEME_PATTERN
