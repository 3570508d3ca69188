"""What the database stores, as frozen dataclasses, and their export form (one JSON line each).

The export line is the unit of review and of merging: every field that identifies
or describes a trial, keys sorted, so two exports diff line by line.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.errors import GemmgenError

#: Trial outcomes; only "ok" trials can win.
#: `superseded`: measured, but of a kernel gemmgen no longer builds (migration_007; the view
#: `current_trials` of migration_008 holds the condition); never a winner, and measured again by
#: the next tuning run
STATUSES = ("ok", "invalid", "build_failed", "check_failed", "run_failed", "superseded")

#: From this instant the baselines and cuBLASLt choices add nn.Linear's bias inside the product
#: (`Problem.linear_bias`); records of such problems made before it were timed against a product
#: and an add after it, and are measured again (migration_009's views hold the same instant).
BIAS_IN_PRODUCT_SINCE = "2026-12-05T16:40:00"

#: The device gemmgen ships tuned records for, and the one compile() assumes without a GPU.
DEFAULT_DEVICE_NAME = "NVIDIA H200"
#: The baseline name a trial records for torch.matmul timed in its candidate's worker session
#: (the winners view in the migrations reads it by this name).
SAME_SESSION_BASELINE = "torch_same_session"
#: The packages whose versions shape a kernel's speed, by backend: torch, which launches every
#: backend, and the backend's compiler (Triton; CUTLASS's templates; NVRTC through cuda-bindings).
TOOLCHAIN_PACKAGES = {"triton": ("torch", "triton"), "cutlass": ("torch", "nvidia-cutlass"),
                      "cuda": ("torch", "cuda-bindings")}


class RecordError(GemmgenError):
    """An export line or record that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Device:
    """The GPU and software a trial was measured with."""

    name: str
    cc: str = ""
    sms: int = 0
    driver: str = ""
    cuda: str = ""
    libraries: Mapping[str, str] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, Any]:
        """The export form (libraries as a plain dict)."""
        return asdict(self) | {"libraries": dict(self.libraries)}

    def libraries_json(self) -> str:
        return json.dumps(dict(self.libraries), sort_keys=True)


@dataclass(frozen=True)
class BaselineTime:
    """One baseline measured in the same run as the trial."""

    device_ms: float
    spread: Optional[float] = None
    server_ms: Optional[float] = None
    host_ms: Optional[float] = None


@dataclass(frozen=True)
class Trial:
    """One candidate program measured (or refused) for one problem on one device."""

    problem: Problem
    device: Device
    program: str
    backend: str
    status: str
    build_ok: Optional[bool] = None
    build_msg: str = ""
    build_s: Optional[float] = None
    check_passed: Optional[bool] = None
    check_msg: str = ""
    max_rel_err: Optional[float] = None
    err_bound: Optional[float] = None
    check_seed: Optional[int] = None
    device_ms: Optional[float] = None
    spread: Optional[float] = None
    server_ms: Optional[float] = None
    server_spread: Optional[float] = None
    host_ms: Optional[float] = None
    baselines: Mapping[str, BaselineTime] = field(default_factory=dict, hash=False)
    proposer: str = ""
    proposer_version: str = ""
    created: str = ""
    #: relative noise of torch.matmul's time over this one, both timed in the candidate's
    #: worker session (gemmgen.measure.comparison); None in trials recorded before schema 6
    noise: Optional[float] = None
    #: merged from elsewhere (`gemmgen db merge`): its times are not trusted, it never serves
    unverified: bool = field(default=False, compare=False)
    id: Optional[int] = field(default=None, compare=False)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise RecordError(f"unknown trial status {self.status!r}; expected one of {', '.join(STATUSES)}")

    @property
    def toolchain(self) -> str:
        return toolchain_of(self.device, self.backend)

    @property
    def best_baseline(self) -> Optional[tuple[str, BaselineTime]]:
        """The fastest baseline of the same run (offline device time)."""
        timed = [(n, b) for n, b in self.baselines.items() if b.device_ms and b.device_ms > 0]
        return min(timed, key=lambda nb: (nb[1].device_ms, nb[0])) if timed else None

    @property
    def best_baseline_server_ms(self) -> Optional[float]:
        times = [b.server_ms for b in self.baselines.values() if b.server_ms and b.server_ms > 0]
        return min(times) if times else None

    @property
    def speedup(self) -> Optional[float]:
        """The best baseline of the same run over this time (offline), as the `winners` view has it."""
        best = self.best_baseline
        return best[1].device_ms / self.device_ms if best and self.device_ms else None

    @property
    def margin(self) -> Optional[float]:
        """What the speedup must exceed 1 by to win: its noise, else (older trials) its spread."""
        return self.noise if self.noise is not None else self.spread

    def beats_baseline(self) -> bool:
        """The never-slower rule: device_ms * (1 + margin) < best baseline's device_ms (the
        `winners` view)."""
        best = self.best_baseline
        if self.status != "ok" or not self.check_passed or best is None:
            return False
        if self.device_ms is None or self.device_ms <= 0 or self.margin is None:
            return False
        return self.device_ms * (1.0 + self.margin) < best[1].device_ms

    def speedups(self) -> dict[str, float]:
        """Baseline time over kernel time, per baseline of the same run (offline)."""
        if not self.device_ms:
            return {}
        return {n: b.device_ms / self.device_ms for n, b in sorted(self.baselines.items()) if b.device_ms}


