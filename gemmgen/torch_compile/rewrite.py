"""Rewriting: gemmgen ops in place of the matched patterns, and the joined weights made once,
here at compile time, as constants the compiled graph owns.

A joined weight is `torch.cat` of the frozen weights' values, registered on the graph module
as a buffer and read through a `get_attr` node, as inductor's freezing registers the parameters
it inlines: inductor lowers it to a constant of the compiled code, made once and never per call,
and a CUDA graph replays against it like any frozen parameter. The copy is the graph's: an
update of the model's weights after compiling does not reach it (inductor's freezing contract,
which every frozen parameter of the graph is under too).
"""
from __future__ import annotations

import torch
from torch import fx
from torch._guards import detect_fake_mode

from gemmgen.torch_compile import ops as torch_ops
from gemmgen.torch_compile.inductor_joins import InductorJoin
from gemmgen.torch_compile.patterns import (
    Candidate,
    Gated,
    Siblings,
    constant_of,
    weight_nk,
)

aten = torch.ops.aten
_META = ("stack_trace", "nn_module_stack")


def _call(graph: fx.Graph, target, args, val) -> fx.Node:
    node = graph.call_function(target, args)
    node.meta["val"] = val
    return node


def _reshape(graph: fx.Graph, node: fx.Node, shape) -> fx.Node:
    return _call(graph, aten.reshape.default, (node, list(shape)), node.meta["val"].reshape(shape))


def _erase_dead(graph: fx.Graph, nodes) -> None:
    """Erase those of `nodes` no one uses any more, consumers first."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in sorted(set(nodes), key=order.__getitem__, reverse=True):
        if not node.users:
            graph.erase_node(node)


def _copy_meta(new: fx.Node, old: fx.Node) -> None:
    new.meta.update({k: v for k, v in old.meta.items() if k in _META})


def add_constant(graph: fx.Graph, value: torch.Tensor, like: fx.Node) -> fx.Node:
    """A get_attr node (at the insertion point) reading `value`, registered on the graph module."""
    gm = graph.owning_module
    index = getattr(gm, "_gemmgen_constant_count", 0)
    while hasattr(gm, f"_gemmgen_constant{index}"):
        index += 1
    name = f"_gemmgen_constant{index}"
    gm._gemmgen_constant_count = index + 1
    value._is_frozen_param = True           # as freezing marks its constants
    gm.register_buffer(name, value)
    node = graph.get_attr(name)
    fake = detect_fake_mode([like.meta["val"]])
    node.meta["val"] = fake.from_tensor(value, static_shapes=True) if fake is not None else value
    return node


def _real(fn):
    """Compute constants with real tensors, whatever dispatch mode the compile runs under."""
    with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
        return fn()


def rewrite_single(graph: fx.Graph, cand: Candidate) -> None:
    """One `gemmgen::gemm` in place of the matmul and the epilogue items it takes."""
    cand.refresh()
    node = cand.node
    anchor = cand.res_add if cand.residual is not None else node
    m, n, _ = cand.shape
    with graph.inserting_before(anchor):
        bias = cand.bias
        if bias is not None and cand.bias_1xn:
            bias = _reshape(graph, cand.bias, [n])
        residual = None
        if cand.residual is not None:
            residual = cand.residual
            if tuple(residual.meta["val"].shape) != (m, n):
                residual = _reshape(graph, residual, (m, n))
        args = (cand.a, cand.b, bias, cand.c, cand.a_major, cand.b_major, cand.activation, cand.alpha, cand.beta)
        if residual is not None:
            args = (*args, residual)
        new = graph.call_function(torch.ops.gemmgen.gemm.default, args)
        new.meta["val"] = node.meta["val"]
        _copy_meta(new, node)
        torch_ops.pin_input_strides(new)
        if cand.residual is not None:
            out = new
            shape = tuple(cand.res_add.meta["val"].shape)
            if shape != (m, n):
                out = _reshape(graph, new, shape)
            cand.res_add.replace_all_uses_with(out)
    dead = [node, *cand.act_nodes]
    if cand.residual is not None:
        dead.append(cand.res_add)
        dead.extend(_chain(node))
        if cand.act_out is not None:
            dead.extend(_chain(cand.act_out))
        _erase_dead(graph, dead)
        return
    node.replace_all_uses_with(new)
    if cand.act_out is not None:
        last = new if cand.chain_last is node else cand.chain_last
        cand.act_out.replace_all_uses_with(last)
    _erase_dead(graph, dead)


def _chain(node: fx.Node) -> list:
    """The reshapes that follow a node, one consumer each."""
    out = []
    while len(node.users) == 1:
        (user,) = node.users
        if user.op == "call_function" and user.target in (aten.reshape.default, aten.view.default,
                                                          aten._unsafe_view.default):
            out.append(user)
            node = user
        else:
            break
    return out


def _joined_weight(graph: fx.Graph, weights: list, like: fx.Node) -> fx.Node:
    """K x sum(N) column-major B over the (N_i, K) weights, joined now: the get_attr of the joined
    (sum N, K) row-major constant, and its transpose."""
    return _read_transposed(graph, _real(lambda: torch.cat([w.contiguous() for w in weights]).contiguous()), like)


def _read_transposed(graph: fx.Graph, weight: torch.Tensor, like: fx.Node) -> fx.Node:
    """A (N, K) row-major weight as a new constant of the graph, and its transpose: a K x N
    column-major B."""
    const = add_constant(graph, weight, like)
    return _call(graph, aten.permute.default, (const, [1, 0]), const.meta["val"].permute(1, 0))


def _nk_copy(b: torch.Tensor) -> torch.Tensor:
    """A contiguous (N, K) copy of a K x N B (`clone`, which fake tensors also take)."""
    return b.t().clone(memory_format=torch.contiguous_format)


def relay_column_major(graph: fx.Graph, node: fx.Node, index: int) -> None:
    """The matmul's constant B (`node.args[index]`, K x N row-major) replaced by a column-major
    copy, made now: the layout the model's own weights had (`inductor_joins`)."""
    old = node.args[index]
    value = constant_of(old)
    with graph.inserting_before(node):
        new = add_constant(graph, _real(lambda: _nk_copy(value).t()), node)
    node.replace_input_with(old, new)
    drop_unused(graph, [old])


