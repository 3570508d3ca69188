"""Tuning from inside a compile: the problems of op keys the graph pass found without a
measured kernel, tuned into the database before the graph is finished."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Optional

from gemmgen.compile import clear_cache
from gemmgen.policy.proposers import get_proposer
from gemmgen.torch_compile.ops import clear_kernels, problem_of
from gemmgen.tune import split_library, tune_backends
from gemmgen.tune.adapters import PoolBuilder, WorkerRunner
from gemmgen.tuning_db import Database, default_db_path


def tune_keys(keys: Iterable[tuple], db=None, budget: int = 8, time_budget_s: Optional[float] = None,
              backends: Optional[Iterable[str]] = None):
    """Tune the problems of these op keys (`missing_keys()`) into the database (GPU), then
    forget cached kernels so the next compile sees the winners. Returns the TuneReport.

    `backends` limits the proposals (e.g. ("triton",): builds in seconds, where one CUTLASS
    build takes a minute, so a short time budget still records trials)."""
    problems = list(dict.fromkeys(problem_of(key) for key in keys))
    path = Path(db) if db is not None else default_db_path()
    library, programs = split_library(tuple(backends) if backends else ())
    proposer = (get_proposer("heuristic", **({"backends": programs} if programs else {}))
                if programs or not library else None)
    with Database(path) as database, WorkerRunner(mode="offline") as runner:
        reports = tune_backends(problems, library=library, proposer=proposer, builder=PoolBuilder(),
                                runner=runner, db=database, budget=budget, time_budget_s=time_budget_s,
                                progress=False)
    summary = "; ".join(f"{part}: {r.summary()}" for part, r in reports.items()) or "nothing run"
    logging.getLogger("gemmgen.torch").info("gemmgen: tuned %d missing problems: %s", len(problems), summary)
    clear_cache()
    clear_kernels()
    return reports
