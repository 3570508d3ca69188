"""Held-out evaluation of the policy on the H200: speedup over torch.matmul of five ways to pick a kernel.

Problems (gemmgen.policy.training.data), never trained on: with `--problems heldout` (the
default) the fixed held-out 20 % of benchmarks/shapes/cudal2_1000.csv (seeded hash) and the
off-grid x @ W.T problems M in {1, 7, 33, 1000, 3000}, N = 11008, K = 4096; with `--problems
unseen` the layer set's held-out families at their own widths (x @ W.T, every M) and 100 random
off-grid shapes, each with B row-major and column-major. With --max-problems (or a short
--time-budget), a fixed subset spread over sizes: the off-grid five first, then held-out grid
shapes in a seeded random order; or held-out layers and random shapes in turn, half each.

Per problem, every candidate of every method is built and measured once through the tuning loop
(pairs the database already holds are read back, not timed again), then each method scores the
best checked time among its own candidates:
  policy_b1      the policy's first program: its greedy answer (`--policy-mode sample`, the
                 default) or the space's program it finds most likely (`rank` and `blend`)
  policy_b8      the policy's 8 programs: greedy first, then samples; or the space's 8 most likely;
                 or (`blend`) the heuristic's first 4, then the space's most likely
  random_b8      8 valid programs of the RandomProposer
  heuristic_b8   the HeuristicProposer's top 8
  space_all      every valid program of the backends' spaces (the exhaustive best), at the first
                 --space-problems problems only
  db_best        the best checked program the database holds for the problem (prior tuning runs
                 and this run together); db_prior is the same before this run
Each row also keeps every candidate's program text and speedup (`candidates`,
`candidate_speedups`). Speedup = torch.matmul time / kernel time, both from the same run
(offline, cold L2); each method scores its program with the best speedup, not its fastest kernel
time, which would let a method read above db_best where trials came from sessions at other
clocks.

    python benchmarks/policy_eval.py --out benchmarks/results/policy_eval --time-budget 150

On G GPUs, one torchrun rank each: every rank takes the next problem from one shared counter,
measures on its own GPU into its own database and writes its rows (DIR/rank<R>/policy_eval.json)
after every problem; rank 0 gathers the records into --db and the rows into one report. A rank
that dies loses only the problem it was measuring; the same command again measures only that
(gemmgen.tune.distributed):

    torchrun --nproc-per-node 8 benchmarks/policy_eval.py --distributed --out DIR --time-budget 600

Or by hand, one process per GPU with --shard i/n (same --max-problems, one shared database),
then one table from the shards:

    python benchmarks/policy_eval.py --out DIR --merge DIR0/policy_eval.json DIR1/policy_eval.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
import warnings
from pathlib import Path

from gemmgen.measure.numerics import geomean
from gemmgen.measure.plots import save_png
from gemmgen.policy.proposers import POLICY_MODES
from gemmgen.tune.distributed import GATHER_TIMEOUT_S, Rank, connect, pin_gpu, share_out

METHODS = ("policy_b1", "policy_b8", "random_b8", "heuristic_b8", "space_all", "db_prior", "db_best")
SPACE_SLACK = 256    # trials beyond the three methods' k each, above any union of backend spaces


def pick_problems(limit: int | None, shard_spec: str | None = None, seed: int = 0, which: str = "heldout"):
    """The problems to judge on, in the order measured (a run the time budget cuts short still
    covers every size): `heldout`, the off-grid five first, then grid problems spread over sizes in
    a seeded random order; `unseen`, held-out layers and random off-grid shapes taken in turn, each
    spread over sizes and then in a seeded random order, a random shape's two majors together."""
    from gemmgen.measure.shapes import shard

    if which == "unseen":
        return _pick_unseen(limit, shard_spec, seed)
    from gemmgen.policy.training.data import OFFGRID_M, heldout_problems

    problems = heldout_problems()
    offgrid = [p for p in problems if p.b_major == "col" and p.m in OFFGRID_M]
    grid = sorted((p for p in problems if p not in offgrid), key=lambda p: p.flops)
    if limit is not None and limit < len(problems):
        grid = spread(grid, max(0, limit - len(offgrid)))
        offgrid = offgrid[:limit]
    picked = shard(offgrid + grid, shard_spec)
    offgrid = [p for p in picked if p in offgrid]
    grid = [p for p in picked if p not in offgrid]
    random.Random(seed).shuffle(grid)
    return offgrid + grid


