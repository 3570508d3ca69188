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

`--policy-modes sample,rank,blend` evaluates each policy in each mode named (`PolicyProposer.mode`),
all but sampling named NAME:mode.

`--recorded FILE` scores on the problems of a GPU evaluation instead (a `policy_eval.json[.gz]`
of `benchmarks/policy_eval.py` whose rows keep `candidate_speedups`, e.g. the unseen problems of
`benchmarks/results/policy_eval_unseen/rank/`): measured there means one of the candidates that
run timed (speedups over torch.matmul, the same ratio within a problem), and every proposer
draws from the backends that run did. It also blends the run's own lists as `PolicyProposer`'s
"blend" mode would have (the heuristic's first k // 2, then the policy's list): every program
of that is timed, so `run_lists_blend` is a measured comparison with the heuristic's best of k.
"""
from __future__ import annotations

import argparse
import gzip
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


def read_report(path: Path) -> dict:
    """A policy_eval.py report (JSON, gzipped or not)."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return json.load(f)


def _speedups(row: dict) -> dict[str, float]:
    """Program text -> its best speedup among a report row's timed candidates."""
    speedups: dict[str, float] = {}
    for method, texts in row.get("candidate_speedups", {}).items():
        for text, speedup in zip(row["candidates"][method], texts):
            if speedup:
                speedups[text] = max(speedups.get(text, 0.0), speedup)
    return speedups


def recorded_problems(report: dict) -> tuple[dict, list[str]]:
    """Problem -> {program text: speedup} from a GPU evaluation's rows, and its backends."""
    from gemmgen.dsl import parse

    measured_of = {}
    for row in report["rows"]:
        problem = parse(next(iter(row["candidates"].values()))[0]).problem
        measured_of.setdefault(problem, {}).update(_speedups(row))
    return measured_of, report["summary"].get("backends") or []


def run_lists_blend(report: dict, k: int) -> dict | None:
    """The blend mode on the run's own lists, all of them timed there: the heuristic's first
    k // 2, then the policy's list (its ranking in a `rank` run); its best over the heuristic's
    best of k, per problem, geomean."""
    from gemmgen.policy.proposers import blended

    ratios = []
    for row in report["rows"]:
        lists, speedups = row["candidates"], _speedups(row)
        heuristic, policy = lists.get("heuristic_b8", [])[:k], lists.get("policy_b8", [])
        if not heuristic or not policy or not all(t in speedups for t in heuristic + policy):
            continue
        blend = blended(heuristic, policy, k)
        ratios.append(max(speedups[t] for t in blend) / max(speedups[t] for t in heuristic))
    if not ratios:
        return None
    return {"policy_mode": report["summary"].get("policy_mode"), "problems": len(ratios),
            "over_heuristic_best": round(geomean(ratios), 4),
            "better": sum(r > 1.01 for r in ratios), "worse": sum(r < 0.99 for r in ratios)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=CHECKPOINT")
    ap.add_argument("--policy-modes", default="sample", help="comma-separated policy modes: sample, rank, blend")
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
            report = read_report(args.recorded)
            measured_of, backends = recorded_problems(report)
            blend_of_run = run_lists_blend(report, args.k)
        except (ValueError, KeyError, IndexError, StopIteration, TypeError, AttributeError) as e:
            ap.error(f"--recorded {args.recorded}: not a policy_eval.py report with candidates ({e!r})")
    else:
        db, backends, blend_of_run = shipped_database(), [], None
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
    with gzip.open(args.out / "policy_offline_eval.json.gz", "wt") as f:     # rows of every proposer: gzipped
        json.dump({"k": args.k, "problems": problem_set, "summary": summary, "rows": rows,
                   **({"run_lists_blend": blend_of_run} if blend_of_run else {})}, f, indent=1)
    print(f"{'proposer':12} {'problems':>8} {'hit best':>8} {'measured/pr':>11} {'known b8 / db best':>19}")
    for name, s in summary.items():
        print(f"{name:12} {s['problems']:8d} {s['hit_best']:8d} {s['measured_per_problem']:11.2f} "
              f"{s['known_b8_geomean'] or float('nan'):19.3f}")
    if blend_of_run:
        b = blend_of_run
        print(f"the run's own lists blended (its {b['policy_mode']} list after the heuristic's first {args.k // 2}): "
              f"best {b['over_heuristic_best']:.3f}x the heuristic's best of {args.k} over {b['problems']} problems, "
              f"better at {b['better']}, worse at {b['worse']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
