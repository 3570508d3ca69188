"""Preference training with trl's DPOTrainer on measured pairs: of two programs timed at the same
training problem, the faster is preferred (data.preference_examples).

This is learning from measured rewards without a GPU: the pairs are the tuning database's
checked trials, so what the policy learns is how the H200 ordered programs, where the
supervised stage learns mostly the heuristic's order. An SFT term on the preferred answer
(`sft_weight`, trl's `loss_type=["sigmoid", "sft"]`) keeps the preferred programs likely, not
only likelier than the others. Runs in chunks like the supervised stage (`minutes`,
`max_steps`, `resume`); writes `<work>/curves/dpo.{json,png}` and copies it beside the policy.

    python -m gemmgen.policy.training.dpo --out /tmp/dpo_policy --minutes 5
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

from gemmgen.errors import GemmgenError
from gemmgen.policy import model as pm
from gemmgen.policy.training import data
from gemmgen.policy.training.curves import copy_curve, write_curves
from gemmgen.policy.training.sft import time_budget_callback, last_checkpoint, weights_digest
from gemmgen.tuning_db import Database, shipped_database

CURVE_KEYS = ("loss", "rewards/accuracies", "rewards/margins", "logps/chosen")


@dataclass(frozen=True)
class DPOSettings:
    max_steps: int = 2000
    minutes: float = 5.0
    batch_size: int = 32
    learning_rate: float = 1e-4
    warmup_steps: int = 10
    beta: float = 0.1
    sft_weight: float = 0.2
    min_gain: float = 1.05
    pairs_per_problem: int = 8
    seed: int = 0
    logging_steps: int = 25
    save_steps: int = 500
    max_length: int = 192


def run_dpo(model, tokenizer, rows: Sequence[dict], out_dir: str | Path, settings: DPOSettings = DPOSettings(),
            *, resume: bool = False):
    """Train `model` on prompt/chosen/rejected `rows` (a frozen copy is the reference);
    returns the trainer (its model is trained)."""
    # Deferred: datasets, torch, trl (optional, heavy to import).
    import torch
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    out_dir = Path(out_dir)
    cuda = torch.cuda.is_available()
    args = DPOConfig(
        output_dir=str(out_dir / "trainer"), max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size, learning_rate=settings.learning_rate,
        lr_scheduler_type="constant_with_warmup", warmup_steps=settings.warmup_steps, weight_decay=0.01,
        logging_steps=settings.logging_steps, save_steps=settings.save_steps, save_total_limit=2,
        report_to="none", max_length=settings.max_length, beta=settings.beta,
        loss_type=["sigmoid", "sft"], loss_weights=[1.0, settings.sft_weight],
        seed=settings.seed, use_cpu=not cuda, bf16=cuda, disable_tqdm=True, dataloader_num_workers=0)
    reference = copy.deepcopy(model).eval()   # trl would reload it by name, which a fresh model lacks
    reference.requires_grad_(False)
    trainer = DPOTrainer(model=model, ref_model=reference, args=args, train_dataset=Dataset.from_list(list(rows)),
                         processing_class=tokenizer, callbacks=[time_budget_callback(settings.minutes)])
    trainer.train(resume_from_checkpoint=last_checkpoint(out_dir / "trainer") if resume else None)
    write_curves(trainer.state.log_history, out_dir / "curves", "dpo", CURVE_KEYS)
    return trainer


def measured_pairs(db, settings: DPOSettings) -> tuple[list[dict], dict]:
    """The rows to train on and their counts; a database without two programs apart at any
    training problem is an error that says what to do."""
    pairs = data.preference_examples(db, min_gain=settings.min_gain, per_problem=settings.pairs_per_problem,
                                     seed=settings.seed)
    if not pairs:
        raise GemmgenError("the database holds no training problem with two checked programs "
                           f"{settings.min_gain}x apart; tune some problems first (gemmgen tune) "
                           "or lower --min-gain")
    return list(data.preference_rows(pairs)), {"pairs": len(pairs),
                                                "problems": len({faster.problem for faster, _ in pairs})}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Preference training of the gemmgen policy on measured pairs.")
    parser.add_argument("--out", required=True, help="folder to write the trained policy to")
    parser.add_argument("--init", default=None, help="policy checkpoint to start from (default: the shipped one)")
    parser.add_argument("--db", help="tuning database to read the pairs from (default: the shipped records)")
    parser.add_argument("--work", help="folder for trainer checkpoints and curves (default: a cache folder)")
    parser.add_argument("--minutes", type=float, default=DPOSettings.minutes)
    parser.add_argument("--max-steps", type=int, default=DPOSettings.max_steps)
    parser.add_argument("--lr", type=float, default=DPOSettings.learning_rate)
    parser.add_argument("--beta", type=float, default=DPOSettings.beta,
                        help="how far from the starting policy (higher: closer)")
    parser.add_argument("--sft-weight", type=float, default=DPOSettings.sft_weight,
                        help="weight of the supervised term on the preferred answer")
    parser.add_argument("--min-gain", type=float, default=DPOSettings.min_gain,
                        help="a pair's faster program is at least this many times the slower's speedup")
    parser.add_argument("--pairs-per-problem", type=int, default=DPOSettings.pairs_per_problem)
    parser.add_argument("--resume", action="store_true", help="continue from the last trainer checkpoint")
    args = parser.parse_args(argv)
    if args.min_gain <= 1.0 or args.pairs_per_problem < 1 or args.minutes <= 0 or args.max_steps < 1:
        parser.error("--min-gain must exceed 1; --pairs-per-problem, --minutes and --max-steps must be positive")

    out = Path(args.out)
    work = Path(args.work) if args.work else pm.cache_root() / "policy" / "runs" / f"dpo-{out.resolve().name}"
    settings = DPOSettings(max_steps=args.max_steps, minutes=args.minutes, learning_rate=args.lr,
                           beta=args.beta, sft_weight=args.sft_weight, min_gain=args.min_gain,
                           pairs_per_problem=args.pairs_per_problem)
    started = time.monotonic()
    try:
        if args.db:
            with Database(args.db, readonly=True) as db:
                rows, counts = measured_pairs(db, settings)
        else:
            rows, counts = measured_pairs(shipped_database(), settings)
        model, tokenizer = pm.load_policy(args.init)
    except GemmgenError as e:
        parser.exit(2, f"gemmgen: {e}\n")
    trainer = run_dpo(model, tokenizer, rows, work, settings, resume=args.resume)
    meta = {**pm.lineage(args.init or pm.CHECKPOINT_DIR), "stage": "dpo",
            "dpo": {**asdict(settings), **counts, "steps": trainer.state.global_step,
                    "wall_minutes": round((time.monotonic() - started) / 60, 2)},
            "data_note": "pairs of programs measured at the same training problem, the faster preferred"}
    pm.save_policy(trainer.model, tokenizer, out, meta={})
    meta.update(weights_sha256=weights_digest(out), model=pm.describe(trainer.model))
    pm.save_policy(trainer.model, tokenizer, out, meta=meta)
    copy_curve(work / "curves", "dpo", out)
    print(json.dumps(meta["dpo"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
