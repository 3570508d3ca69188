"""The tuning loop: propose -> validate -> build (CPU, parallel) -> check + time (GPU, isolated) -> record.

The loop only orchestrates. Its four parts stay separate and replaceable (as in TVM
MetaSchedule): the proposer (`gemmgen.policy.proposers`), the builder (`Builder`), the
runner (`Runner`), the database (`gemmgen.tuning_db.Database`). The default builder and
runner adapt `gemmgen.backends.build` and `gemmgen.measure.worker` (see adapters.py);
tests inject fakes.

`tune_library` is the same loop for a vendor library's own algorithms (cuBLASLt): one
search per problem, in the worker, recorded as a `LibraryChoice`.

Winners that hold up: a trial that would win (it beats every baseline by more than its
noise) is measured again, in a fresh worker beside torch.matmul (`Runner.confirm`), and
recorded with that second measurement; it wins only if the low end of that speedup's
interval is above 1 (`gemmgen.measure.comparison.speedup_lower_bound`). The best of many
noisy trials is biased upward; its second measurement is not. The runner measures; the
decision is the loop's (`_confirmed`). A shape's would-be winners are confirmed after its
other trials, fastest first: one whose selection speedup is not above that of a winner already
confirmed at the problem is recorded unconfirmed, since the winners view ranks it below that
winner (same toolchain, lower speedup) and it can never serve; a fresh worker's start (seconds)
is saved for each. Where many programs beat the baseline (the narrow weights at small M), this
confirms one or two a problem instead of each that beat the ones before it.

Resumable: a (problem, program) pair already in the database for this GPU is skipped,
and so is a problem with a library choice already recorded for this GPU.
Every trial is committed as it completes, a would-be winner once confirmed, so an interruption
loses at most the one in flight and the shape's would-be winners not yet confirmed; a time
budget that runs out within a shape still confirms them. While one chunk of shapes is
measured, the next chunk's candidates build.
"""
from __future__ import annotations

import time
import zlib
from collections import Counter
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence, Union

from gemmgen.backends import registry, validate
from gemmgen.backends.base import BackendError
from gemmgen.dsl import to_text
from gemmgen.dsl.diagnostics import ProgramError
from gemmgen.dsl.ir import Problem, Program
from gemmgen.errors import GemmgenError
from gemmgen.measure.comparison import speedup_lower_bound
from gemmgen.tuning_db import BaselineTime, Database, Device, LibraryChoice, Trial
from gemmgen.tuning_db.records import SAME_SESSION_BASELINE, baseline_superseded


@dataclass(frozen=True)
class BuildOutcome:
    """A built program: the artifact, or why it failed."""

    program: Program
    artifact: Any = None
    error: str = ""
    seconds: Optional[float] = None
    retry: bool = False      # a failure the builder tries once more in a later run: not recorded

    @property
    def ok(self) -> bool:
        return self.artifact is not None and not self.error


@dataclass(frozen=True)
class Measurement:
    """Check, then time, of one built candidate in the isolated worker.

    `failure` is set when the worker hung, crashed or faulted (status run_failed);
    spreads are relative (a fraction of the median).
    """

    check_passed: Optional[bool] = None
    check_msg: str = ""
    max_rel_err: Optional[float] = None
    err_bound: Optional[float] = None
    seed: Optional[int] = None
    device_ms: Optional[float] = None
    spread: Optional[float] = None
    server_ms: Optional[float] = None
    server_spread: Optional[float] = None
    host_ms: Optional[float] = None
    failure: str = ""
    #: torch.matmul timed in the candidate's own worker session, interleaved with it
    reference: Optional[BaselineTime] = None
    #: the noise of the speedup over that reference (gemmgen.measure.comparison.speedup_noise)
    noise: Optional[float] = None


class Builder(Protocol):
    def build_many(self, programs: Sequence[Program]) -> list[BuildOutcome]: ...


