"""Decoding constrained by the DSL's lark grammar, so every sample parses.

The grammar is `dsl/gemm.lark` itself, read from the package, compiled by
llguidance (which reads lark syntax) into a token mask for any tokenizer. Two
narrowings of its start and split_k rules make the accepted language exactly the
answers `gemmgen.dsl.parse` accepts, in canonical order:

- `start` becomes the answer's statements in the printer's order, each once
  (the full grammar's `_line*` allows any order; the parser rejects repeats);
- `split_k` is `1` or a count of 2 or more with its reduction, which the parser
  demands after parsing;
- and, where the caller asks for some backends only, `backend` names one of them
  (a sample for another backend would be drawn only to be dropped).

Beside the grammar, a canonical-form mask keeps samples short and in the form the
model was trained on: no comments, no tabs, no runs of blanks or blank lines, at
most 4 digits in a number; and, for the DSL's own tokenizer, every lexeme one
whole token (no `t`+`ile`, no `6`+`4`), so an answer is at most ~60 tokens and an
untrained model still finishes every sample.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np
from gemmgen.dsl.parser import grammar_text
from gemmgen.errors import GemmgenError
from gemmgen.policy.prompt import answer_statements
from gemmgen.policy.tokenizer import LEXEME_PATTERN, is_dsl_tokenizer

MAX_DIGITS = 4
_WS, _NL, _DIGIT, _LETTER, _OTHER, _NONE = range(6)


@lru_cache(maxsize=8)
def decoding_grammar(backends: Optional[tuple[str, ...]] = None) -> str:
    """gemm.lark with the narrowings of the module docstring (lark syntax); `backends`: the
    names a `backend` statement may take (default: every backend the grammar knows)."""

    text = grammar_text()
    start = "start: " + " _NL ".join(answer_statements()) + " _NL"
    split_k = ('split_k: "split_k" (SPLIT_ONE | SPLIT_MANY SPLIT_K_REDUCE)\n'
               'SPLIT_ONE: "1"\nSPLIT_MANY: /[2-9]|[1-9][0-9]+/')
    narrowings = [("start", start), ("split_k", split_k)]
    if backends:
        known = re.findall(r'"(\w+)"', re.search(r"^BACKEND:.*$", text, flags=re.M).group(0))
        unknown = sorted(set(backends) - set(known))
        if unknown:
            raise GemmgenError(f"no backend named {', '.join(unknown)}; the DSL's backends are {', '.join(known)}")
        narrowings.append(("BACKEND", "BACKEND: " + " | ".join(f'"{b}"' for b in sorted(set(backends)))))
    for rule, new in narrowings:
        text, count = re.subn(rf"^{rule}:.*$", lambda _: new, text, count=1, flags=re.M)
        if count != 1:
            raise RuntimeError(f"gemm.lark has no one-line `{rule}:` rule to narrow; update policy/constrained.py")
    return text


def _char_class(ch: str) -> int:
    if ch == "\n":
        return _NL
    if ch.isspace():
        return _WS
    if ch.isdigit():
        return _DIGIT
    if ch.isalpha() or ch == "_":
        return _LETTER
    return _OTHER


def _digit_runs(text: str) -> tuple[int, int, int]:
    """(leading digits, trailing digits, longest inner run)."""
    lead = len(text) - len(text.lstrip("0123456789"))
    trail = len(text) - len(text.rstrip("0123456789"))
    inner = max((len(r) for r in re.findall(r"[0-9]+", text)), default=0)
    return lead, trail, inner


@dataclass
class TokenTable:
    """Per-token facts the canonical-form mask reads, computed once per tokenizer."""

    texts: list[str]
    first: np.ndarray       # class of the first character
    last: np.ndarray        # class of the last character
    lead_digits: np.ndarray
    trail_digits: np.ndarray
    all_digits: np.ndarray  # bool
    static_ok: np.ndarray   # bool: allowed at all in an answer
    eos_ids: tuple[int, ...]
    same_class_ban: bool    # DSL tokenizer: a digit or letter token never follows its own class
    probes: tuple[tuple[int, int], ...] = ()  # (token, first class) that can end a word


def _byte_level_chars() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): printable bytes stand for themselves, the other
    bytes for the code points from 256 on, in byte order. Maps each character back to its byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def token_bytes(tokenizer, vocab_size: int) -> list[bytes]:
    """The bytes each token id stands for, read from the tokenizer's vocabulary.

    Byte-level vocabularies (GPT-2, Llama 3, SmolLM) are mapped back through their alphabet;
    `<0xNN>` byte-fallback pieces are that byte; `▁` (SentencePiece) is a space; otherwise the
    token's text. Ids past the vocabulary (padded embedding rows) are empty.
    """

    spec = json.dumps(json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder"))
    byte_level = '"ByteLevel"' in spec
    alphabet = _byte_level_chars()
    out = []
    for i in range(vocab_size):
        piece = tokenizer.convert_ids_to_tokens(i) if i < len(tokenizer) else None
        if piece is None:
            out.append(b"")
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
            out.append(bytes([int(piece[3:5], 16)]))
        elif byte_level and i not in tokenizer.all_special_ids and all(ch in alphabet for ch in piece):
            out.append(bytes(alphabet[ch] for ch in piece))
        else:
            out.append(piece.replace("\u2581", " ").encode())
    return out


def _answer_words() -> set[str]:
    return set(re.findall(r'"([^"\\]+)"', grammar_text()))


def build_token_table(tokenizer, vocab_size: int) -> TokenTable:
    texts = [b.decode("utf-8", "replace") for b in token_bytes(tokenizer, vocab_size)]
    special = set(tokenizer.all_special_ids)
    eos = tuple(i for i in {tokenizer.eos_token_id} if i is not None)
    dsl = is_dsl_tokenizer(tokenizer)
    words = _answer_words()
    lexeme = re.compile(LEXEME_PATTERN)
    n = len(texts)
    first = np.full(n, _NONE, np.int8)
    last = np.full(n, _NONE, np.int8)
    lead = np.zeros(n, np.int16)
    trail = np.zeros(n, np.int16)
    all_digits = np.zeros(n, bool)
    ok = np.zeros(n, bool)
    for i, t in enumerate(texts):
        if not t or i in special:
            continue
        first[i], last[i] = _char_class(t[0]), _char_class(t[-1])
        lead[i], trail[i], inner = _digit_runs(t)
        all_digits[i] = t.isdigit()
        # No comments, tabs, blank runs or blank lines; a space only before a word (never trailing:
        # after `backend triton ` only a newline could follow, which would make a blank run).
        good = (not re.search(r"[#\t\r\x0b\x0c]|  | \n|\n |\n\n| $", t)) and inner <= MAX_DIGITS and t.isascii()
        if dsl and good:
            core = t[1:] if t.startswith(" ") and len(t) > 1 else t
            whole = t == "\n" or (lexeme.fullmatch(t) is not None and (
                core in words or re.fullmatch(r"0|[1-9][0-9]*", core) is not None))
            good = whole
        ok[i] = good
    probes = tuple((texts.index(p), _char_class(p[0])) for p in (" ", "\n", "=", "x", "1") if p in texts)
    return TokenTable(texts, first, last, lead, trail, all_digits, ok, eos, dsl, probes)


class CanonicalForm:
    """The canonical-form mask for one sample, given the text generated so far."""

    def __init__(self, table: TokenTable):
        self.t = table
        self.last = _NL        # the prompt ends with a newline
        self.digit_run = 0

    def allowed(self) -> np.ndarray:
        t = self.t
        ok = t.static_ok.copy()
        if self.last in (_WS, _NL):
            ok &= ~np.isin(t.first, (_WS, _NL))
        if self.last == _DIGIT:
            ok &= self.digit_run + t.lead_digits <= MAX_DIGITS
        if t.same_class_ban and self.last in (_DIGIT, _LETTER):
            ok &= t.first != self.last
        ok[list(t.eos_ids)] = True
        return ok

    def advance(self, token: int) -> None:
        t = self.t
        text = t.texts[token] if token < len(t.texts) else ""
        if not text:
            return
        if t.all_digits[token]:
            self.digit_run += len(text)
        else:
            self.digit_run = int(t.trail_digits[token])
        self.last = int(t.last[token])


class GrammarSampler:
    """llguidance matchers plus canonical form, one pair per sample row."""

    def __init__(self, tokenizer, vocab_size: int, backends: Optional[Sequence[str]] = None):
        # Deferred: llguidance (optional, heavy to import).
        import llguidance

        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.table = build_token_table(tokenizer, vocab_size)
        self.lltok = _lltokenizer(tokenizer, vocab_size)
        self.grammar = llguidance.LLMatcher.grammar_from_lark(
            decoding_grammar(tuple(sorted(set(backends))) if backends else None))
        error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(self.grammar, self.lltok)
        if error:
            raise RuntimeError(f"llguidance refused the DSL grammar: {messages[0]}")
        self._template = llguidance.LLMatcher(self.lltok, self.grammar, log_level=0)

    def new_row(self) -> "RowState":
        return RowState(self._template.deep_copy(), CanonicalForm(self.table), self.table.eos_ids)


class RowState:
    def __init__(self, matcher, canonical: CanonicalForm, eos_ids: Sequence[int]):
        self.matcher = matcher
        self.canonical = canonical
        self.eos_ids = tuple(eos_ids)
        self.done = False
        self.failed = False

    def mask(self, vocab_size: int) -> np.ndarray:
        """Allowed next tokens (bool, vocab_size); a dead end allows EOS only and marks failure."""
        allowed = np.zeros(vocab_size, bool)
        if self.done:
            allowed[list(self.eos_ids)] = True
            return allowed
        grammar = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8).astype(bool)
        n = min(vocab_size, grammar.size)
        allowed[:n] = grammar[:n]
        table = self.canonical.t
        allowed[: table.static_ok.size] &= self.canonical.allowed()[:vocab_size]
        if table.same_class_ban:
            self._drop_word_prefixes(allowed, table)
        if not allowed.any():
            self.failed = True
            allowed[list(self.eos_ids)] = True
        return allowed

    def _drop_word_prefixes(self, allowed: np.ndarray, table: TokenTable) -> None:
        """Refuse a word token the grammar takes only as the start of a longer word (`c` of `cuda`):
        with one token per lexeme, nothing could follow it."""
        for token in np.nonzero(allowed[: table.last.size] & (table.last == _LETTER))[0]:
            followers = [p for p, cls in table.probes if cls != _LETTER] + list(self.eos_ids)
            if not any(self.matcher.validate_tokens([int(token), p]) == 2 for p in followers):
                allowed[token] = False

    def consume(self, token: int) -> None:
        if self.done:
            return
        if token in self.eos_ids:
            self.done = True
            self.failed = self.failed or not self.matcher.is_accepting()
            return
        if not self.matcher.consume_token(int(token)):
            self.failed = True
            self.done = True
            return
        self.canonical.advance(int(token))


def _lltokenizer(tokenizer, vocab_size: int):
    """An llguidance tokenizer over `token_bytes`: one path for the DSL tokenizer and any
    pretrained one (llguidance.hf reads only some decoder layouts; a GGUF-converted SmolLM2's
    is not among them, and its tokens would be taken for their `Ġ`-spelled text)."""
    # Deferred: llguidance (optional, heavy to import).
    import llguidance

    class _Vocabulary:
        eos_token_id = tokenizer.eos_token_id
        bos_token_id = None
        special_token_ids = list(tokenizer.all_special_ids)
        tokens = token_bytes(tokenizer, vocab_size)

        def __call__(self, data: bytes) -> list[int]:
            return tokenizer.encode(data.decode("utf-8", "replace"), add_special_tokens=False)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary()), n_vocab=vocab_size)


@dataclass(frozen=True)
class Sample:
    """One constrained sample: its answer text, tokens, their log-probabilities, and whether it finished."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    complete: bool


