"""time(fn, problem, mode): device time from CUPTI kernel records, and host-inclusive time.

Device time. Calls run inside torch.profiler (CUPTI activity records), each wrapped in
a `record_function` range and preceded by the L2 flush (a read of 128+ MiB). Every GPU
activity (kernel, memset, memcpy) a call launched, on whatever stream, is attributed to
it (attribute_activities: by CUPTI correlation to the torch op that launched it, or,
for launches from library code outside torch ops, by GPU time between the flushes);
the device time of a call is the sum of their durations. The flush is never counted,
nor are host gaps between kernels. Per kernel: warm-up, then at least `min_reps` calls
(short kernels get more, up to `max_reps`, as `rep_budget_s` allows; server mode uses
exactly `min_reps`); median, p10/p90 and IQR reported. Kernels timed together are
interleaved in a seeded shuffled order, so drift in clocks or heat hits all alike.

Inputs (rotation.py): every call, timed or not, gets fresh random normal inputs in one of a
rotation of buffers, refilled outside the timed range, with `out` poisoned; sampled calls
(each kernel's last among them) are judged by the check's rules. A failed sample makes the
timing a MeasureError naming it, never a time.

The flush reads a buffer of max(128 MiB, 4 x L2), so the L2 it leaves holds clean lines. A
flush that wrote the buffer (`TimingOptions(flush="write")`) left ~60 MiB of dirty lines
that the timed kernel's own reads then evicted, writing them back inside its time: a
memory-bound kernel paid for up to 60 MiB of writes it never made (docs/measure.md).

Modes: `offline` (L2 flushed, calls back to back), `server` (L2 flushed, then the
device is synchronised and the host sleeps a seeded exponential gap, mean
`mean_gap_s`, before each call), `warm` (no flush, back to back).

Host-inclusive time, measured without the profiler: offline/warm: wall clock of
`host_reps` back-to-back calls between two device synchronisations, divided by the
count (CUDA-L2's timer: launch overhead included, L2 warm); server: per call, flush,
synchronise, gap, then wall clock from the call to the end of a device-wide
synchronisation. Every clock stops only after torch.cuda.synchronize() (all streams).

A median device time under Problem.floor_s raises FloorViolation: it is not recorded.

Clocks. Once per round of the device-timed loop, while the GPU still works on it, NVML's SM
clock and clock-event reasons are read (`clocks.py`); every Timing of the session carries
their summary in `clocks`, so sessions run at different clocks can be told apart.
"""
from __future__ import annotations

import bisect
import math
import random
import re
import time as _clock
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

from gemmgen.dsl.ir import Problem
from gemmgen.errors import NoGPUError
from gemmgen.measure.clocks import ClockSampler, nvml_index
from gemmgen.measure.errors import FloorViolation, MeasureError, TimedCheckFailure
from gemmgen.measure.numerics import median, quantile

MODES = ("offline", "server", "warm")
_CALL = "gemmgen.call."
_FLUSH = "gemmgen.flush"
PROFILE_ATTEMPTS = 3         # profiled runs of one batch before a lost record fails it


@dataclass(frozen=True)
class TimingOptions:
    warmup: int = 3
    min_reps: int = 30
    max_reps: int = 200
    rep_budget_s: float = 0.02      # device seconds per kernel that may buy reps past min_reps
    mean_gap_s: float = 1e-3        # server mode
    host_reps: int = 30
    seed: int = 0
    flush_bytes: Optional[int] = None   # None: max(128 MiB, 4 x L2)
    flush: str = "read"             # "read" leaves L2 clean; "write" (a fill) leaves it dirty
    check_floor: bool = True
    timer: str = "cupti"            # or "events": CUDA events on the calling stream (a fallback)
    clocks: bool = True             # sample the SM clock during the timed loop (NVML)


