"""Joining sibling matmuls: one activation times several weights becomes one wider GEMM.

A Llama layer multiplies its normed activation by the q, k and v weights (and by gate and
up): matmuls of the same A and K whose B are weights, column-major views of (N_i, K)
parameters. Joined, they are one GEMM of N = sum(N_i) (`gemmgen::gemm_joined`, on a copy of
the weights made once), whose output the graph slices: fewer partial waves and launches.
Measured on the H200 at Llama-1B's shapes with cuBLAS for both: q, k,
v at M = 2048 took 85.7 us apart and 78.0 us joined, gate and up 149.1 us apart and 154.8 us
joined, so a join is taken only where the database's times say it saves `min_gain_us`, and
only where the joined kernel runs long enough to hide the op's host cost (`MIN_DEVICE_US`).

Part of the torch pass (gemmgen/torch_compile/graph_pass.py); opt in with the backend option
`join_siblings=True` (the joined copy costs the joined weights' memory once more).
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

from gemmgen.torch_compile import ops as torch_ops

aten = torch.ops.aten
_WEIGHT_VIEWS = (aten.permute.default, aten.t.default)
_SAME_VIEWS = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)


@dataclass(frozen=True)
class Join:
    """Sibling matmul candidates (graph_pass._Candidate) to be computed as one GEMM."""

    members: tuple

    def key(self) -> tuple:
        """The op key of the joined problem: M x sum(N) x K, B column-major, no epilogue."""
        first = self.members[0]
        m, k = first.a.meta["val"].shape
        n = sum(int(c.b.meta["val"].shape[1]) for c in self.members)
        return torch_ops.kernel_key(int(m), n, int(k), first.a_major, "col", False, False, "none", 1.0, 0.0,
                                    first.device)


def _is_weight(b: fx.Node) -> bool:
    """The transpose of a row-major (N, K) graph input (a parameter): the same tensor every call."""
    if not (b.op == "call_function" and b.target in _WEIGHT_VIEWS and isinstance(b.args[0], fx.Node)
            and b.args[0].op == "placeholder" and "val" in b.args[0].meta):
        return False
    if b.target is aten.permute.default and list(b.args[1]) != [1, 0]:
        return False
    w = b.args[0].meta["val"]
    return w.dim() == 2 and w.stride() == (w.shape[1], 1) and w.storage_offset() == 0


def _source(node: fx.Node):
    """What a node computes, so that equal views of one tensor compare equal."""
    if node.op == "call_function" and node.target in _SAME_VIEWS:
        return (node.target, _source(node.args[0]), tuple(node.args[1]))
    return node


def sibling_groups(candidates: list) -> list:
    """Joins of two or more plain matmuls (no bias, C or alpha) with one A, weights for B."""
    groups = defaultdict(list)
    for cand in candidates:
        if (cand.bias is None and cand.c is None and cand.alpha == 1.0 and cand.b_major == "col"
                and _is_weight(cand.b)):
            groups[(_source(cand.a), cand.a_major, cand.device)].append(cand)
    return [Join(tuple(members)) for members in groups.values() if len(members) > 1]


def time_ms(kernel) -> Optional[float]:
    """Device time of what would run for a key: the tuned kernel or the baseline, as measured."""
    p = kernel.provenance
    times = [t for t in (p.baseline_ms_here, p.device_ms if p.how in ("exact", "library") else None) if t]
    return min(times) if times else None


#: The joined op's own host time per call, measured in the Llama decode step on the H200
#: (profiler self time of gemmgen::gemm_joined: 34 us, a Python op with a list argument).
#: A joined kernel shorter than this leaves the GPU waiting on the host: in the decode step
#: (M = 8) joining q, k and v took 0.874x the default's speed. Inductor's own calls to cuBLAS cost the host far less.
MIN_DEVICE_US = 40.0


def decide(join: Join, kernels: dict, min_gain_us: float) -> str:
    """joined, or why not: unmeasured (a time is missing), host_bound (the joined kernel is
    shorter than the op's host cost), gain_below_overhead (it saves under min_gain_us)."""
    apart = [time_ms(kernels[c.key(bare=True)]) for c in join.members]
    joined = time_ms(kernels[join.key()])
    if joined is None or None in apart:
        return "unmeasured"
    if joined * 1e3 < MIN_DEVICE_US:
        return "host_bound"
    return "joined" if (sum(apart) - joined) * 1e3 >= min_gain_us else "gain_below_overhead"


def rewrite(graph: fx.Graph, join: Join) -> fx.Node:
    """One gemm_joined node before the first member, each member replaced by its column slice.

    The op takes the (N_i, K) parameters themselves, not the transposed views the matmuls
    read: inductor hands a view to an op as a fresh alias whose version counter does not
    follow the parameter's, so a joined copy keyed on it went stale after an in-place update
    (the GPU test shows it). The parameters are graph inputs, passed as they are."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    members = sorted(join.members, key=lambda c: order[c.node])
    first = members[0].node                                  # its A is defined before it
    a_val = members[0].a.meta["val"]
    with graph.inserting_before(first), (detect_fake_mode([a_val]) or contextlib.nullcontext()):
        weights = [c.b.args[0] for c in members]            # the placeholders (N_i, K)
        joined = graph.call_function(torch.ops.gemmgen.gemm_joined.default,
                                     (members[0].a, weights, members[0].a_major))
        joined.meta["val"] = torch_ops.gemm_joined_fake(a_val, [w.meta["val"] for w in weights],
                                                        members[0].a_major)
        torch_ops.pin_input_strides(joined)
        start, parts = 0, []
        for cand in members:
            n = int(cand.b.meta["val"].shape[1])
            part = graph.call_function(aten.slice.Tensor, (joined, 1, start, start + n))
            part.meta["val"] = aten.slice.Tensor(joined.meta["val"], 1, start, start + n)
            for key in ("stack_trace", "nn_module_stack"):
                if key in cand.node.meta:
                    part.meta[key] = cand.node.meta[key]
            parts.append(part)
            start += n
    for cand, part in zip(members, parts):  # erased only now: `first` was the insertion point
        cand.node.replace_all_uses_with(part)
        graph.erase_node(cand.node)
    return joined