class Runner(Protocol):
    device: Device

    def baselines(self, problem: Problem) -> Mapping[str, BaselineTime]: ...

    def measure(self, program: Program, artifact: Any, *, seed: Optional[int]) -> Measurement: ...

    # Optional: `confirm(program, artifact) -> Measurement`, the candidate measured again in a
    # fresh worker beside torch.matmul; a runner without it is asked to `measure` again.
    # Optional: `ready()`, waiting for what the runner starts (timed as "starting workers").

    def library(self, problem: Problem) -> Mapping[str, Any]: ...


@dataclass
class TuneReport:
    shapes: int = 0
    shapes_done: int = 0
    recorded: int = 0
    skipped: int = 0
    statuses: Counter = field(default_factory=Counter)
    stopped_by_time: bool = False
    wall_s: float = 0.0
    failures: list = field(default_factory=list)     # (problem key, why) of runs that recorded nothing
    unit: str = "trials"                             # what `recorded` counts
    phase_s: Counter = field(default_factory=Counter)   # seconds by part of the run (`timed`)

    @contextmanager
    def timed(self, phase: str):
        """Adds the block's wall time to `phase_s[phase]`."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.phase_s[phase] += time.monotonic() - start

    def summary(self) -> str:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())) or "none"
        stop = " (stopped: time budget)" if self.stopped_by_time else ""
        phases = ", ".join(f"{name} {s:.1f}" for name, s in self.phase_s.items() if s >= 0.05)
        failed = "".join(f"\n  {key}: {why}" for key, why in self.failures[:3])
        more = f"\n  ... and {len(self.failures) - 3} more" if len(self.failures) > 3 else ""
        return (f"{self.shapes_done}/{self.shapes} shapes, {self.recorded} {self.unit} recorded "
                f"({statuses}), {self.skipped} already measured, {self.wall_s:.1f} s"
                f"{f' ({phases})' if phases else ''}{stop}{failed}{more}")


@dataclass(frozen=True)
class _Plan:
    problem: Problem
    valid: list[Program]
    invalid: list[tuple[Program, str]]
    skipped: int
    short: int


def shape_seed(seed: int, problem: Problem) -> int:
    """A per-problem seed, stable across runs (what makes random proposals resumable)."""
    return (seed * 1_000_003 + zlib.crc32(problem.key.encode())) & 0x7FFFFFFF


def program_text(program: Program) -> str:
    return to_text(program)


def plan_shape(problem: Problem, proposer, budget: int, db: Database, device: Device, seed: int) -> _Plan:
    """Propose, drop what this GPU model already measured under this driver and toolchain (merged
    and older measurements are taken again), and validate the rest."""
    tried = db.measured_programs(problem, device)
    proposed = proposer.propose(problem, budget, seed=shape_seed(seed, problem))[:budget]
    valid, invalid, seen, skipped = [], [], set(), 0
    for program in proposed:
        text = program_text(program)
        if text in seen:
            continue
        seen.add(text)
        if text in tried:
            skipped += 1
            continue
        try:
            validate(program)
            valid.append(program)
        except ProgramError as exc:
            invalid.append((program, exc.message))
    return _Plan(problem, valid, invalid, skipped, budget - len(seen))


def tune(problems: Iterable[Problem], *, proposer, builder: Builder, runner: Runner, db: Database,
         budget: int, time_budget_s: Optional[float] = None, seed: int = 0,
         progress: bool = True, build_chunk: int = 8,
         on_shape: Optional[Callable[[Problem], None]] = None) -> TuneReport:
    """Tune every problem with up to `budget` trials each; see the module docstring.

    Candidates build `build_chunk` shapes at a time (one pool start serves them all), the
    next chunk building while this one is measured. `time_budget_s` stops new trials.
    `on_shape(problem)` runs once a shape's trials are all recorded (a report written as it goes).
    The run's first wait for the runner's workers is not counted against `time_budget_s` (a
    process's first run waits for their start; kept workers serve its later runs). Later waits,
    for standbys started again after confirmations took them, are counted.
    """
    # Deferred: tqdm (optional, heavy to import).
    from tqdm import tqdm

    problems = list(dict.fromkeys(problems))
    report = TuneReport(shapes=len(problems))
    start = time.monotonic()

    free_wait_s: Optional[float] = None     # the run's first wait for its workers: not budgeted

    def out_of_time() -> bool:
        spent = time.monotonic() - start - (free_wait_s or 0.0)
        return time_budget_s is not None and spent > time_budget_s

    device = runner.device
    chunks = [problems[i:i + build_chunk] for i in range(0, len(problems), max(1, build_chunk))]
    bar = tqdm(total=len(problems) * budget, unit="trial", disable=not progress, dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gemmgen-build")

    def prefetch(c: int) -> Optional[tuple[list[_Plan], Optional[Future]]]:
        if c >= len(chunks):
            return None
        with report.timed("proposals"):
            plans = [plan_shape(p, proposer, budget, db, device, seed) for p in chunks[c]]
        programs = [program for plan in plans for program in plan.valid]
        return plans, pool.submit(builder.build_many, programs) if programs else None

    def record(trial: Trial) -> None:
        if db.record(trial) is not None:
            report.recorded += 1
            report.statuses[trial.status] += 1
        bar.update(1)

    def run_shape(plan: _Plan, built: list[BuildOutcome]) -> bool:
        """Record one shape's trials; False if the time budget ran out first."""
        nonlocal free_wait_s
        problem = plan.problem
        bar.set_postfix_str(f"{problem.m}x{problem.n}x{problem.k}", refresh=False)
        report.skipped += plan.skipped
        bar.update(plan.skipped + plan.short)
        common = dict(problem=problem, device=device, proposer=proposer.name,
                      proposer_version=str(proposer.version))
        for program, message in plan.invalid:
            record(Trial(program=program_text(program), backend=program.backend, status="invalid",
                         build_msg=message, **common))
        if built and hasattr(runner, "ready"):
            with report.timed("starting workers"):
                runner.ready()
            if free_wait_s is None:
                free_wait_s = report.phase_s["starting workers"]
        with report.timed("baselines"):
            try:
                baselines = dict(runner.baselines(problem)) if built else {}
            except GemmgenError as exc:   # this problem cannot be measured here; the others can
                report.failures.append((problem.key, str(exc)))
                bar.update(len(built))
                return True
        would_win: list[tuple[Trial, BuildOutcome]] = []   # confirmed once the shape's trials are in
        in_time = True
        for outcome in built:
            if out_of_time():
                in_time = False
                break
            if outcome.retry:         # possibly transient: a later run builds it again
                report.failures.append((problem.key, f"build failed, retried in a later run: {outcome.error}"))
                continue
            with report.timed("trials"):
                trial = _trial(outcome, runner, baselines, common)
            if trial.beats_baseline():
                would_win.append((trial, outcome))
            else:
                record(trial)
        # Fastest first: a would-be winner not faster when selected than one confirmed here would
        # rank below it whatever its second time, so it is not measured again.
        confirmed_best = None     # speedup of the best winner confirmed at the problem
        for trial, outcome in sorted(would_win, key=lambda pair: pair[0].speedup, reverse=True):
            if confirmed_best is not None and trial.speedup <= confirmed_best:
                trial = replace(trial, check_msg=f"not confirmed: {trial.speedup:.3f}x when selected, not above "
                                                 f"the {confirmed_best:.3f}x of a winner confirmed in this run")
            else:
                with report.timed("confirmations"):
                    trial = _confirmed(trial, outcome, runner, baselines)
                if trial.beats_baseline():
                    confirmed_best = max(trial.speedup, confirmed_best or 0.0)
            record(trial)
        if not in_time:
            return False
        report.shapes_done += 1
        if on_shape is not None:
            on_shape(problem)
        return True

    try:
        upcoming = prefetch(0)
        for c in range(len(chunks)):
            plans, future = upcoming
            if out_of_time():
                report.stopped_by_time = True
                break
            upcoming = prefetch(c + 1)
            with report.timed("waiting for builds"):
                outcomes = iter(future.result() if future is not None else [])
            for plan in plans:
                built = [next(outcomes) for _ in plan.valid]
                if out_of_time() or not run_shape(plan, built):
                    report.stopped_by_time = True
                    break
            if report.stopped_by_time:
                break
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        bar.close()
        report.wall_s = time.monotonic() - start
    return report


#: The baseline name under which a confirmed trial keeps torch.matmul as timed in the session
#: that selected it (its own numbers are the confirmation's); its presence marks the confirmation.
SELECTION_BASELINE = "torch_selection_session"


def _trial(built: BuildOutcome, runner: Runner, baselines: dict, common: dict) -> Trial:
    base = dict(program=program_text(built.program), backend=built.program.backend, build_s=built.seconds,
                **common)
    if not built.ok:
        return Trial(status="build_failed", build_ok=False, build_msg=built.error or "no artifact", **base)
    m = runner.measure(built.program, built.artifact, seed=None)  # fresh inputs, seed recorded
    return _trial_of(m, baselines, base)


def _trial_of(m: Measurement, baselines: dict, base: dict, why: str = "") -> Trial:
    if m.failure:
        status = "run_failed"
    elif not m.check_passed:
        status = "check_failed"
    else:
        status = "ok"
    if m.reference is not None:
        # One more baseline: the same cuBLAS call, timed under the candidate's own GPU state,
        # so a win cannot come from the two processes running at different clocks.
        baselines = {**baselines, SAME_SESSION_BASELINE: m.reference}
    return Trial(status=status, build_ok=True, check_passed=m.check_passed,
                 check_msg=why + (m.failure or m.check_msg), max_rel_err=m.max_rel_err, err_bound=m.err_bound,
                 check_seed=m.seed, device_ms=m.device_ms,
                 spread=m.spread, server_ms=m.server_ms, server_spread=m.server_spread,
                 host_ms=m.host_ms, baselines=baselines, noise=m.noise if m.reference is not None else None, **base)


def _confirmed(trial: Trial, built: BuildOutcome, runner: Runner, baselines: dict) -> Trial:
    """A trial that would win, measured again and judged: the one that is recorded.

    The confirmation's numbers replace the selection's, the selection session's torch.matmul
    stays as one more baseline (SELECTION_BASELINE). It wins only if the low end of the
    speedup over the torch.matmul timed beside it (else, for runners without one, over the
    best baseline) is above 1; the winners view applies the same rule to what is recorded."""
    if not trial.beats_baseline():
        return trial
    confirm = getattr(runner, "confirm", None)
    m = confirm(built.program, built.artifact) if confirm else runner.measure(built.program, built.artifact,
                                                                             seed=None)
    kept = dict(baselines)
    if SAME_SESSION_BASELINE in trial.baselines:
        kept[SELECTION_BASELINE] = trial.baselines[SAME_SESSION_BASELINE]
    base = dict(problem=trial.problem, device=trial.device, program=trial.program, backend=trial.backend,
                build_s=trial.build_s, proposer=trial.proposer, proposer_version=trial.proposer_version)
    again = _trial_of(m, kept, base, why="confirmation in a fresh worker: ")
    if again.status != "ok":
        return again
    reference = m.reference.device_ms if m.reference is not None else again.best_baseline[1].device_ms
    low = speedup_lower_bound(again.device_ms, reference, again.margin)
    if low is None or low <= 1.0:
        return replace(again, check_msg=f"not a winner: the speedup's lower bound {low or 0:.3f} in a fresh worker "
                                        "is not above 1")
    return again


def tune_library(problems: Iterable[Problem], *, runner: Runner, db: Database,
                 time_budget_s: Optional[float] = None, progress: bool = True,
                 on_shape: Optional[Callable[[Problem], None]] = None) -> TuneReport:
    """Record cuBLASLt's fastest algorithm for every problem not yet searched on this GPU by the
    current method (`searched`; an older method's choice is searched again).

    `runner.library(problem)` selects, checks and times it beside torch.matmul
    (gemmgen.measure.library); a search that fails is reported, not recorded. A gated problem
    has no library algorithm (no library fuses the gate): its baselines run the plain product
    and the gate as torch ops, so it is skipped. Within `time_budget_s`, a search expected to
    end past it (`library_search_s`) is not begun. `on_shape(problem)` runs after each search."""
    # Deferred: tqdm (optional, heavy to import).
    from tqdm import tqdm

    problems = [p for p in dict.fromkeys(problems) if not p.epilogue.gate]
    report = TuneReport(shapes=len(problems), unit="library choices")
    start = time.monotonic()
    device = runner.device
    todo = [p for p in problems if not searched(db.library_choices(p.key, device.name))]
    report.skipped = len(problems) - len(todo)
    report.shapes_done = report.skipped
    try:
        for problem in tqdm(todo, unit="shape", disable=not progress, dynamic_ncols=True):
            if time_budget_s is not None:
                # a search under way runs to its end, so one expected to end past the budget is
                # not begun; a smaller problem after it may still fit
                left = time_budget_s - (time.monotonic() - start)
                if library_search_s(problem) > left:
                    report.stopped_by_time = True
                    if left <= 0:
                        break
                    continue
            found = runner.library(problem)
            choice = library_choice(found, problem, device)
            status = "run_failed" if choice is None else "ok" if choice.check_passed else "check_failed"
            if choice is None:
                report.failures.append((problem.key, found.get("error") or "the search returned no timing"))
            if choice is not None and db.record_library(choice) is not None:
                report.recorded += 1
            report.statuses[status] += 1
            report.shapes_done += 1
            if on_shape is not None:
                on_shape(problem)
    finally:
        report.wall_s = time.monotonic() - start
    return report


def searched(choices: Iterable[LibraryChoice]) -> bool:
    """Whether one of these choices came from the current search on this GPU model: its method,
    the noise of its speedup and, if it would serve, its server-mode time (older and merged,
    unverified choices, and those timed against a baseline since made faster, are searched
    again)."""
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.library import SEARCH

    return any(not c.unverified and not baseline_superseded(c.problem, c.created)
               and c.config.get("search") == SEARCH and c.noise is not None
               and (c.server_ms is not None or not c.beats_torch()) for c in choices)


def library_choice(found: Mapping[str, Any], problem: Problem, device: Device) -> Optional[LibraryChoice]:
    """The record of a library search (gemmgen.measure.library's dict); None if it has nothing
    to record (the search failed before an algorithm was chosen, or its timing failed)."""
    if not found or "algorithm" not in found or found.get("error"):
        return None
    if found["check_passed"] and not (found.get("device_ms") and found.get("torch_ms")):
        return None
    # the search's dict names the record's fields; it also carries what the record leaves out
    # (host times, clocks, the check's failures); `created` and `id` are the database's
    recorded = {f.name: found[f.name] for f in fields(LibraryChoice)
                if f.name in found and f.name not in ("problem", "device", "created", "id")}
    return LibraryChoice(problem=problem, device=device, **recorded | {"check_passed": bool(found["check_passed"])})


def split_library(backends: Sequence[str]) -> tuple[bool, tuple[str, ...]]:
    """(whether `LIBRARY` is asked for, the program backends) of a --backends list."""
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.library import LIBRARY

    return LIBRARY in backends, tuple(b for b in backends if b != LIBRARY)


def reports_summary(reports: Mapping[str, TuneReport], empty: str = "nothing run") -> str:
    """One line of `tune_backends`' reports: what each part ran and recorded (`empty` if none ran)."""
    return "; ".join(f"{part}: {report.summary()}" for part, report in reports.items()) or empty


#: Where cuBLASLt's own algorithms, not programs, win: batches of LIBRARY_MIN_M rows or more
#: over LIBRARY_MIN_GFLOP. Of the shipped H200 records' problems tried both ways, there a
#: program won 7 of 706 and a cuBLASLt choice 250; at M >= 32 under 1 GFLOP programs won 168
#: of 305 and choices 39. At M <= 16 programs won 65 of the 175 tried.
LIBRARY_MIN_M = 32
LIBRARY_MIN_GFLOP = 1.0


def library_first(problem: Problem) -> bool:
    """Whether the records say cuBLASLt's algorithms, not programs, win problems like this one
    (never for a gated product: no library algorithm fuses the gate)."""
    return problem.m >= LIBRARY_MIN_M and problem.gflop >= LIBRARY_MIN_GFLOP and not problem.epilogue.gate


#: What one cuBLASLt search took on the H200 (benchmarks/results/tune_llm_library/log.txt, its
#: progress bar): about 5 s, and about 25 s more per GB of operands (4-8 s at 10-300 MB, 12-29 s
#: at a 1.1 GB LM head, 41-60 s at Llama-3-70B's 2.1 GB one); at M = 2048 about 30 s more per
#: TFLOP (the records' times in benchmarks/results/tune_llm_library_m2048_8192/: 13 s at
#: 2048 x 8192 x 8192, 39-48 s at 0.96 TFLOP, 73 s at 1.9, about 115 s at the 2.2 TFLOP LM head).
LIBRARY_SEARCH_BASE_S = 5.0
LIBRARY_SEARCH_S_PER_GB = 25.0
LIBRARY_SEARCH_S_PER_TFLOP = 30.0


def library_search_s(problem: Problem) -> float:
    """The seconds cuBLASLt's search is expected to take for `problem` (an estimate from the H200)."""
    return (LIBRARY_SEARCH_BASE_S + LIBRARY_SEARCH_S_PER_GB * problem.bytes / 1e9
            + LIBRARY_SEARCH_S_PER_TFLOP * problem.flops / 1e12)


#: `--backends auto`: cuBLASLt's search where `library_first`, then every backend's programs.
AUTO_BACKENDS = "auto"


def parse_backends(text: str) -> tuple[Union[bool, Callable[[Problem], bool]], tuple[str, ...]]:
    """A --backends value -> (`library` as `tune_backends` takes it, the program backends):
    AUTO_BACKENDS, or a comma list of backends and `cublaslt`."""
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.library import LIBRARY

    names = [b.strip() for b in text.split(",") if b.strip()]
    if names == [AUTO_BACKENDS]:
        return library_first, registry.NAMES
    unknown = [n for n in names if n not in (*registry.NAMES, LIBRARY)]
    if unknown or not names:
        raise BackendError(f"--backends {text!r}: {', '.join(unknown) or 'nothing'} not understood; give "
                           f"{AUTO_BACKENDS!r} alone, or a comma list of {', '.join((*registry.NAMES, LIBRARY))}")
    return split_library(names)


def tune_backends(problems: Iterable[Problem], *, library: Union[bool, Callable[[Problem], bool]], proposer,
                  builder: Builder, runner: Runner, db: Database, budget: int, time_budget_s: Optional[float] = None,
                  seed: int = 0, progress: bool = True, announce=lambda line: None,
                  on_shape: Optional[Callable[[Problem], None]] = None) -> dict[str, TuneReport]:
    """The library search (for every problem if `library` is True, or those it says yes to, e.g.
    `library_first`), then the program loop (if a `proposer` is given) with what is left of one
    time budget. Returns the reports by part: 'cublaslt', 'programs'. `on_shape(problem)` runs
    after each problem of either part."""
    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.library import LIBRARY

    problems = list(problems)
    start, reports = time.monotonic(), {}
    searched = [p for p in problems if library(p)] if callable(library) else problems if library else []
    if searched:
        announce(f"searching cuBLASLt's algorithms for {len(searched)} shapes")
        reports[LIBRARY] = tune_library(searched, runner=runner, db=db, time_budget_s=time_budget_s,
                                        progress=progress, on_shape=on_shape)
        announce(f"{LIBRARY}: {reports[LIBRARY].summary()}")
    left = None if time_budget_s is None else time_budget_s - (time.monotonic() - start)
    if proposer is not None and (left is None or left > 0):
        names = ",".join(getattr(proposer, "backends", None) or ("all",))
        announce(f"tuning {len(problems)} shapes: proposer {proposer.name} v{proposer.version}, "
                 f"budget {budget}, backends {names}")
        reports["programs"] = tune(problems, proposer=proposer, builder=builder, runner=runner, db=db,
                                   budget=budget, time_budget_s=left, seed=seed, progress=progress,
                                   on_shape=on_shape)
        announce(reports["programs"].summary())
    return reports