@dataclass(frozen=True)
class Timing:
    mode: str
    device_ms: float          # median over calls
    device_p10_ms: float
    device_p90_ms: float
    device_iqr_ms: float
    host_ms: float            # see module docstring for what it includes per mode
    host_p10_ms: float
    host_p90_ms: float
    reps: int
    floor_ms: float
    kernels: tuple[str, ...] = ()   # GPU activities of one call, in launch order
    timer: str = "cupti"
    notes: tuple[str, ...] = field(default_factory=tuple)
    clocks: dict = field(default_factory=dict, compare=False)   # the session's ClockSampler.summary()
    #: every call's device time in round order (sample i of each kernel of one session was
    #: timed in round i): what `comparison.speedup_noise` pairs; left out of to_dict()
    samples_ms: tuple[float, ...] = field(default=(), compare=False, repr=False)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median of the device time."""
        return (self.device_p90_ms - self.device_p10_ms) / self.device_ms

    @property
    def fraction_of_floor(self) -> float:
        return self.floor_ms / self.device_ms

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["samples_ms"]
        d["spread"] = self.spread
        d["fraction_of_floor"] = self.fraction_of_floor
        return d


@dataclass
class _Entry:
    name: str
    fn: Callable
    problem: Problem
    args: tuple
    kwargs: dict
    reps: int = 0
    error: Optional[Exception] = None
    device_us: list = field(default_factory=list)
    kernels: tuple = ()
    host_s: list = field(default_factory=list)
    rotation: Any = None                    # rotation.Rotation of the problem, shared per problem
    checked_rounds: frozenset = frozenset()
    judged: list = field(default_factory=list)   # (which call, seed, the check's numbers)

    def call(self) -> None:
        self.fn(*self.args, **self.kwargs)

    def load(self, seed: int) -> int:
        """The next input set of the rotation, refilled from `seed`, for the next call."""
        self.args, self.kwargs = self.rotation.prepare(seed)
        return seed

    def judge(self, which: str, seed: int) -> None:
        """Queue the check of the last call's output (read after the loop)."""
        self.judged.append((which, seed, self.rotation.stats(self.args[2], seed)))


