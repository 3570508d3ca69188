"""Run kernel programs (and torch.matmul on their shapes) once each, for Nsight Compute to read.

Why: a timing says how long a kernel took, not what held it back. Under `ncu` each launch
below is profiled with caches flushed (ncu's default), as the timer flushes L2; the script
checks each result against an fp64 reference so a profile of a wrong kernel is not read.

    ncu --clock-control none --nvtx --nvtx-include "profile/" --section SpeedOfLight \\
        --section WarpStateStats python3 benchmarks/profile_programs.py \\
        dsl/examples/cuda_*.gemm --torch

`--shape MxNxK` binds shape-generic programs (`gemm *x*x*`, the folders of benchmarks/programs/)
to that shape first, e.g. `--shape 64x4096x4096 benchmarks/programs/tma_stream_k_swap/*.gemm`.
Prints one line per launch, in launch order (ncu's report lists the kernels in that order).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def run(path: Path, with_torch: bool, seen: set, shape=None) -> None:
    import torch

    from gemmgen import backends
    from gemmgen.dsl import parse
    from gemmgen.measure.cases import TORCH_DTYPES, empty_laid_out, lay_out, make_case

    program = parse(path.read_text(), str(path))
    if shape is not None:
        program = program.bind(shape)
    problem = program.problem
    case = make_case(problem, "main", seed=20261130)
    a, b = lay_out(case.a, problem.a_major), lay_out(case.b, problem.b_major)
    out = empty_laid_out(problem.m, problem.n, problem.c_major, TORCH_DTYPES[problem.epilogue.out_dtype], "cuda")
    source = backends.lower(program)
    launcher = backends.load(backends.get(program.backend).build(source), program)
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("profile"):
        launcher(a, b, out, bias=case.bias, residual=case.residual, c=case.c)
    torch.cuda.synchronize()
    err = ((out.float() - case.ref).abs().max() / case.ref.abs().max()).item()
    verdict = "ok" if err <= case.bound else f"WRONG (bound {case.bound:.2e})"
    print(f"launch: {path.stem}  {problem.m}x{problem.n}x{problem.k}  rel err {err:.2e} {verdict}", flush=True)
    key = (problem.m, problem.n, problem.k, problem.a_major, problem.b_major)
    if with_torch and key not in seen:
        seen.add(key)
        with torch.cuda.nvtx.range("profile"):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        print(f"launch: torch.matmul  {problem.m}x{problem.n}x{problem.k}  a={problem.a_major} b={problem.b_major}",
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="+", type=Path, help=".gemm files with bound shapes")
    ap.add_argument("--torch", action="store_true", help="also run torch.matmul once per distinct shape and majors")
    ap.add_argument("--shape", metavar="MxNxK", help="bind shape-generic programs to this shape")
    args = ap.parse_args(argv)
    # Deferred: torch, gemmgen (heavy to import; --help needs neither).
    import torch

    from gemmgen.compile import ShapeError, parse_shape
    try:
        shape = parse_shape(args.shape) if args.shape else None
    except ShapeError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        print("profile_programs.py runs the kernels: it needs a CUDA GPU (none is visible here)", file=sys.stderr)
        return 2
    from gemmgen.dsl import ProgramError
    seen: set = set()
    for path in args.programs:
        try:
            run(path, args.torch, seen, shape)
        except ProgramError as exc:   # a malformed or unbindable program: its located message
            print(exc, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
