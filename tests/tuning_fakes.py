"""Shared helpers of the tuning tests: trials, programs, and a fake builder and runner for the loop."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from gemmgen.dsl import parse
from gemmgen.dsl.ir import Problem, Program, Tile
from gemmgen.tune import BuildOutcome, Measurement
from gemmgen.tuning_db import BaselineTime, Device, LibraryChoice, Trial

TEST_GPU = Device("Test GPU", "9.0", 132, "580.00", "13.0", {"torch": "2.11.0", "triton": "3.6.0"})

GENERIC_TRITON = """\
gemm *x*x* a=row b=row c=row in=f16 acc=f32
epilogue out=f16
backend triton
tile 128x128x64
warps 2x2
instr auto
cluster 1x1
stages 4
mainloop multistage
scheduler tile
raster m swizzle=8
smem_swizzle auto
split_k 1
"""


def triton_program(problem: Problem, tile=(128, 128, 64), stages=4, warps=None) -> Program:
    """A Triton program for `problem` (majors and epilogue taken from it); 8 warps for big tiles."""
    generic = parse(GENERIC_TRITON)
    if warps is None:
        warps = (2, 4) if tile[0] * tile[1] > 128 * 128 else (2, 2)
    return replace(generic.bind(problem), tile=Tile(*tile), stages=stages, warps=warps)


def program_text(program: Program) -> str:
    from gemmgen.dsl import to_text

    return to_text(program)


def trial(problem: Problem, *, device_ms=1.0, spread=0.01, baseline_ms=1.2, status="ok",
          check_passed=True, device=TEST_GPU, program=None, created="", backend="triton") -> Trial:
    """A measured trial with torch.matmul and cuBLASLt baselines (the best at baseline_ms)."""
    text = program if program is not None else program_text(triton_program(problem))
    return Trial(problem=problem, device=device, program=text, backend=backend, status=status,
                 build_ok=True, build_s=1.5, check_passed=check_passed, max_rel_err=1e-3,
                 err_bound=5e-3, check_seed=7, device_ms=device_ms, spread=spread, host_ms=device_ms + 0.01,
                 baselines={"torch": BaselineTime(baseline_ms * 1.05, 0.01),
                            "cublaslt_auto": BaselineTime(baseline_ms, 0.01)},
                 proposer="test", proposer_version="1", created=created)


def library_choice(problem: Problem, *, device_ms=0.9, spread=0.01, torch_ms=1.0, check_passed=True,
                   device=TEST_GPU, created="2026-11-29T20:00:00.000000+00:00", algorithm="00ff") -> LibraryChoice:
    """A cuBLASLt algorithm recorded for `problem`, timed beside torch.matmul."""
    return LibraryChoice(problem=problem, device=device, library="cublaslt", version="130100",
                         config={"algorithm_id": 66, "tile": "(256, 128)", "split_k": 1}, algorithm=algorithm,
                         candidates=12, check_passed=check_passed, device_ms=device_ms, spread=spread,
                         torch_ms=torch_ms, torch_spread=0.01, max_rel_err=1e-4, err_bound=2e-3, check_seed=3,
                         created=created)


class FakeBuilder:
    """Builds instantly; programs whose tile K is 32 'fail to compile'."""

    def __init__(self):
        self.built: list[Program] = []
        self.calls = 0

    def build_many(self, programs):
        self.calls += 1
        self.built.extend(programs)
        return [BuildOutcome(p, error="nvcc: planted failure") if p.tile.k == 32
                else BuildOutcome(p, artifact=("artifact", p.tile), seconds=0.1) for p in programs]


@dataclass
class FakeRunner:
    """Times a program by its tile (bigger tiles faster); stages 2 'crashes'; stages 5 fails the check.

    `stop_after` raises KeyboardInterrupt on that measurement, like a user's Ctrl-C.
    """

    device: Device = TEST_GPU
    stop_after: int | None = None
    measured: list[Program] = field(default_factory=list)
    baseline_calls: int = 0

    def close(self):
        pass

    def __enter__(self):                 # the WorkerRunner's context-manager face
        return self

    def __exit__(self, *exc):
        return False

    def baselines(self, problem):
        self.baseline_calls += 1
        return {"torch": BaselineTime(1.0, 0.01, server_ms=1.1), "cublaslt_auto": BaselineTime(0.98, 0.01)}

    def measure(self, program, artifact, *, seed=None):
        seed = 1234 + len(self.measured) if seed is None else seed   # the harness draws a fresh one
        if self.stop_after is not None and len(self.measured) >= self.stop_after:
            raise KeyboardInterrupt
        self.measured.append(program)
        if program.stages == 2:
            return Measurement(failure="worker crashed: illegal memory access (planted)")
        if program.stages == 5:
            return Measurement(check_passed=False, check_msg="max rel err 0.3 > bound 0.004", seed=seed,
                               max_rel_err=0.3, err_bound=0.004)
        ms = 64.0 / (program.tile.m + program.tile.n)
        return Measurement(check_passed=True, max_rel_err=1e-3, err_bound=4e-3, seed=seed,
                           device_ms=ms, spread=0.01, host_ms=ms + 0.005)


class ListProposer:
    """Proposes a fixed list of programs (re-bound to each problem)."""

    name = "list"
    version = "0"

    def __init__(self, variants):
        self.variants = variants  # (tile, stages) pairs

    def propose(self, problem, k, *, seed=None):
        return [triton_program(problem, tile, stages) for tile, stages in self.variants][:k]
