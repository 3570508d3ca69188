"""One short training chunk of the policy on the H200: optional supervised refresh, then GRPO on
measured speedups. Writes the trained policy, the reward curve (JSON + PNG) and a short table.

    python benchmarks/policy_grpo.py --out benchmarks/results/policy_grpo --minutes 2.5 --sft-minutes 1

1. (--sft-minutes > 0) supervised warm start on the GPU, from --checkpoint, on the saved heuristic
   programs beside it (imitation of the heuristic; no re-ranking) plus the tuning database's
   measured winners, held-out problems excluded;
2. GRPO (trl GRPOTrainer, grammar-constrained rollouts) for --minutes: each step samples
   prompts x generations programs, builds the new ones in parallel, checks and times them in the
   isolated worker, records every trial in the tuning database (a pair it already holds is not
   timed again) and rewards log(best baseline / kernel time), -2 for a failed or invalid one.
   --backends limits what is measured (default triton: a CUTLASS build takes ~a minute of nvcc);
   programs of other backends get no reward and so no gradient.

Resumable: --resume continues the trainer from <out>/grpo/work/trainer.

On G GPUs, GRPO over torchrun ranks (every rank measures its own rollouts on its own GPU, rank 0
gathers the records into --db and writes the report; no supervised refresh, --checkpoint instead):

    torchrun --nproc-per-node 8 benchmarks/policy_grpo.py --distributed --out DIR --minutes 10
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", default=None, help="policy to start from (default: the shipped one)")
    parser.add_argument("--db", default=None, help="tuning database (default: GEMMGEN_DB or the user's)")
    parser.add_argument("--sft-minutes", type=float, default=0.0)
    parser.add_argument("--minutes", type=float, default=2.5, help="GRPO wall-clock budget")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--problems", type=int, default=64, help="training problems to draw prompts from")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--backends", default="triton", help="backends measured for the reward")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--distributed", action="store_true",
                        help="one rank of `torchrun --nproc-per-node G benchmarks/policy_grpo.py --distributed ...`")
    args = parser.parse_args(argv)

    from gemmgen.policy import model as pm
    from gemmgen.tune.distributed import DistributedError, Rank

    rank = Rank.from_env(how="benchmarks/policy_grpo.py --distributed ...") if args.distributed else None
    if rank is not None and args.sft_minutes > 0:
        raise DistributedError("--distributed trains GRPO only: run the supervised refresh first, without torchrun "
                               "(python -m gemmgen.policy.training.sft --out SFT ...), then pass --checkpoint SFT")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Trainer state (optimizer, checkpoints) is for --resume, not for the repository.
    (out / ".gitignore").write_text("sft_work/\ngrpo/work/trainer/\n")
    started = time.monotonic()
    start_from = Path(args.checkpoint) if args.checkpoint else pm.CHECKPOINT_DIR
    report: dict = {"start_checkpoint": args.checkpoint or "the shipped policy (policy/checkpoint)"}
    if args.sft_minutes > 0:
        from gemmgen.policy.training.sft import main as sft_main

        sft_out = out / "sft"
        sft_args = ["--out", str(sft_out), "--work", str(out / "sft_work"), "--init", str(start_from),
                    "--minutes", str(args.sft_minutes), "--batch-size", "256", "--lr", "1e-3",
                    "--max-steps", "100000"]
        data = start_from / "sft_heuristic_programs.jsonl.gz"
        if data.is_file():
            sft_args += ["--data", str(data)]
        from gemmgen.tuning_db import default_db_path

        db_path = Path(args.db) if args.db else default_db_path()
        if db_path.is_file():            # measured winners (held-out problems excluded) join the data
            sft_args += ["--db", str(db_path)]
        t0 = time.monotonic()
        sft_main(sft_args)
        report["sft"] = {"minutes": round((time.monotonic() - t0) / 60, 2), **pm.read_meta(sft_out).get("sft", {})}
        start_from = sft_out

    from gemmgen.policy.training.grpo import grpo_chunk

    grpo_args = argparse.Namespace(
        checkpoint=str(start_from), out=str(out / "grpo"), db=args.db, problems=args.problems,
        minutes=args.minutes, max_steps=args.max_steps, prompts_per_step=args.prompts_per_step,
        generations=args.generations, lr=args.lr, resume=args.resume, seed=args.seed,
        backends=tuple(b for b in args.backends.split(",") if b), distributed=args.distributed)
    t0 = time.monotonic()
    grpo_chunk(grpo_args)
    if rank is not None and rank.rank != 0:
        return 0                         # rank 0 gathered the records and writes the report
    report["grpo"] = {"minutes": round((time.monotonic() - t0) / 60, 2), **pm.read_meta(out / "grpo").get("grpo", {})}
    curve = json.loads((out / "grpo" / "work" / "curves" / "grpo.json").read_text())
    rewards = [(row["step"], row["reward"]) for row in curve if "reward" in row]
    report["reward_curve"] = rewards
    report["total_minutes"] = round((time.monotonic() - started) / 60, 2)
    (out / "policy_grpo.json").write_text(json.dumps(report, indent=1) + "\n")
    for name in ("grpo.png", "grpo.json"):
        src = out / "grpo" / "work" / "curves" / name
        if src.is_file():
            (out / f"reward_curve_{name}").write_bytes(src.read_bytes())

    print(f"\nGRPO chunk: {report['grpo'].get('steps')} steps in {report['grpo']['minutes']} min "
          f"(total {report['total_minutes']} min incl. SFT {report.get('sft', {}).get('minutes', 0)} min); "
          f"pairs measured {report['grpo'].get('measured_pairs')}, read back {report['grpo'].get('reused_pairs')}")
    print(f"{'step':>6}{'mean reward':>14}")
    for step, reward in rewards:
        print(f"{step:>6}{reward:>14.3f}")
    print(f"trained policy: {out / 'grpo'}  (evaluate: python benchmarks/policy_eval.py --checkpoint {out / 'grpo'} ...)")
    return 0


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