@dataclass(frozen=True)
class LibraryChoice:
    """The fastest algorithm of a vendor library for one problem, checked, then timed beside
    torch.matmul in one session (gemmgen.measure.library). It serves a problem no program won,
    if it beat torch.matmul by more than its noise (the `library_winners` view)."""

    problem: Problem
    device: Device
    library: str                      # 'cublaslt'
    version: str                      # the library version the algorithm is valid for
    config: Mapping[str, Any]         # readable: algorithm id, tile, stages, split-K, ...
    algorithm: str                    # the library's serialised algorithm, hex
    candidates: int                   # how many algorithms were timed to choose it
    check_passed: bool
    device_ms: Optional[float] = None
    spread: Optional[float] = None
    torch_ms: Optional[float] = None  # torch.matmul in the same session
    torch_spread: Optional[float] = None
    #: relative noise of torch_ms / device_ms (gemmgen.measure.comparison); None in choices
    #: recorded before schema 5, which are judged by their spread
    noise: Optional[float] = None
    #: the same pair timed in server mode (idle gaps before each call); None before schema 5
    server_ms: Optional[float] = None
    torch_server_ms: Optional[float] = None
    server_noise: Optional[float] = None
    max_rel_err: Optional[float] = None
    err_bound: Optional[float] = None
    check_seed: Optional[int] = None
    created: str = ""
    #: merged from elsewhere (`gemmgen db merge`): its times are not trusted, it never serves
    unverified: bool = field(default=False, compare=False)
    id: Optional[int] = field(default=None, compare=False)

    @property
    def speedup(self) -> Optional[float]:
        """torch.matmul's time over the library's, both offline in one session."""
        return self.torch_ms / self.device_ms if self.device_ms and self.torch_ms else None

    @property
    def margin(self) -> Optional[float]:
        """What the speedup must exceed 1 by to serve: its noise, else (older choices) its spread."""
        return self.noise if self.noise is not None else self.spread

    def beats_torch(self) -> bool:
        """The never-slower rule against torch.matmul: device_ms * (1 + margin) < torch_ms, and,
        where server mode was timed, not slower there beyond its noise (the `library_winners` view)."""
        offline = bool(self.check_passed and self.device_ms and self.margin is not None and self.torch_ms
                       and self.device_ms * (1.0 + self.margin) < self.torch_ms)
        if not offline or not (self.server_ms and self.torch_server_ms):
            return offline
        return self.server_ms * (1.0 - (self.server_noise or 0.0)) <= self.torch_server_ms


@dataclass(frozen=True)
class TunedProblem:
    """One problem tuned on one kind of GPU, and what serves it (`Database.tuned_summary`)."""

    problem: Problem
    device_name: str
    trials: int
    winner_backend: Optional[str] = None     # the winning program's backend, if a program won
    speedup: Optional[float] = None          # its speedup over its run's best baseline
    library_speedup: Optional[float] = None  # a serving library choice's speedup over torch.matmul
    passed: bool = False                     # a trial or library choice of its own runs passed

    @property
    def serves(self) -> str:
        """'<backend> <speedup>x', 'library <speedup>x', 'baseline' (tuned, nothing won) or
        'nothing passed' (no trial or library choice of its own runs passed its check). Where a
        program and a library choice both won, the larger speedup, as `gemmgen.compile` chooses
        (it compares the two over torch.matmul timed beside each; `gemmgen db show` has those)."""
        if self.winner_backend and (not self.library_speedup or (self.speedup or 0.0) >= self.library_speedup):
            return f"{self.winner_backend} {self.speedup:.3f}x"
        if self.library_speedup:
            return f"library {self.library_speedup:.3f}x"
        return "baseline" if self.passed else "nothing passed"


