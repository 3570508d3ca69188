"""Tuning from inside a compile: the problems of op keys the graph pass found without a
measured kernel, tuned into the database before the graph is finished."""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable

from gemmgen.compile import clear_cache
from gemmgen.torch_compile.ops import clear_kernels, problem_of, resolve
from gemmgen.tune import reports_summary
from gemmgen.tune.on_demand import tune_now


def tune_keys(keys: Iterable[tuple], db=None, budget: int = 8, time_budget_s: float | None = None,
              backends: Iterable[str] | None = None, *, found: int | None = None):
    """Tune the problems of these op keys (`missing_keys()`) into the database (GPU), with a
    progress bar, then forget cached kernels so the next compile sees the winners, and print one
    line: GEMMs found (`found`, else the keys), tuned, won, seconds. Returns the reports
    (`gemmgen.tune.on_demand.tune_now`)."""
    keys = list(dict.fromkeys(keys))
    problems = list(dict.fromkeys(problem_of(key) for key in keys))
    start = time.monotonic()
    reports = tune_now(problems, db=db, budget=budget, time_budget_s=time_budget_s, backends=backends,
                       progress=True)
    logging.getLogger("gemmgen.torch").info("gemmgen: tuned %d missing problems: %s", len(problems),
                                            reports_summary(reports))
    clear_cache()
    clear_kernels()
    won = sum(resolve(key, db).provenance.how != "baseline" for key in keys)
    print(f"gemmgen: {len(keys) if found is None else found} GEMMs found, {len(problems)} tuned, {won} won, "
          f"{time.monotonic() - start:.0f} s", file=sys.stderr)
    return reports
