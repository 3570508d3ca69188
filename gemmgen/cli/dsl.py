"""`gemmgen check`, `gemmgen fmt`, `gemmgen inspect`: the DSL at the command line.

Errors reach the user as `file:line:col: message` lines, never as tracebacks.
"""
from __future__ import annotations

import argparse
import functools
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Optional

from gemmgen import backends
from gemmgen.backends import diagnose, fact_rows
from gemmgen.files import read_text
from gemmgen.compile import parse_shape
from gemmgen.dsl.diagnostics import ProgramError
from gemmgen.dsl.parser import parse, parse_with_comments
from gemmgen.dsl.printer import to_text, to_text_with_comments
from gemmgen.errors import GemmgenError


def register(subparsers) -> None:
    check = subparsers.add_parser("check", help="parse and validate kernel programs (.gemm files)",
                                  description="Parse and validate each FILE; print file:line:col: message "
                                              "for the first error of each; exit 1 if any file has one.")
    check.add_argument("files", nargs="+", metavar="FILE", help="DSL programs, or folders of .gemm files")
    check.add_argument("--shape", metavar="MxNxK", help="bind generic programs to this shape before checking")
    check.set_defaults(func=run_check)

    fmt = subparsers.add_parser("fmt", help="print kernel programs in canonical form",
                                description="Print the canonical text of each FILE.")
    fmt.add_argument("files", nargs="+", metavar="FILE", help="DSL programs, or folders of .gemm files")
    fmt.add_argument("--check", action="store_true", help="print nothing; exit 1 listing files not canonical")
    fmt.add_argument("--write", action="store_true", help="rewrite each FILE in place in canonical form")
    fmt.set_defaults(func=run_fmt)

    inspect = subparsers.add_parser("inspect", help="show a program and its derived facts",
                                    description="Print FILE's program and its derived facts (grid, waves, "
                                                "shared memory, roofline floor).")
    inspect.add_argument("file", metavar="FILE")
    inspect.add_argument("--shape", metavar="MxNxK", help="bind a generic program to this shape")
    inspect.add_argument("--lower", metavar="BACKEND", help="also print the source BACKEND lowers it to")
    inspect.set_defaults(func=run_inspect)


def _reporting_warnings(command):
    """Run `command`, printing any validator warnings once each as one line on stderr."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code = command(args)
        for message in dict.fromkeys(str(w.message) for w in caught):
            print(f"gemmgen: warning: {message}", file=sys.stderr)
        return code
    return run


class CommandError(GemmgenError):
    """A command-line mistake (a missing file, an unknown backend)."""


def _read(path: str) -> str:
    return read_text(path, "a DSL program (.gemm)", CommandError)


def _files(paths: list[str]) -> list[str]:
    """The paths given, each folder replaced by its .gemm files (a folder without one stays, to
    be reported)."""
    out = []
    for path in paths:
        found = sorted(Path(path).glob("*.gemm")) if Path(path).is_dir() else []
        out += [str(f) for f in found] or [path]
    return out


def _shape(text: Optional[str]) -> Optional[tuple[int, int, int]]:
    """--shape, checked before any file is read: a bad shape is one error, not one per file."""
    return parse_shape(text) if text is not None else None


def _load(path: str, shape: Optional[tuple[int, int, int]]):
    """Parse `path`, bind it if a shape is given; ProgramError for a bad program."""

    program = parse(_read(path), filename=path)
    if shape:
        program = program.bind(shape)
    return program


@_reporting_warnings
def run_check(args: argparse.Namespace) -> int:
    bad = 0
    shape = _shape(args.shape)
    files = _files(args.files)
    for path in files:
        try:
            program = _load(path, shape)
            problems = diagnose(program)
        except ProgramError as exc:
            print(exc.located())
            bad += 1
            continue
        except CommandError as exc:
            print(f"{exc}")
            bad += 1
            continue
        if problems:
            print(problems[0].format(path))
            bad += 1
    total = len(files)
    if bad:
        print(f"{bad} of {total} file(s) have errors", file=sys.stderr)
        return 1
    print(f"{total} file(s) OK")
    return 0


def run_fmt(args: argparse.Namespace) -> int:
    failed, not_canonical = 0, []
    files = _files(args.files)
    for path in files:
        try:
            text = _read(path)
            canonical = to_text_with_comments(*parse_with_comments(text, filename=path))
        except (ProgramError, CommandError) as exc:
            print(str(exc), file=sys.stderr)
            failed += 1
            continue
        if args.check:
            if text != canonical:
                not_canonical.append(path)
        elif args.write:
            if text != canonical:
                Path(path).write_text(canonical)
                print(f"rewrote {path}")
        else:
            if len(files) > 1:
                print(f"# {path}")
            sys.stdout.write(canonical)
    if args.check and not_canonical:
        for path in not_canonical:
            print(f"{path}: not in canonical form (run `gemmgen fmt --write {path}`)")
        return 1
    return 1 if failed else 0


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name.ljust(width)}  {value}" for name, value in rows)


@_reporting_warnings
def run_inspect(args: argparse.Namespace) -> int:
    shape = _shape(args.shape)
    try:
        program = _load(args.file, shape)
    except ProgramError as exc:
        print(exc.located())
        return 1
    print(f"# {args.file}" + (f" bound to {args.shape}" if args.shape else ""))
    print(to_text(program), end="")
    problems = diagnose(program)
    print()
    if problems:
        print("problems:")
        for d in problems:
            print(f"  {d.format(args.file)}")
        print()
    else:
        print("valid for sm_90a" + ("" if program.problem.is_bound else
                                    " (shape-generic: --shape MxNxK binds it and adds the grid facts)"))
        print()
    try:
        rows = fact_rows(program)
    except (ZeroDivisionError, TypeError, ValueError):
        print("derived facts: unavailable until the problems above are fixed")
        return 1
    print("derived facts:")
    print(_table(rows))
    if args.lower:
        print()
        print(_lower(program, args.lower))
    return 1 if problems else 0


def _lower(program, backend: str) -> str:


    if backend not in backends.names():
        raise CommandError(f"--lower {backend}: unknown backend; choose one of {', '.join(backends.names())}")
    try:
        backends.get(backend)                  # imports it: refused here if it is not installed
    except ImportError as exc:
        raise CommandError(f"--lower {backend}: the {backend} backend is not available here "
                           f"({exc.__class__.__name__}: {exc})") from None
    if program.backend != backend:
        program = replace(program, backend=backend)
    problems = diagnose(program)
    if problems:
        raise CommandError(f"--lower {backend}: not lowering an invalid program: {problems[0].message}")
    try:
        source = backends.lower(program)
    except GemmgenError:
        raise
    except Exception as exc:  # a backend bug must still reach the user as one line
        raise CommandError(f"--lower {backend}: the backend failed ({exc.__class__.__name__}: {exc}); "
                           "please report this program") from None
    return f"# lowered by the {backend} backend (entry {source.entry})\n{source.text}"