def sample(model, tokenizer, sampler: GrammarSampler, prompt: str, n: int, *,
           max_new_tokens: int = 96, temperature: float = 1.0, top_p: float = 1.0,
           seed: Optional[int] = None, greedy: bool = False) -> list[Sample]:
    """`n` grammar-constrained answers to one prompt, batched with the KV cache."""
    # Deferred: torch (optional, heavy to import).
    import torch

    if n <= 0:
        return []
    device = next(model.parameters()).device
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(0 if seed is None else int(seed))
    rows = [sampler.new_row() for _ in range(n)]
    vocab = sampler.vocab_size
    ids = torch.tensor([prompt_ids] * n, device=device)
    attention = torch.ones_like(ids)
    past = None
    out_tokens: list[list[int]] = [[] for _ in range(n)]
    out_logps: list[list[float]] = [[] for _ in range(n)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for _ in range(max_new_tokens):
                result = model(input_ids=ids, attention_mask=attention, past_key_values=past, use_cache=True)
                past = result.past_key_values
                logits = result.logits[:, -1, :vocab].float().cpu()
                masks = torch.from_numpy(np.stack([row.mask(vocab) for row in rows]))
                logits = logits.masked_fill(~masks, float("-inf"))
                if greedy:
                    chosen = logits.argmax(dim=-1)
                    logp = torch.log_softmax(logits, dim=-1)
                else:
                    logp = torch.log_softmax(logits / max(temperature, 1e-5), dim=-1)
                    probs = _top_p(logp.exp(), top_p)
                    chosen = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                for i, row in enumerate(rows):
                    if row.done:
                        continue
                    token = int(chosen[i])
                    out_tokens[i].append(token)
                    out_logps[i].append(float(logp[i, token]))
                    row.consume(token)
                if all(row.done for row in rows):
                    break
                ids = chosen.unsqueeze(1).to(device)
                attention = torch.cat([attention, torch.ones_like(ids)], dim=1)
    finally:
        model.train(was_training)
    samples = []
    eos = set(sampler.table.eos_ids)
    for row, tokens, logps in zip(rows, out_tokens, out_logps):
        text = tokenizer.decode([t for t in tokens if t not in eos], skip_special_tokens=True,
                                clean_up_tokenization_spaces=False)
        complete = row.done and not row.failed
        samples.append(Sample(text, tuple(tokens), tuple(logps), complete))
    return samples


def _top_p(probs, top_p: float):
    # Deferred: torch (optional, heavy to import).
    import torch

    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = sorted_probs.cumsum(dim=-1) - sorted_probs < top_p
    keep[..., 0] = True
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
    return filtered / filtered.sum(dim=-1, keepdim=True)
