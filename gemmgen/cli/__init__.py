"""The `gemmgen` command. Each room contributes its subcommands through a module
with `register(subparsers)`; each subparser sets `func(args) -> int`.

Command modules must import cheaply: heavy imports (torch, triton) go inside the
command's function, so `gemmgen check` stays fast on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys

from gemmgen.errors import GemmgenError

COMMAND_MODULES = (
    "gemmgen.cli.dsl",        # check, fmt, inspect
    "gemmgen.cli.build",   # build
    "gemmgen.cli.measure",    # bench
    "gemmgen.cli.db",         # db: stats, list, show, export, merge
    "gemmgen.cli.tune",       # tune, compile
    "gemmgen.cli.policy",     # propose
)


class _Parser(argparse.ArgumentParser):
    """argparse takes a word that starts with '-' for an option unless it looks like a negative
    number; a shape such as -5x10x10 must reach the shape check, which says what is wrong with
    it. No option of gemmgen starts with a digit. Subcommand parsers are of this class too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gemmgen",
        description="Searched fp16 GEMM kernels for NVIDIA Hopper: read, check, build, tune, measure.",
        epilog="Shapes are written MxNxK (e.g. 4096x4096x4096). `gemmgen db list` shows the tuned shapes; "
               "`gemmgen compile MxNxK` shows the kernel gemmgen.compile serves for one.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that room has no commands yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GemmgenError as exc:
        print(f"gemmgen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gemmgen: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:             # `gemmgen db show ... | head`: the reader left; so do we
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
