"""Tuning on demand: problems met without a measured kernel, tuned into the user's database
right away, by the same loop as `gemmgen tune` (propose, build in parallel, check and time in
the isolated worker, record). `gemmgen.compile(..., tune=SECONDS)` and the torch.compile
backend's `tune_missing` call it; a problem tuned once is not tuned again, since its trials
are then in the database.

A time budget counts from the call, except the call's first wait for the measurement workers
(`gemmgen.tune.tune`). That start takes seconds, so the worker and its standbys stay up for the
process's next request and end after WORKERS_IDLE_S idle seconds (or at exit, or
`release_workers()`).
"""
from __future__ import annotations

import atexit
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

from gemmgen.backends import registry
from gemmgen.dsl.ir import Problem
from gemmgen.policy.proposers import get_proposer
from gemmgen.tune import TuneReport, library_first, library_search_s, split_library, tune_backends
from gemmgen.tune.adapters import PoolBuilder, WorkerRunner
from gemmgen.tune.neighbours import with_neighbours
from gemmgen.tuning_db import Database, default_db_path


#: The backends a budget shorter than SLOW_BUILD_S proposes. A CUTLASS build takes nvcc up to a
#: minute: on the H200, compile(..., tune=10) over every backend ran 49-59 s and recorded no
#: trial. Raw CUDA builds through NVRTC in under a second, but proposing its programs too served
#: 1.022x torch.matmul against 1.021x on an H100 (benchmarks/results/on_demand_fast_backends_h100).
FAST_BACKENDS = ("triton",)
SLOW_BUILD_S = 120.0
#: Standby workers kept for confirmations (adapters.STANDBY_WORKERS for tuning runs): these run
#: beside the user's own model, each a CUDA context on its GPU, and a short budget confirms few.
ON_DEMAND_STANDBY = 3


def backends_for(problem: Problem, time_budget_s: Optional[float],
                 backends: Optional[Iterable[str]] = None) -> tuple[str, ...]:
    """The backends asked for; else what won problems like this one: under a budget shorter than
    SLOW_BUILD_S, cuBLASLt's search where `library_first` and the search is expected to fit the
    budget (`library_search_s`), the fast backends' programs elsewhere; with more time, that
    search where it leads and every backend's programs."""
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.library import LIBRARY

    if backends:
        return tuple(backends)
    if time_budget_s is not None and time_budget_s < SLOW_BUILD_S:
        fits = library_search_s(problem) <= time_budget_s
        return (LIBRARY,) if library_first(problem) and fits else FAST_BACKENDS
    return ((LIBRARY,) if library_first(problem) else ()) + registry.NAMES


#: Seconds the on-demand workers wait, idle, for the next request before they end.
WORKERS_IDLE_S = 60.0


class _Workers:
    """The process's on-demand WorkerRunner: made at the first request, kept while requests come."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runner: Optional[WorkerRunner] = None
        self._timer: Optional[threading.Timer] = None
        self._hooked = False

    @contextmanager
    def use(self) -> Iterator[WorkerRunner]:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self._runner is None:
                self._runner = WorkerRunner(mode="offline", standby=ON_DEMAND_STANDBY)
                if not self._hooked:
                    atexit.register(self.release)      # before multiprocessing joins its children
                    self._hooked = True
            try:
                yield self._runner
            finally:
                self._timer = threading.Timer(WORKERS_IDLE_S, self.release)
                self._timer.daemon = True
                self._timer.start()

    def release(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            runner, self._runner, self._timer = self._runner, None, None
        if runner is not None:
            runner.close()


_WORKERS = _Workers()


def release_workers() -> None:
    """End the on-demand measurement workers now (they hold a CUDA context each)."""
    _WORKERS.release()


def tune_now(problems: Iterable[Problem], *, db: Union[None, str, Path, Database] = None, budget: int = 8,
             time_budget_s: Optional[float] = None, backends: Optional[Iterable[str]] = None,
             progress: bool = False) -> dict[str, TuneReport]:
    """Tune `problems` on this GPU into `db` (a path or an open `Database`; default the user's
    database); returns the reports of the parts run ('cublaslt', 'programs').

    `backends` limits the search; by default each problem gets what won problems like it
    (`backends_for`): cuBLASLt's search first, for the problems where it leads, then programs
    for the others, the nearest tuned problems' winners measured first. `time_budget_s` counts
    from this call, less its first wait for the workers; it stops new searches and trials, not
    one under way, and begins no search expected to end past it (`gemmgen.tune.library_search_s`,
    whose constants hold the H200's measured rates)."""
    start = time.monotonic()
    problems = list(dict.fromkeys(problems))
    plans = {p: split_library(backends_for(p, time_budget_s, backends)) for p in problems}
    searched = [p for p, (library, _) in plans.items() if library]
    programmed = [p for p, (_, programs) in plans.items() if programs]
    program_backends = tuple(dict.fromkeys(b for _, programs in plans.values() for b in programs))
    database = db if isinstance(db, Database) else Database(Path(db) if db is not None else default_db_path())

    def left() -> Optional[float]:
        return None if time_budget_s is None else max(0.0, time_budget_s - (time.monotonic() - start))

    try:
        with _WORKERS.use() as runner:
            reports = {}
            if searched:
                reports |= tune_backends(searched, library=True, proposer=None, builder=PoolBuilder(),
                                         runner=runner, db=database, budget=budget, time_budget_s=left(),
                                         progress=progress)
            if programmed and (time_budget_s is None or left() > 0):
                proposer = with_neighbours(get_proposer("heuristic", backends=program_backends), database,
                                           runner.device.name)
                reports |= tune_backends(programmed, library=False, proposer=proposer, builder=PoolBuilder(),
                                         runner=runner, db=database, budget=budget, time_budget_s=left(),
                                         progress=progress)
            return reports
    finally:
        if database is not db:
            database.close()

