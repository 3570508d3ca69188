"""`gemmgen build`: compile programs into the disk cache ahead of time, in parallel.

    gemmgen build --backend triton --programs k1.gemm k2.gemm -j 2
    gemmgen build --backend triton --space triton --shapes shapes.csv --top 12 -j 16

The first builds the given program files (generic ones as they are); the second
enumerates a backend's search space for every shape of a CSV (M,N,K[,layout]) and
builds the first --top candidates that validate. Later `load`s, benchmarks and the
tuning loop then find every artifact in the cache (GEMMGEN_CACHE_DIR).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from gemmgen import backends, dsl
from gemmgen.backends.base import BackendError
from gemmgen.backends.build import build_many, cache_root, default_jobs
from gemmgen.errors import GemmgenError
from gemmgen.files import read_text
from gemmgen.measure.shapes import read_shapes


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "build", help="compile programs (files, or a backend's search space over shapes) into the cache",
        description="Lower and compile programs ahead of time into the artifact cache (GEMMGEN_CACHE_DIR), "
                    "in parallel worker processes; prints builds per minute.",
    )
    p.add_argument("--backend", required=True, help="triton, cutlass or cuda: the backend to build with")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--programs", nargs="+", metavar="FILE", help=".gemm files or directories of them")
    what.add_argument("--space", metavar="NAME", help="enumerate backend NAME's search space (needs --shapes)")
    p.add_argument("--shapes", metavar="CSV", help="M,N,K[,layout] per line (layout nn|nt|tn|tt)")
    p.add_argument("--top", type=int, default=12, help="with --space: candidates per shape (default 12)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel builds (default: all CPU cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_build)


def _program_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files.extend(sorted(path.glob("*.gemm")))
        elif path.exists():
            files.append(path)
        else:
            raise GemmgenError(f"no such program file or directory: {text}")
    if not files:
        raise GemmgenError(f"no .gemm files in {', '.join(paths)}")
    return files


def programs_from_files(paths: list[str], backend: str) -> list:


    out = []
    for path in _program_files(paths):
        program = dsl.parse(read_text(path, "a DSL program (.gemm)"), filename=str(path))
        if program.backend != backend:
            program = replace(program, backend=backend)
        out.append(backends.validate(program, filename=str(path)))
    return out


def programs_from_space(space: str, shapes_csv: str, backend: str, top: int) -> list:


    enumerate_space = backends.get(space).space
    out = []
    for shape in read_shapes(shapes_csv):
        kept = [replace(p, backend=backend) for p in enumerate_space(shape.problem())]
        out.extend([p for p in kept if not backends.diagnose(p)][:top])
    return out


def run_build(args: argparse.Namespace) -> int:
    backends.get(args.backend)                 # an unknown or missing backend is refused first
    if args.jobs is not None and args.jobs < 1:
        raise GemmgenError(f"-j {args.jobs}: give at least 1 parallel build (or leave it out: all CPU cores)")
    if args.space:
        if not args.shapes:
            raise GemmgenError("--space needs --shapes CSV (the shapes to enumerate candidates for)")
        if args.top < 1:
            raise GemmgenError(f"--top {args.top}: give the number of candidates per shape, 1 or more")
        backends.get(args.space)
        programs = programs_from_space(args.space, args.shapes, args.backend, args.top)
        if not programs:
            raise GemmgenError(f"backend {args.space}'s space holds no program that backend {args.backend} can "
                               f"build at the shapes of {args.shapes} (each is re-targeted to --backend; "
                               f"use --space {args.backend}, or other shapes)")
    else:
        programs = programs_from_files(args.programs, args.backend)
    sources = [backends.lower(p) for p in programs]
    jobs = args.jobs or default_jobs()
    print(f"building {len(sources)} {args.backend} program(s) with {jobs} job(s) into {cache_root()}")
    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(sources), unit="build")
        except ImportError:
            bar = None
    start = time.perf_counter()
    results = build_many(sources, jobs=jobs, progress=(lambda i, r: bar.update(1)) if bar else None)
    if bar:
        bar.close()
    elapsed = time.perf_counter() - start
    failed = [(p, r) for p, r in zip(programs, results) if isinstance(r, BackendError)]
    for p, r in failed:
        print(f"failed: {p.problem.key} tile {p.tile.m}x{p.tile.n}x{p.tile.k}: {r}")
    done = len(results) - len(failed)
    rate = len(results) / elapsed * 60 if elapsed > 0 else float("inf")
    print(f"{done} built, {len(failed)} failed in {elapsed:.1f} s: {rate:.0f} builds/minute "
          "(cache hits count as builds)")
    return 1 if failed else 0
