"""The `gemmgen` command. Each room contributes its subcommands through a module
with `register(subparsers)`; each subparser sets `func(args) -> int`.

Command modules must import cheaply: heavy imports (torch, triton) go inside the
command's function, so `gemmgen check` stays fast on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from gemmgen.errors import GemmgenError

COMMAND_MODULES = (
    "gemmgen.cli.dsl",        # check, fmt, inspect
    "gemmgen.cli.build",   # build
    "gemmgen.cli.measure",    # bench
    "gemmgen.cli.db",  # db
    "gemmgen.cli.tune",       # tune, compile
    "gemmgen.cli.policy",     # propose
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gemmgen",
        description="Searched fp16 GEMM kernels for NVIDIA Hopper: read, check, build, tune, measure.",
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
