"""GRPO with trl's GRPOTrainer: sample programs, measure them, push the policy toward the fast ones.

Generation goes through trl's `rollout_func` hook (trl 1.16: "receives the
per-process prompts and the trainer, returns prompt_ids, completion_ids and
logprobs"), so every rollout is decoded under the DSL grammar (constrained.py);
the extra field `complete` reaches the reward, which scores unfinished answers as
invalid. The reward is `reward.SpeedupReward` on the GPU; tests pass a stub.

Runs in chunks: `max_steps` or `minutes`, whichever first; trainer checkpoints
under `<work>/trainer`, `resume=True` continues from the last one; the reward
curve goes to `<work>/curves/grpo.{json,png}`.

On G GPUs, one rank each (`torchrun --nproc-per-node G -m gemmgen.policy.training.grpo
--distributed ...`): trl deals every rank its own prompts, each rank measures its own
completions on its own GPU into its own database (`reward.measure_rewards`), and rank 0
gathers the records and writes the policy.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from gemmgen.dsl.ir import Problem
from gemmgen.policy import model as pm
from gemmgen.policy.constrained import GrammarSampler, sample
from gemmgen.policy.prompt import prompt_text
from gemmgen.policy.training import data
from gemmgen.policy.training.curves import write_curves
from gemmgen.policy.training.reward import measure_rewards, problem_to_json
from gemmgen.policy.training.sft import (
    time_budget_callback,
    last_checkpoint,
    weights_digest,
)
from gemmgen.tuning_db import default_db_path

from gemmgen.tune.adapters import PoolBuilder, WorkerRunner
from gemmgen.tune.distributed import Rank, connect, pin_gpu

#: the torchrun command line a --distributed chunk runs under
HOW = "-m gemmgen.policy.training.grpo --distributed ..."


@dataclass(frozen=True)
class GRPOSettings:
    max_steps: int = 50
    minutes: float = 3.0
    prompts_per_step: int = 4
    generations: int = 8
    learning_rate: float = 3e-4
    temperature: float = 1.0
    max_new_tokens: int = 96
    seed: int = 0
    save_steps: int = 5
    logging_steps: int = 1


def grpo_dataset(problems: Sequence[Problem]):
    """One row per problem: the prompt text and the problem (JSON) for the reward."""
    # Deferred: datasets (optional, heavy to import).
    from datasets import Dataset


    return Dataset.from_list([{"prompt": prompt_text(p), "problem": problem_to_json(p)} for p in problems])


def constrained_rollout(settings: GRPOSettings) -> Callable:
    """trl's rollout_func: grammar-constrained samples of the trainer's current model."""
    samplers: dict[int, GrammarSampler] = {}

    def rollout(prompts: list, trainer) -> dict:
        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = trainer.processing_class
        vocab = model.get_output_embeddings().weight.shape[0]
        sampler = samplers.get(id(tokenizer))
        if sampler is None:
            sampler = samplers[id(tokenizer)] = GrammarSampler(tokenizer, vocab)
        prompt_ids, completion_ids, logprobs, complete = [], [], [], []
        # The sampler repeats each prompt `generations` times in a row: decode each run as one batch.
        start = 0
        while start < len(prompts):
            end = start
            while end < len(prompts) and prompts[end] == prompts[start]:
                end += 1
            # the rank too: two ranks dealt the same prompt sample different programs
            seed = (settings.seed * 1_000_003 + trainer.state.global_step * 1009 + start
                    + trainer.accelerator.process_index * 7919)
            samples = sample(model, tokenizer, sampler, prompts[start], end - start,
                             temperature=settings.temperature, max_new_tokens=settings.max_new_tokens, seed=seed)
            ids = tokenizer.encode(prompts[start], add_special_tokens=False)
            for s in samples:
                prompt_ids.append(ids)
                completion_ids.append(list(s.token_ids))
                logprobs.append(list(s.logprobs))
                complete.append(s.complete)
            start = end
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs,
                "complete": complete}

    return rollout


def run_grpo(model, tokenizer, problems: Sequence[Problem], reward_fn, work_dir: str | Path,
             settings: GRPOSettings = GRPOSettings(), *, resume: bool = False, peft_config=None):
    """One chunk of GRPO; returns the trainer (its model is updated in place)."""

    # Deferred: torch, trl (optional, heavy to import).
    import torch
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    work_dir = Path(work_dir)
    cuda = torch.cuda.is_available()
    batch = settings.prompts_per_step * settings.generations
    args = GRPOConfig(
        output_dir=str(work_dir / "trainer"), max_steps=settings.max_steps, learning_rate=settings.learning_rate,
        per_device_train_batch_size=batch, num_generations=settings.generations,
        max_completion_length=settings.max_new_tokens, temperature=settings.temperature, beta=0.0,
        logging_steps=settings.logging_steps, save_steps=settings.save_steps, save_total_limit=2,
        report_to="none", seed=settings.seed, use_cpu=not cuda, bf16=False, disable_tqdm=True,
        gradient_checkpointing=False, dataloader_num_workers=0, lr_scheduler_type="constant", warmup_steps=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=grpo_dataset(problems),
                          processing_class=tokenizer, rollout_func=constrained_rollout(settings),
                          callbacks=[time_budget_callback(settings.minutes)], peft_config=peft_config)

    trainer.train(resume_from_checkpoint=last_checkpoint(work_dir / "trainer") if resume else None)

    if not trainer.is_world_process_zero():
        return trainer
    name = getattr(reward_fn, "__name__", "reward")
    write_curves(trainer.state.log_history, work_dir / "curves", "grpo",
                 ["reward", f"rewards/{name}/mean", "reward_std", "completions/mean_length", "loss"])
    return trainer


def main(argv: Optional[Sequence[str]] = None) -> int:
    """A GRPO chunk on this GPU: see benchmarks/policy_grpo.py, which calls this."""

    parser = argparse.ArgumentParser(description="One GRPO chunk of the gemmgen policy on the GPU.")
    parser.add_argument("--checkpoint", help="policy to start from (default: the shipped one)")
    parser.add_argument("--out", required=True, help="folder for the trained policy, trainer state and curves")
    parser.add_argument("--db", help="tuning database (default: GEMMGEN_DB or ~/.cache/gemmgen/tuning.sqlite)")
    parser.add_argument("--problems", type=int, default=32, help="training problems to draw prompts from")
    parser.add_argument("--minutes", type=float, default=GRPOSettings.minutes)
    parser.add_argument("--max-steps", type=int, default=GRPOSettings.max_steps)
    parser.add_argument("--prompts-per-step", type=int, default=GRPOSettings.prompts_per_step)
    parser.add_argument("--generations", type=int, default=GRPOSettings.generations)
    parser.add_argument("--lr", type=float, default=GRPOSettings.learning_rate)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", default="triton", help="backends measured for the reward (others: no reward)")
    parser.add_argument("--distributed", action="store_true",
                        help=f"one rank of `torchrun --nproc-per-node G {HOW}`: G GPUs measure G times the rollouts")
    args = parser.parse_args(argv)
    args.backends = tuple(b for b in args.backends.split(",") if b)
    return grpo_chunk(args)


def pin_rank(args) -> Optional[Rank]:
    """With --distributed, this process's rank, pinned to its GPU before CUDA starts; else None."""
    if not getattr(args, "distributed", False):
        return None
    rank = Rank.from_env(how=HOW)
    pin_gpu(rank)
    # It now sees one GPU, its device 0: what accelerate's device and barriers index by LOCAL_RANK.
    os.environ["LOCAL_RANK"] = "0"
    return rank


