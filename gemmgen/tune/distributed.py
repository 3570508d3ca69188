"""Tuning over many GPUs and hosts, launched by torchrun: one rank per GPU.

    torchrun --nproc-per-node G [--nnodes H --rdzv-endpoint HOST:PORT] -m gemmgen tune --distributed ...

- **Sharing.** The problems are ordered by estimated cost, the most expensive first, and each
  rank takes the next one from one counter in torch.distributed's `TCPStore`: the long problems
  start first, and a rank that finishes early takes the next instead of waiting on a fixed
  share (longest-first order, assigned as ranks come free).
- **Each rank** measures on its own GPU (LOCAL_RANK), builds on its share of the host's cores,
  and records into a database of its own beside the main one (`<db>.rank<R>.sqlite`: SQLite
  has one writer), seeded from the main database so that nothing measured before is measured
  again. After every problem it writes its export (`<db>.rank<R>.jsonl`).
- **Gathering.** When the counter runs out, rank 0 waits for each rank's `done` key and merges
  every rank's export into the main database through the existing merge, as records this run
  measured. A rank that never says done (it died) is given up after `gather_timeout_s`: its
  export up to its last finished problem is merged all the same, so it loses only the problem
  it was measuring, and running the same command again finishes what is left (the tune loop
  skips every program already measured). torchrun itself stops every rank when one fails, so
  then nothing is gathered: the next run's rank 0 first merges every export left beside the
  database (an export is removed once merged). With several hosts, the database's folder must
  be one every host writes to and rank 0 reads.
- **The store** is a `TCPStore` on MASTER_ADDR at MASTER_PORT + 1 (torchrun sets both; rank 0
  serves it), so no collective call can hang on a rank that died.

The pieces serve other runs over the same ranks: `share_out` shares any list of items (the
policy's evaluation, benchmarks/policy_eval.py), and `seed_rank` then `finish` give a rank its
own database and gather it where something else shares the work out (GRPO's reward, whose
prompts trl deals to the ranks: gemmgen.policy.training.reward.measure_rewards).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, TypeVar, Union

from gemmgen.dsl.ir import Problem
from gemmgen.errors import GemmgenError
from gemmgen.tune import TuneReport, tune_backends
from gemmgen.tuning_db import Database
from gemmgen.tuning_db.exchange import export, merge

#: store keys
_NEXT, _READY, _ARRIVED, _DONE = "next", "ready", "arrived", "done/{}"
#: how long the ranks wait for each other before the first problem (a rank that failed to start never comes)
START_TIMEOUT_S = 120.0
#: how long rank 0 waits for the other ranks once the problems ran out (a rank that died never answers)
GATHER_TIMEOUT_S = 900.0
_POLL_S = 0.2
T = TypeVar("T")


class DistributedError(GemmgenError):
    """A distributed tuning run that cannot start as asked."""


@dataclass(frozen=True)
class Rank:
    """Where this process stands in a torchrun launch (its environment variables)."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    @classmethod
    def from_env(cls, env: Optional[dict] = None, how: str = "-m gemmgen tune --distributed ...") -> "Rank":
        """`how`: the rest of the torchrun command line that the error suggests."""
        env = os.environ if env is None else env
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise DistributedError(f"--distributed runs under torchrun, which sets {', '.join(missing)}: start it as "
                                   f"`torchrun --nproc-per-node G {how}`")
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        return cls(rank, world, int(env.get("LOCAL_RANK", rank)), int(env.get("LOCAL_WORLD_SIZE", world)))

    def cores(self, total: Optional[int] = None) -> int:
        """This rank's share of the host's cores, for its builds."""
        return max(1, (total or os.cpu_count() or 1) // self.local_world)


def pin_gpu(rank: Rank, env: Optional[dict] = None) -> None:
    """Make this rank's GPU (LOCAL_RANK of the visible ones) the only one it and its measuring
    worker see, before CUDA starts: its records then name the GPU by NVML's index
    (`gemmgen.measure.clocks.nvml_index` reads CUDA_VISIBLE_DEVICES), not CUDA's 0."""
    env = os.environ if env is None else env
    visible = [e.strip() for e in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if visible and rank.local_rank >= len(visible):
        raise DistributedError(f"local rank {rank.local_rank} has no GPU: CUDA_VISIBLE_DEVICES lists "
                               f"{len(visible)}; launch at most that many processes per node")
    env["CUDA_VISIBLE_DEVICES"] = visible[rank.local_rank] if visible else str(rank.local_rank)


def connect(rank: Rank, env: Optional[dict] = None, timeout_s: float = 300.0):
    """The run's store: a TCPStore served by rank 0 on MASTER_ADDR, MASTER_PORT + 1."""
    # Deferred: torch (optional, heavy to import).
    from torch.distributed import TCPStore

    env = os.environ if env is None else env
    return TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]) + 1, rank.world, is_master=rank.rank == 0,
                    timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def cost_order(problems: Sequence[Problem]) -> list[Problem]:
    """The most expensive first: a trial times the kernel many times, so its cost grows with the
    problem's physical floor (FLOPs at peak, or bytes at HBM's rate); ties keep their order."""
    return sorted(dict.fromkeys(problems), key=lambda p: -p.floor_s)


def rank_paths(db_path: Path, rank: int) -> tuple[Path, Path]:
    """(database, export) of one rank, beside the main database."""
    return (db_path.with_name(f"{db_path.name}.rank{rank}.sqlite"),
            db_path.with_name(f"{db_path.name}.rank{rank}.jsonl"))


