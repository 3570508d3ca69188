"""`gemmgen db stats | show M N K | export FILE | merge FILE`: look into and move tuning results."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from gemmgen.compile import as_problem
from gemmgen.errors import GemmgenError
from gemmgen.tuning_db import Database, default_db_path, shipped_database
from gemmgen.tuning_db.exchange import export, merge


def register(subparsers) -> None:
    db = subparsers.add_parser("db", help="inspect, export and merge tuning databases",
                               description="Inspect, export and merge tuning databases.")
    db.add_argument("--db", metavar="PATH",
                    help="database file (default: GEMMGEN_DB or ~/.cache/gemmgen/tuning.sqlite)")
    sub = db.add_subparsers(dest="db_command", metavar="ACTION")
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS, help="database file")

    stats = sub.add_parser("stats", parents=[common], help="counts of problems, trials and winners")
    stats.add_argument("--shipped", action="store_true", help="the shipped records instead of --db")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(func=_stats)

    show = sub.add_parser("show", parents=[common], help="the trials and the winner of one problem")
    show.add_argument("m", type=int)
    show.add_argument("n", type=int)
    show.add_argument("k", type=int)
    show.add_argument("--a-major", choices=("row", "col"), default="row")
    show.add_argument("--b-major", choices=("row", "col"), default="row")
    show.add_argument("--epilogue", default=None, help="e.g. 'bias=n gelu' (default: none)")
    show.add_argument("--device", default=None, help="GPU name (default: every GPU)")
    show.add_argument("--shipped", action="store_true", help="the shipped records instead of --db")
    show.add_argument("--programs", action="store_true", help="print each trial's program text")
    show.set_defaults(func=_show)

    export = sub.add_parser("export", parents=[common], help="write sorted JSON lines, one trial each (diff-friendly)")
    export.add_argument("file")
    export.add_argument("--shipped", action="store_true", help="the shipped records instead of --db")
    export.add_argument("--winners-only", action="store_true",
                        help="only each problem's winning trial per GPU (what gemmgen.compile reads)")
    export.set_defaults(func=_export)

    merge = sub.add_parser("merge", parents=[common], help="import an export file or another database file")
    merge.add_argument("file")
    merge.set_defaults(func=_merge)


def _open(args: argparse.Namespace, *, create: bool = False):


    if getattr(args, "shipped", False):
        return shipped_database(fresh=True)
    path = Path(args.db) if args.db else default_db_path()
    if not create and not path.is_file():
        raise GemmgenError(f"{path}: no tuning database here yet (`gemmgen tune` or `gemmgen db merge` "
                           "creates it; --shipped reads the records gemmgen ships)")
    return Database(path)


def _stats(args) -> int:
    with _open(args) as db:
        stats = db.stats()
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    print(f"database: {stats['path']} (schema v{stats['schema_version']})")
    print(f"problems: {stats['problems']}   trials: {stats['trials']}")
    for title in ("by_status", "by_backend"):
        items = ", ".join(f"{k} {v}" for k, v in stats[title].items()) or "-"
        print(f"trials {title.replace('_', ' ')}: {items}")
    for gpu, w in stats["winners"].items() or ():
        print(f"winners on {gpu}: {w['problems']} problems, geomean speedup over the best baseline "
              f"{w['geomean_speedup']:.3f}x")
    if not stats["winners"]:
        print("winners: none (no trial has beaten its run's best baseline beyond its noise)")
    served = ", ".join(f"{gpu} {n}" for gpu, n in stats["library_winners"].items()) or "none"
    print(f"library choices: {stats['library_choices']}; problems they serve: {served}")
    return 0


def _show(args) -> int:
    problem = as_problem((args.m, args.n, args.k), a_major=args.a_major, b_major=args.b_major,
                         epilogue=args.epilogue)
    with _open(args) as db:
        trials = list(db.trials(problem.key, args.device))
        library = list(db.library_choices(problem.key, args.device))
        devices = sorted({t.device.name for t in trials})
        winners = {d: db.winner(problem, d) for d in devices}
        serving = {c.id for d in {c.device.name for c in library} for c in db.library_winners(d)}
    print(f"problem {problem.key}: {len(trials)} trials, {len(library)} library choices")
    for c in library:
        mark = " * serves it" if c.id in serving else ""
        noise = f" (noise {100 * c.noise:.1f}%)" if c.noise is not None else ""
        if c.server_ms and c.torch_server_ms:
            noise += f"; server mode {c.torch_server_ms / c.server_ms:.3f}x"
        timed = (f"{c.device_ms:.4f} ms (spread {100 * (c.spread or 0):.1f}%) vs torch.matmul {c.torch_ms:.4f} ms, "
                 f"{c.speedup:.3f}x{noise}" if c.speedup else "not timed")
        print(f"  {c.library} {c.version} on {c.device.name}, {c.created[:19]}: "
              f"{'passed' if c.check_passed else 'FAILED its check'}, {timed}{mark}")
        print("    " + ", ".join(f"{k}={v}" for k, v in sorted(c.config.items())))
    if not trials:
        return 0
    # margin: what the speedup must exceed 1 by to win, the paired noise (schema 6) or the spread
    print(f"{'id':>6} {'status':<12} {'backend':<8} {'device ms':>10} {'margin':>7} "
          f"{'best base ms':>12} {'speedup':>8}  device / proposer")
    for t in sorted(trials, key=lambda t: (t.device.name, t.device_ms or float("inf"), t.id)):
        best = t.best_baseline
        win = winners.get(t.device.name)
        mark = " *" if win is not None and win.id == t.id else ""
        ms = f"{t.device_ms:.4f}" if t.device_ms else "-"
        margin = f"{100 * t.margin:.1f}%" if t.margin is not None else "-"
        base = f"{best[1].device_ms:.4f}" if best else "-"
        speed = f"{t.speedup:.3f}x" if t.speedup else "-"
        print(f"{t.id:>6} {t.status:<12} {t.backend:<8} {ms:>10} {margin:>7} {base:>12} {speed:>8}  "
              f"{t.device.name} / {t.proposer} {t.proposer_version}{mark}")
        if t.status != "ok" and (t.build_msg or t.check_msg):
            print(f"{'':>6} {(t.build_msg or t.check_msg).splitlines()[0][:110]}")
        if args.programs:
            print("".join(f"{'':>8}{line}\n" for line in t.program.splitlines()), end="")
    for device, win in winners.items():
        print(f"winner on {device}: " + (f"trial #{win.id}" if win else
                                         "none (nothing beat the best baseline beyond its noise)"))
    return 0


def _export(args) -> int:
    with _open(args) as db:
        count = export(db, args.file, winners_only=args.winners_only)
    print(f"wrote {count} records to {args.file}")
    return 0


def _merge(args) -> int:
    with _open(args, create=True) as db:
        new, seen = merge(db, args.file)
        path = db.path
    print(f"merged {args.file} into {path}: {new} new records, {seen} already present")
    return 0