def split_join(graph: fx.Graph, join: InductorJoin) -> list:
    """Inductor's joined product as one `mm` a part, each over its own (N_i, K) weight read
    transposed (copied now out of the joined constant): the products the model had before
    freezing joined them. Returns the new matmul nodes."""
    node, sizes = join.node, join.sizes
    (split,) = node.users
    a, old = node.args[0], node.args[join.index]
    value = constant_of(old)
    parts, start = [], 0
    with graph.inserting_before(node):
        for n in sizes:
            b = _read_transposed(graph, _real(lambda s=start, n=n: _nk_copy(value.narrow(1, s, n))), node)
            part = _call(graph, aten.mm.default, (a, b), a.meta["val"].new_empty((a.meta["val"].shape[0], n)))
            _copy_meta(part, node)
            parts.append(part)
            start += n
    for item in list(split.users):
        item.replace_all_uses_with(parts[item.args[1]])
        graph.erase_node(item)
    graph.erase_node(split)
    graph.erase_node(node)
    drop_unused(graph, [old])
    return parts


def rewrite_siblings(graph: fx.Graph, join: Siblings) -> fx.Node:
    """One `gemmgen::gemm` over the joined weight (and bias) before the first member, each member
    replaced by its column slice."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    members = sorted(join.members, key=lambda c: order[c.node])
    for cand in members:
        cand.refresh()
    first = members[0]
    with graph.inserting_before(first.node):
        weights = [weight_nk(c) for c in members]
        b = _joined_weight(graph, weights, first.a)
        bias = None
        if first.bias is not None:
            joined_bias = _real(lambda: torch.cat([constant_of(c.bias).reshape(-1) for c in members]))
            bias = add_constant(graph, joined_bias, first.a)
        m = first.shape[0]
        val = first.a.meta["val"].new_empty((m, int(b.meta["val"].shape[1])))
        new = _call(graph, torch.ops.gemmgen.gemm.default,
                    (first.a, b, bias, None, first.a_major, "col", "none", 1.0, 0.0), val)
        torch_ops.pin_input_strides(new)
        start, parts = 0, []
        for cand in members:
            n = int(cand.shape[1])
            part = _call(graph, aten.slice.Tensor, (new, 1, start, start + n),
                         aten.slice.Tensor(val, 1, start, start + n))
            _copy_meta(part, cand.node)
            parts.append(part)
            start += n
    for cand, part in zip(members, parts):   # erased only now: the first was the insertion point
        cand.node.replace_all_uses_with(part)
        graph.erase_node(cand.node)
    drop_unused(graph, [x for c in members for x in (c.b, c.bias) if x is not None])
    return new


def rewrite_gated(graph: fx.Graph, pair: Gated) -> fx.Node:
    """One `gemmgen::gemm_gated` over [W_gate; W_up] (joined now) in place of the product."""
    gate = pair.gate
    for cand in pair.members:
        cand.refresh()
    with graph.inserting_before(pair.mul):
        if pair.split is None:
            weights = [weight_nk(c) for c in (pair.gate, pair.up)]
        else:                                  # inductor's joined B, K x 2N, halves [gate | up] or [up | gate]
            b_all, n = constant_of(gate.b), pair.n
            halves = [b_all[:, :n].t(), b_all[:, n:].t()]
            weights = halves if pair.gate_first else halves[::-1]
        b = _joined_weight(graph, weights, gate.a)
        m = gate.shape[0]
        val = gate.a.meta["val"].new_empty((m, pair.n))
        new = _call(graph, torch.ops.gemmgen.gemm_gated.default, (gate.a, b, gate.a_major, "silu"), val)
        _copy_meta(new, gate.node)
        torch_ops.pin_input_strides(new)
        out = new
        shape = tuple(pair.mul.meta["val"].shape)
        if shape != (m, pair.n):
            out = _reshape(graph, new, shape)
    pair.mul.replace_all_uses_with(out)
    dead = [pair.mul, *pair.act, *(c.node for c in pair.members), *_all_below(pair)]
    _erase_dead(graph, dead)
    # a constant no one reads any more (inductor's joined B, a folded weight view) goes too
    drop_unused(graph, [pair.gate.b, pair.up.b])
    return new


def drop_unused(graph: fx.Graph, nodes) -> None:
    """Erase weight nodes no one reads any more (a folded view, inductor's own joined B) and the
    graph module's constants behind them, so the graph does not hold them."""
    for node in dict.fromkeys(nodes):
        if node.graph is not graph or node.users or node.op not in ("get_attr", "call_function"):
            continue
        base = node.args[0] if node.op == "call_function" else None
        if node.op == "call_function" and node.target not in (aten.permute.default, aten.t.default):
            continue
        graph.erase_node(node)
        if node.op == "get_attr" and not any(n.op == "get_attr" and n.target == node.target for n in graph.nodes):
            delattr(graph.owning_module, node.target)
        if isinstance(base, fx.Node):
            drop_unused(graph, [base])


def _all_below(pair: Gated) -> list:
    """The reshapes, split and getitems between the matmul(s) and the product."""
    nodes = []
    for c in pair.members:
        stack = list(c.node.users)
        while stack:
            node = stack.pop()
            if node is pair.mul or node in pair.act or node in nodes:
                continue
            nodes.append(node)
            stack.extend(node.users)
    return nodes