def toolchain_of(device: Device, backend: str) -> str:
    """The driver and toolchain a trial of `backend` was measured under, as one string that a
    lookup compares ('?' where a version was not recorded)."""
    parts = [("driver", device.driver), ("cuda", device.cuda)]
    parts += [(name, device.libraries.get(name)) for name in TOOLCHAIN_PACKAGES.get(backend, ("torch",))]
    return ", ".join(f"{name} {value or '?'}" for name, value in parts)


def baseline_superseded(problem: Problem, created: str) -> bool:
    """Whether a record of `problem` made at `created` was timed against a baseline that has
    since become faster (BIAS_IN_PRODUCT_SINCE): it neither serves nor counts as measured."""
    return problem.linear_bias and created < BIAS_IN_PRODUCT_SINCE


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def problem_from_key(key: str) -> Problem:
    """Rebuild a Problem from Problem.key (shape:majors:in:acc:epilogue signature).

    The signature keeps which epilogue parts are present, not the runtime alpha/beta
    values; a rebuilt problem carries alpha=2.0 / beta=1.0 as placeholders for them
    (Epilogue.from_signature).
    """
    try:
        dims, majors, in_dtype, acc_dtype, signature = key.split(":")
        m, n, k = (None if d == "*" else int(d) for d in dims.split("x"))
        major = {"r": "row", "c": "col"}
        a_major, b_major, c_major = (major[c] for c in majors)
        problem = Problem(m, n, k, a_major, b_major, c_major, in_dtype, acc_dtype, Epilogue.from_signature(signature))
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(f"not a problem key: {key!r} ({exc})") from None
    if problem.key != key:
        raise RecordError(f"not a canonical problem key: {key!r} (reads back as {problem.key!r})")
    return problem


_TRIAL_SCALARS = [f.name for f in fields(Trial) if f.name not in ("problem", "device", "baselines", "id")]


#: trial fields added by schema version 6, written only where measured
_TRIAL_SINCE_V6 = ("noise",)


def _without_unmeasured(record: dict[str, Any], added_later: tuple[str, ...]) -> dict[str, Any]:
    """Drops the fields a later schema added where they are None, and the unverified mark where it
    is not set, so older lines stay as they were written."""
    return {k: v for k, v in record.items()
            if not (k in added_later and v is None) and not (k == "unverified" and not v)}


def trial_to_json(trial: Trial) -> str:
    """One export line: sorted keys, no id (ids are local to one database file)."""
    record = _without_unmeasured({name: getattr(trial, name) for name in _TRIAL_SCALARS}, _TRIAL_SINCE_V6)
    record["problem"] = trial.problem.key
    record["device"] = trial.device.as_dict()
    record["baselines"] = {n: asdict(b) for n, b in sorted(trial.baselines.items())}
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


_LIBRARY_SCALARS = [f.name for f in fields(LibraryChoice) if f.name not in ("problem", "device", "config", "id")]
#: fields added by schema version 5, written only where measured
_SINCE_V5 = ("noise", "server_ms", "torch_server_ms", "server_noise")


def library_to_json(choice: LibraryChoice) -> str:
    """One export line, marked `"kind": "library"` (trial lines carry no kind)."""
    record = _without_unmeasured({name: getattr(choice, name) for name in _LIBRARY_SCALARS}, _SINCE_V5)
    record.update(kind="library", problem=choice.problem.key, config=dict(choice.config),
                  device=choice.device.as_dict())
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def record_from_json(line: str, where: str = "<line>") -> "Trial | LibraryChoice":
    """A trial or a library choice (`"kind": "library"`), whichever the export line holds; the
    line is parsed once. Errors name `where` and say what was expected."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise RecordError(f"{where}: not a gemmgen export line ({exc})") from None
    library = isinstance(record, dict) and record.get("kind") == "library"
    what = "library" if library else "trial"
    try:
        if library:
            record.pop("kind")
        problem = problem_from_key(record.pop("problem"))
        device = Device(**record.pop("device"))
        if library:
            return LibraryChoice(problem=problem, device=device, **record)
        baselines = {n: BaselineTime(**b) for n, b in record.pop("baselines", {}).items()}
        return Trial(problem=problem, device=device, baselines=baselines, **record)
    except RecordError as exc:
        raise RecordError(f"{where}: {exc}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RecordError(f"{where}: not a gemmgen {what} record ({exc}); "
                          "expected a line written by `gemmgen db export`") from None


def export_sort_key(record: "Trial | LibraryChoice") -> tuple:
    if isinstance(record, LibraryChoice):
        return (record.problem.key, "~library " + record.library, record.device.name, record.created)
    return (record.problem.key, record.program, record.device.name, record.created)
