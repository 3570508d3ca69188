"""What the pass did in this process: `stats()`, `missing_keys()`, `reset_stats()`."""
from __future__ import annotations

import logging
from collections import Counter

from gemmgen.torch_compile import ops as torch_ops

log = logging.getLogger("gemmgen.torch")

_COUNTERS = ("replaced", "patterns", "skipped", "problems", "missing", "joins", "gated", "masks", "kv_heads")
_STATS: dict = {**{name: Counter() for name in _COUNTERS}, "graphs": 0, "from_cache": 0}
_MISSING_KEYS: dict = {}     # op key -> None, in first-seen order: what tuning would serve


def stats() -> dict:
    """What the pass did in this process:

    - `replaced`: matmul nodes replaced, by kind (`mm`, `addmm+silu`, `mm+residual`, `joined_mm`,
      `gated_mm`, ...);
    - `patterns`: gemmgen ops inserted, by pattern: `gated` (a gate/up pair as one gated GEMM),
      `joined` (siblings such as q, k, v as one GEMM; `bias` too where they had one), `residual`
      (an add into the residual stream in the epilogue), `activation`, `bias`, `plain`;
    - `skipped`: matmuls left to inductor, by reason;
    - `problems` / `missing`: the gemmgen problem keys rewritten / left for want of a tuned kernel;
    - `joins` and `gated`: sibling groups and gate/up pairs found, by outcome (joined or gated,
      unmeasured, not_served, no_winner, gain_below_overhead, weights_not_constant); `joins` also counts
      the products inductor's freezing joined that the pass split back into their parts
      (inductor_join_split: the join had not measured faster, or a time was missing, whose keys
      are then in `missing`) or kept and laid out column-major again (inductor_join_column_major);
    - `masks`: attention calls with a mask, by outcome: `causal` (the mask was proven causal and
      became `is_causal=True`; causal_mask.py) or why it stayed (mask_from_inputs, not_causal, ...);
    - `kv_heads`: attention calls whose K and V repeat their heads per query group, by outcome:
      `grouped` (SDPA reads the heads once, `enable_gqa=True`; grouped_kv.py) or why not
      (`masked`: the call kept a mask; `repeat_not_proven`, `repeat_too_large_to_prove`, ...);
    - `graphs`: graphs the pass ran on; `from_cache`: graphs served from inductor's compile
      caches (FX graph, AOTAutograd), on which the pass did not run, so their rewrites (made when
      the cache was filled) are not in the counts."""
    return {**{name: dict(_STATS[name]) for name in _COUNTERS}, "graphs": _STATS["graphs"],
            "from_cache": _STATS["from_cache"]}


def missing_keys() -> list:
    """Op keys of the CUDA matmuls left for want of a tuned kernel (for `tune_keys`)."""
    return list(_MISSING_KEYS)


def reset_stats() -> None:
    for name in _COUNTERS:
        _STATS[name].clear()
    _STATS["graphs"] = _STATS["from_cache"] = 0
    _MISSING_KEYS.clear()


def note_missing(key: tuple) -> None:
    _STATS["missing"][torch_ops.problem_key(key)] += 1
    _MISSING_KEYS[key] = None


def note_cache_hit() -> None:
    """A graph compiled without the pass running (one of inductor's compile caches had it)."""
    _STATS["from_cache"] += 1
    log.info("gemmgen: a graph came from inductor's compile cache; the pass did not run on it, so the "
             "replacement counts leave it out (torch._inductor.config.fx_graph_cache = False recounts)")


def add_graph(replaced: Counter, patterns: Counter, skipped: Counter, problems: Counter) -> None:
    _STATS["graphs"] += 1
    for name, counts in (("replaced", replaced), ("patterns", patterns), ("skipped", skipped),
                         ("problems", problems)):
        _STATS[name].update(counts)
    if replaced or skipped:
        log.info("gemmgen: graph %d: replaced %d matmuls (%s) by %d ops (%s); left %d to inductor (%s)",
                 _STATS["graphs"], sum(replaced.values()), _fmt(replaced), sum(patterns.values()),
                 _fmt(patterns), sum(skipped.values()), _fmt(skipped))


def note_masks(outcomes: Counter) -> None:
    _STATS["masks"].update(outcomes)
    if outcomes:
        log.info("gemmgen: attention masks: %s", _fmt(outcomes))


def note_kv_heads(outcomes: Counter) -> None:
    _STATS["kv_heads"].update(outcomes)
    if outcomes:
        log.info("gemmgen: repeated KV heads: %s", _fmt(outcomes))


def note_outcome(what: str, outcome: str) -> None:
    """A sibling group (`joins`) or gate/up pair (`gated`) and what became of it."""
    _STATS[what][outcome] += 1


def _fmt(counts: Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
