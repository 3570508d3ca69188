"""Tuning on demand: problems met without a measured kernel, tuned into the user's database
right away, by the same loop as `gemmgen tune` (propose, build in parallel, check and time in
the isolated worker, record). `gemmgen.compile(..., tune=SECONDS)` and the torch.compile
backend's `tune_missing` call it; a problem tuned once is not tuned again, since its trials
are then in the database.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Union

from gemmgen.dsl.ir import Problem
from gemmgen.policy.proposers import get_proposer
from gemmgen.tune import TuneReport, split_library, tune_backends
from gemmgen.tune.adapters import PoolBuilder, WorkerRunner
from gemmgen.tune.neighbours import with_neighbours
from gemmgen.tuning_db import Database, default_db_path


#: Backends whose builds take seconds. A CUTLASS or raw CUDA build takes nvcc up to a minute,
#: so a budget shorter than SLOW_BUILD_S that proposes their programs is spent building and
#: measures nothing (on the H200, compile(..., tune=10) over every backend ran 49-59 s and
#: recorded no trial).
FAST_BACKENDS = ("triton",)
SLOW_BUILD_S = 120.0


def backends_for(time_budget_s: Optional[float], backends: Optional[Iterable[str]] = None) -> tuple[str, ...]:
    """The backends asked for; else, under a budget shorter than SLOW_BUILD_S, the fast ones;
    else () (every backend)."""
    if backends:
        return tuple(backends)
    if time_budget_s is not None and time_budget_s < SLOW_BUILD_S:
        return FAST_BACKENDS
    return ()


def tune_now(problems: Iterable[Problem], *, db: Union[None, str, Path, Database] = None, budget: int = 8,
             time_budget_s: Optional[float] = None, backends: Optional[Iterable[str]] = None,
             progress: bool = False) -> dict[str, TuneReport]:
    """Tune `problems` on this GPU into `db` (a path or an open `Database`; default the user's
    database); returns the reports of the parts run ('programs', 'library').

    `backends` limits the proposals; by default every backend, or under a short time budget
    the ones that build in seconds (`backends_for`). The nearest tuned problems' winners are
    measured first."""
    problems = list(dict.fromkeys(problems))
    library, programs = split_library(backends_for(time_budget_s, backends))
    proposer = (get_proposer("heuristic", **({"backends": programs} if programs else {}))
                if programs or not library else None)
    database = db if isinstance(db, Database) else Database(Path(db) if db is not None else default_db_path())
    try:
        with WorkerRunner(mode="offline") as runner:
            if proposer is not None:
                proposer = with_neighbours(proposer, database, runner.device.name)
            return tune_backends(problems, library=library, proposer=proposer, builder=PoolBuilder(),
                                 runner=runner, db=database, budget=budget, time_budget_s=time_budget_s,
                                 progress=progress)
    finally:
        if database is not db:
            database.close()


def summary(reports: dict[str, TuneReport]) -> str:
    """One line: what each part ran and recorded."""
    return "; ".join(f"{part}: {report.summary()}" for part, report in reports.items()) or "nothing run"