def flusher(options: TimingOptions, device) -> Callable[[], None]:
    # Deferred: torch (optional, heavy to import).
    import torch

    size = options.flush_bytes
    if size is None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
        size = max(128 << 20, 4 * l2)
    buf = torch.zeros(size // 8, dtype=torch.int64, device=device)
    if options.flush == "write":
        return lambda: buf.zero_()
    if options.flush != "read":
        raise ValueError(f"flush={options.flush!r}: write 'read' (L2 left clean) or 'write' (left dirty)")
    return lambda: torch.sum(buf)


def _sleep_until(deadline: float) -> None:
    """Host sleep, finished by spinning: time.sleep alone overshoots by ~60 us."""
    while True:
        left = deadline - _clock.perf_counter()
        if left <= 0:
            return
        if left > 3e-4:
            _clock.sleep(left - 2e-4)


def _gap(rng: random.Random, options: TimingOptions) -> None:
    _sleep_until(_clock.perf_counter() + rng.expovariate(1.0 / options.mean_gap_s))


def _estimate_reps(entry: _Entry, mode: str, options: TimingOptions, flush) -> int:
    """Warm up, and size the run: short kernels get more calls, none gets fewer than min_reps."""
    # Deferred: torch (optional, heavy to import).
    import torch

    for _ in range(options.warmup):
        entry.load(entry.rotation.untimed_seed())
        entry.call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    entry.load(entry.rotation.untimed_seed())
    flush()
    start.record()
    entry.call()
    end.record()
    torch.cuda.synchronize()
    if mode == "server":
        return options.min_reps          # each call there costs a gap; the count stays fixed
    est_s = max(start.elapsed_time(end) * 1e-3, 1e-6)
    return int(min(options.max_reps, max(options.min_reps, options.rep_budget_s / est_s)))


def _ns(event, what: str) -> int:
    """start_ns/end_ns/duration_ns of a raw kineto event (microsecond accessors on old torch)."""
    get = getattr(event, f"{what}_ns", None)
    return int(get()) if get is not None else int(getattr(event, f"{what}_us")() * 1000)


_NOT_WORK = ("annotation", "sync", "overhead", "runtime", "driver")


def _is_device_work(ev) -> bool:
    """Kernels, copies and fills; not the GPU-side spans kineto draws for user annotations
    nor its synchronisation markers."""
    if ev.name().startswith(_CALL) or getattr(ev, "is_user_annotation", lambda: False)():
        return False
    kind = getattr(ev, "activity_type", None)
    return kind is None or not any(word in str(kind()).lower() for word in _NOT_WORK)


_API_NAME = re.compile(r"^cu(da)?[A-Z]")


def _is_torch_op(ev) -> bool:
    """A torch op or user range, whose correlation id GPU activities link to; not a CUDA
    runtime/driver record (those carry CUPTI's ids, another numbering)."""
    if ev.linked_correlation_id() != 0 or _API_NAME.match(ev.name()):
        return False
    kind = getattr(ev, "activity_type", None)
    return kind is None or not any(word in str(kind()).lower() for word in ("runtime", "driver"))


def attribute_activities(events) -> dict[int, list[list[tuple[str, int]]]]:
    """Per call range `gemmgen.call.<i>`: the GPU activities (name, ns) the call launched.

    Two links, because CUPTI gives two kinds of launches. (1) A launch from inside a torch
    op (aten::mm ...) carries that op's correlation id: the op lies inside exactly one call
    range, found by its start time. (2) A launch from plain library code (cuBLASLt through
    nvmath, a driver-API launcher) may carry none: it is placed by GPU time, after the
    marker of its call. Markers are the GPU work of the `gemmgen.flush` range before each
    call (the L2 flush, or a tiny fill in warm mode); each flush range belongs to the first
    call range that starts after it ends. GPU work of ops outside every range (allocations,
    the profiler's own) is neither counted nor taken for a marker.
    Pure over the raw kineto events, so it is tested with stand-ins on CPU.
    """
    # Deferred: torch (optional, heavy to import).
    from torch.autograd import DeviceType

    op_start: dict[int, int] = {}
    ranges: list[tuple[int, int, int]] = []
    flushes: list[tuple[int, int]] = []
    device: list[tuple[int, int, int, str]] = []
    for ev in events:
        if ev.device_type() == DeviceType.CPU:
            if not _is_torch_op(ev):
                continue                      # runtime/driver API records (cudaLaunchKernel ...)
            start = _ns(ev, "start")
            op_start[ev.correlation_id()] = start
            name = ev.name()
            if name.startswith(_CALL):
                ranges.append((start, _ns(ev, "end"), int(name[len(_CALL):])))
            elif name == _FLUSH:
                flushes.append((start, _ns(ev, "end")))
        elif _is_device_work(ev):
            device.append((ev.linked_correlation_id(), _ns(ev, "start"), _ns(ev, "duration"), ev.name()))
    ranges.sort()
    flushes.sort()
    starts = [r[0] for r in ranges]
    flush_starts = [f[0] for f in flushes]

    def enclosing(spans, span_starts, cpu_start: int):
        j = bisect.bisect_right(span_starts, cpu_start) - 1
        return j if j >= 0 and cpu_start <= spans[j][1] else None

    per_range: list[list[tuple[int, str, int]]] = [[] for _ in ranges]
    marker_start: dict[int, int] = {}     # flush index -> GPU start of its first activity
    orphans = []
    for corr, gpu_start, dur, name in device:
        cpu_start = op_start.get(corr) if corr else None
        if cpu_start is None:
            orphans.append((gpu_start, dur, name))
            continue
        j = enclosing(ranges, starts, cpu_start)
        if j is not None:
            per_range[j].append((gpu_start, name, dur))
            continue
        f = enclosing(flushes, flush_starts, cpu_start)
        if f is not None:
            marker_start[f] = min(gpu_start, marker_start.get(f, gpu_start))
    if orphans:
        markers = []                      # (GPU start, index of the call range it precedes)
        for f, gpu_start in marker_start.items():
            j = bisect.bisect_left(starts, flushes[f][1])
            if j < len(ranges):
                markers.append((gpu_start, j))
        markers.sort()
        if len(markers) != len(ranges):
            raise MeasureError(f"cannot place {len(orphans)} GPU activities launched outside torch ops: "
                               f"{len(markers)} flush markers for {len(ranges)} calls")
        marker_times = [m[0] for m in markers]
        for gpu_start, dur, name in orphans:
            k = bisect.bisect_right(marker_times, gpu_start) - 1
            if k >= 0:
                per_range[markers[k][1]].append((gpu_start, name, dur))
    calls: dict[int, list[list[tuple[str, int]]]] = {}
    for (_, _, index), acts in zip(ranges, per_range):
        calls.setdefault(index, []).append([(name, dur) for _, name, dur in sorted(acts)])
    return calls


def _schedule(entries: list[_Entry], mode: str, options: TimingOptions, flush, timed_call,
              on_round: Callable[[], None]) -> None:
    """The timed loop: per rep, every kernel once in a shuffled order, each call preceded
    by its inputs (fresh values from the round's seed, out poisoned) and its flush (warm
    mode: a 1-element fill, so every call still has its marker) and, in a checked round,
    followed by the check of its output; `on_round` after each round's last launch, before
    anything waits for the GPU."""
    # Deferred: torch (optional, heavy to import).
    import torch

    # Deferred: torch (optional, heavy to import).
    from torch.profiler import record_function

    device = torch.device(entries[0].rotation.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rng = random.Random(options.seed)
    marker = torch.zeros(1, device=device)
    before = flush if mode != "warm" else marker.zero_
    for rep in range(max(e.reps for e in entries)):
        order = [i for i, e in enumerate(entries) if rep < e.reps and e.error is None]
        rng.shuffle(order)
        for i in order:
            entry = entries[i]
            seed = entry.load(entry.rotation.round_seed(rep))
            with record_function(_FLUSH):
                before()
            if mode == "server":
                sync()
                _gap(rng, options)
            try:
                timed_call(i)
            except Exception as exc:  # noqa: BLE001 - recorded against that kernel alone
                entry.error = exc
                continue
            if rep in entry.checked_rounds:
                entry.judge(f"timed call {rep + 1} of {entry.reps}", seed)
        on_round()
    sync()


def _events_device(entries: list[_Entry], mode: str, options: TimingOptions, flush, on_round) -> None:
    """Fallback timer: CUDA events around each call on the calling stream. It cannot see
    work on other streams (the check rejects such kernels before they are timed)."""
    # Deferred: torch (optional, heavy to import).
    import torch

    pending = []

    def timed_call(i: int) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        entries[i].call()
        end.record()
        pending.append((i, start, end))

    _schedule(entries, mode, options, flush, timed_call, on_round)
    for i, start, end in pending:
        entries[i].device_us.append(start.elapsed_time(end) * 1e3)


def _profile_device(entries: list[_Entry], mode: str, options: TimingOptions, flush, on_round) -> None:
    # Deferred: torch (optional, heavy to import).
    from torch.profiler import ProfilerActivity, profile, record_function

    def timed_call(i: int) -> None:
        with record_function(f"{_CALL}{i}"):
            entries[i].call()

    # The profiler now and then loses one record in thousands (on the H200: one flush marker in
    # 4,200 or 6,600 calls, at 1 and at 5 of the 73 shapes of two searches), and then no launch
    # outside torch ops can be placed: the batch is profiled again, from the same shuffle,
    # before it counts as failed.
    for attempt in range(PROFILE_ATTEMPTS):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _schedule(entries, mode, options, flush, timed_call, on_round)
        try:
            attributed = attribute_activities(prof.profiler.kineto_results.events())
            break
        except MeasureError as exc:
            if attempt + 1 == PROFILE_ATTEMPTS:
                for entry in entries:
                    entry.error = entry.error or exc
                return
    for index, calls in attributed.items():
        entry = entries[index]
        for acts in calls:
            entry.device_us.append(sum(ns for _, ns in acts) * 1e-3)
            if not entry.kernels and acts:
                entry.kernels = tuple(name for name, _ in acts)


def _time_host(entry: _Entry, mode: str, options: TimingOptions, flush, rng: random.Random) -> None:
    # Deferred: torch (optional, heavy to import).
    import torch

    # Deferred: torch (rotation.py holds tensors).
    from gemmgen.measure.rotation import ROTATION_SETS

    if options.host_reps <= 0:
        return

    rotation = entry.rotation
    if mode == "server":
        for _ in range(options.host_reps):
            seed = entry.load(rotation.untimed_seed())
            flush()
            torch.cuda.synchronize()
            _gap(rng, options)
            t0 = _clock.perf_counter()
            entry.call()
            torch.cuda.synchronize()
            entry.host_s.append(_clock.perf_counter() - t0)
        entry.judge("the last host-timed call", seed)
        return
    batches, per = 5, max(1, options.host_reps // 5)
    sets = min(per, ROTATION_SETS)
    for _ in range(batches):
        seeds = [rotation.untimed_seed() for _ in range(sets)]
        loaded = [rotation.prepare(seed) for seed in seeds]     # the clock has not started
        torch.cuda.synchronize()
        t0 = _clock.perf_counter()
        for j in range(per):
            entry.args, entry.kwargs = loaded[j % sets]
            entry.call()
        torch.cuda.synchronize()
        entry.host_s.append((_clock.perf_counter() - t0) / per)
    entry.judge("the last host-timed call", seeds[(per - 1) % sets])


def conclude_checks(entry: _Entry) -> None:
    """Read the checks of the entry's sampled calls; a failure becomes its error."""
    # Deferred: torch (rotation.py holds tensors).
    from gemmgen.measure.rotation import verdict

    if entry.error is not None or not entry.judged:
        return
    failed = []
    for which, seed, stats in entry.judged:
        reasons = entry.rotation.failures(stats, seed)
        if reasons:
            failed.append((which, reasons))
    message = verdict(entry.name, failed, len(entry.judged))
    if message:
        entry.error = TimedCheckFailure(message)


def _summarise(entry: _Entry, mode: str, options: TimingOptions, clocks: Optional[dict] = None) -> Timing:
    floor_ms = entry.problem.floor_s * 1e3
    if isinstance(entry.error, TimedCheckFailure):
        raise entry.error                  # its message names the kernel; callers tell it apart
    if entry.error is not None:
        raise MeasureError(f"{entry.name}: the call raised {type(entry.error).__name__}: {entry.error}")
    dev = sorted(us * 1e-3 for us in entry.device_us)
    if not dev or dev[-1] <= 0.0:
        raise MeasureError(
            f"{entry.name}: the profiler recorded no GPU work for the call: it ran nowhere CUPTI "
            "could see (another thread?) or did nothing"
        )
    zero_calls = sum(1 for d in dev if d <= 0.0)
    med = median(dev)
    if options.check_floor and med < floor_ms:
        raise FloorViolation(
            f"{entry.name}: median device time {med * 1e3:.3f} us is below the physical floor "
            f"{floor_ms * 1e3:.3f} us of {entry.problem.key}: a broken timer or a kernel that skips work"
        )
    host = sorted(s * 1e3 for s in entry.host_s)
    notes = (f"{zero_calls} of {len(dev)} calls recorded no GPU work",) if zero_calls else ()
    return Timing(
        mode=mode, device_ms=med, device_p10_ms=quantile(dev, 0.1), device_p90_ms=quantile(dev, 0.9),
        device_iqr_ms=quantile(dev, 0.75) - quantile(dev, 0.25),
        host_ms=median(host) if host else math.nan,
        host_p10_ms=quantile(host, 0.1) if host else math.nan,
        host_p90_ms=quantile(host, 0.9) if host else math.nan,
        reps=len(dev), floor_ms=floor_ms, kernels=entry.kernels, timer=options.timer, notes=notes,
        clocks=clocks or {}, samples_ms=tuple(us * 1e-3 for us in entry.device_us),
    )


def time_many(kernels: Sequence[tuple[str, Callable, Problem]], mode: str = "offline", *,
              options: Optional[TimingOptions] = None, device: Any = "cuda") -> dict[str, Any]:
    """Time several kernels in one profiler session; name -> Timing, or the MeasureError
    that kept that kernel from a time (the others are still measured)."""
    # Deferred: torch (and the rotation's tensors, which import it) only where a GPU times.
    import torch

    # Deferred: torch (optional, heavy to import).
    from gemmgen.measure.cases import fresh_seed
    from gemmgen.measure.rotation import Rotation

    if mode not in MODES:
        raise MeasureError(f"unknown timing mode {mode!r}; use one of {', '.join(MODES)}")
    if not torch.cuda.is_available():
        raise NoGPUError("timing")
    options = options or TimingOptions()
    names = [name for name, _, _ in kernels]
    if len(set(names)) != len(names):
        raise MeasureError(f"kernel names must be unique within one timing: {names}")
    rotations: dict[str, Rotation] = {}
    entries: list[_Entry] = []
    for name, fn, problem in kernels:
        if not problem.is_bound:
            raise MeasureError(f"problem {problem.key} is shape-generic; bind M, N and K before timing")
        if problem.key not in rotations:      # fresh seeds: no kernel can know the inputs ahead
            rotations[problem.key] = Rotation(problem, fresh_seed(), device)
        entries.append(_Entry(name, fn, problem, (), {}, rotation=rotations[problem.key]))
    flush = flusher(options, device)
    for entry in entries:
        try:
            entry.reps = _estimate_reps(entry, mode, options, flush)
        except Exception as exc:  # noqa: BLE001
            entry.error = exc
    plan_checks(entries, options)
    if options.timer not in ("cupti", "events"):
        raise MeasureError(f"unknown timer {options.timer!r}; use cupti or events")
    sampler = ClockSampler(_nvml_index(device)) if options.clocks else None
    if any(e.error is None for e in entries):
        (_profile_device if options.timer == "cupti" else _events_device)(
            entries, mode, options, flush, sampler.sample if sampler else (lambda: None))
    clocks = sampler.summary() if sampler else {}
    if sampler:
        sampler.close()
    rng = random.Random(options.seed + 1)
    for entry in entries:
        if entry.error is None:
            try:
                _time_host(entry, mode, options, flush, rng)
            except Exception as exc:  # noqa: BLE001
                entry.error = exc
        conclude_checks(entry)
    results: dict[str, Any] = {}
    for entry in entries:
        try:
            results[entry.name] = _summarise(entry, mode, options, clocks)
        except MeasureError as exc:
            results[entry.name] = exc
    return results


def plan_checks(entries: list[_Entry], options: TimingOptions) -> None:
    """Choose each problem's checked rounds (rotation.checked_rounds) and build their
    references now, so the loop itself only launches the comparisons."""
    # Deferred: torch (rotation.py holds tensors).
    from gemmgen.measure.rotation import checked_rounds

    by_rotation: dict[int, list[_Entry]] = {}
    for entry in entries:
        if entry.error is None:
            by_rotation.setdefault(id(entry.rotation), []).append(entry)
    for group in by_rotation.values():
        rounds = checked_rounds([e.reps for e in group], options.seed)
        rotation = group[0].rotation
        for r in sorted(rounds):
            rotation.case(rotation.round_seed(r))
        for entry in group:
            entry.checked_rounds = frozenset(r for r in rounds if r < entry.reps)


def _nvml_index(device) -> int:
    """The NVML index of a CUDA device, so a session's clocks are read from the GPU it ran on."""
    # Deferred: torch (optional, heavy to import).
    import torch

    dev = torch.device(device)
    return nvml_index(dev.index if dev.index is not None else torch.cuda.current_device())


def time(fn: Callable, problem: Problem, mode: str = "offline", *,
         options: Optional[TimingOptions] = None, device: Any = "cuda") -> Timing:
    """Time one kernel; raises FloorViolation or MeasureError instead of recording a bad time."""
    result = time_many([("kernel", fn, problem)], mode, options=options, device=device)["kernel"]
    if isinstance(result, Exception):
        raise result
    return result
