"""`gemmgen bench`: every shape, every baseline and candidate, checked then timed, saved as it goes.

Per shape: one set of check cases (fresh seed, recorded) shared by all kernels; each
baseline is built, checked, and the ones that pass are timed together in one
interleaved profiler session; `cublas` is the better of `cublas_nn` and `cublas_tn`;
candidates run in the isolated worker (a hang or crash costs one row) unless
`isolate=False`. results.json is rewritten after every shape, so a stopped run
(time budget, Ctrl-C, lost machine) keeps everything measured and `--resume` skips it.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time as _clock
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gemmgen.dsl.ir import Problem
from gemmgen.errors import GemmgenError, NoGPUError
from gemmgen.measure import baselines as baseline_registry
from gemmgen.measure import candidates as candidate_registry
from gemmgen.measure import results as results_io
from gemmgen.measure.baselines import Kernel
from gemmgen.measure.cases import fresh_seed, make_cases
from gemmgen.measure.checking import check
from gemmgen.measure.env import environment, gpu_record
from gemmgen.measure.errors import UnknownName
from gemmgen.measure.numerics import bucket_of, tflops
from gemmgen.measure.shapes import Shape, in_m_band, read_shapes, shard
from gemmgen.measure.timing import MODES, TimingOptions, time_many
from gemmgen.measure.worker import Job, Runner, load_named


@dataclass
class BenchConfig:
    shapes: str
    out: str
    mode: str = "offline"
    baselines: list[str] = field(default_factory=lambda: ["torch", "cublas", "lt_heuristic", "lt_autotune"])
    candidates: list[str] = field(default_factory=list)
    shard: Optional[str] = None
    part: str = "all"             # all rows, or one side of the file's held-out split
    min_m: Optional[int] = None   # a band of batch sizes (one M: min_m == max_m)
    max_m: Optional[int] = None
    resume: bool = False
    time_budget_s: Optional[float] = None
    seed: Optional[int] = None
    timing: TimingOptions = field(default_factory=TimingOptions)
    isolate: bool = True
    trial_timeout_s: float = 300.0
    progress: bool = True
    command: str = ""
    device: str = "cuda"          # "cpu" only for tests of the loop itself (timing is stubbed there)
    #: the baseline an isolated candidate is also timed against inside its worker's session
    reference: str = "torch"


def layout_letters(problem: Problem) -> str:
    letters = "".join("n" if m == "row" else "t" for m in (problem.a_major, problem.b_major))
    return letters + ("t" if problem.c_major == "col" else "")


def make_row(name: str, kind: str, shape: Shape, problem: Problem, *, check: Optional[dict] = None,
             timing: Optional[dict] = None, status: str = "ok", message: str = "",
             notes: Optional[dict] = None) -> dict[str, Any]:
    """One results row; check and timing are the to_dict() forms (or None)."""
    passed = bool(check and check.get("passed"))
    device_ms = timing.get("device_ms") if timing else None
    floor_ms = problem.floor_s * 1e3
    return {
        "name": name, "kind": kind, "m": shape.m, "n": shape.n, "k": shape.k,
        "layout": layout_letters(problem), "shape_layout": shape.layout,
        "gflop": shape.gflop, "bucket": bucket_of(shape.gflop),
        "status": status, "message": message, "passed": passed,
        "max_rel_err": check.get("max_rel_err") if check else None,
        "bound": check.get("bound") if check else None,
        "seed": check.get("seed") if check else None,
        "check_failures": list(check.get("failures", ())) if check else [],
        "device_ms": device_ms,
        "device_p10_ms": timing.get("device_p10_ms") if timing else None,
        "device_p90_ms": timing.get("device_p90_ms") if timing else None,
        "spread": timing.get("spread") if timing else None,
        "host_ms": timing.get("host_ms") if timing else None,
        "reps": timing.get("reps") if timing else None,
        "tflops": tflops(problem.flops, device_ms * 1e-3) if device_ms else None,
        "floor_ms": floor_ms,
        "fraction_of_floor": floor_ms / device_ms if device_ms else None,
        "kernels": list(timing.get("kernels", ())) if timing else [],
        "clocks": dict(timing.get("clocks") or {}) if timing else {},
        "notes": dict(notes or {}),
    }


def _measure_kernels(kernels: list, shape: Shape, cases, cfg: BenchConfig, kind: str) -> list[dict]:
    """Check each kernel on the shared cases, then time those that passed, together."""

    checked: dict[str, dict] = {}
    for k in kernels:
        checked[k.name] = check(k.fn, k.problem, cases=cases, device=cfg.device).to_dict()
    passing = [(k.name, k.fn, k.problem) for k in kernels if checked[k.name]["passed"]]
    timed = time_many(passing, cfg.mode, options=cfg.timing, device=cfg.device) if passing else {}
    rows = []
    for k in kernels:
        c = checked[k.name]
        t = timed.get(k.name)
        if not c["passed"]:
            rows.append(make_row(k.name, kind, shape, k.problem, check=c, status="failed_check",
                                 message="; ".join(c["failures"]), notes=k.notes))
        elif isinstance(t, Exception):
            rows.append(make_row(k.name, kind, shape, k.problem, check=c, status="error",
                                 message=str(t), notes=k.notes))
        else:
            rows.append(make_row(k.name, kind, shape, k.problem, check=c, timing=t.to_dict(), notes=k.notes))
    return rows


def _derived_rows(rows: list[dict], wanted: list[str]) -> list[dict]:
    """`cublas` = the better measured of its parts, as its own row."""
    out = []
    by_name = {r["name"]: r for r in rows}
    for name, parts in baseline_registry.DERIVED.items():
        if name not in wanted:
            continue
        times = {p: by_name[p]["device_ms"] for p in parts if p in by_name and by_name[p]["passed"]}
        best = baseline_registry.better_of(times, parts)
        if best is None:
            src = by_name.get(parts[0], {})
            out.append({**src, "name": name, "status": "error", "passed": False, "device_ms": None,
                        "message": f"none of {', '.join(parts)} was measured", "notes": {}})
        else:
            out.append({**by_name[best], "name": name, "notes": {**by_name[best]["notes"], "chosen": best}})
    return out


def _baseline_rows(shape: Shape, problem: Problem, cases, cfg: BenchConfig, measured: list[str]) -> list[dict]:
    kernels, rows = [], []
    for name in measured:
        try:
            kernels.append(baseline_registry.make(name, problem, timing_options=_selection_options(cfg)))
        except Exception as exc:  # noqa: BLE001 - one broken baseline must not stop the others
            rows.append(make_row(name, "baseline", shape, problem, status="error",
                                 message=f"{type(exc).__name__}: {exc}"))
    try:
        rows.extend(_measure_kernels(kernels, shape, cases, cfg, "baseline"))
    finally:
        baseline_registry.release(kernels)
    order = {n: i for i, n in enumerate(measured)}
    rows.sort(key=lambda r: order.get(r["name"], len(order)))
    return rows


def _selection_options(cfg: BenchConfig) -> TimingOptions:
    """cuBLASLt autotuning selects with the reported device timer (cold L2), no host loop."""
    return dataclasses.replace(cfg.timing, host_reps=0, max_reps=min(cfg.timing.max_reps, 60))


def _candidate_rows(shape: Shape, problem: Problem, cases, seed: int, cfg: BenchConfig, runner) -> list[dict]:
    """`cases` are this process's check inputs; None when the candidates run in `runner`'s worker,
    which makes its own from `seed`."""
    rows = []
    for name in cfg.candidates:
        spec = candidate_registry.spec_of(name)
        if runner is not None:
            job = Job(name, load_named, (spec, problem), problem, seed=seed,
                      mode=cfg.mode, timing=cfg.timing, timeout_s=cfg.trial_timeout_s,
                      reference=cfg.reference)
            res = runner.run(job)
            ref = res.reference_timing or {}
            notes = {"isolated": True, "reference": cfg.reference,
                     "reference_device_ms": ref.get("device_ms"), "reference_error": ref.get("error"),
                     "speedup_noise": (res.timing or {}).get("speedup_noise"),
                     **candidate_registry.notes_for(name, problem)}
            rows.append(make_row(name, "candidate", shape, problem, check=res.check, timing=res.timing,
                                 status=res.status, message=res.message,
                                 notes={k: v for k, v in notes.items() if v is not None}))
            continue
        try:
            made = candidate_registry.resolve(spec)(problem)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot be built costs its row
            rows.append(make_row(name, "candidate", shape, problem, status="error",
                                 message=f"{type(exc).__name__}: {exc}"))
            continue
        fn = getattr(made, "fn", made)
        notes = candidate_registry.notes_for(name, problem)
        rows.extend(_measure_kernels([Kernel(name, fn, problem, notes)], shape, cases, cfg, "candidate"))
    return rows


def measure_shape(shape: Shape, cfg: BenchConfig, measured: list[str], runner=None) -> list[dict]:
    # Deferred: torch (optional, heavy to import).
    import torch


    problem = shape.problem()
    seed = fresh_seed() if cfg.seed is None else cfg.seed
    cases = make_cases(problem, seed, cfg.device)
    rows = _baseline_rows(shape, problem, cases, cfg, measured)
    rows.extend(_derived_rows(rows, cfg.baselines))
    if runner is not None:
        # The worker makes its own inputs: hand it this process's GPU memory (a large layer's
        # inputs, references and timing copies would otherwise stay cached here, and it runs out).
        cases = None
        torch.cuda.empty_cache()
    rows.extend(_candidate_rows(shape, problem, cases, seed, cfg, runner))
    del cases
    torch.cuda.empty_cache()
    return rows


def _preflight(cfg: BenchConfig) -> list[str]:
    if cfg.mode not in MODES:
        raise GemmgenError(f"--mode {cfg.mode!r}: use offline, server or warm")
    measured = baseline_registry.expand(cfg.baselines)
    if cfg.reference not in baseline_registry.BASELINES:
        raise UnknownName(f"--same-session-reference {cfg.reference!r}: choose one of "
                          f"{', '.join(baseline_registry.BASELINES)}")
    for name in cfg.candidates:
        candidate_registry.spec_of(name)
    # Deferred: torch (optional, heavy to import).
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():  # the first thing to fix, so said first
        raise NoGPUError("gemmgen bench")
    if any(n.startswith("lt_") for n in measured) and importlib.util.find_spec("nvmath") is None:
        raise GemmgenError("lt_heuristic and lt_autotune need nvmath-python (pip install nvmath-python); "
                           "leave them out of --baselines or install it")
    return measured


def run(cfg: BenchConfig) -> dict:
    """Measure, saving after every shape; returns the final results document."""

    # the shapes first: a bad file or band is said on any machine, before the GPU is looked for
    shapes = shard(in_m_band(read_shapes(cfg.shapes, cfg.part), cfg.min_m, cfg.max_m, cfg.shapes), cfg.shard)
    measured = _preflight(cfg)
    out = Path(cfg.out)
    rows: list[dict] = []
    wanted = list(cfg.baselines) + list(cfg.candidates)
    if cfg.resume and (out / results_io.RESULTS).exists():
        rows = results_io.load(out)["rows"]
    done = results_io.done_shapes(rows, wanted) if cfg.resume else set()
    todo = [s for s in shapes if (s.m, s.n, s.k, s.layout) not in done]
    meta = {
        "command": cfg.command or " ".join(sys.argv), "mode": cfg.mode, "shapes": cfg.shapes,
        "shard": cfg.shard, "part": cfg.part, "min_m": cfg.min_m, "max_m": cfg.max_m, "out": str(out),
        "baselines": cfg.baselines, "candidates": cfg.candidates,
        "same_session_reference": cfg.reference,
        "timing": dataclasses.asdict(cfg.timing),
        "timer": {"cupti": "CUPTI kernel records (torch.profiler)", "events": "CUDA events on the calling stream"}
        .get(cfg.timing.timer, cfg.timing.timer),
        "skipped_done": len(shapes) - len(todo), "environment": environment(),
    }
    meta["date"] = meta["environment"]["date"]
    start = _clock.monotonic()
    runner = None
    if cfg.candidates and cfg.isolate:
        runner = Runner(timeout_s=cfg.trial_timeout_s)
    bar = _progress(todo, cfg.progress)
    try:
        for shape in bar:
            if cfg.time_budget_s is not None and _clock.monotonic() - start > cfg.time_budget_s:
                meta["stopped"] = f"time budget of {cfg.time_budget_s:g} s reached"
                break
            new = measure_shape(shape, cfg, measured, runner)
            key = (shape.m, shape.n, shape.k, shape.layout)
            rows = [r for r in rows if results_io.shape_key(r) != key] + new
            meta["elapsed_s"] = round(_clock.monotonic() - start, 1)
            results_io.save(out, meta, rows)
    except KeyboardInterrupt:
        meta["stopped"] = "interrupted"
    finally:
        if runner is not None:
            runner.close()
        meta["elapsed_s"] = round(_clock.monotonic() - start, 1)
        meta["gpu_after"] = _gpu_after()
        doc = results_io.save(out, meta, rows)
    return doc


def _gpu_after() -> Any:
    return gpu_record()


def _progress(items: list, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="bench", unit="shape", disable=not enabled, mininterval=2.0, file=sys.stderr)


def table(doc: dict) -> str:
    """The short table printed last: per name, speedups and how far from the floor."""
    s = doc.get("summary") or results_io.summarize(doc["rows"])
    refs = [b for b in ("torch", "cublas", "lt_autotune") if b in s["baselines"]]
    head = f"{'name':<14}{'passed':>8}" + "".join(f"{'vs ' + r:>16}" for r in refs) + f"{'floor frac':>12}"
    lines = [f"{s['n_shapes']} shapes, mode {doc.get('meta', {}).get('mode', '?')}", head]
    for name in s["names"]:
        cells = []
        for r in refs:
            g = s["geomean"].get(f"{name}/{r}") if name != r else 1.0
            cells.append(f"{g:>16.3f}" if g else f"{'-':>16}")
        frac = s["median_fraction_of_floor"].get(name)
        passed = f"{s['passed'].get(name, 0)}/{s['n_shapes']}"
        lines.append(f"{name:<14}{passed:>8}" + "".join(cells) + (f"{frac:>12.3f}" if frac else f"{'-':>12}"))
    for name, same in (s.get("same_session") or {}).items():
        lines.append(f"{name} vs {same['reference']} timed in {name}'s own worker session: "
                     f"{same['geomean']:.3f} over {same['n']} shapes, lowest {same['min']:.3f}"
                     + (f", {same['slower_beyond_noise']} of {same['with_noise']} slower beyond noise"
                        if same.get("with_noise") else "")
                     + (f" ({same['slower_serving_the_reference']} of them serving {same['reference']} itself)"
                        if same.get("slower_serving_the_reference") else ""))
    if doc.get("meta", {}).get("stopped"):
        lines.append(f"stopped early: {doc['meta']['stopped']}")
    return "\n".join(lines)


__all__ = ["BenchConfig", "make_row", "measure_shape", "run", "table"]
