"""The policy on held-out problems, scored against what the H200 already measured (no GPU).

Every shape of the 1,000 set now has Triton programs measured on the H200 (the shipped
records), the held-out fifth included (tuned, never trained on). So a policy's proposals can
be scored on CPU wherever they coincide with a measured program. Per held-out grid problem
(row-major A and B, no epilogue) and per proposer, with k proposals:
  hit_best      the database's fastest checked program is among them
  measured      how many of them the database has timed
  known_b8      best speedup among the measured ones / the database's best (problems with one)
This is a proxy, not a timing: a proposal never measured counts for nothing here, good or bad.
`benchmarks/policy_eval.py` times every proposal on the GPU.

    python3 benchmarks/policy_offline_eval.py --policy shipped=policy/checkpoint \\
        --policy old=/tmp/policy_old --out benchmarks/results/policy_offline

`--policy-modes sample,rank` evaluates each policy in both of its modes (`PolicyProposer.mode`),
the second named NAME:rank.

`--recorded FILE` scores on the problems of a GPU evaluation instead (a `policy_eval.json[.gz]`
of `benchmarks/policy_eval.py` whose rows keep `candidate_speedups`, e.g. the unseen problems of
`benchmarks/results/policy_eval_unseen/rank/`): measured there means one of the candidates that
run timed (speedups over torch.matmul, the same ratio within a problem), and every proposer
draws from the backends that run did.
"""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from gemmgen.measure.numerics import geomean


def measured_speedups(db, problem, device_name: str) -> dict[str, float]:
    """Program text -> speedup over the best baseline of its run, for checked trials."""
    out: dict[str, float] = {}
    for t in db.trials(problem.key, device_name):
        if t.status == "ok" and t.check_passed and t.speedup:
            out[t.program] = max(out.get(t.program, 0.0), t.speedup)
    return out


def score(proposals: list[str], measured: dict[str, float]) -> dict:
    best_text = max(measured, key=measured.get)
    known = [measured[p] for p in proposals if p in measured]
    return {"hit_best": best_text in proposals, "measured": len(known),
            "known_b8": max(known) / measured[best_text] if known else None}


def recorded_problems(path: Path) -> tuple[dict, list[str]]:
    """Problem -> {program text: speedup} from a GPU evaluation's rows, and its backends."""
    import gzip

    from gemmgen.dsl import parse

    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        report = json.load(f)
    measured_of = {}
    for row in report["rows"]:
        speedups = measured_of.setdefault(parse(next(iter(row["candidates"].values()))[0]).problem, {})
        for method, texts in row.get("candidate_speedups", {}).items():
            for text, speedup in zip(row["candidates"][method], texts):
                if speedup:
                    speedups[text] = max(speedups.get(text, 0.0), speedup)
    return measured_of, report["summary"].get("backends") or []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=CHECKPOINT")
    ap.add_argument("--policy-modes", default="sample", help="comma-separated policy modes: sample, rank")
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None, help="first N held-out problems only")
    ap.add_argument("--recorded", type=Path, help="a policy_eval.json[.gz] whose candidates' speedups to score on")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from gemmgen.dsl import to_text
    from gemmgen.policy.training import data
    from gemmgen.policy.lm_proposer import PolicyProposer
    from gemmgen.policy.proposers import POLICY_MODES, HeuristicProposer
    from gemmgen.tuning_db import DEFAULT_DEVICE_NAME, shipped_database

    modes = [m.strip() for m in args.policy_modes.split(",") if m.strip()]
    if not modes or set(modes) - set(POLICY_MODES):
        ap.error(f"--policy-modes: choose from {', '.join(POLICY_MODES)}")
    if any("=" not in s for s in args.policy):
        ap.error("--policy takes NAME=CHECKPOINT, e.g. --policy shipped=policy/checkpoint")
    if args.k < 1 or (args.limit is not None and args.limit < 1):
        ap.error("-k and --limit count proposals and problems: give 1 or more")
    if args.recorded:
        if not args.recorded.is_file():
            ap.error(f"--recorded {args.recorded}: no such file")
        try:
            measured_of, backends = recorded_problems(args.recorded)
        except (ValueError, KeyError, IndexError, StopIteration) as e:
            ap.error(f"--recorded {args.recorded}: not a policy_eval.py report with candidates ({e!r})")
    else:
        db, backends = shipped_database(), []
        measured_of = {p: measured_speedups(db, p, DEFAULT_DEVICE_NAME) for p in data.heldout_problems()
                       if p.b_major == "row" and p.epilogue.signature == "f16"}
    problems = [p for p, measured in measured_of.items() if measured][: args.limit]
    if not problems:
        ap.error("no problem with a measured program to score against")
    proposers = {"heuristic": HeuristicProposer(backends) if backends else HeuristicProposer()}
    for name, path in (s.split("=", 1) for s in args.policy):
        for mode in modes:
            proposers[name if mode == "sample" else f"{name}:{mode}"] = PolicyProposer(path, mode=mode,
                                                                                       backends=backends)
    rows = []
    for problem in tqdm(problems, desc="held-out problems"):
        measured = measured_of[problem]
        row = {"problem": problem.key, "db_best": max(measured.values()), "programs_measured": len(measured)}
        for name, proposer in proposers.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                texts = [to_text(p) for p in proposer.propose(problem, args.k, seed=0)]
            row[name] = score(texts, measured) | {"proposed": len(texts)}
        rows.append(row)
    summary = {}
    for name in proposers:
        known = [r[name]["known_b8"] for r in rows if r[name]["known_b8"]]
        summary[name] = {"problems": len(rows), "hit_best": sum(r[name]["hit_best"] for r in rows),
                         "with_a_measured_proposal": len(known),
                         "known_b8_geomean": round(geomean(known), 4) if known else None,
                         "measured_per_problem": round(sum(r[name]["measured"] for r in rows) / len(rows), 2),
                         "proposed_per_problem": round(sum(r[name]["proposed"] for r in rows) / len(rows), 2)}
    args.out.mkdir(parents=True, exist_ok=True)
    problem_set = str(args.recorded) if args.recorded else "held-out grid problems, the shipped records"
    (args.out / "policy_offline_eval.json").write_text(json.dumps(
        {"k": args.k, "problems": problem_set, "summary": summary, "rows": rows}, indent=1))
    print(f"{'proposer':12} {'problems':>8} {'hit best':>8} {'measured/pr':>11} {'known b8 / db best':>19}")
    for name, s in summary.items():
        print(f"{name:12} {s['problems']:8d} {s['hit_best']:8d} {s['measured_per_problem']:11.2f} "
              f"{s['known_b8_geomean'] or float('nan'):19.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