def seed_rank(rank: Rank, store, db_path: Path, start_timeout_s: float = START_TIMEOUT_S) -> tuple[Path, Path]:
    """This rank's (database, export), its database a fresh copy of the main one (rank 0 creates
    that first) so that nothing measured before is measured again; returns once every rank has
    arrived (or after `start_timeout_s`), so that the first items spread over every rank."""
    db_path = Path(db_path)
    own_db, own_export = rank_paths(db_path, rank.rank)
    if rank.rank == 0:
        with Database(db_path) as db:                # created and migrated before anyone copies it
            # An earlier run's exports that no rank 0 gathered: torchrun stops every rank when one fails.
            _take_in(db, sorted(db_path.parent.glob(f"{glob.escape(db_path.name)}.rank*.jsonl")))
        store.set(_READY, "1")
    else:
        store.wait([_READY])
    for stale in (own_db, *(own_db.with_name(own_db.name + s) for s in ("-wal", "-shm", "-journal"))):
        stale.unlink(missing_ok=True)                # a rank that died left these behind
    shutil.copyfile(db_path, own_db)
    _arrive(store, rank.world, start_timeout_s)
    return own_db, own_export


def take(store, count: int, stop: Callable[[], bool] = lambda: False) -> Iterator[int]:
    """The indices (below `count`) this rank takes from the shared counter, until they run out
    or `stop()` says so (checked before each take, so a stopped rank leaves the next to others)."""
    while not stop():
        index = store.add(_NEXT, 1) - 1
        if index >= count:
            return
        yield index


def finish(rank: Rank, store, db_path: Path, summary: dict, gather_timeout_s: float = GATHER_TIMEOUT_S) -> dict:
    """Say this rank is done, with its `summary` (JSON); on rank 0, also gather (see `gather`)."""
    store.set(_DONE.format(rank.rank), json.dumps(summary))
    return {**summary, **(gather(rank, store, Path(db_path), gather_timeout_s) if rank.rank == 0 else {})}


def share_out(items: Sequence[T], rank: Rank, store, *, db_path: Path, work: Callable[[T, Database], object],
              stop: Callable[[], bool] = lambda: False, gather_timeout_s: float = GATHER_TIMEOUT_S,
              start_timeout_s: float = START_TIMEOUT_S) -> dict:
    """This rank's part of a shared run: `work(item, its database)` on each item it takes, in the
    order given, exporting after each; then `finish`. Returns {"rank", "done": indices}, and on
    rank 0 what `gather` returns."""
    own_db, own_export = seed_rank(rank, store, db_path, start_timeout_s)
    done = []
    with Database(own_db) as db:
        for index in take(store, len(items), stop):
            work(items[index], db)
            export(db, own_export)
            done.append(index)
    return finish(rank, store, db_path, {"rank": rank.rank, "done": done}, gather_timeout_s)


def run_rank(problems: Sequence[Problem], rank: Rank, store, *, db_path: Path,
             tune_one: Callable[[Problem, Database], dict[str, TuneReport]],
             gather_timeout_s: float = GATHER_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S) -> dict:
    """This rank's part of a tuning run (see the module docstring): the problems the most
    expensive first; returns what it did, and on rank 0 what was gathered."""
    order = cost_order(problems)
    out = share_out(order, rank, store, db_path=db_path, work=tune_one, gather_timeout_s=gather_timeout_s,
                    start_timeout_s=start_timeout_s)
    return {**out, "problems": [order[i].key for i in out["done"]]}


def _arrive(store, world: int, timeout_s: float) -> None:
    """Start together (up to `timeout_s`)."""
    store.add(_ARRIVED, 1)
    deadline = time.monotonic() + timeout_s
    while store.add(_ARRIVED, 0) < world and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def gather(rank: Rank, store, db_path: Path, timeout_s: float) -> dict:
    """Rank 0: wait for every rank's done key (up to `timeout_s`), then merge every export.
    Returns the ranks that never said done, the records merged, and each finished rank's summary."""
    deadline = time.monotonic() + timeout_s
    waiting = set(range(rank.world))
    while waiting and time.monotonic() < deadline:
        waiting = {r for r in waiting if not store.check([_DONE.format(r)])}
        if waiting:
            time.sleep(_POLL_S)
    with Database(db_path) as db:
        merged = _take_in(db, [rank_paths(db_path, r)[1] for r in range(rank.world)])
    summaries = {r: json.loads(store.get(_DONE.format(r))) for r in range(rank.world) if r not in waiting}
    return {"lost_ranks": sorted(waiting), "merged": merged, "ranks": summaries}


def _take_in(db: Database, exports: Sequence[Path]) -> int:
    """Merge ranks' exports into the main database, as records measured on these GPUs, and
    remove them: an export on disk is one not gathered yet. Returns the records new to `db`."""
    merged = 0
    for path in exports:
        if path.exists():
            merged += merge(db, path, verified=True)[0]
            path.unlink()
    return merged


def tune_one_with(*, proposer, builder, runner, budget: int, time_budget_s: Optional[float], seed: int = 0,
                  library: Union[bool, Callable[[Problem], bool]] = False
                  ) -> Callable[[Problem, Database], dict[str, TuneReport]]:
    """A `tune_one` for `run_rank`: the tune loop on one problem, within what is left of the time budget."""
    start = time.monotonic()

    def tune_one(problem: Problem, db: Database) -> dict[str, TuneReport]:
        left = None if time_budget_s is None else max(0.0, time_budget_s - (time.monotonic() - start))
        return tune_backends([problem], library=library, proposer=proposer, builder=builder, runner=runner,
                             db=db, budget=budget, time_budget_s=left, seed=seed, progress=False)

    return tune_one