def spread(items: list, count: int) -> list:
    """`count` of `items` (sorted by size) at even steps."""
    if count >= len(items):
        return list(items)
    step = len(items) / max(1, count)
    return [items[int(i * step)] for i in range(count)]


def _pick_unseen(limit: int | None, shard_spec: str | None, seed: int):
    from gemmgen.measure.shapes import shard
    from gemmgen.policy.training.data import heldout_layer_problems, unseen_random_pairs

    layers = sorted(heldout_layer_problems(), key=lambda p: p.flops)
    pairs = sorted(unseen_random_pairs(), key=lambda pair: pair[0].flops)
    if limit is not None and limit < len(layers) + 2 * len(pairs):
        pairs = spread(pairs, limit // 4)               # a quarter of the limit, two problems each
        layers = spread(layers, limit - 2 * len(pairs))
    random.Random(seed).shuffle(layers)
    random.Random(seed).shuffle(pairs)
    ordered, turns = [], max(len(layers), len(pairs))
    for i in range(turns):                          # in turn, each list at its own even steps
        ordered += layers[i * len(layers) // turns:(i + 1) * len(layers) // turns]
        for pair in pairs[i * len(pairs) // turns:(i + 1) * len(pairs) // turns]:
            ordered += pair
    return shard(ordered, shard_spec)


def best_speedups(db, problem, device_name):
    """program text -> its best speedup over torch.matmul timed in the same run, over its
    checked trials in the database. Each trial is judged against its own session's torch.matmul
    (trials read back may come from other sessions, at other clocks), so a method's best is
    never above the database's best."""
    out = {}
    for t in db.trials(problem.key, device_name):
        speedup = t.speedups().get("torch") if t.status == "ok" and t.check_passed else None
        if speedup:
            out[t.program] = max(out.get(t.program, 0.0), speedup)
    return out


def method_speedup(texts, speedups):
    """The best speedup among `texts` that have a checked time (None if none)."""
    best = [speedups[t] for t in texts if t in speedups]
    return max(best) if best else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--time-budget", type=float, default=300.0, metavar="S",
                        help="stop measuring new problems after S seconds (default 300)")
    parser.add_argument("--problems", choices=("heldout", "unseen"), default="heldout",
                        help="heldout: the grid's held-out fifth and the off-grid five; unseen: the layer set's "
                             "held-out families and 100 random off-grid shapes in both majors")
    parser.add_argument("--max-problems", type=int, default=None,
                        help="how many held-out problems (default: as many as the budget allows, about 1 per 15 s)")
    parser.add_argument("--space-problems", type=int, default=0, metavar="N",
                        help="at the first N problems also measure every valid program of the spaces "
                             "(space_all: the exhaustive best, about 50 more trials a problem)")
    parser.add_argument("--checkpoint", default=None, help="policy to evaluate (default: the shipped one)")
    parser.add_argument("--policy-mode", choices=POLICY_MODES, default="sample",
                        help="sample: constrained samples; rank: the spaces' programs by the model's likelihood")
    parser.add_argument("--db", default=None, help="tuning database (default: GEMMGEN_DB or the user's)")
    parser.add_argument("--backends", default="triton,cutlass,cuda")
    parser.add_argument("-k", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="evaluate every N-th of the picked problems from the I-th (one process per GPU)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="measure nothing: one table and plot from the policy_eval.json of several shards")
    parser.add_argument("--distributed", action="store_true",
                        help="one rank of `torchrun --nproc-per-node G benchmarks/policy_eval.py --distributed ...`: "
                             "the problems shared out over G GPUs, one report")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))

    if args.distributed and args.shard:
        parser.error("--distributed shares the problems out itself: leave out --shard")
    rank = None
    if args.distributed:
        rank = Rank.from_env(how="benchmarks/policy_eval.py --distributed ...")
        pin_gpu(rank)                                        # before anything starts CUDA
    import torch

    from gemmgen.policy.lm_proposer import PolicyProposer
    from gemmgen.policy.training.reward import BaselinesOnce
    from gemmgen.tune.adapters import PoolBuilder, WorkerRunner
    from gemmgen.tuning_db import Database, default_db_path

    warnings.simplefilter("ignore")
    cores = rank.cores() if rank else None
    torch.set_num_threads(min(8, cores or torch.get_num_threads()))   # shards share the host's cores
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    backends = tuple(b for b in args.backends.split(",") if b)
    limit = args.max_problems if args.max_problems is not None else max(5, int(args.time_budget // 15))
    problems = pick_problems(limit, args.shard, args.seed, args.problems)
    policy = PolicyProposer(args.checkpoint, backends=backends, mode=args.policy_mode)
    meta = {"problem_set": args.problems, "problems_planned": len(problems), "checkpoint": args.checkpoint or "shipped",
            "policy_version": policy.version, "policy_mode": args.policy_mode, "backends": list(backends), "k": args.k,
            "shard": args.shard, "space_problems": args.space_problems}
    settings = dict(policy=policy, backends=backends, k=args.k, seed=args.seed, builder=PoolBuilder(jobs=cores),
                    space_keys=frozenset(p.key for p in problems[:args.space_problems]))
    db_path = Path(args.db) if args.db else default_db_path()
    # torch.matmul is the one baseline the speedups use.
    with WorkerRunner(baselines=("torch",)) as raw_runner:
        runner = BaselinesOnce(raw_runner)
        if rank is not None:
            eval_rank(problems, rank, connect(rank), db_path=db_path, out=out, meta=meta, runner=runner,
                      time_budget_s=args.time_budget, **settings)
            return 0
        rows = []

        def on_row(row):
            rows.append(row)
            print_row(row, started)
            write_json(rows, out, {**meta, "wall_s": round(time.monotonic() - started, 1), "partial": True})

        with Database(db_path) as db:
            evaluate(problems, db=db, runner=runner, time_budget_s=args.time_budget, on_row=on_row, **settings)
    write_report(rows, out, {**meta, "wall_s": round(time.monotonic() - started, 1)})
    return 0


def evaluate(problems, *, policy, backends, k: int, seed: int, builder, runner, db, time_budget_s, on_row,
             space_keys: frozenset = frozenset()) -> None:
    """Measure every method's candidates for `problems` in one tuning-loop call (proposing and
    building the next shapes overlap measuring this one; the budget holds the union of the three
    methods' k programs, and the spaces' every valid program at the problems of `space_keys`);
    `on_row(row)` once each problem is measured."""
    from gemmgen.tune import tune

    candidates = EvalCandidates(policy, backends, k, seed, db, runner.device.name, space_keys)
    budget = 3 * k + (SPACE_SLACK if space_keys else 0)
    tune(problems, proposer=candidates, builder=builder, runner=runner, db=db, budget=budget,
         time_budget_s=time_budget_s, progress=False, build_chunk=4, on_shape=lambda p: on_row(candidates.row(p)))


def rank_dir(out: Path, rank: int) -> Path:
    """Where one rank of a --distributed run writes its rows."""
    return out / f"rank{rank}"


def eval_rank(problems, rank, store, *, db_path: Path, out: Path, meta: dict, time_budget_s: float,
              gather_timeout_s: float = GATHER_TIMEOUT_S, **settings) -> dict:
    """One rank of a --distributed run: problems from the shared counter, each evaluated into
    this rank's database, its rows written after each; rank 0 then writes the one report from
    every rank's rows (a rank that died: up to its last problem). Returns `share_out`'s dict."""
    started = time.monotonic()
    rows = []
    own = {**meta, "shard": f"rank {rank.rank}/{rank.world}", "problems_planned": None}

    def write():
        write_json(rows, rank_dir(out, rank.rank), {**own, "wall_s": round(time.monotonic() - started, 1)})

    def on_row(row):
        rows.append(row)
        print_row(row, started)
        write()

    def one(problem, db):
        left = max(0.0, time_budget_s - (time.monotonic() - started))
        evaluate([problem], db=db, time_budget_s=left, on_row=on_row, **settings)

    write()                                # this run's rows only, never an earlier run's
    done = share_out(problems, rank, store, db_path=db_path, work=one, gather_timeout_s=gather_timeout_s,
                     stop=lambda: time.monotonic() - started > time_budget_s)
    if rank.rank == 0:
        parts = [rank_dir(out, r) / "policy_eval.json" for r in range(rank.world)]
        merge([p for p in parts if p.is_file()], out, problems_planned=len(problems), ranks=rank.world,
              lost_ranks=done["lost_ranks"], wall_s=round(time.monotonic() - started, 1))
    return done


def print_row(row, started: float) -> None:
    scores = "  ".join(f"{m} {row[m]:.3f}" if row.get(m) else f"{m} -" for m in METHODS)
    print(f"[{time.monotonic() - started:6.0f} s] {row['problem']}: {scores}", flush=True)


class EvalCandidates:
    """The tuning loop's proposer for this evaluation: per problem, the union of every method's
    candidates, proposed when the loop reaches the problem (remembered, to score each method)."""

    name = "policy_eval"
    version = ""

    def __init__(self, policy, backends, k: int, seed: int, db, device_name: str, space_keys=frozenset()):
        from gemmgen.policy.proposers import HeuristicProposer, RandomProposer

        self.policy, self.k, self.seed, self.db, self.device_name = policy, k, seed, db, device_name
        self.space_keys = space_keys
        self.random, self.heuristic = RandomProposer(backends), HeuristicProposer(backends)
        self.plans: dict[str, tuple] = {}

    def propose(self, problem, budget: int, *, seed=None):
        from gemmgen.dsl import parse, to_text

        t0 = time.monotonic()
        policy_programs = self.policy.propose(problem, self.k, seed=self.seed)
        propose_s = time.monotonic() - t0
        # a blend's list opens with the heuristic's picks; its best-of-1 is the model's own first
        # (any Proposer may stand in for the policy here; only PolicyProposer has modes)
        blend = getattr(self.policy, "mode", "sample") == "blend"
        first = self.policy.last_ranking[:1] if blend else policy_programs[:1]
        texts = {
            "policy_b1": [to_text(p) for p in first],
            "policy_b8": [to_text(p) for p in policy_programs],
            "random_b8": [to_text(p) for p in self.random.propose(problem, self.k, seed=self.seed)],
            "heuristic_b8": [to_text(p) for p in self.heuristic.propose(problem, self.k)],
        }
        if problem.key in self.space_keys:     # every valid program of the spaces: the exhaustive best
            texts["space_all"] = [to_text(p) for p in self.heuristic.ranked(problem)]
        prior = best_speedups(self.db, problem, self.device_name)
        self.plans[problem.key] = (texts, propose_s, dict(self.policy.last_stats), prior)
        return [parse(t) for t in dict.fromkeys(t for group in texts.values() for t in group)][:budget]

    def row(self, problem) -> dict:
        texts, propose_s, stats, prior = self.plans[problem.key]
        times = best_speedups(self.db, problem, self.device_name)
        row = {"problem": problem.key, "m": problem.m, "n": problem.n, "k": problem.k,
               "b_major": problem.b_major, "gflop": problem.gflop, "policy_propose_s": round(propose_s, 3),
               "policy_stats": stats, "candidates": texts}
        # each candidate's own speedup, in the candidates' order (None: no checked time), so that a
        # proposer's ranking can be studied later without the run's database
        row["candidate_speedups"] = {method: [times.get(t) for t in group] for method, group in texts.items()}
        for method, group in texts.items():
            row[method] = method_speedup(group, times)
        row["db_prior"] = method_speedup(list(prior), prior)
        row["db_best"] = method_speedup(list(times), times)
        return row


def write_json(rows, out: Path, meta: dict) -> dict:
    summary = {**summarize(rows), **meta}
    out.mkdir(parents=True, exist_ok=True)
    (out / "policy_eval.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return summary


def write_report(rows, out: Path, meta: dict) -> None:
    summary = write_json(rows, out, meta)
    plot(rows, out / "policy_eval.png")
    print_table(summary)


def merge(paths, out: Path, **meta) -> int:
    """One report from shards: their rows together; the wall time is the longest shard's;
    `meta` is said in the summary too, over what the shards say."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    versions = {d["summary"].get("policy_version") for d in docs}
    if len(versions) > 1:
        raise SystemExit(f"--merge: the shards evaluated different policies {sorted(map(str, versions))}")
    first = docs[0]["summary"]
    rows = [r for d in docs for r in d["rows"]]
    write_report(rows, out, {
        "wall_s": max(d["summary"].get("wall_s") or 0 for d in docs),
        "problems_planned": sum(d["summary"].get("problems_planned") or 0 for d in docs),
        **{k: first.get(k) for k in ("problem_set", "checkpoint", "policy_version", "policy_mode", "backends",
                                     "k")},
        "shards": [d["summary"].get("shard") for d in docs], **meta})
    return 0


def summarize(rows):
    summary = {"problems": len(rows)}
    for m in METHODS:
        values = [r[m] for r in rows if r.get(m)]
        summary[m] = {"geomean_speedup_vs_torch": geomean(values), "measured": len(values)}
    for a, b in RATIOS:
        summary[f"{a}_over_{b}"] = ratio(rows, a, b)
    return summary


# Method over method, each a geomean over the problems where both have a checked program.
RATIOS = (("policy_b8", "db_best"), ("policy_b8", "random_b8"), ("policy_b8", "heuristic_b8"),
          ("policy_b8", "space_all"), ("heuristic_b8", "space_all"))


def ratio(rows, a: str, b: str):
    pairs = [(r[a], r[b]) for r in rows if r.get(a) and r.get(b)]
    return {"geomean": geomean([x / y for x, y in pairs]), "problems": len(pairs)} if pairs else None


def plot(rows, path):
    """Left: each method over the database's best, problems sorted (how often a method gets
    close); right: speedup over torch.matmul against size. Readable at any problem count."""
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for m in METHODS[:4]:
        ratios = sorted(r[m] / r["db_best"] for r in rows if r.get(m) and r["db_best"])
        if ratios:
            left.plot([(i + 0.5) / len(ratios) for i in range(len(ratios))], ratios, label=m)
    left.axhline(0.95, color="grey", linewidth=0.8, linestyle="--")
    left.set_xlabel("fraction of held-out problems (sorted)")
    left.set_ylabel("best of the method / database's best")
    left.legend(fontsize=8)
    for m, marker in (("random_b8", "x"), ("heuristic_b8", "+"), ("policy_b8", "o"), ("db_best", ".")):
        pts = [(r["gflop"], r[m]) for r in rows if r[m]]
        right.scatter([x for x, _ in pts], [y for _, y in pts], marker=marker, s=18, label=m,
                      facecolors="none" if marker == "o" else None)
    right.axhline(1.0, color="k", linewidth=0.8)
    right.set_xscale("log")
    right.set_xlabel("GFLOP")
    right.set_ylabel("speedup over torch.matmul")
    right.legend(fontsize=8)
    fig.suptitle(f"policy on {len(rows)} held-out problems")
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


def print_table(summary):
    print(f"\nheld-out problems measured: {summary['problems']} (wall {summary.get('wall_s')} s)")
    print(f"{'method':<14}{'geomean speedup vs torch':>26}{'problems':>10}")
    for m in METHODS:
        s = summary[m]
        value = f"{s['geomean_speedup_vs_torch']:.3f}" if s["geomean_speedup_vs_torch"] else "-"
        print(f"{m:<14}{value:>26}{s['measured']:>10}")
    for a, b in RATIOS:
        v = summary.get(f"{a}_over_{b}")
        print(f"{a} / {b}: {v['geomean']:.3f} over {v['problems']} problems" if v else f"{a} / {b}: -")


if __name__ == "__main__":
    from gpu_main import run_main
    sys.exit(run_main(main))
