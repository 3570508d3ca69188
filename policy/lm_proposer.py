"""`PolicyProposer`: the language model as a Proposer (registered as "policy").

Three ways to propose (`mode`):
- "sample": it samples answers under the grammar (constrained.py), parses each with the
  prompt into a program, drops what the validator rejects and repeats, and returns up to k
  programs: the greedy answer first (the model's best-of-1), then samples by their
  log-probability. A peaked model repeats itself, so this can return fewer than k.
- "rank": it scores every valid program of the backends' spaces (the programs the heuristic
  ranks) by the model's log-probability of its answer, and returns the k most likely: always
  k distinct valid programs where the space holds k, in the model's order, not the prior's.
- "blend": the heuristic's first k // 2 programs (the prior's surest picks), then the rest in
  the model's order, as in "rank". Its best-of-1 is the model's first choice.
It never compiles or times; the tuning loop does that.
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from gemmgen.backends import validate
from gemmgen.dsl import ProgramError
from gemmgen.dsl.ir import Problem, Program
from gemmgen.policy import model as policy_model
from gemmgen.policy.constrained import GrammarSampler, sample
from gemmgen.policy.model import CHECKPOINT_DIR, read_meta
from gemmgen.policy.prompt import answer_text, program_from_answer, prompt_text
from gemmgen.policy.proposers import ALL_BACKENDS, POLICY_MODES, HeuristicProposer, blended
from gemmgen.policy.tokenizer import is_dsl_tokenizer

from gemmgen.errors import GemmgenError


class PolicyProposer:
    name = "policy"

    def __init__(self, checkpoint: Optional[str | Path] = None, *, base_model: Optional[str | Path] = None,
                 backends: Optional[Sequence[str]] = None, mode: str = "sample", temperature: float = 1.0,
                 top_p: float = 0.95, oversample: int = 3, rounds: int = 5, max_new_tokens: Optional[int] = None,
                 device: Optional[str] = None, model=None, tokenizer=None):
        if mode not in POLICY_MODES:
            raise GemmgenError(f"unknown policy mode {mode!r}; choose one of {', '.join(POLICY_MODES)}")
        self.mode = mode
        self.checkpoint = checkpoint
        self.base_model = base_model
        self.backends = tuple(backends) if backends else None
        self.temperature = temperature
        self.top_p = top_p
        self.oversample = max(1, oversample)
        self.rounds = max(1, rounds)
        self.max_new_tokens = max_new_tokens
        self.device = device
        self._model, self._tokenizer = model, tokenizer
        self._sampler = None
        self.last_stats: dict = {}
        self.last_ranking: list[Program] = []

    # -- loading ------------------------------------------------------------------
    def _load_model(self):
        if self._model is None:
            if self.base_model and not self.checkpoint:
                self._model, self._tokenizer = policy_model.load_base_model(self.base_model)
            else:
                self._model, self._tokenizer = policy_model.load_policy(self.checkpoint)
            if self.device:
                self._model.to(self.device)
        return self._model, self._tokenizer

    def _load(self):
        """The model, its tokenizer and the grammar sampler (which only sampling needs)."""
        model, tokenizer = self._load_model()
        if self._sampler is None:
            self._sampler = GrammarSampler(tokenizer, model.get_output_embeddings().weight.shape[0],
                                           backends=self.backends)
        return model, tokenizer, self._sampler

    @property
    def version(self) -> str:
        """Which weights: the checkpoint's recorded digest, else the path; `+rank` or `+blend` in
        those modes, so a record says which way its program was proposed."""

        return self._weights_version() + ("" if self.mode == "sample" else f"+{self.mode}")

    def _weights_version(self) -> str:
        source = Path(self.checkpoint) if self.checkpoint else (None if self.base_model else CHECKPOINT_DIR)
        if source is not None:
            digest = read_meta(source).get("weights_sha256", "")
            if digest:
                return digest[:12]
        text = str(self.checkpoint or self.base_model or CHECKPOINT_DIR)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def _default_max_new_tokens(self) -> int:
        return 96 if is_dsl_tokenizer(self._tokenizer) else 192

    # -- proposing -----------------------------------------------------------------
    def propose(self, problem: Problem, k: int, *, seed: Optional[int] = None) -> list[Program]:
        if k <= 0:
            return []
        if not problem.is_bound:
            raise GemmgenError("the policy proposes for a concrete shape; bind M, N and K first")
        if self.mode != "sample":
            return self._ranked(problem, k)
        model, tokenizer, sampler = self._load()
        prompt = prompt_text(problem)
        max_new = self.max_new_tokens or self._default_max_new_tokens()
        base_seed = 0 if seed is None else int(seed)
        found: list[Program] = []
        seen: set[Program] = set()
        stats = {"sampled": 0, "incomplete": 0, "unparsed": 0, "invalid": 0, "duplicate": 0, "other_backend": 0}

        def take(samples):
            ranked = sorted(samples, key=lambda s: -sum(s.logprobs)) if len(samples) > 1 else samples
            for s in ranked:
                stats["sampled"] += 1
                outcome, program = judge(problem, s, self.backends)
                if outcome != "ok":
                    stats[outcome] += 1
                elif program in seen:
                    stats["duplicate"] += 1
                else:
                    seen.add(program)
                    found.append(program)

        take(sample(model, tokenizer, sampler, prompt, 1, greedy=True, max_new_tokens=max_new))
        for round_ in range(self.rounds):
            if len(found) >= k:
                break
            n = (k - len(found)) * self.oversample
            take(sample(model, tokenizer, sampler, prompt, n, temperature=self.temperature, top_p=self.top_p,
                        seed=base_seed * 1000 + round_, max_new_tokens=max_new))
        self.last_stats = stats
        return found[:k]

    def _ranked(self, problem: Problem, k: int) -> list[Program]:
        model, tokenizer = self._load_model()
        space = HeuristicProposer(self.backends or ALL_BACKENDS).ranked(problem)
        scores = answer_logprobs(model, tokenizer, prompt_text(problem), [answer_text(p) for p in space])
        # ties keep the heuristic's order (sorted is stable)
        ranked = [space[i] for i in sorted(range(len(space)), key=lambda i: -scores[i])]
        self.last_stats = {"space": len(space), "scored": len(scores)}
        self.last_ranking = ranked   # the model's own order, which a blend's list hides
        # `space` is in the heuristic's order
        return blended(space, ranked, k) if self.mode == "blend" else ranked[:k]


def answer_logprobs(model, tokenizer, prompt: str, answers: Sequence[str], batch: int = 64) -> list[float]:
    """log p(answer, then end of text | prompt) under `model`, teacher-forced, one per answer."""
    # Deferred: torch (optional, heavy to import).
    import torch

    if not answers:
        return []
    device = next(model.parameters()).device
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    rows = [tokenizer.encode(a, add_special_tokens=False) + end for a in answers]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: list[float] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(rows), batch):
                chunk = rows[start:start + batch]
                width = max(len(r) for r in chunk)
                ids = torch.tensor([prompt_ids + r + [pad] * (width - len(r)) for r in chunk], device=device)
                # right padding: the pads come after every scored token, so they change none of them
                logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
                p = len(prompt_ids)
                for i, r in enumerate(chunk):
                    targets = torch.tensor(r, device=device)
                    # the logits at position t predict token t + 1
                    picked = logp[i, p - 1:p - 1 + len(r)].gather(1, targets[:, None])
                    out.append(float(picked.sum()))
    finally:
        model.train(was_training)
    return out


def judge(problem: Problem, s, backends: Optional[Sequence[str]] = None) -> tuple[str, Optional[Program]]:
    """('ok', program) or (why not, None): incomplete, unparsed, invalid, other_backend."""

    if not s.complete:
        return "incomplete", None
    try:
        program = program_from_answer(problem, s.text)
    except ProgramError:
        return "unparsed", None
    if backends and program.backend not in backends:
        return "other_backend", None
    program = replace(program, spans={})  # spans point into the prompt text; drop them
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate(program)
    except ProgramError:
        return "invalid", None
    return "ok", program
