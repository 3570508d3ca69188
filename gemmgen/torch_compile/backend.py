"""`torch.compile(model, backend="gemmgen")`: inductor, with gemmgen kernels for fp16 matmuls.

The backend is inductor's own compiler (`compile_fx`) with one post-grad graph pass
added (graph_pass.py; a CustomGraphPass in `post_grad_custom_pre_pass`). Because the pass is
given to inductor as a config patch, it applies to the forward graph and to the backward graph inductor compiles
later. Before inductor sees dynamo's graph, attention masks proven causal become
`is_causal=True` (causal_mask.py), and K and V heads repeated per query group are handed to
SDPA once, with `enable_gqa=True` (grouped_kv.py). Options come from
`torch.compile(..., options={...})` or `make_backend(...)`:

    ops           which matmuls to take and which epilogues to fuse (subset of "mm", "addmm",
                  "relu", "gelu", "silu", "residual", "gated"; default all)
    devices       device types to rewrite on: ("cuda",) by default; add "cpu" to run the
                  rewrite on CPU, where the op computes a torch reference (for testing)
    baseline      "stock" (default): a CUDA matmul with no tuned kernel stays with inductor;
                  "op": it goes through gemmgen's cuBLAS fallback anyway
    tune_missing  tune shapes the database lacks at compile time (GPU; minutes); default False
    tune_budget   trials per shape when tuning (default 8)
    tune_seconds  time to spend tuning per compiled graph (default: no limit but tune_budget)
    min_gain_us   take a tuned kernel only if it saves at least this much device time per call
                  (default 5, the op's extra host cost, or 0 where the graph replays as a CUDA
                  graph: mode="reduce-overhead" or inductor's triton.cudagraphs; see
                  docs/torch_compile.md)
    join_siblings join matmuls of one activation by several weights into one GEMM where the
                  database's times say it saves min_gain_us: gate and up into one gated GEMM
                  (silu(x Wg^T) * (x Wu^T)), q, k and v into one wider GEMM. The weights are
                  joined once, at compile time, into constants the compiled graph owns (their
                  memory once more). That needs the weights' values, which a graph has under
                  inductor's freezing: torch._inductor.config.freezing = True when the model is
                  traced (its first call), under torch.no_grad(). Freezing's contract holds:
                  weights updated after compiling are not seen; recompile. Default False
    causal_masks  give SDPA `is_causal=True` in place of a mask proven at compile time to be the
                  causal mask (transformers materializes it under tracing, and the kernel then
                  computes the blocks the causal form skips; causal_mask.py). Default True
    grouped_kv    give SDPA `enable_gqa=True` and the KV heads once, in place of K and V proven
                  to be their heads repeated per query group (transformers' repeat_kv), on calls
                  with no mask (grouped_kv.py). Default True
    db            tuning database path (default: GEMMGEN_DB or ~/.cache/gemmgen/tuning.sqlite)
    mode          an inductor mode ("reduce-overhead": CUDA graphs; "max-autotune", ...) for
                  backend="gemmgen" with options= (torch.compile takes mode= or options=, not both)
    inductor      a dict of inductor config patches passed through unchanged

`stats()` says what was rewritten and why the rest was not.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gemmgen.errors import GemmgenError, finite_number
from gemmgen.torch_compile import causal_mask, counts, grouped_kv
from gemmgen.torch_compile import graph_pass as torch_pass
from gemmgen.torch_compile import ops as torch_ops
from gemmgen.torch_compile.counts import missing_keys, reset_stats, stats
from gemmgen.torch_compile.graph_pass import OP_KINDS, GemmgenPass, PassOptions
from gemmgen.torch_compile.tuning import tune_keys
from gemmgen.tuning_db import Database

__all__ = ["TorchBackendError", "gemmgen_backend", "make_backend", "missing_keys", "reset_stats", "stats",
           "tune_keys"]

_DEVICE_TYPES = ("cuda", "cpu")
_BASELINES = ("stock", "op")
#: Where the pass goes in inductor's config (the first of the post-grad passes).
PASS_SLOT = "post_grad_custom_pre_pass"
_OPTION_NAMES = ("ops", "devices", "baseline", "tune_missing", "tune_budget", "tune_seconds", "min_gain_us",
                 "join_siblings", "causal_masks", "grouped_kv", "db", "inductor", "mode")


class TorchBackendError(GemmgenError):
    """Options of the gemmgen torch.compile backend that cannot be honoured."""


def pass_options(ops: Iterable[str] = OP_KINDS, devices: Iterable[str] = ("cuda",), baseline: str = "stock",
                 tune_missing: bool = False, tune_budget: int = 8, min_gain_us: float | None = None,
                 db=None, join_siblings: bool = False, tune_seconds: float | None = None,
                 causal_masks: bool = True, grouped_kv: bool = True) -> PassOptions:
    """Validated PassOptions from user values."""
    ops = (ops,) if isinstance(ops, str) else tuple(ops)
    devices = (devices,) if isinstance(devices, str) else tuple(devices)
    bad = [o for o in ops if o not in OP_KINDS]
    if bad:
        raise TorchBackendError(f"ops {bad} not understood; choose from {', '.join(OP_KINDS)}")
    bad = [d for d in devices if d not in _DEVICE_TYPES]
    if bad:
        raise TorchBackendError(f"devices {bad} not understood; choose from {', '.join(_DEVICE_TYPES)}")
    if baseline not in _BASELINES:
        raise TorchBackendError(f"baseline={baseline!r} not understood; choose 'stock' or 'op'")
    if not isinstance(tune_budget, int) or tune_budget < 1:
        raise TorchBackendError(f"tune_budget must be a positive integer, got {tune_budget!r}")
    if tune_seconds is not None and not (finite_number(tune_seconds) and tune_seconds > 0):
        raise TorchBackendError(f"tune_seconds must be a positive number of seconds, got {tune_seconds!r}")
    if min_gain_us is not None and not (finite_number(min_gain_us) and min_gain_us >= 0):
        raise TorchBackendError(f"min_gain_us must be a number >= 0, got {min_gain_us!r}")
    for name, value in (("join_siblings", join_siblings), ("causal_masks", causal_masks),
                        ("grouped_kv", grouped_kv)):
        if not isinstance(value, bool):
            raise TorchBackendError(f"{name} must be True or False, got {value!r}")
    if db is not None and Path(db).exists():   # a file that is not a tuning database: said now, not skipped later
        try:
            Database(db, readonly=True).close()
        except GemmgenError as exc:
            raise TorchBackendError(f"db={str(db)!r}: {exc}") from None
    return PassOptions(ops=ops, devices=devices, tune_missing=bool(tune_missing), tune_budget=tune_budget,
                       db=None if db is None else str(db), baseline=baseline,
                       min_gain_us=None if min_gain_us is None else float(min_gain_us),
                       join_siblings=join_siblings, causal_masks=causal_masks, grouped_kv=grouped_kv,
                       tune_seconds=None if tune_seconds is None else float(tune_seconds))


def make_backend(ops: Iterable[str] = OP_KINDS, *, devices: Iterable[str] = ("cuda",), baseline: str = "stock",
                 tune_missing: bool = False, tune_budget: int = 8, min_gain_us: float | None = None, db=None,
                 join_siblings: bool = False, inductor: Mapping[str, Any] | None = None,
                 tune_seconds: float | None = None, causal_masks: bool = True, grouped_kv: bool = True):
    """A torch.compile backend with these options: torch.compile(m, backend=make_backend(...))."""
    chosen = pass_options(ops, devices, baseline, tune_missing, tune_budget, min_gain_us, db, join_siblings,
                          tune_seconds, causal_masks, grouped_kv)
    patches = dict(inductor or {})

    def backend(gm, example_inputs, mode: str | None = None, options: dict | None = None):
        if options:
            raise TorchBackendError("a make_backend() backend takes its options from make_backend(); "
                                    "pass options= only with backend='gemmgen'")
        return compile_with_pass(gm, example_inputs, chosen, mode=mode, inductor=patches)

    backend.__name__ = "gemmgen"
    return backend


def gemmgen_backend(gm, example_inputs, mode: str | None = None, options: dict | None = None):
    """The registered backend (entry point `gemmgen`): options arrive from torch.compile(options=...)."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise TorchBackendError(f"unknown gemmgen backend options {unknown}; valid: {', '.join(_OPTION_NAMES)}")
    inductor = options.pop("inductor", None) or {}
    mode = options.pop("mode", None) or mode
    return compile_with_pass(gm, example_inputs, pass_options(**options), mode=mode, inductor=inductor)


