"""Timed inputs: a rotation of input sets, refilled before every call, and timed outputs checked.

A kernel must not be able to tell a timed call from a checked one, nor profit from having
seen its inputs before. So every timed call (warm-up, rep sizing, the device-timed loop,
the host-timed batches) gets a set of `ROTATION_SETS` buffers in turn, refilled just before
the call with fresh random normal values from a seed of its own, and `out` poisoned with
NaN, all outside the timed range. In the device-timed loop, round r uses seed base + r for
every kernel of one problem, so the kernels of one session share references. A result
cache keyed on input values never hits; one keyed on pointers returns stale results.

Checked calls are sampled: `CHECKED_CALLS` rounds drawn from the loop (the last round of
every kernel always among them, and the last host-timed call), whose outputs are judged
right after the call, outside its timed range and without waiting for the GPU, against a
reference built before the loop from the round's seed, by the check's own rules
(checking.out_stats: normwise and elementwise bounds, unwritten elements); the numbers are
read after the loop. A kernel that is
right for its first calls and then writes zeros, or that caches, fails: the timing is an
error naming the failed call, never a recorded time.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from gemmgen.dsl.ir import Problem
from gemmgen.measure.cases import Case, a_scale, case_from
from gemmgen.measure.checking import Reading, out_stats, stat_failures
from gemmgen.runtime.tensors import TORCH_DTYPES, empty_laid_out

ROTATION_SETS = 3
#: rounds of the device-timed loop whose outputs are checked, besides each kernel's last
CHECKED_CALLS = 3
#: seeds of calls outside the timed loop (warm-up, sizing, host timing) start here
_UNTIMED_SEED_OFFSET = 1 << 20


@dataclass
class _Set:
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    extras: dict[str, torch.Tensor]


def _new_set(problem: Problem, device) -> _Set:
    m, n, k = problem.m, problem.n, problem.k
    ep = problem.epilogue
    in_dt, out_dt = TORCH_DTYPES[problem.in_dtype], TORCH_DTYPES[ep.out_dtype]
    extras: dict[str, torch.Tensor] = {}
    if ep.bias:
        extras["bias"] = torch.empty((n if ep.bias == "n" else m,), dtype=out_dt, device=device)
    if ep.residual:
        extras["residual"] = empty_laid_out(m, n, problem.c_major, out_dt, device)
    if ep.beta != 0.0:
        extras["c"] = empty_laid_out(m, n, problem.c_major, out_dt, device)
    return _Set(empty_laid_out(m, k, problem.a_major, in_dt, device),
                empty_laid_out(k, problem.b_cols, problem.b_major, in_dt, device),
                empty_laid_out(m, n, problem.c_major, out_dt, device), extras)


def _storage(t: torch.Tensor) -> torch.Tensor:
    """The contiguous tensor behind a row- or column-major view (filled in storage order, so a
    refill from the same seed gives the same values whatever the layout)."""
    return t if t.is_contiguous() or t.dim() < 2 else t.t()


def _fill(s: _Set, seed: int, device, scale_a: float) -> None:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    for t in (s.a, s.b, *s.extras.values()):
        _storage(t).normal_(generator=gen)
    if scale_a != 1.0:
        s.a.mul_(scale_a)


@dataclass
class Rotation:
    """The input sets of one problem (shared by every kernel timed on it in one session)."""

    problem: Problem
    seed: int
    device: Any
    sets: list = field(default_factory=list)
    untimed: int = 0              # calls made outside the timed loop so far
    _turn: int = 0
    _cases: dict = field(default_factory=dict)
    _readings: dict = field(default_factory=dict)     # seed -> checking.Reading, for every case built

    def __post_init__(self):
        self.sets = [_new_set(self.problem, self.device) for _ in range(ROTATION_SETS)]

    def prepare(self, seed: int) -> tuple[tuple, dict]:
        """The next set, refilled from `seed`, out poisoned: (a, b, out) and the keywords."""
        s = self.sets[self._turn % len(self.sets)]
        self._turn += 1
        _fill(s, seed, self.device, a_scale(self.problem, "timed"))
        s.out.fill_(float("nan"))
        ep = self.problem.epilogue
        return (s.a, s.b, s.out), {"alpha": ep.alpha, "beta": ep.beta, **s.extras}

    def round_seed(self, rnd: int) -> int:
        return self.seed + rnd

    def untimed_seed(self) -> int:
        self.untimed += 1
        return self.seed + _UNTIMED_SEED_OFFSET + self.untimed

    def case(self, seed: int) -> Case:
        """The reference of the inputs `seed` fills, kept: the checked rounds of the timed loop,
        which every kernel of the session shares, are built before the loop (timing.plan_checks)."""
        if seed not in self._cases:
            self._cases[seed] = self._build(seed)
        return self._cases[seed]

    def _build(self, seed: int) -> Case:
        s = _new_set(self.problem, self.device)
        _fill(s, seed, self.device, a_scale(self.problem, "timed"))
        case = case_from(self.problem, "timed", seed, s.a, s.b, bias=s.extras.get("bias"),
                         residual=s.extras.get("residual"), c=s.extras.get("c"))
        self._readings[seed] = Reading.of(case)
        return case

    def stats(self, out: torch.Tensor, seed: int) -> torch.Tensor:
        """The check's numbers of one call's output (on the device; nothing waits for them). The
        reference of a call outside the timed loop (one seed, one call) is built for it and not
        kept: at an LM head's size each holds gigabytes, and a session checks one per kernel."""
        return out_stats(out, self._cases.get(seed) or self._build(seed))

    def failures(self, stats: torch.Tensor, seed: int) -> list[str]:
        return stat_failures(stats, self._readings[seed], self.problem)[0]


def checked_rounds(reps: list[int], seed: int, count: int = CHECKED_CALLS) -> set[int]:
    """The rounds of the timed loop whose outputs are checked: `count` drawn (seeded) from the
    rounds every kernel runs, and each kernel's last round (reps: the kernels' round counts)."""
    if not reps:
        return set()
    common = min(reps)
    rng = random.Random(seed ^ 0x5EED)
    picked = set(rng.sample(range(common), min(count, common)))
    return picked | {r - 1 for r in reps if r > 0}


def verdict(name: str, failed: list[tuple[str, list[str]]], checked: int) -> Optional[str]:
    """The timing error of a kernel whose checked calls failed, or None."""
    if not failed:
        return None
    which, reasons = failed[0]
    return (f"{name}: {len(failed)} of {checked} checked timed calls failed the check ({which}: "
            f"{'; '.join(reasons)}): its timed calls do not compute what its checked calls did")