def grpo_chunk(args) -> int:
    started = time.monotonic()
    rank = pin_rank(args)
    out = Path(args.out)
    model, tokenizer = pm.load_policy(out if args.resume and (out / "config.json").is_file() else args.checkpoint)
    rng = random.Random(args.seed)
    pool = [p for p in data.training_problems() if p.epilogue == data.EPILOGUE_VARIANTS[0]]
    problems = rng.sample(pool, min(args.problems, len(pool)))
    settings = GRPOSettings(max_steps=args.max_steps, minutes=args.minutes, prompts_per_step=args.prompts_per_step,
                            generations=args.generations, learning_rate=args.lr, seed=args.seed)
    reward_log: list = []
    with WorkerRunner() as runner:
        trainer, reward, gathered = measure_rewards(
            lambda reward: run_grpo(model, tokenizer, problems, reward, out / "work", settings, resume=args.resume),
            db_path=Path(args.db) if args.db else default_db_path(), runner=runner, rank=rank,
            store=connect(rank) if rank else None, builder=PoolBuilder(jobs=rank.cores() if rank else None),
            proposer_version="grpo", log=reward_log, backends=getattr(args, "backends", None))
    if rank is not None and rank.rank != 0:
        return 0
    counts = list(gathered.get("ranks", {}).values()) or [{"measured": reward.measured, "reused": reward.reused}]
    meta = {**pm.read_meta(args.checkpoint or pm.CHECKPOINT_DIR), "stage": "grpo"}
    pm.save_policy(trainer.model, tokenizer, out, meta={})
    meta["grpo"] = {"steps": trainer.state.global_step, "wall_minutes": round((time.monotonic() - started) / 60, 2),
                    "problems": len(problems), "measured_pairs": sum(c["measured"] for c in counts),
                    "reused_pairs": sum(c["reused"] for c in counts), "ranks": rank.world if rank else 1,
                    "lost_ranks": gathered.get("lost_ranks", []),
                    "prompts_per_step": settings.prompts_per_step, "generations": settings.generations,
                    "backends": list(getattr(args, "backends", None) or [])}
    meta["weights_sha256"] = weights_digest(out)
    pm.save_policy(trainer.model, tokenizer, out, meta=meta)
    (out / "work" / "curves" / "reward_batches.json").write_text(json.dumps(reward_log) + "\n")
    print(json.dumps(meta["grpo"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
