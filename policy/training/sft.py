"""Supervised warm start with trl's SFTTrainer: prompt -> the answer of a good program.

Data: the tuning database's fastest checked programs per problem (measured) and the
HeuristicProposer's top programs (imitation of the heuristic, not measurements; see
data.py). Loss on the answer tokens only. Runs in chunks: stops at `max_steps` or
after `minutes`, whichever comes first, keeps trainer checkpoints under
`<work>/trainer`, and `resume=True` continues from the last one. Writes
`<work>/curves/sft.{json,png}` and copies the curve beside the saved policy.

    python -m gemmgen.policy.training.sft --out policy/checkpoint --minutes 3
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

from gemmgen.dsl import parse, to_text
from gemmgen.policy import model as pm
from gemmgen.policy.proposers import HeuristicProposer, present_backends
from gemmgen.policy.tokenizer import train_tokenizer
from gemmgen.policy.training import data
from gemmgen.policy.training.curves import copy_curve, write_curves
from gemmgen.tuning_db import Database


@dataclass(frozen=True)
class SFTSettings:
    max_steps: int = 3000
    minutes: float = 3.0
    batch_size: int = 32
    learning_rate: float = 2e-3
    warmup_steps: int = 20
    seed: int = 0
    logging_steps: int = 25
    save_steps: int = 500
    max_length: int = 192


def time_budget_callback(minutes: float):
    # Deferred: transformers (optional, heavy to import).
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        """Stops training (and saves) once the chunk's wall-clock budget is spent."""

        def __init__(self):
            self.start = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if _agreed(time.monotonic() - self.start > minutes * 60):
                control.should_training_stop = True
                control.should_save = True
            return control

    return TimeBudget()


def _agreed(flag: bool) -> bool:
    """Rank 0's `flag` on every rank of a data-parallel run (ranks that stopped at different
    steps would wait on each other's collectives for ever); off torchrun, `flag`."""
    # Deferred: torch (optional, heavy to import).
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    agreed = [flag]
    dist.broadcast_object_list(agreed, src=0)
    return bool(agreed[0])


def last_checkpoint(folder: Path) -> Optional[str]:
    # Deferred: transformers (optional, heavy to import).
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(folder)) if folder.is_dir() else None


def run_sft(model, tokenizer, rows: Sequence[dict], out_dir: str | Path, settings: SFTSettings = SFTSettings(),
            *, resume: bool = False, peft_config=None):
    """Train `model` on prompt/completion `rows`; returns the trainer (its model is trained)."""
    # Deferred: datasets, torch, trl (optional, heavy to import).
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    out_dir = Path(out_dir)
    cuda = torch.cuda.is_available()
    args = SFTConfig(
        output_dir=str(out_dir / "trainer"), max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size, learning_rate=settings.learning_rate,
        lr_scheduler_type="constant_with_warmup", warmup_steps=settings.warmup_steps, weight_decay=0.01,
        logging_steps=settings.logging_steps, save_steps=settings.save_steps, save_total_limit=2,
        report_to="none", max_length=settings.max_length, completion_only_loss=True, packing=False,
        seed=settings.seed, use_cpu=not cuda, bf16=cuda, disable_tqdm=True, dataloader_num_workers=0,
        eos_token=tokenizer.eos_token)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(list(rows)),
                         processing_class=tokenizer, callbacks=[time_budget_callback(settings.minutes)],
                         peft_config=peft_config)
    trainer.train(resume_from_checkpoint=last_checkpoint(out_dir / "trainer") if resume else None)

    write_curves(trainer.state.log_history, out_dir / "curves", "sft", ["loss", "mean_token_accuracy", "learning_rate"])
    return trainer


def weights_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def read_programs(path: str | Path) -> list:
    """Programs from a JSON-lines file ({"program": text} per line), gzipped or not."""


    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [parse(json.loads(line)["program"]) for line in f if line.strip()]


def write_programs(programs, path: str | Path) -> None:


    with gzip.open(path, "wt") as f:
        for p in programs:
            f.write(json.dumps({"program": to_text(p)}) + "\n")


def build_rows(db_path: Optional[str], heuristic_top: int, offgrid: int, cache_dir: Path,
               data_path: Optional[str] = None, user_shapes: int = 0) -> tuple[list[dict], dict, list]:
    """Supervised rows from the database (if any) and the heuristic (or a saved snapshot of it);
    the counts of each; and the heuristic programs."""

    programs_db = []
    if db_path:

        with Database(db_path, readonly=True) as db:
            programs_db = data.database_examples(db)
    if data_path:
        programs_h = [p for p in read_programs(data_path) if not data.is_heldout(p.problem)]
        n_problems = len({p.problem for p in programs_h})
    else:

        problems = data.training_problems(offgrid=offgrid, user_shapes=user_shapes)
        teacher = [HeuristicProposer.version, heuristic_top] + [m.NAME for m in present_backends()]
        key = hashlib.sha256(json.dumps([p.key for p in problems] + teacher).encode()).hexdigest()[:12]
        programs_h = data.heuristic_examples(problems, top=heuristic_top, cache=cache_dir / f"heuristic-{key}.jsonl")
        n_problems = len(problems)
    # Measured programs count twice: they are the better teacher.
    rows = list(data.supervised_rows(programs_db * 2 + programs_h))
    return rows, {"database_programs": len(programs_db), "heuristic_programs": len(programs_h),
                  "training_problems": n_problems, "heuristic_top": heuristic_top,
                  **({"user_shapes": user_shapes} if user_shapes and not data_path else {})}, programs_h