def compile_with_pass(gm, example_inputs, options: PassOptions, *, mode: str | None = None,
                      inductor: Mapping[str, Any] | None = None):
    """Inductor's compile_fx with the gemmgen pass patched in (forward and backward graphs),
    after the causal-mask and grouped-KV rewrites of dynamo's graph."""
    # Deferred: torch (optional, heavy to import).
    import torch._inductor
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    torch_ops.set_lookup_db(options.db)
    if options.causal_masks:
        counts.note_masks(causal_mask.make_masks_causal(gm, options.devices))
    if options.grouped_kv:       # after the masks: only calls left with none are grouped
        counts.note_kv_heads(grouped_kv.group_kv_heads(gm, options.devices))
    if options.tune_missing and not torch.cuda.is_available():
        warnings.warn("gemmgen backend: tune_missing=True needs a CUDA GPU to measure on; this compile "
                      "tunes nothing", stacklevel=2)
    patches: dict = {}
    if mode and mode != "default":
        patches.update(torch._inductor.list_mode_options(mode))
    patches.update(inductor or {})
    # what a tuned kernel must save depends on whether the graph replays as a CUDA graph
    options = replace(options, graphs=bool(patches.get("triton.cudagraphs", inductor_config.triton.cudagraphs)))
    # The pre slot of the post-grad passes: inductor's own post-grad patterns run after it, and
    # on some versions they split a GPU addmm into mm + add before a post pass could see it.
    existing = patches.get(PASS_SLOT, getattr(inductor_config, PASS_SLOT))
    chained = None if isinstance(existing, GemmgenPass) else existing
    patches[PASS_SLOT] = GemmgenPass(options, chained)
    seen = torch_pass.stats()["graphs"]
    compiled = compile_fx(gm, example_inputs, config_patches=patches)
    if torch_pass.stats()["graphs"] == seen:     # the forward graph came from a compile cache
        torch_pass.note_cache_hit()
    return compiled


