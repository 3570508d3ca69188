"""A neighbour's winner as a candidate to measure, never as a served kernel.

A program that won at a nearby problem (same majors, dtypes and epilogue; nearest in log M,
log N, log K) is often good next door, and sometimes much worse: re-bound neighbours
measured 0.75x torch.matmul at off-grid shapes on the H200. So `gemmgen.compile` serves only
programs measured at the problem itself, and tuning puts the neighbours' programs, re-bound
and validated, ahead of its proposer's own candidates, where the runner checks and times them
at this shape like any other.
"""
from __future__ import annotations

from typing import Optional

from gemmgen.backends import diagnose
from gemmgen.dsl import parse
from gemmgen.dsl.diagnostics import ProgramError
from gemmgen.dsl.ir import Problem, Program
from gemmgen.dsl.printer import to_text
from gemmgen.tuning_db import Database
from gemmgen.tuning_db.store import WinnerIndex, shipped_database

#: neighbours tried before the proposer's own programs, per problem
NEIGHBOURS = 2
#: neighbours further than this in log-shape space (about 2.7x in one dimension) are too unlike
MAX_DISTANCE = 1.0


def neighbour_programs(index: WinnerIndex, problem: Problem, count: int = NEIGHBOURS) -> list[Program]:
    """The programs of the nearest tuned problems' winners, re-bound to `problem` and valid there."""
    found = []
    for near in index.nearest(problem):
        if near.distance > MAX_DISTANCE or len(found) == count:
            break
        try:
            program = parse(near.trial.program).bind(problem)
        except ProgramError:
            continue
        if not diagnose(program):
            found.append(program)
    return found


def with_neighbours(proposer, db: Database, device_name: str, count: int = NEIGHBOURS) -> "WithNeighbours":
    """`proposer` led by the winners near each problem in `db` and the shipped records."""
    return WithNeighbours(proposer, WinnerIndex([("user", db), ("shipped", shipped_database())], device_name), count)


class WithNeighbours:
    """A proposer whose first candidates are the neighbours' winners (`neighbour_programs`),
    then the wrapped proposer's programs, without repeats."""

    def __init__(self, proposer, index: WinnerIndex, count: int = NEIGHBOURS):
        self.proposer, self.index, self.count = proposer, index, count
        self.name = f"{proposer.name}+neighbours"
        self.version = str(proposer.version)
        self.backends = getattr(proposer, "backends", None)

    def propose(self, problem: Problem, k: int, *, seed: Optional[int] = None) -> list[Program]:
        near = [p for p in neighbour_programs(self.index, problem, min(self.count, k))
                if self.backends is None or p.backend in self.backends]
        own = self.proposer.propose(problem, k, seed=seed)
        seen, out = set(), []
        for program in near + own:
            text = to_text(program)
            if text not in seen:
                seen.add(text)
                out.append(program)
        return out[:k]
