"""CUTLASS builds of one problem varied where the DSL does not reach: the epilogue, and the transposed product.

Asked first: does CUTLASS's epilogue cost the 2 % per clock by which 4096^3 trails cuBLAS?
(Session 17's answer: no; nor do bigger clusters or cuBLAS's own geometry. `docs/history/cutlass.md`.)

Session 16 (Nsight Compute, `benchmarks/results/profile_s16/anchor4096/`) found the best
CUTLASS program at 4096^3 needing 290 K SM cycles against cuBLAS's 285 K, with the same DRAM
bytes. Four 128x256 tiles an SM, each K loop about 65 K cycles at wgmma's rate, leave 5-7 K
cycles a tile outside the loop: the epilogue's share. The emitter asks for CUTLASS's automatic
epilogue: a 128x32 sub-tile (cooperative; 64x32 for ping-pong) stored through shared memory by
TMA, eight synchronised rounds for a 128x256 tile. This probe builds each program again with
another epilogue and times every build in pairs with torch.matmul, as the bench times a
candidate (`gemmgen.measure.turns.in_pairs`), after the harness's check:

- `MxN`: the TMA-store epilogue with an M x N sub-tile (fewer, larger rounds; more shared
  memory, which the automatic stage count then takes from the ring);
- `direct`: `NoSmemWarpSpecialized`, each thread storing its accumulators to global memory.

Session 21 also had `unscaled` here (the plain epilogue without alpha; commit 7e9b6b3,
`benchmarks/results/epilogue_probe/s21_unscaled/`). The backend now builds that itself for every
program whose epilogue is plain at alpha 1 (`InstanceSpec.unscaled`), so the choice was dropped.

With `--epilogues auto` alone it times CUTLASS programs as written: session 18 timed stream-K
builds against persistent ones this way (`benchmarks/results/streamk_probe/`). `--sms 128,120`
also times each variant with its persistent grid on fewer SMs than the GPU has. Session 18 found
that choice with a text edit of the instance; it is now the program's `scheduler persistent N`, a
run-time argument of the same build, and the probe writes it so.

The epilogue variants are text edits of the emitted instance (the build cache keys them by that
text), not DSL programs: a probe, to learn whether a DSL choice would pay before adding one. Of
them, the DSL has since taken the cooperative 128-row and ping-pong 64-row sub-tiles of 32-128
columns (`tile ... epilogue=MxN`); the probe still reaches the rest (`128x256`, `direct`).

A program with `c=col` is taken as the transposed product, the way cuBLAS runs a row-major
problem: D^T = B^T A^T, an N x M x K problem with the operands' majors swapped, run on
transposed views of the row-major problem's tensors (no copies). The backend itself refuses
`c=col` (its support table), so the probe validates such a program as if it were `c=row` and
takes the plain epilogue only.

    python benchmarks/cutlass_epilogue_probe.py --out DIR --epilogues auto,128x64,direct PROGRAM.gemm ...
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

from gemmgen.dsl.ir import Epilogue

AUTO_TILE = "cutlass::epilogue::collective::EpilogueTileAuto"
SCHEDULES = ("cutlass::epilogue::TmaWarpSpecializedCooperative", "cutlass::epilogue::TmaWarpSpecialized")
DIRECT = "cutlass::epilogue::NoSmemWarpSpecialized"


def with_epilogue(text: str, choice: str) -> str:
    """The emitted instance with epilogue `choice` ('auto', 'MxN' or 'direct'); ValueError if
    the text has no automatic-tile TMA epilogue to replace or the choice is not one of those."""
    if choice == "auto":
        return text
    schedule = next((s for s in SCHEDULES if re.search(re.escape(s) + r"\s*,", text)), None)
    if AUTO_TILE not in text or schedule is None:
        raise ValueError("the instance has no automatic-tile TMA epilogue to vary")
    if choice == "direct":
        return re.sub(re.escape(schedule) + r"(\s*,)", DIRECT + r"\1", text, count=1)
    m = re.fullmatch(r"([0-9]+)x([0-9]+)", choice)
    if not m:
        raise ValueError(f"epilogue {choice!r}: write auto, direct, or a sub-tile MxN such as 128x64")
    return text.replace(AUTO_TILE, f"cute::Shape<cute::_{m.group(1)}, cute::_{m.group(2)}>", 1)


FLIP = {"row": "col", "col": "row"}


def timed_problem(program):
    """The row-major problem a program is timed on: its own, or for a `c=col` program the
    transposed one (M and N swapped, A and B swapped with their majors flipped)."""
    pr = program.problem
    if pr.c_major == "row":
        return pr
    if pr.epilogue != Epilogue(out_dtype=pr.epilogue.out_dtype):
        raise ValueError("a transposed (c=col) program must have the plain epilogue")
    return replace(pr, m=pr.n, n=pr.m, a_major=FLIP[pr.b_major], b_major=FLIP[pr.a_major], c_major="row")


def transposed_call(fn):
    """fn of the transposed problem as a call of the row-major one: D^T = B^T A^T on views."""
    return lambda a, b, out, **kw: fn(b.t(), a.t(), out.t(), **kw)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("programs", nargs="*", help="CUTLASS DSL files, each bound to its shape")
    p.add_argument("--out", required=True)
    p.add_argument("--epilogues", default="auto,128x64,direct",
                   help="comma-separated: auto, direct, or MxN sub-tiles (a choice a program's tile refuses "
                        "is its row's failure, not the run's)")
    p.add_argument("--sms", default="",
                   help="also time each variant with its persistent grid on these SM counts, e.g. 128,120: the "
                        "program's `scheduler persistent N`, a run-time choice of the same build (names gain _smsN)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel nvcc builds (default: every core)")
    p.add_argument("--build-only", action="store_true", help="build every variant and stop (no GPU needed)")
    p.add_argument("--replot", action="store_true", help="only draw --out's results.json again as probe.png")
    return p.parse_args(argv)


def variant_sources(programs: list, epilogues: list[str], sms: tuple[int, ...] = ()) -> tuple[list, dict]:
    """([(name, program, Source)], {name: failure}) for every program x epilogue choice (x each
    of `sms`, after the grid of all SMs: the program with `scheduler persistent N`, which the
    validator checks, on the same source)."""
    from gemmgen import backends

    variants, failed = [], {}
    for stem, program in programs:
        source = backends.get("cutlass").lower(program)
        for count in (None, *sms):
            grid = program if count is None else replace(program, grid_sms=count)
            refused = refusals(grid) if count else []
            for choice in epilogues:
                name = f"{stem}_epi_{choice}" + (f"_sms{count}" if count else "")
                if refused:
                    failed[name] = refused[0]
                    continue
                try:
                    variants.append((name, grid, replace(source, text=with_epilogue(source.text, choice))))
                except ValueError as exc:
                    failed[name] = str(exc)
    return variants, failed


def refusals(program) -> list[str]:
    """What the validator says of a program, a `c=col` one validated as its row-major twin (the
    backend refuses `c=col`; the probe runs it as the transposed product)."""
    from gemmgen import dsl

    return [d.message for d in dsl.diagnose(replace(program, problem=replace(program.problem, c_major="row")))]


def main(argv=None) -> int:
    from gemmgen import dsl
    from gemmgen.backends.build import build_many

    args = parse_args(argv)
    if args.replot:
        results = Path(args.out) / "results.json"
        if not results.is_file():
            print(f"--replot: no {results}", file=sys.stderr)
            return 2
        plot(json.loads(results.read_text()), Path(args.out) / "probe.png")
        return 0
    if not args.programs:
        print("give one or more CUTLASS programs (.gemm files)", file=sys.stderr)
        return 2
    epilogues = [e.strip() for e in args.epilogues.split(",") if e.strip()]
    try:
        sms = tuple(int(n) for n in args.sms.split(",") if n.strip())
    except ValueError:
        print(f"--sms {args.sms!r}: give SM counts separated by commas, e.g. 128,120", file=sys.stderr)
        return 2
    programs, problem = [], None
    for path in args.programs:
        try:
            program = dsl.parse(Path(path).read_text())
        except (OSError, dsl.ProgramError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
        if program.backend != "cutlass" or not program.problem.is_bound:
            print(f"{path}: needs a CUTLASS program whose gemm line gives M, N and K", file=sys.stderr)
            return 2
        refused = refusals(program)
        try:
            timed = timed_problem(program)
        except ValueError as exc:
            refused.append(str(exc))
        if refused:
            print(f"{path}: {refused[0]}", file=sys.stderr)
            return 2
        if problem not in (None, timed):
            print(f"{path}: every program must be of one problem, or its transpose ({problem.key})", file=sys.stderr)
            return 2
        problem = timed
        programs.append((Path(path).stem, program))
    try:
        variants, failed = variant_sources(programs, epilogues, sms)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    started = time.monotonic()
    results = build_many([s for _, _, s in variants], jobs=args.jobs)
    build_s = time.monotonic() - started
    print(f"built {len(variants)} variants in {build_s:.0f} s", flush=True)
    artifacts = {}
    for (name, program, _), r in zip(variants, results):
        if isinstance(r, Exception):
            failed[name] = f"build: {r}"[:400]
        else:
            artifacts[name] = (program, r)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.build_only:
        for name, why in failed.items():
            print(f"  {name}: {why}")
        return 0 if artifacts else 1
    return measure(problem, artifacts, failed, args, out, build_s)


def measure(problem, artifacts: dict, failed: dict, args, out: Path, build_s: float) -> int:
    """Check every built variant, time the passing ones in pairs, write results.json, print a table."""
    import torch

    from gemmgen import backends
    from gemmgen.measure.turns import checked_variants, in_pairs

    if not torch.cuda.is_available():
        print("timing needs a CUDA GPU (an H200); use --build-only here", file=sys.stderr)
        return 2
    named = []
    for name, (program, artifact) in artifacts.items():
        fn = backends.get("cutlass").load(artifact, program)
        if program.problem.c_major == "col":
            fn = transposed_call(fn)
        named.append((name, fn, {"stages": artifact.meta.get("stages"), "resources": artifact.meta.get("resources")}))
    rows = {name: {"failures": [why]} for name, why in failed.items()}
    fns = checked_variants(problem, named, args.seed, rows)
    shape = in_pairs(problem, fns, rows, args.repeats, args.seed)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "command": "python " + " ".join(sys.argv), "build_s": round(build_s, 1)}
    (out / "results.json").write_text(json.dumps({**meta, **shape}, indent=1))
    plot({**meta, **shape}, out / "probe.png")
    print(f"\n{shape['shape']}, in pairs with torch.matmul ({args.repeats} repeats)")
    for name, v in sorted(shape["variants"].items(), key=lambda kv: -(kv[1].get("vs_torch_median_ratio") or [0, 0])[1]):
        ratio = v.get("vs_torch_median_ratio")
        if ratio is None:
            print(f"  {name:44s} not timed: {'; '.join(v.get('failures', []))[:160]}")
        else:
            print(f"  {name:44s} {v['median_ms']:.4f} ms {v['tflops']:5.0f} TFLOP/s  "
                  f"x torch {ratio[1]:.3f} ({ratio[0]:.3f}-{ratio[2]:.3f})  stages {v.get('stages')}")
    return 0


def plot(result: dict, path: Path) -> None:
    """Each timed variant's per-repeat speedup over torch.matmul, with its 95 % interval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = sorted(((n, v["vs_torch_median_ratio"]) for n, v in result["variants"].items()
                    if v.get("vs_torch_median_ratio")), key=lambda nv: nv[1][1])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(timed) + 1.2))
    names = [n for n, _ in timed]
    mid = [r[1] for _, r in timed]
    err = [[r[1] - r[0] for _, r in timed], [r[2] - r[1] for _, r in timed]]
    ax.errorbar(mid, range(len(timed)), xerr=err, fmt="o", color="tab:green", ecolor="gray", capsize=3)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(range(len(timed)), names, fontsize=8)
    ax.set_xlabel("speedup over torch.matmul, per repeat (median, 95 %)")
    ax.set_title(f"{result['shape']}, {result.get('gpu', '')}, {result.get('date', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
