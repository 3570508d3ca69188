"""The inductor post-grad pass that puts gemmgen kernels in place of fp16 matmuls.

It runs on every graph inductor compiles (forward and backward alike) after
AOTAutograd's decompositions and before inductor's own post-grad patterns, so it sees `aten.mm` / `aten.addmm` on 2-D operands
whose strides say their major-ness (a `permute` of an (N, K) weight is a column-major
B: no copy is ever inserted). A matmul whose only consumer, through reshapes, is a
relu, an exact gelu or a silu takes the activation into its epilogue; the activation
is recognised by comparing the graph with inductor's own decomposition of it.

A tuned kernel replaces a node only if it beats what inductor would run in its place,
by at least `min_gain_us`. Tuning measured each problem against cuBLAS with the epilogue
as separate torch passes; inside a graph those passes are mostly free: cuBLAS applies
addmm's bias itself, and inductor fuses an activation into the pointwise op that consumes
it (Llama's silu(gate) * up). So unless the activation is the epilogue's only item and it
feeds nothing inductor can fuse into (a matmul, the graph's output), the reference is the
bare matmul's baseline, measured at the same M, N, K and majors.

With `join_siblings`, matmuls of one activation by several weights (q, k, v) may first be
joined into one wider GEMM where the database's times say it pays (joins.py).

A matmul whose M is symbolic (`dynamic=True`, `mark_dynamic` on the batch) while N, K and the
strides are not is rewritten when gemmgen serves some batch size of its (·, N, K) with a
measured program or algorithm (`gemmgen.dispatch`): the op then serves each call's M from that
table, and torch.matmul elsewhere. Its activation stays with inductor, so that at the batch
sizes torch.matmul serves the graph runs what inductor would have run.

What is not rewritten stays for inductor, counted by reason in `stats()`.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from gemmgen.torch_compile import joins as torch_join
from gemmgen.torch_compile import ops as torch_ops
from gemmgen.torch_compile.tuning import tune_keys
from gemmgen.tuning_db import default_db_path

log = logging.getLogger("gemmgen.torch")

aten = torch.ops.aten
MATMULS = (aten.mm.default, aten.addmm.default)
BATCHED = (aten.bmm.default, aten.baddbmm.default)
RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
OP_KINDS = ("mm", "addmm", "relu", "gelu", "silu")
#: 16-byte alignment of fp16 operands, in elements.
ALIGN_ELEMS = 8

_COUNTERS = ("replaced", "skipped", "problems", "missing", "joins")
_STATS: dict = {**{name: Counter() for name in _COUNTERS}, "graphs": 0, "from_cache": 0}
_MISSING_KEYS: dict = {}     # op key -> None, in first-seen order: what tuning would serve


def stats() -> dict:
    """What the pass did in this process: rewrites by kind, skips by reason, the gemmgen
    problem keys it rewrote (`problems`) and those it left for want of a tuned kernel
    (`missing`), with their counts, and how many graphs it saw. `from_cache` counts the
    graphs served from inductor's compile caches (FX graph, AOTAutograd): the pass did not
    run on those, so their rewrites (made when the cache was filled) are not in the counts.
    `joins` counts sibling groups (join_siblings) by outcome: joined, unmeasured (the
    database lacks a time; tuning would add it), host_bound, gain_below_overhead
    (joins.py)."""
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


def note_cache_hit() -> None:
    """A graph compiled without the pass running (one of inductor's compile caches had it)."""
    _STATS["from_cache"] += 1
    log.info("gemmgen: a graph came from inductor's compile cache; the pass did not run on it, so the "
             "replacement counts leave it out (torch._inductor.config.fx_graph_cache = False recounts)")


@dataclass(frozen=True)
class PassOptions:
    """What the pass takes. `baseline="stock"` leaves a CUDA matmul without a tuned kernel to
    inductor (the same cuBLAS, with inductor's fusions); "op" routes it through gemmgen anyway.
    A tuned kernel is taken when it saves at least `min_gain_us` per call: the op's dispatch
    costs a few microseconds of host time more than inductor's direct cuBLAS call."""

    ops: tuple = OP_KINDS
    devices: tuple = ("cuda",)
    tune_missing: bool = False
    tune_budget: int = 8
    tune_seconds: Optional[float] = None
    db: Optional[str] = None
    baseline: str = "stock"
    min_gain_us: float = 5.0
    join_siblings: bool = False


@dataclass
class _Candidate:
    """One matmul node the pass may rewrite, with everything the op needs."""

    node: fx.Node
    a: fx.Node
    b: fx.Node
    a_major: str
    b_major: str
    bias: Optional[fx.Node] = None
    bias_1xn: bool = False
    c: Optional[fx.Node] = None
    alpha: float = 1.0
    beta: float = 0.0
    activation: str = "none"
    act_nodes: list = field(default_factory=list)
    act_out: Optional[fx.Node] = None
    chain_last: Optional[fx.Node] = None
    act_standalone: bool = False        # inductor would run the activation as a kernel of its own
    device: Optional[int] = None
    chosen: bool = False
    dynamic_m: bool = False             # M is symbolic: its key has M = None (a dispatch over M)

    def key(self, fused: bool = True, bare: bool = False) -> tuple:
        """The op key with the activation (fused) or without; bare: no epilogue at all."""
        m, k = self.a.meta["val"].shape
        n = self.b.meta["val"].shape[1]
        m = None if self.dynamic_m else int(m)
        if bare:
            return torch_ops.kernel_key(m, int(n), int(k), self.a_major, self.b_major,
                                        False, False, "none", 1.0, 0.0, self.device)
        act = self.activation if fused else "none"
        return torch_ops.kernel_key(m, int(n), int(k), self.a_major, self.b_major,
                                    self.bias is not None, self.c is not None, act, self.alpha,
                                    self.beta, self.device)

    @property
    def kind(self) -> str:
        base = "addmm" if (self.bias is not None or self.c is not None) else "mm"
        return base if self.activation == "none" else f"{base}+{self.activation}"


def major_of(shape, stride) -> Optional[str]:
    """'row' or 'col' by the rules gemmgen kernels check, or None (a strided view)."""
    rows, cols = shape
    if (stride[1] == 1 or cols == 1) and (stride[0] == cols or rows == 1):
        return "row"
    if (stride[0] == 1 or rows == 1) and (stride[1] == rows or cols == 1):
        return "col"
    return None


def _is_static(t) -> bool:
    return all(isinstance(d, int) for d in (*t.shape, *t.stride(), t.storage_offset()))


def _dynamic_m(a, b) -> bool:
    """A symbolic M alone: A row-major (M x K) with static K, strides and offset; B all static.
    (Read without comparing the symbol, so that no guard on M is added.)"""
    rows, cols = a.shape
    return (not isinstance(rows, int) and isinstance(cols, int) and _is_static(b)
            and all(isinstance(d, int) for d in (*a.stride(), a.storage_offset()))
            and tuple(a.stride()) == (cols, 1))


class GemmgenPass(CustomGraphPass):
    """The post-grad graph pass; its uuid keys inductor's FX-graph cache (code, options, database)."""

    def __init__(self, options: PassOptions = PassOptions(), chained=None):
        self.options = options
        self.chained = chained          # a post-grad pass the user had configured; runs after ours

    def uuid(self):
        h = hashlib.sha256()
        for path in (__file__, torch_ops.__file__, torch_join.__file__):
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(repr(self.options).encode())
        h.update(repr(_database_state(self.options.db)).encode())
        if self.chained is not None:
            other = self.chained.uuid() if hasattr(self.chained, "uuid") else None
            if other is None:
                return None
            h.update(repr(other).encode())
        return h.hexdigest()

    def __call__(self, graph: fx.Graph) -> None:
        replaced, skipped, problems = Counter(), Counter(), Counter()
        candidates = []
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in BATCHED:
                skipped["batched_matmul"] += 1
            elif node.target in MATMULS:
                found = self._candidate(node)
                if isinstance(found, str):
                    skipped[found] += 1
                else:
                    candidates.append(found)
        static = [c for c in candidates if not c.dynamic_m]
        joins = self._choose_joins(static) if self.options.join_siblings else []
        in_joins = {id(c) for join in joins for c in join.members}
        candidates = [c for c in candidates if id(c) not in in_joins]
        self._choose_kernels(candidates, skipped)
        for join in joins:
            problems[torch_ops.problem_key(join.key())] += 1
            torch_join.rewrite(graph, join)
            replaced["joined_mm"] += len(join.members)
        for cand in candidates:
            if cand.chosen:
                problems[torch_ops.problem_key(cand.key())] += 1
                _rewrite(graph, cand)
                replaced[cand.kind] += 1
        _STATS["graphs"] += 1
        _STATS["replaced"].update(replaced)
        _STATS["skipped"].update(skipped)
        _STATS["problems"].update(problems)
        if replaced or skipped:
            log.info("gemmgen: graph %d: replaced %d matmuls (%s); left %d to inductor (%s)",
                     _STATS["graphs"], sum(replaced.values()), _fmt(replaced), sum(skipped.values()),
                     _fmt(skipped))
        if self.chained is not None:
            self.chained(graph)

    # -- analysis -----------------------------------------------------------------------

    def _candidate(self, node: fx.Node):
        """A _Candidate, or the reason the node stays with inductor."""
        opts = self.options
        is_addmm = node.target is aten.addmm.default
        if is_addmm:
            inp, a, b = node.args[:3]
            beta = float(node.kwargs.get("beta", 1.0))
            alpha = float(node.kwargs.get("alpha", 1.0))
        else:
            (a, b), inp, alpha, beta = node.args[:2], None, 1.0, 0.0
        if ("addmm" if is_addmm else "mm") not in opts.ops:
            return "not_selected"
        if not all(isinstance(x, fx.Node) and "val" in x.meta for x in (a, b, node)):
            return "no_metadata"
        va, vb, vout = a.meta["val"], b.meta["val"], node.meta["val"]
        if any(v.dtype != torch.float16 for v in (va, vb, vout)):
            return "dtype"
        if va.device.type not in opts.devices:
            return f"device_{va.device.type}"
        dynamic = not (_is_static(va) and _is_static(vb))
        if dynamic and not _dynamic_m(va, vb):
            return "dynamic_shape"
        a_major = "row" if dynamic else major_of(va.shape, va.stride())
        b_major = major_of(vb.shape, vb.stride())
        if a_major is None or b_major is None:
            return "layout"
        if va.storage_offset() % ALIGN_ELEMS or vb.storage_offset() % ALIGN_ELEMS:
            return "misaligned"
        cand = _Candidate(node, a, b, a_major, b_major, alpha=alpha,
                          device=_cuda_index(va.device), dynamic_m=dynamic)
        if is_addmm and beta != 0.0:
            reason = _addmm_input(cand, inp, beta, va.shape[0], vb.shape[1])
            if reason:
                return reason
        _find_activation(cand, opts.ops)
        return cand

    def _kernels(self, keys, missing) -> dict:
        """Each key's Kernel, after tuning those `missing(kernel)` names if the options ask for it."""
        opts = self.options
        kernels = {k: torch_ops.resolve(k, opts.db) for k in keys}
        lacking = [k for k, kern in kernels.items() if missing(kern)]
        if opts.tune_missing and lacking:
            tune_keys(lacking, opts.db, opts.tune_budget, opts.tune_seconds, found=len(keys))
            kernels = {k: torch_ops.resolve(k, opts.db) for k in kernels}
        return kernels

    def _choose_joins(self, candidates: list) -> list:
        """The sibling groups worth joining: on CUDA, those torch_join.decide takes by the
        measured times (tuning the unmeasured ones first if asked); on CPU, all (for testing)."""
        opts = self.options
        groups = torch_join.sibling_groups(candidates)
        cuda = [j for j in groups if j.members[0].device is not None]
        keys = {k for j in cuda for k in (j.key(), *(c.key(bare=True) for c in j.members))}
        kernels = self._kernels(keys, lambda kern: torch_join.time_ms(kern) is None)
        chosen = [j for j in groups if j.members[0].device is None]
        for join in cuda:
            outcome = torch_join.decide(join, kernels, opts.min_gain_us)
            if outcome == "joined":
                chosen.append(join)
                continue
            _STATS["joins"][outcome] += 1
            if outcome == "unmeasured":
                for key in (join.key(), *(c.key(bare=True) for c in join.members)):
                    if torch_join.time_ms(kernels[key]) is None:
                        _note_missing(key)
        for join in chosen:
            _STATS["joins"]["joined"] += 1
            for cand in join.members:
                _drop_activation(cand)      # a fused activation would cover only its own slice
        return chosen

    def _choose_kernels(self, candidates: list, skipped: Counter) -> None:
        """Look kernels up (tuning the missing ones if asked) and mark what gets rewritten."""
        opts = self.options
        for cand in candidates:
            cand.chosen = cand.device is None          # CPU nodes: the reference op, for testing
        for cand in [c for c in candidates if c.device is not None and c.dynamic_m]:
            _choose_dynamic(cand, opts, skipped)
        cuda = [c for c in candidates if c.device is not None and not c.dynamic_m]
        if not cuda:
            return
        keys = {c.key(**kw) for c in cuda for kw in ({"fused": True}, {"fused": False}, {"bare": True})}
        kernels = self._kernels(keys, lambda kern: kern.backend == "torch"
                                and kern.provenance.baseline_ms_here is None)
        for cand in cuda:
            fused, plain = cand.key(True), cand.key(False)
            worth = lambda key: (kernels[key].backend != "torch"  # noqa: E731
                                 and in_graph_gain_us(cand, key, kernels) >= opts.min_gain_us)
            if opts.baseline == "op" or worth(fused):
                cand.chosen = True
            elif cand.activation != "none" and worth(plain):
                _drop_activation(cand)
                cand.chosen = True
            elif kernels[fused].backend == "torch" and kernels[plain].backend == "torch":
                skipped["no_tuned_kernel"] += 1
                _note_missing(cand.key(True))
            elif _reference_unmeasured(cand, kernels):
                skipped["reference_unmeasured"] += 1
                _note_missing(cand.key(bare=True))
            else:
                skipped["gain_below_overhead"] += 1


def _choose_dynamic(cand: _Candidate, opts: PassOptions, skipped: Counter) -> None:
    """A symbolic-M matmul: taken, without its activation, when some batch size of its (., N, K)
    is served by a measured program or algorithm (module docstring)."""
    _drop_activation(cand)
    dispatch = torch_ops.resolve(cand.key(fused=False), opts.db)
    if opts.baseline == "op" or dispatch.serves_measured:
        cand.chosen = True
    else:
        skipped["dynamic_m_untuned"] += 1


def _note_missing(key: tuple) -> None:
    _STATS["missing"][torch_ops.problem_key(key)] += 1
    _MISSING_KEYS[key] = None


def _own_baseline_is_reference(cand: _Candidate, key: tuple) -> bool:
    """Whether what inductor runs in the kernel's place is what tuning measured it against:
    a bare matmul, or one activation alone that inductor would run as a kernel of its own."""
    if key == cand.key(bare=True):
        return True
    alone = cand.bias is None and cand.c is None and cand.alpha == 1.0
    return alone and key == cand.key(True) and cand.act_standalone


def _reference_unmeasured(cand: _Candidate, kernels: dict) -> bool:
    """A tuned kernel with an epilogue, but the bare matmul it competes with in-graph was never timed."""
    return (kernels[cand.key(bare=True)].provenance.baseline_ms_here is None
            and not all(_own_baseline_is_reference(cand, k) for k in (cand.key(True), cand.key(False))))


def in_graph_gain_us(cand: _Candidate, key: tuple, kernels: dict) -> float:
    """Device microseconds the tuned kernel for `key` saves per call against what inductor
    would run in its place (module docstring); 0 where that is unknown."""
    kernel = kernels[key]
    if _own_baseline_is_reference(cand, key):
        return estimated_gain_us(kernel)
    reference = kernels[cand.key(bare=True)].provenance.baseline_ms_here
    return estimated_gain_us(kernel, reference) if reference else 0.0


def estimated_gain_us(kernel, reference_ms: Optional[float] = None) -> float:
    """Device time a tuned kernel saves per call against `reference_ms` (default: the best
    baseline of its tuning run), as measured at this very shape (a winner or a library choice);
    0 for the baseline."""
    p = kernel.provenance
    if kernel.backend == "torch" or not p.device_ms or not p.best_baseline_ms:
        return 0.0
    reference = p.best_baseline_ms if reference_ms is None else min(reference_ms, p.best_baseline_ms)
    return (reference - p.device_ms) * 1e3


def _cuda_index(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def _fmt(counts: Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _database_state(db) -> tuple:
    """What a lookup would read: the database path and its modification stamp."""

    path = str(db) if db is not None else str(default_db_path())
    try:
        st = os.stat(path)
        return path, st.st_mtime_ns, st.st_size
    except OSError:
        return path, None, None


def _addmm_input(cand: _Candidate, inp, beta: float, m: int, n: int) -> Optional[str]:
    """Place addmm's input as the bias (a row vector) or as C (an M x N matrix)."""
    if not isinstance(inp, fx.Node) or "val" not in inp.meta:
        return "no_metadata"
    v = inp.meta["val"]
    if v.dtype != torch.float16:
        return "dtype"
    if not _is_static(v):
        return "dynamic_shape"
    shape = tuple(v.shape)
    if shape in ((n,), (1, n)) and v.stride()[-1] == 1:
        if beta != 1.0:
            return "scaled_bias"
        if v.storage_offset() % ALIGN_ELEMS:
            return "misaligned"
        cand.bias, cand.bias_1xn = inp, len(shape) == 2
        return None
    if shape == (m, n):
        if major_of(shape, v.stride()) != "row" or v.storage_offset() % ALIGN_ELEMS:
            return "layout"
        cand.c, cand.beta = inp, beta
        return None
    return "addmm_broadcast"


# -- activations: inductor's decomposition of act(x) for an fp16 x, compared node by node --------

_ACT_GRAPHS: dict = {}


def _act_graph(name: str) -> fx.Graph:
    graph = _ACT_GRAPHS.get(name)
    if graph is None:
        # Deferred: torch (optional, heavy to import).
        from torch._inductor.pattern_matcher import fwd_only

        fn = {"relu": torch.relu, "silu": torch.nn.functional.silu,
              "gelu": lambda x: torch.nn.functional.gelu(x, approximate="none")}[name]
        graph = _ACT_GRAPHS[name] = fwd_only(lambda x: fn(x), [torch.empty(8, dtype=torch.float16)]).graph
    return graph


def _find_activation(cand: _Candidate, ops) -> None:
    """If the matmul's one consumer (through reshapes) is an activation, fuse it."""
    node = cand.node
    while len(node.users) == 1:
        (user,) = node.users
        if user.op == "call_function" and user.target in RESHAPES and user.args[0] is node:
            node = user
            continue
        break
    for name in ("relu", "gelu", "silu"):
        if name not in ops:
            continue
        matched = _match_activation(node, _act_graph(name))
        if matched is not None:
            cand.activation, cand.act_out, cand.act_nodes = name, matched[0], matched[1]
            cand.chain_last = node
            cand.act_standalone = all(_unfusable(user) for user in _through_reshapes(matched[0]))
            return


def _through_reshapes(node: fx.Node) -> list:
    """The consumers of node's value, looking through reshapes."""
    users = []
    for user in node.users:
        if user.op == "call_function" and user.target in RESHAPES:
            users.extend(_through_reshapes(user))
        else:
            users.append(user)
    return users


def _unfusable(user: fx.Node) -> bool:
    """A consumer inductor cannot fuse a pointwise producer into: a matmul or the graph's output."""
    return user.op == "output" or (user.op == "call_function" and user.target in (*MATMULS, *BATCHED))


def _drop_activation(cand: _Candidate) -> None:
    cand.activation, cand.act_out, cand.act_nodes, cand.chain_last = "none", None, [], None
    cand.act_standalone = False


def _match_activation(x: fx.Node, ref: fx.Graph):
    """(output node, matched nodes) if the nodes consuming x compute exactly `ref`, else None."""
    (placeholder,) = [n for n in ref.nodes if n.op == "placeholder"]
    ref_out = [n for n in ref.nodes if n.op == "output"][0].args[0]
    if isinstance(ref_out, (tuple, list)):
        (ref_out,) = ref_out
    if len(x.users) == 0:
        return None
    # Walk down from x: the output is the unique consumer-closed node whose pattern matches.
    for start in _descendants(x, len([n for n in ref.nodes if n.op == "call_function"])):
        pairs: dict = {}
        if _same(ref_out, start, placeholder, x, pairs):
            nodes = [n for n in pairs.values() if n is not x]
            inside = set(nodes)
            closed = all(set(n.users) <= inside for n in nodes if n is not start)
            if closed and all(u in inside for u in x.users):
                order = {n: i for i, n in enumerate(x.graph.nodes)}
                return start, sorted(nodes, key=order.__getitem__)
    return None


def _descendants(x: fx.Node, depth: int) -> list:
    seen, frontier = [], [x]
    for _ in range(depth):
        frontier = [u for n in frontier for u in n.users if u not in seen]
        seen.extend(frontier)
    return seen


def _same(ref: fx.Node, node, placeholder: fx.Node, x: fx.Node, pairs: dict) -> bool:
    if ref is placeholder:
        return node is x
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target != ref.target:
        return False
    if ref in pairs:
        return pairs[ref] is node
    if len(ref.args) != len(node.args) or set(ref.kwargs) != set(node.kwargs):
        return False
    pairs[ref] = node
    for r, n in zip((*ref.args, *ref.kwargs.values()), (*node.args, *(node.kwargs[k] for k in ref.kwargs))):
        if isinstance(r, fx.Node):
            if not _same(r, n, placeholder, x, pairs):
                return False
        elif isinstance(n, fx.Node) or not _literal_equal(r, n):
            return False
    return True


def _literal_equal(r, n) -> bool:
    if isinstance(r, float) or isinstance(n, float):
        return isinstance(n, (int, float)) and math.isclose(float(r), float(n), rel_tol=1e-12)
    if isinstance(r, torch.device) or isinstance(n, torch.device):
        return True                      # the device of a constant does not change the math
    return r == n


# -- rewriting ------------------------------------------------------------------------------------


def _rewrite(graph: fx.Graph, cand: _Candidate) -> None:
    node = cand.node
    with graph.inserting_before(node):
        bias = cand.bias
        if bias is not None and cand.bias_1xn:
            n = bias.meta["val"].shape[1]
            bias = graph.call_function(aten.view.default, (cand.bias, [n]))
            bias.meta["val"] = cand.bias.meta["val"].view(n)
        new = graph.call_function(
            torch.ops.gemmgen.gemm.default,
            (cand.a, cand.b, bias, cand.c, cand.a_major, cand.b_major, cand.activation,
             cand.alpha, cand.beta))
    new.meta.update({k: v for k, v in node.meta.items() if k in ("val", "stack_trace", "nn_module_stack")})
    torch_ops.pin_input_strides(new)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    if cand.act_out is not None:
        last = new if cand.chain_last is node else cand.chain_last
        cand.act_out.replace_all_uses_with(last)
        for n in reversed(cand.act_nodes):
            graph.erase_node(n)
