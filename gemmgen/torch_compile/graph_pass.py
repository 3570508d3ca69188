"""The inductor post-grad pass that puts gemmgen kernels in place of fp16 matmuls.

It runs on every graph inductor compiles (forward and backward alike) after AOTAutograd's
decompositions and before inductor's own post-grad patterns. Its three roles live apart:

- matching (patterns.py): matmuls, their epilogues (bias, activation, residual add), sibling
  matmuls of one activation (q, k, v) and gated MLPs (silu(gate) * up);
- deciding (decide.py): a pattern is replaced only where the database's times say the gemmgen
  kernel beats what inductor would run in its place by `min_gain_us`;
- rewriting (rewrite.py): the gemmgen ops, and weights joined at compile time as constants of
  the graph.

Products inductor's freezing joined itself (row-major, `cat([W_1^T, W_2^T], dim=1)`) come
first: kept where the measured times favour the join, and laid out column-major again, the
layout of the model's own weights, which cuBLAS ran faster; split back into their parts
elsewhere (inductor_joins.py).

With `join_siblings`, gate/up pairs become one gated GEMM and other siblings one wider GEMM
where the weights are constants of the graph (inductor's freezing, on while the model is first
traced, under torch.no_grad(): dynamo reads it then, before any backend runs), each where it
pays; elsewhere they count as `weights_not_constant`.

A matmul whose M is symbolic (`dynamic=True`, `mark_dynamic` on the batch) while N, K and the
strides are not is rewritten when gemmgen serves some batch size of its (·, N, K) with a
measured program or algorithm (`gemmgen.dispatch`): the op then serves each call's M from that
table, and torch.matmul elsewhere. Its fusions stay with inductor, so that at the batch sizes
torch.matmul serves the graph runs what inductor would have run.

What is not rewritten stays for inductor, counted by reason in `stats()`.
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch._inductor.config as inductor_config
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from gemmgen.errors import GemmgenError
from gemmgen.torch_compile import counts, decide, patterns, rewrite
from gemmgen.torch_compile import ops as torch_ops
from gemmgen.torch_compile.counts import (  # noqa: F401
    missing_keys,
    note_cache_hit,
    reset_stats,
    stats,
)
from gemmgen.torch_compile.decide import estimated_gain_us, in_graph_gain_us  # noqa: F401
from gemmgen.torch_compile.inductor_joins import InductorJoin, inductor_joins
from gemmgen.torch_compile.patterns import (  # noqa: F401
    BATCHED,
    MATMULS,
    OP_KINDS,
    Candidate,
    _act_graph,
    _match_activation,
    major_of,
)
from gemmgen.torch_compile.tuning import tune_keys
from gemmgen.tuning_db import default_db_path


@dataclass(frozen=True)
class PassOptions:
    """What the pass takes. `baseline="stock"` leaves a CUDA matmul without a tuned kernel to
    inductor (the same cuBLAS, with inductor's fusions); "op" routes it through gemmgen anyway.
    A tuned kernel is taken when it saves at least `gain_threshold_us` per call: `min_gain_us`
    if given, else decide.HOST_MIN_GAIN_US, or decide.GRAPH_MIN_GAIN_US where the compiled graph
    replays as a CUDA graph (`graphs`, set from inductor's config when compiling)."""

    ops: tuple = OP_KINDS
    devices: tuple = ("cuda",)
    tune_missing: bool = False
    tune_budget: int = 8
    tune_seconds: float | None = None
    db: str | None = None
    baseline: str = "stock"
    min_gain_us: float | None = None
    join_siblings: bool = False
    causal_masks: bool = True
    grouped_kv: bool = True
    graphs: bool = False

    @property
    def gain_threshold_us(self) -> float:
        if self.min_gain_us is not None:
            return self.min_gain_us
        return decide.GRAPH_MIN_GAIN_US if self.graphs else decide.HOST_MIN_GAIN_US


class GemmgenPass(CustomGraphPass):
    """The post-grad graph pass; its uuid keys inductor's FX-graph cache (code, options, database).

    Under freezing it has no uuid, so inductor compiles the graph afresh (AOTAutograd's cache
    already skips frozen graphs): a cached graph reads its frozen constants by name off the
    graph module it is loaded for, and the constants this pass adds (joined and relaid weights)
    are on that module only when the pass runs, which a cache hit skips."""

    def __init__(self, options: PassOptions = PassOptions(), chained=None):
        self.options = options
        self.chained = chained          # a post-grad pass the user had configured; runs after ours

    def uuid(self):
        if inductor_config.freezing:
            return None
        h = hashlib.sha256()
        for path in sorted(Path(__file__).parent.glob("*.py")):
            h.update(path.read_bytes())
        h.update(repr(self.options).encode())
        h.update(repr(_database_state(self.options.db)).encode())
        if self.chained is not None:
            other = self.chained.uuid() if hasattr(self.chained, "uuid") else None
            if other is None:
                return None
            h.update(repr(other).encode())
        return h.hexdigest()

    def __call__(self, graph: fx.Graph) -> None:
        opts = self.options
        replaced, found, skipped, problems = Counter(), Counter(), Counter(), Counter()
        for join in inductor_joins(graph, opts.devices):
            self._split_or_relay(graph, join)
        candidates = []
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in BATCHED:
                skipped["batched_matmul"] += 1
            elif node.target in MATMULS:
                cand = patterns.candidate(node, opts.ops, opts.devices)
                if isinstance(cand, str):
                    skipped[cand] += 1
                else:
                    candidates.append(cand)
        patterns.settle_residuals(candidates)
        gated, joins = [], []
        if opts.join_siblings:
            for _ in range(patterns.siblings_of_inputs(candidates)):
                counts.note_outcome("joins", "weights_not_constant")
            gated = self._choose_gated(candidates) if "gated" in opts.ops else []
            taken = {id(c) for pair in gated for c in pair.members}
            joins = self._choose_joins([c for c in candidates if id(c) not in taken])
            taken |= {id(c) for join in joins for c in join.members}
            candidates = [c for c in candidates if id(c) not in taken]
        self._choose_kernels(candidates, skipped)
        for pair in gated:
            problems[torch_ops.problem_key(pair.key())] += 1
            rewrite.rewrite_gated(graph, pair)
            replaced["gated_mm"] += 2
            found["gated"] += 1
        for join in joins:
            problems[torch_ops.problem_key(join.key())] += 1
            rewrite.rewrite_siblings(graph, join)
            replaced["joined_mm"] += len(join.members)
            found["joined"] += 1
            found["bias"] += join.members[0].bias is not None
        for cand in candidates:
            if cand.chosen:
                problems[torch_ops.problem_key(cand.key())] += 1
                rewrite.rewrite_single(graph, cand)
                replaced[cand.kind] += 1
                found[cand.pattern] += 1
                found["bias"] += cand.bias is not None and cand.pattern != "bias"
        counts.add_graph(replaced, +found, skipped, problems)
        if self.chained is not None:
            self.chained(graph)

    # -- deciding, with the database's kernels -------------------------------------------------------

    def _kernels(self, keys, missing) -> dict:
        """Each key's Kernel (None where gemmgen.compile refuses the problem), after tuning those
        `missing(kernel)` names if the options ask for it."""
        opts = self.options

        def lookup():
            out = {}
            for key in keys:
                try:
                    out[key] = torch_ops.resolve(key, opts.db)
                except GemmgenError:         # e.g. a gated problem gemmgen.compile cannot serve yet
                    out[key] = None
            return out

        kernels = lookup()
        lacking = [k for k, kern in kernels.items() if kern is not None and missing(kern)]
        if opts.tune_missing and lacking:
            tune_keys(lacking, opts.db, opts.tune_budget, opts.tune_seconds, found=len(keys))
            kernels = lookup()
        return kernels

    def _split_or_relay(self, graph: fx.Graph, join: InductorJoin) -> None:
        """A product inductor's freezing joined: on CUDA kept only where the database's times
        say it beats its parts apart (decide.decide_split; tuning the unmeasured keys first if
        asked), else split back into them; a kept one, and any the pass cannot split, laid out
        column-major again (inductor_joins.py)."""
        keys = join.keys()
        if keys is not None:
            joined, parts = keys
            kernels = self._kernels({joined, *parts}, lambda kern: decide.time_ms(kern) is None)
            outcome = decide.decide_split(joined, parts, kernels, self.options.gain_threshold_us)
            if outcome == "unmeasured":
                _note_untimed((joined, *parts), kernels)
            if outcome != "kept":
                rewrite.split_join(graph, join)
                counts.note_outcome("joins", "inductor_join_split")
                return
        rewrite.relay_column_major(graph, join.node, join.index)
        counts.note_outcome("joins", "inductor_join_column_major")

    def _choose_gated(self, candidates: list) -> list:
        """The gate/up pairs worth one gated GEMM: on CUDA, those decide.decide_gated takes; on
        CPU, all (for testing); only where the weights are constants of the graph."""
        return self._choose_measured(patterns.gated_pairs(candidates), lambda pair: pair.gate.device,
                                     decide.gated_keys, decide.decide_gated, "gated", "gated")

    def _choose_joins(self, candidates: list) -> list:
        """The sibling groups worth joining: on CUDA, those decide.decide_join takes by the
        measured times (tuning the unmeasured ones first if asked); on CPU, all (for testing)."""
        chosen = self._choose_measured(patterns.sibling_groups(candidates), lambda join: join.members[0].device,
                                       decide.join_keys, decide.decide_join, "joins", "joined")
        for join in chosen:
            for cand in join.members:
                cand.drop_fusions()      # a fused activation would cover only its own slice
        return chosen

    def _choose_measured(self, groups: list, device_of, keys_of, decide_one, kind: str, taken: str) -> list:
        """The groups `decide_one` takes on CUDA by the database's times (after tuning the
        unmeasured keys if asked), and every CPU group; each outcome counted under `kind`, and an
        unmeasured group's untimed keys noted as missing."""
        cuda = [g for g in groups if device_of(g) is not None]
        keys = {k for g in cuda for k in keys_of(g)}
        kernels = self._kernels(keys, lambda kern: decide.time_ms(kern) is None)
        chosen = [g for g in groups if device_of(g) is None]
        for group in cuda:
            outcome = decide_one(group, kernels, self.options.gain_threshold_us)
            if outcome == taken:
                chosen.append(group)
                continue
            counts.note_outcome(kind, outcome)
            if outcome == "unmeasured":
                _note_untimed(keys_of(group), kernels)
        for _ in chosen:
            counts.note_outcome(kind, taken)
        return chosen

    def _choose_kernels(self, candidates: list, skipped: Counter) -> None:
        """Look kernels up (tuning the missing ones if asked) and mark what gets rewritten."""
        opts = self.options
        for cand in candidates:
            cand.chosen = cand.device is None          # CPU nodes: the reference op, for testing
        for cand in [c for c in candidates if c.device is not None and c.dynamic_m]:
            decide.choose_dynamic(cand, lambda key: torch_ops.resolve(key, opts.db), opts.baseline, skipped)
        cuda = [c for c in candidates if c.device is not None and not c.dynamic_m]
        if not cuda:
            return
        keys = {c.key(**kw) for c in cuda for kw in ({"fused": True}, {"fused": False}, {"bare": True})}
        kernels = self._kernels(keys, lambda kern: kern.backend == "torch"
                                and kern.provenance.baseline_ms_here is None)
        for cand in cuda:
            decide.choose_single(cand, kernels, opts.gain_threshold_us, opts.baseline, skipped)


def _note_untimed(keys, kernels: dict) -> None:
    """List for tuning each of the keys gemmgen serves with no measured time."""
    for key in keys:
        if kernels[key] is not None and decide.time_ms(kernels[key]) is None:
            counts.note_missing(key)


def _database_state(db) -> tuple:
    """What a lookup would read: the database path and its modification stamp."""

    path = str(db) if db is not None else str(default_db_path())
    try:
        st = os.stat(path)
        return path, st.st_mtime_ns, st.st_size
    except OSError:
        return path, None, None