def words_trained(rows: Sequence[dict], words: Sequence[str]) -> list[str]:
    """The added vocabulary words that occur in the answers of `rows` (what this run taught)."""
    answers = "\n".join(row["completion"] for row in rows)
    return sorted({w.strip() for w in words if re.search(rf"\b{re.escape(w.strip())}\b", answers)})


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Supervised warm start of the gemmgen policy.")
    parser.add_argument("--out", required=True, help="folder to write the trained policy to")
    parser.add_argument("--work", help="folder for trainer checkpoints and curves (default: a cache folder)")
    parser.add_argument("--init", help="start from this policy checkpoint instead of a fresh small model")
    parser.add_argument("--base-model", help="adapt this local causal LM (folder or .gguf) with LoRA")
    parser.add_argument("--db", help="tuning database whose fastest programs per problem to learn from")
    parser.add_argument("--data", help="heuristic programs saved by --keep-data (skips re-ranking)")
    parser.add_argument("--keep-data", action="store_true",
                        help="save the heuristic programs beside the policy (sft_heuristic_programs.jsonl.gz)")
    parser.add_argument("--heuristic-top", type=int, default=4)
    parser.add_argument("--offgrid", type=int, default=400, help="off-grid shapes of model widths")
    parser.add_argument("--user-shapes", type=int, default=0,
                        help="log-uniform off-grid shapes, as a new user brings them (heuristic programs)")
    parser.add_argument("--minutes", type=float, default=SFTSettings.minutes)
    parser.add_argument("--max-steps", type=int, default=SFTSettings.max_steps)
    parser.add_argument("--batch-size", type=int, default=SFTSettings.batch_size)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--resume", action="store_true", help="continue from the last trainer checkpoint in --out")
    args = parser.parse_args(argv)


    out = Path(args.out)
    work = Path(args.work) if args.work else pm.cache_root() / "policy" / "runs" / f"sft-{out.resolve().name}"
    started = time.monotonic()
    rows, counts, programs_h = build_rows(args.db, args.heuristic_top, args.offgrid, pm.cache_root() / "policy",
                                          args.data, args.user_shapes)
    peft_config = None
    if args.base_model:
        # Deferred: peft (optional, heavy to import).
        from peft import LoraConfig

        model, tokenizer = pm.load_base_model(args.base_model)
        s = pm.LoraSettings()
        peft_config = LoraConfig(r=s.r, lora_alpha=s.alpha, lora_dropout=s.dropout,
                                 target_modules=list(s.target_modules), task_type="CAUSAL_LM")
        lr = args.lr or 2e-4
        base = {"base_model": str(args.base_model)}
    elif args.init or (args.resume and (out / "config.json").is_file()):
        model, tokenizer = pm.load_policy(args.init or out)
        lr = args.lr or 5e-4
        base = pm.lineage(args.init or out)
    else:
        tokenizer = train_tokenizer()
        model = pm.new_small_model(tokenizer)
        lr = args.lr or SFTSettings.learning_rate
        base = {"small_config": asdict(pm.SmallConfig())}
    if "vocabulary_added" in base:
        added = base["vocabulary_added"]
        base["vocabulary_added"] = {**added, "trained": words_trained(rows, added.get("tokens", []))}
    settings = SFTSettings(max_steps=args.max_steps, minutes=args.minutes, batch_size=args.batch_size,
                           learning_rate=lr)
    trainer = run_sft(model, tokenizer, rows, work, settings, resume=args.resume, peft_config=peft_config)
    final = trainer.model
    pm.save_policy(final, tokenizer, out, meta={})
    meta = {**base, "stage": "sft", "sft": {**asdict(settings), **counts, "steps": trainer.state.global_step,
                                              "wall_minutes": round((time.monotonic() - started) / 60, 2)},
            "data_note": "heuristic_programs imitate the HeuristicProposer (roofline prior), not measurements",
            "weights_sha256": weights_digest(out), "model": pm.describe(final)}
    pm.save_policy(final, tokenizer, out, meta=meta)
    if args.keep_data:
        write_programs(programs_h, out / "sft_heuristic_programs.jsonl.gz")
    copy_curve(work / "curves", "sft", out)
    print(json.dumps(meta["sft"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
