"""A vendor library's own algorithms as candidates: the fastest cuBLASLt algorithm per problem.

cuBLAS picks one algorithm per call by heuristic; cuBLASLt offers the list behind that
pick. On the H200 the fastest of that list measured up to 1.2x torch.matmul on shapes
with small K (the `lt_autotune` baseline of `gemmgen bench`). `search_cublaslt` does what
the tuning database needs to serve such an algorithm honestly:

1. time every algorithm the heuristic offers (up to 100) with the device timer, cold L2;
2. widen: the fastest few, each with one knob changed (split-K, CTA swizzling, tile,
   stages, custom option), kept where cuBLASLt's own check (`cublasLtMatmulAlgoCheck`)
   accepts them; these are timed in short sessions, and each session's fastest meet the
   bases in a final one, so the heuristic's best and its neighbours compete on the same clocks;
3. check the fastest one on fresh random inputs (`gemmgen.measure.check`); a neighbour that
   fails gives way to the heuristic's best;
4. time it beside torch.matmul, interleaved in one session, so the comparison shares the
   GPU's clock state (a separate process measured 10 % apart or more under the power cap
   on the H200), and record the noise of that speedup
   (`gemmgen.measure.comparison`); then again in server mode (idle gaps before each call),
   where a choice must not be slower than torch.matmul beyond that mode's noise. Where
   torch.matmul under torch's default reduction fails the check in those timed calls, the
   choice meets what gemmgen would serve instead (the same call, summing in fp32), and its
   config says so (`torch_baseline`).

It runs in the isolated worker (`library_job`), like every candidate, and returns plain
data the tuning loop records as a `tuning_db.LibraryChoice`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

import numpy as np

from gemmgen.dsl.ir import Problem
from gemmgen.measure.baselines import autotune_lt, make_torch
from gemmgen.measure.checking import check
from gemmgen.measure.comparison import speedup_noise
from gemmgen.measure.errors import MeasureError, TimedCheckFailure
from gemmgen.measure.timing import TimingOptions, time_many
from gemmgen.runtime.cublaslt import (
    WORKSPACE_BYTES,
    LtMatmul,
    algorithm_config,
    algorithm_to_hex,
    cublaslt_version,
    library_launcher,
)
from gemmgen.runtime.torch_call import torch_call

LIBRARY = "cublaslt"
#: calls per algorithm while choosing (the median of 10 separates algorithms a few % apart;
#: the chosen one is then timed with the full options beside torch.matmul)
SELECTION_REPS = 10
#: how the search chooses (recorded in each choice's config); `gemmgen tune` searches again a
#: problem whose recorded choice came from another method
SEARCH = "heuristic+neighbours"
#: the fastest heuristic algorithms whose neighbours are tried
NEIGHBOUR_BASES = 3
#: at most this many neighbours per base, in the order `knob_changes` lists them
NEIGHBOURS_PER_BASE = 32
#: algorithms per timing session while choosing among neighbours: one session of ~150 short
#: kernels at 50 calls each lost GPU records on the H200 (the session could not be attributed);
#: the fastest FINALISTS of each session and the bases meet again in a final one
SESSION_SIZE = 24
FINALISTS = 2
SPLIT_KS = (2, 3, 4, 6, 8, 12, 16, 24, 32)
#: split-K factors leaving fewer K per slice than this are not tried
MIN_K_PER_SPLIT = 128
#: cublasLtReductionScheme_t: how split-K slices are summed (NONE is 0), in the order tried (only
#: the first the algorithm supports): in a workspace of the compute type (fp32 here; every split-K
#: win of the first sample search used it), in place in the output, in a workspace of the output type
REDUCTION_SCHEMES = (2, 1, 4)


def search_cublaslt(problem: Problem, seed: Optional[int] = None, timing_options=None) -> dict[str, Any]:
    """Select, check and time the fastest cuBLASLt algorithm for `problem` (needs a GPU).

    The chosen algorithm is checked and timed through its recorded text form and the
    launcher that `gemmgen.compile` serves, so what is recorded is what runs later."""

    options = timing_options or TimingOptions()
    # selection among many algorithms: fewer calls each; the chosen one is timed in full below
    selection = replace(options, min_reps=SELECTION_REPS, max_reps=max(SELECTION_REPS, options.max_reps // 4))
    version = cublaslt_version() or ""
    rejected = []
    for algorithm, config in _select(problem, selection):
        record: dict[str, Any] = {"library": LIBRARY, "version": version, "candidates": config.pop("candidates"),
                                  "config": {**config, "search": SEARCH}, "algorithm": algorithm}
        if rejected:
            record["config"]["rejected"] = rejected
        fn = library_launcher(problem, algorithm, version)
        checked = check(fn, problem, seed=seed)
        record.update(check_passed=checked.passed, max_rel_err=checked.max_rel_err, err_bound=checked.bound,
                      check_seed=checked.seed, check_failures=list(checked.failures))
        if checked.passed:
            break
        # a neighbour cuBLASLt accepted but that computes wrongly: fall back to the heuristic's best
        rejected.append({"from": config["from"], "failures": list(checked.failures)[:3]})
    if not record["check_passed"]:
        return record
    pair = [("library", fn, problem), ("torch", make_torch(problem).fn, problem)]
    timed = time_many(pair, "offline", options=options)
    if isinstance(timed["torch"], TimedCheckFailure):
        # torch's default lets cuBLAS sum split-K partials in fp16, which can fail gemmgen's
        # check (17x4611x3583 on the H100): the choice then meets what gemmgen serves instead
        record["config"]["torch_baseline"] = f"fp32 reduction, as served: {timed['torch']}"
        pair[1] = ("torch", torch_call(problem), problem)
        timed = time_many(pair, "offline", options=options)
    failed = [f"{name} could not be timed: {t}" for name, t in timed.items() if isinstance(t, Exception)]
    if failed:
        record["error"] = "; ".join(failed)
        return record
    mine, torch_ = timed["library"], timed["torch"]
    record.update(device_ms=mine.device_ms, spread=mine.spread, host_ms=mine.host_ms, torch_ms=torch_.device_ms,
                  torch_spread=torch_.spread, torch_host_ms=torch_.host_ms, clocks=mine.clocks,
                  noise=speedup_noise(mine.samples_ms, torch_.samples_ms))
    # the same pair with idle gaps before each call: an algorithm ahead back to back may not be
    # (a 4096x16384x16384 choice recorded 1.037x offline and measured 0.963x in server mode)
    gapped = time_many(pair, "server", options=options)
    mine, torch_ = gapped["library"], gapped["torch"]
    if not isinstance(mine, Exception) and not isinstance(torch_, Exception):
        record.update(server_ms=mine.device_ms, torch_server_ms=torch_.device_ms,
                      server_noise=speedup_noise(mine.samples_ms, torch_.samples_ms))
    return record


def _select(problem: Problem, selection) -> list[tuple[str, dict[str, Any]]]:
    """Steps 1 and 2 of the search: the fastest algorithm as text with its config (what it is,
    where it came from, the selection's times), then the heuristic's fastest if that differs."""

    lt, algos, _, timed = autotune_lt(problem, selection)
    ranked = sorted(timed, key=lambda name: timed[name].device_ms)[:NEIGHBOUR_BASES]
    bases = [(f"heuristic #{name[len('algo'):]}", algos[int(name[len('algo'):])]) for name in ranked]
    extra = [(f"{label} with " + ", ".join(f"{k}={v}" for k, v in changes.items()), variant)
             for label, base in bases for changes, variant in neighbours(lt, base, problem.k)]
    entries = bases + extra
    times = heuristic_only = {0: timed[ranked[0]].device_ms}
    note: dict[str, Any] = {}
    if extra:
        try:
            entries, times = _tournament(problem, entries, len(bases),
                                         replace(selection, max_reps=selection.min_reps))
        except MeasureError as exc:       # the heuristic's best still stands
            entries, times, note = bases, heuristic_only, {"neighbours_failed": str(exc)[:300]}
    best = min(times, key=times.get)
    own = min((i for i in times if i < len(bases)), key=times.get, default=None)
    # the heuristic's best of this same session: what the neighbours had to beat
    selection_note = {"heuristic_best_ms": times.get(own), "selected_ms": times[best], "neighbours": len(extra), **note}
    out = []
    for i in dict.fromkeys(i for i in (best, own) if i is not None):
        label, algorithm = entries[i]
        out.append((algorithm_to_hex(algorithm), {**algorithm_config(algorithm), "from": label,
                                                  "selection": selection_note, "candidates": len(algos) + len(extra)}))
    return out


def _tournament(problem: Problem, entries: list, n_bases: int, selection) -> tuple[list, dict[int, float]]:
    """Time (label, algorithm) entries in sessions of SESSION_SIZE, then the bases (the first
    `n_bases`) and each session's FINALISTS together: (the entries as planned, index -> device ms
    of that final session)."""

    plan = LtMatmul(problem, algorithms=[a for _, a in entries])
    fns = [plan.fn(a) for a in plan.algorithms]

    def session(indices) -> dict[int, float]:
        timed = time_many([(str(i), fns[i], problem) for i in indices], "offline", options=selection)
        return {int(name): t.device_ms for name, t in timed.items() if not isinstance(t, Exception)}

    finalists = list(range(n_bases))
    if len(entries) > SESSION_SIZE:
        for start in range(n_bases, len(entries), SESSION_SIZE):
            times = session(range(start, min(start + SESSION_SIZE, len(entries))))
            finalists += sorted(times, key=times.get)[:FINALISTS]
    else:
        finalists = list(range(len(entries)))
    times = session(finalists)
    if not times:
        raise MeasureError(f"cuBLASLt: none of the {len(finalists)} finalists among {len(entries)} algorithms "
                           "could be timed")
    return list(zip([label for label, _ in entries], plan.algorithms)), times


def knob_changes(algorithm, k: int) -> list[dict[str, Any]]:
    """One algorithm's neighbours worth timing, one knob changed each, as attribute values: split-K
    (each factor leaving at least MIN_K_PER_SPLIT of K per slice, with the first of REDUCTION_SCHEMES
    the algorithm supports), CTA swizzling, each other tile, stage count and custom option."""
    try:
        caps = algorithm.capabilities
    except Exception:  # noqa: BLE001 - an algorithm whose capabilities this nvmath cannot read
        return []
    out: list[dict[str, Any]] = []
    if getattr(caps, "splitk_support", 0):
        mask = int(getattr(caps, "reduction_scheme_mask", 0) or 0)
        schemes = [s for s in REDUCTION_SCHEMES if mask & s][:1]
        out += [{"split_k": s, "reduction_scheme": r} for s in SPLIT_KS
                if k // s >= MIN_K_PER_SPLIT and s != algorithm.split_k for r in schemes]
        if algorithm.split_k > 1:
            out.append({"split_k": 1, "reduction_scheme": 0})
    if getattr(caps, "cta_swizzling_support", 0):
        out.append({"cta_swizzling": not algorithm.cta_swizzling})
    out += [{"tile": t} for t in getattr(caps, "tile_ids", ()) if t != algorithm.tile]
    out += [{"stages": s} for s in getattr(caps, "stages_ids", ()) if s != algorithm.stages]
    out += [{"custom_option": c} for c in range(int(getattr(caps, "custom_option_max", 0) or 0) + 1)
            if c != algorithm.custom_option]
    return out


def neighbours(lt, algorithm, k: int) -> list[tuple[dict[str, Any], Any]]:
    """(changes, algorithm) for each of `knob_changes` that cuBLASLt accepts for the planned
    problem with a workspace within the cap, at most NEIGHBOURS_PER_BASE."""
    out = []
    for changes in knob_changes(algorithm, k):
        variant = checked_variant(lt, algorithm, changes)
        if variant is not None:
            out.append((changes, variant))
            if len(out) == NEIGHBOURS_PER_BASE:
                break
    return out


def checked_variant(lt, algorithm, changes: dict[str, Any]):
    """`algorithm` with `changes` applied, if cublasLtMatmulAlgoCheck accepts it for `lt`'s
    descriptors; its workspace size is the check's (a split-K reduction may need more)."""
    # Deferred: nvmath (optional, heavy to import).
    from nvmath.bindings import cublasLt
    from nvmath.linalg.advanced import Algorithm


    variant = Algorithm.from_numpy(algorithm.as_numpy())
    result = cublasLt.MatmulHeuristicResult(1)
    mm = lt.mm
    try:
        for name, value in changes.items():
            setattr(variant, name, value)
        cublasLt.matmul_algo_check(mm.handle, mm.mm_desc, mm.a_layout_ptr, mm.b_layout_ptr, mm.c_layout_ptr,
                                   mm.d_layout_ptr, variant.algorithm["algo"].ctypes.data, result.ptr)
    except Exception:  # noqa: BLE001 - cuBLASLt refuses this combination (or nvmath cannot name it)
        return None
    checked = np.frombuffer(bytes(memoryview(result)), dtype=cublasLt.matmul_heuristic_result_dtype)
    if int(checked["workspace_size"][0]) > WORKSPACE_BYTES:
        return None
    array = variant.as_numpy().copy()
    for field in ("workspace_size", "state", "waves_count"):
        array[field] = checked[field]
    return Algorithm.from_numpy(array)


def library_job(problem: Problem, seed: Optional[int], timing_options) -> Callable[[], dict]:
    """A gemmgen.measure.worker plain job's load function: the search, to be called in the worker."""
    return lambda: search_cublaslt(problem, seed, timing_options)


__all__ = ["LIBRARY", "SEARCH", "knob_changes", "library_job", "neighbours", "search_cublaslt"]
