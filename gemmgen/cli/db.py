"""`gemmgen db stats | list | show MxNxK | export FILE | merge FILE`: look into and move tuning results.

`show *xNxK` prints the dynamic-M table that `gemmgen.compile((None, N, K))` serves from.

The reading commands open the database read-only (they never create, migrate or write it) and, on
a fresh install with no database yet, read the records gemmgen ships.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Optional

from gemmgen.backends import registry as backend_registry
from gemmgen.compile import ShapeError, as_problem, parse_shape
from gemmgen.compile import compile as compile_kernel
from gemmgen.errors import GemmgenError
from gemmgen.tuning_db import DEFAULT_DEVICE_NAME, Database, default_db_path, shipped_database
from gemmgen.tuning_db.exchange import export, export_lines, merge_records, read_any

#: Rows `gemmgen db list` prints unless --limit says otherwise.
LIST_LIMIT = 50


def register(subparsers) -> None:
    db = subparsers.add_parser("db", help="inspect, export and merge tuning databases",
                               description="Inspect, export and merge tuning databases.")
    db.add_argument("--db", metavar="PATH",
                    help="database file (default: GEMMGEN_DB or ~/.cache/gemmgen/tuning.sqlite)")
    db.add_argument("--shipped", action="store_true", help="read the records gemmgen ships instead of --db")
    sub = db.add_subparsers(dest="db_command", metavar="ACTION")
    sub.required = True
    # The same options after the action as before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS, help="database file")
    common.add_argument("--shipped", action="store_true", default=argparse.SUPPRESS,
                        help="read the records gemmgen ships instead of --db")

    stats = sub.add_parser("stats", parents=[common], help="counts of problems, trials and winners")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(func=_stats)

    listing = sub.add_parser("list", parents=[common], help="the tuned problems and what serves each",
                             description="The tuned problems, one row per problem and GPU: shape, majors, "
                                         "epilogue, and what serves it (the winning program's backend and "
                                         "its speedup over the best baseline of its run, a library choice, "
                                         "or the baseline when nothing won).")
    for dim in "mnk":
        listing.add_argument(f"--{dim}", metavar="RANGE",
                             help=f"{dim.upper()}: a number (4096), a range (1024-8192), 1024- or -512")
    listing.add_argument("--shape", metavar="PATTERN", help="MxNxK, each part a number, a range or *, "
                                                            "e.g. 4096x*x1024-")
    listing.add_argument("--backend", help="what serves: triton, cutlass, cuda, library or baseline")
    listing.add_argument("--winners-only", action="store_true",
                         help="only problems a program or a library choice wins")
    listing.add_argument("--device", default=None, help="GPU name (default: every GPU)")
    listing.add_argument("--limit", type=int, default=LIST_LIMIT, help=f"at most this many rows "
                                                                         f"(default {LIST_LIMIT}; 0: all)")
    listing.set_defaults(func=_list)

    show = sub.add_parser("show", parents=[common], help="the trials and the winner of one problem "
                                                         "(*xNxK: the table of M for a dynamic batch)")
    show.add_argument("shape", metavar="MxNxK", nargs="+")
    show.add_argument("--a-major", choices=("row", "col"), default="row")
    show.add_argument("--b-major", choices=("row", "col"), default="row")
    show.add_argument("--epilogue", default=None, help="e.g. 'bias=n gelu' (default: none)")
    show.add_argument("--device", default=None, help="GPU name (default: every GPU)")
    show.add_argument("--programs", action="store_true", help="print each trial's program text")
    show.set_defaults(func=_show)

    export = sub.add_parser("export", parents=[common], help="write sorted JSON lines, one trial each (diff-friendly)")
    export.add_argument("file", help="the file to write (.gz: gzip-compressed); - writes to standard output")
    export.add_argument("--winners-only", action="store_true",
                        help="only each problem's winning trial per GPU (what gemmgen.compile reads)")
    export.set_defaults(func=_export)

    merge = sub.add_parser("merge", parents=[common], help="import an export file or another database file "
                                                           "(its records stay unverified until tuned here)")
    merge.add_argument("file")
    merge.set_defaults(func=_merge)


def _open(args: argparse.Namespace, *, write: bool = False) -> Database:
    """The database a command reads (read-only) or writes. Reading with no database yet, and no
    --db named, reads the shipped records."""
    if args.shipped:
        if write:
            raise GemmgenError("the shipped records cannot be changed; drop --shipped to merge into your "
                               "database (--db, or GEMMGEN_DB)")
        return shipped_database(fresh=True)
    path = Path(args.db) if args.db else default_db_path()
    if write:
        return Database(path)
    if not path.exists():
        if args.db:
            raise GemmgenError(f"{path}: no tuning database here yet (`gemmgen tune` or `gemmgen db merge` "
                               "creates it; --shipped reads the records gemmgen ships)")
        print(f"gemmgen: no tuning database at {path} yet (`gemmgen tune` or `gemmgen db merge` makes one); "
              "reading the shipped records", file=sys.stderr)
        return shipped_database(fresh=True)
    return Database(path, readonly=True)


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


def _shape(words: list[str]) -> tuple[int, int, int]:
    """The one MxNxK of `db show`; the old `M N K` form gets a message saying how to write it."""
    if len(words) == 3 and all(re.fullmatch(r"[+-]?\d+", w) for w in words):
        raise GemmgenError(f"`gemmgen db show` takes the shape as MxNxK, like every other command: "
                           f"write `gemmgen db show {'x'.join(words)}`")
    if len(words) != 1:
        raise GemmgenError(f"give one shape as MxNxK, e.g. 4096x4096x4096 (got {' '.join(words)!r})")
    return parse_shape(words[0])


def _show(args) -> int:
    if len(args.shape) == 1 and args.shape[0].startswith("*"):
        return _show_dynamic(args)
    problem = as_problem(_shape(args.shape), a_major=args.a_major, b_major=args.b_major,
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
        mark += " (merged: unverified, never serves)" if c.unverified else ""
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
        mark += " (merged: unverified, never serves)" if t.unverified else ""
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


def _show_dynamic(args) -> int:
    """`db show *xNxK`: the rows of M that gemmgen.compile((None, N, K)) serves, and how."""
    text = args.shape[0]
    try:
        _, n, k = parse_shape("1" + text[1:])
    except ShapeError:
        raise GemmgenError(f"shape {text!r}: write *xNxK for every M at N and K, e.g. *x4096x4096") from None
    with _open(args) as db:
        kernel = compile_kernel((None, n, k), a_major=args.a_major, b_major=args.b_major, epilogue=args.epilogue,
                                device=args.device or DEFAULT_DEVICE_NAME, db=db)
        print(kernel.describe())
    return 0


def _export(args) -> int:
    with _open(args) as db:
        if args.file == "-":
            sys.stdout.writelines(line + "\n" for line in export_lines(db, winners_only=args.winners_only))
            return 0
        count = export(db, args.file, winners_only=args.winners_only)
    print(f"wrote {count} records to {args.file}")
    return 0


def _merge(args) -> int:
    source = Path(args.file)
    if source.is_dir():
        raise GemmgenError(f"{source} is a folder; give an export file or a database file")
    records = list(read_any(source))   # every record checked before the database is opened (or made)
    with _open(args, write=True) as db:
        new, seen = merge_records(db, records)
        path = db.name
    print(f"merged {args.file} into {path}: {new} new records, {seen} already present; the new ones are "
          "unverified (their times were measured elsewhere) and serve only once `gemmgen tune` measures "
          "their problems here")
    return 0


def _list(args) -> int:
    wanted = _filters(args)
    with _open(args) as db:
        rows = [row for row in db.tuned_summary(args.device) if all(keep(row) for keep in wanted)]
        devices = db.device_names()
    if not rows:
        print("no tuned problems match")
        if args.device is not None and args.device not in devices:
            print(f"(no records name a GPU {args.device!r}; they name {', '.join(map(repr, devices)) or 'none'})")
        return 0
    shown = rows if args.limit <= 0 else rows[:args.limit]
    print(f"{'shape':<20} {'majors':<6} {'epilogue':<22} {'gpu':<16} {'serves':<16} {'trials':>6}")
    for row in shown:
        p = row.problem
        print(f"{f'{p.m}x{p.n}x{p.k}':<20} {p.a_major[0] + p.b_major[0]:<6} {p.epilogue.signature:<22} "
              f"{row.device_name:<16} {row.serves:<16} {row.trials:>6}")
    more = len(rows) - len(shown)
    print(f"{len(rows)} problems" + (f"; {more} more not shown (--limit 0 shows all)" if more else ""))
    return 0


def _filters(args) -> list:
    """The row tests `db list` applies, from its options."""
    wanted = []
    ranges = {dim: _range(getattr(args, dim), f"--{dim}") for dim in "mnk" if getattr(args, dim) is not None}
    if args.shape is not None:
        parts = re.split(r"[xX]", args.shape)
        if len(parts) != 3:
            raise GemmgenError(f"--shape {args.shape!r}: write three parts as MxNxK, each a number, a range "
                               "or *, e.g. 4096x*x1024-")
        ranges.update({dim: _range(part, f"--shape {args.shape!r}: {dim.upper()}")
                       for dim, part in zip("mnk", parts) if part.strip() not in ("*", "")})
    for dim, (low, high) in ranges.items():
        wanted.append(lambda row, dim=dim, low=low, high=high:
                      low <= getattr(row.problem, dim) and (high is None or getattr(row.problem, dim) <= high))
    if args.backend:
        known = tuple(backend_registry.NAMES) + ("library", "baseline")
        if args.backend not in known:
            raise GemmgenError(f"--backend {args.backend}: choose one of {', '.join(known)}")
        wanted.append(lambda row: row.serves.split()[0] == args.backend)
    if args.winners_only:
        wanted.append(lambda row: bool(row.winner_backend or row.library_speedup))
    return wanted


def _range(text: str, what: str) -> tuple[int, Optional[int]]:
    """'4096' -> (4096, 4096); '1024-8192', '1024-', '-512' -> (low, high or None)."""
    match = re.fullmatch(r"\s*(\d*)\s*(-?)\s*(\d*)\s*", text)
    if not match or not (match.group(1) or match.group(3)) or (match.group(3) and not match.group(2)):
        raise GemmgenError(f"{what} {text!r}: write a number (4096), a range (1024-8192) or an open range "
                           "(1024- or -512)")
    low = int(match.group(1) or 1)
    high = int(match.group(3)) if match.group(3) else (None if match.group(2) else low)
    if high is not None and high < low:
        raise GemmgenError(f"{what} {text!r}: the range runs backwards; write the smaller bound first")
    return low, high

