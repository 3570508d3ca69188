"""How well the roofline prior (`gemmgen.backends.ranking`) orders programs the H200 measured,
and what the records say its split-K summing costs are (CPU: no timing here, only the shipped
records' device times).

The heuristic proposer sorts each backend's space by the prior, so a prior that puts a slow
program first spends the tuning budget on it. Over the checked trials of the shipped records:

- per family (backend, mainloop, how split-K's partials are summed), the median of measured
  minus estimated time of the family's best program at each problem under 12 us (where fixed
  costs decide the order), and the summing cost a split family implies: its constant plus its
  median less the unsplit programs' median of the same backend;
- per problem with at least 3 measured programs, the measured time of the prior's first pick
  over the best's (top-1) and of the best of its first 4 (top-4), geomean over problems, for
  the prior as shipped and for the prior without the per-SM streaming cap and summing table;
- the same for the heuristic proposer's order (the spaces' programs the records hold, in the
  order it proposes them), with each prior;
- the prior's top-1 with other per-SM streaming rates in place of the hardware model's estimate
  (`SM90A.sm_load_bytes_per_s`), to show how much the order leans on that number.

Problems are split in two halves by a hash of their key: the implied costs come from the first,
the order is scored on the second, so the scored half did not set the constants it is scored
with. A proxy: the records hold mostly the programs the heuristic already picked, so an order
can only be scored among those.

    python3 benchmarks/prior_fit.py --out benchmarks/results/prior_fit
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import zlib
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm

from gemmgen.backends import ranking
from gemmgen.dsl import parse
from gemmgen.dsl.diagnostics import ProgramError
from gemmgen.errors import GemmgenError
from gemmgen.measure.numerics import geomean, median
from gemmgen.policy.proposers import HeuristicProposer
from gemmgen.tuning_db.exchange import read_jsonl
from gemmgen.tuning_db.records import Trial
from gemmgen.tuning_db.store import SHIPPED_FILES

SHIPPED = Path(__file__).resolve().parents[1] / "tuning_db" / "shipped" / SHIPPED_FILES[0]
SMALL_S = 12e-6
#: per-SM streaming rates to score the prior with (bytes/s), around the hardware model's 150 GB/s
SM_RATES = (60e9, 75e9, 100e9, 150e9, 250e9, 500e9)
#: the prior before the per-SM cap and the summing table: a second launch for every split
#: except the register ring's last-CTA sum
PLAIN = {"sm_load_bytes_per_s": math.inf,
         "split_reduce_s": {("cuda", "unordered"): 0.0, ("cuda", "atomic"): 0.0}}


def measured_programs(path: Path) -> dict[str, dict]:
    """Problem key -> {program: median device seconds} over the checked trials of `path`."""
    times: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    texts: dict[str, object] = {}
    for record in read_jsonl(path):
        if not isinstance(record, Trial) or record.status != "ok" or not record.check_passed or not record.device_ms:
            continue
        if record.program not in texts:
            try:
                texts[record.program] = parse(record.program)
            except ProgramError:
                texts[record.program] = None
        program = texts[record.program]
        if program is not None:
            times[record.problem.key][program].append(record.device_ms * 1e-3)
    return {key: {prog: median(v) for prog, v in progs.items()} for key, progs in times.items()}


def family(program) -> tuple[str, str, str]:
    return (program.backend, program.mainloop, program.split_k_reduce if program.split_k > 1 else "-")


def residuals(groups: dict[str, dict], **prior) -> dict[tuple, list[float]]:
    """Family -> measured minus estimated seconds of its best program, per problem under SMALL_S."""
    best: dict[tuple, tuple[float, object]] = {}
    for key, progs in groups.items():
        for prog, seconds in progs.items():
            slot = (key,) + family(prog)
            if slot not in best or seconds < best[slot][0]:
                best[slot] = (seconds, prog)
    out: dict[tuple, list[float]] = defaultdict(list)
    for slot, (seconds, prog) in best.items():
        estimate = ranking.estimated_seconds(prog, **prior)
        if estimate <= SMALL_S:
            out[slot[1:]].append(seconds - estimate)
    return out


def implied_summing(res: dict[tuple, list[float]]) -> dict[str, float]:
    """(backend, reduce) -> the summing cost that gives its split programs the unsplit median."""
    unsplit = defaultdict(list)
    for (backend, _, reduce), values in res.items():
        if reduce == "-":
            unsplit[backend] += values
    split = defaultdict(list)
    for (backend, _, reduce), values in res.items():
        if reduce != "-" and unsplit[backend]:
            split[(backend, reduce)] += values
    out = {}
    for (backend, reduce), values in split.items():
        now = ranking.SPLIT_REDUCE_S.get((backend, reduce), ranking.REDUCE_LAUNCH_S)
        out[f"{backend} {reduce}"] = {"implied_us": (now + median(values) - median(unsplit[backend])) * 1e6,
                                      "shipped_us": now * 1e6, "problems": len(values)}
    return out


def order_score(groups: dict[str, dict], keys, order_of, small_only: bool = False) -> dict:
    """Top-1 and top-4 of `order_of(measured programs) -> the same, best first`, over `keys`."""
    top1, top4 = [], []
    for key in keys:
        progs = groups[key]
        problem = next(iter(progs)).problem
        if small_only and min(problem.m, problem.n) > 128:
            continue
        order = order_of(progs)
        if len(order) < 3:
            continue
        best = min(progs[prog] for prog in order)
        top1.append(progs[order[0]] / best)
        top4.append(min(progs[prog] for prog in order[:4]) / best)
    return {"problems": len(top1), "top1": geomean(top1), "top4": geomean(top4)}


def by_prior(**prior):
    return lambda progs: sorted(progs, key=lambda prog: ranking.estimated_seconds(prog, **prior))


def by_heuristic(**prior):
    """The heuristic proposer's order of the measured programs its spaces hold."""
    proposer = HeuristicProposer(estimate=functools.partial(ranking.estimated_seconds, **prior))

    def order_of(progs):
        problem = next(iter(progs)).problem
        return [prog for prog in proposer.ranked(problem) if prog in progs]
    return order_of


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=Path, default=SHIPPED, help="an export file (default: the shipped records)")
    ap.add_argument("--out", type=Path, help="folder for results.json")
    args = ap.parse_args(argv)
    if not args.records.is_file():
        print(f"error: {args.records}: no such file; pass --records with a `gemmgen db export` file",
              file=sys.stderr)
        return 2
    try:
        groups = {k: v for k, v in measured_programs(args.records).items() if len(v) >= 3}
    except GemmgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    halves = ([k for k in groups if zlib.crc32(k.encode()) % 2 == 0],
              [k for k in groups if zlib.crc32(k.encode()) % 2 == 1])
    fit_groups = {k: groups[k] for k in halves[0]}
    res = residuals(groups)
    result = {
        "records": args.records.name,
        "problems": {"fit": len(halves[0]), "scored": len(halves[1])},
        "residual_us": {" ".join(f): {"median": median(v) * 1e6, "problems": len(v)} for f, v in sorted(res.items())},
        "implied_summing": implied_summing(residuals(fit_groups)),
        "order": {},
    }
    orders = [(f"{how} {name}", make(**prior)) for how, make in (("prior", by_prior), ("heuristic", by_heuristic))
              for name, prior in (("shipped", {}), ("plain", PLAIN))]
    for name, order_of in tqdm(orders, desc="orders", unit="order"):
        result["order"][name] = {"all": order_score(groups, halves[1], order_of),
                                 "min(M, N) <= 128": order_score(groups, halves[1], order_of, small_only=True)}
    result["sm_rate_top1"] = {f"{rate / 1e9:g} GB/s": order_score(groups, halves[1], by_prior(sm_load_bytes_per_s=rate))["top1"]
                              for rate in SM_RATES}
    print(f"{len(groups)} problems with >= 3 measured programs; implied summing costs from "
          f"{len(halves[0])}, order scored on {len(halves[1])}")
    print("family (best program under 12 us)            median measured - estimated  problems")
    for name, row in result["residual_us"].items():
        print(f"  {name:42s} {row['median']:+7.2f} us  {row['problems']:5d}")
    print("summing cost      implied   shipped  problems")
    for name, row in result["implied_summing"].items():
        print(f"  {name:15s} {row['implied_us']:5.2f} us {row['shipped_us']:5.2f} us {row['problems']:5d}")
    print("order (measured time of the pick / the best)")
    for name, rows in result["order"].items():
        for subset, row in rows.items():
            if not row["problems"]:
                print(f"  {name:17s} {subset:18s} no problem with 3 of its programs measured")
                continue
            print(f"  {name:17s} {subset:18s} top-1 {row['top1']:.3f}  top-4 {row['top4']:.3f}  ({row['problems']} problems)")
    print("prior top-1 by per-SM streaming rate: " + ", ".join(f"{rate} {top1:.3f}"
                                                               for rate, top1 in result["sm_rate_top1"].items()))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
