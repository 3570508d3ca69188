"""Attention masks proven causal at compile time become `is_causal=True`.

transformers builds the causal mask as a tensor whenever it is traced (its shortcut to
`is_causal=True` is off under torch.compile), so every compiled decoder hands SDPA a
materialized (q, kv) mask, and the attention kernel computes the blocks above the diagonal
that the causal form skips: about 0.6 ms of Llama-3-8B's 4-layer prefill at 2048 tokens on
the H200 (docs/model_benchmark.md).

This pass runs on dynamo's graph, before AOTAutograd. For each SDPA call with a mask it
proves, or leaves alone:

- the mask is a constant of the graph: none of its inputs is a graph input or attribute, no op
  among them draws random numbers or reads uninitialized memory, and no op outside them writes
  into them in place;
- its value, computed once now, is the causal mask: q and kv of one length, and every
  (batch, head) slice equal to tril(ones) (bool), or 0 on and below the diagonal and -inf above
  (float).

A proven call drops the mask and sets `is_causal=True`, which computes the same softmax. A mask
that depends on the inputs (padding, a KV cache's positions) or on symbolic sizes is never
rewritten.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch import fx

SDPA_TARGETS = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)
#: SDPA's parameters in order: positional arguments are named by them
SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
#: ops whose value is not a function of their inputs: a mask computed with them is no constant
UNSTABLE_WORDS = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "poisson", "exponential",
                  "cauchy", "geometric", "empty", "seed")


def make_masks_causal(gm: fx.GraphModule, device_types: tuple) -> Counter:
    """Rewrite the SDPA calls of `gm` (on `device_types`) whose masks are proven causal; the
    outcome of every masked call, counted: `causal` (rewritten) or why not."""
    outcomes: Counter = Counter()
    verdicts: dict = {}     # (mask node, q length, kv length) -> verdict: layers share a mask
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in SDPA_TARGETS:
            continue
        params = sdpa_params(node)
        mask = params.get("attn_mask")
        if not isinstance(mask, fx.Node) or params.get("is_causal"):
            continue
        query, key = example_value(params.get("query")), example_value(params.get("key"))
        if query is None or key is None:
            outcomes["shapes_unknown"] += 1
            continue
        if query.device.type not in device_types:
            continue
        q_len, kv_len = query.shape[-2], key.shape[-2]
        if not (isinstance(q_len, int) and isinstance(kv_len, int)):
            outcomes["symbolic_lengths"] += 1
            continue
        # keyed by the lengths too: a (1, 1) mask broadcasts to any (q, kv) and is causal at one only
        seen = (mask, q_len, kv_len)
        if seen not in verdicts:
            verdicts[seen] = _verdict(gm, *seen)
        outcomes[verdicts[seen]] += 1
        if verdicts[seen] == "causal":
            params.update(attn_mask=None, is_causal=True)
            leading = tuple(node.args[:3])         # query, key, value stay where they were
            node.args = leading
            node.kwargs = {k: v for k, v in params.items() if k not in SDPA_PARAMS[:len(leading)]}
    if outcomes["causal"]:
        _drop_dead(gm.graph, list(dict.fromkeys(mask for mask, _, _ in verdicts)))
        gm.recompile()
    return outcomes


def is_causal_mask(mask: torch.Tensor, q_len: int, kv_len: int) -> bool:
    """Whether `mask`, as SDPA's attn_mask for q and kv of these lengths, is the causal mask:
    bool tril(ones), or float 0 / -inf, in every leading slice."""
    if q_len != kv_len or mask.dim() < 2 or tuple(mask.shape[-2:]) != (q_len, kv_len):
        return False
    lower = torch.ones(q_len, kv_len, dtype=torch.bool, device=mask.device).tril()
    if mask.dtype == torch.bool:
        return torch.equal(mask, lower.expand_as(mask))
    if not mask.is_floating_point():
        return False
    additive = torch.zeros(q_len, kv_len, device=mask.device).masked_fill(~lower, float("-inf"))
    return torch.equal(mask.float(), additive.expand_as(mask))


def sdpa_params(node: fx.Node) -> dict:
    """The call's arguments by name, however it passed them."""
    params = dict(zip(SDPA_PARAMS, node.args))
    params.update(node.kwargs)
    return params


def example_value(arg):
    """The fake tensor dynamo recorded for a node, if any."""
    value = arg.meta.get("example_value") if isinstance(arg, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _verdict(gm: fx.GraphModule, mask: fx.Node, q_len: int, kv_len: int) -> str:
    ancestors = _ancestors(mask)
    if any(n.op in ("placeholder", "get_attr") for n in ancestors):
        return "mask_from_inputs"
    if any(_unstable(n) for n in ancestors) or _written(ancestors):
        return "mask_not_constant"
    try:
        value = _evaluate(gm, ancestors, mask)
    except Exception:  # noqa: BLE001 - a mask we cannot compute here is one we do not rewrite
        return "mask_not_evaluated"
    if type(value) is not torch.Tensor:
        return "mask_not_evaluated"       # e.g. a fake tensor: no value to prove anything by
    return "causal" if is_causal_mask(value, q_len, kv_len) else "not_causal"


def _ancestors(node: fx.Node) -> list:
    """`node` and every node it is computed from, in graph order."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return [n for n in node.graph.nodes if n in seen]


def _name(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))


def _unstable(node: fx.Node) -> bool:
    return any(word in _name(node).lower() for word in UNSTABLE_WORDS)


def _written(ancestors: list) -> bool:
    """Whether an op outside the mask's computation writes in place (`x.tril_()`, `x[i] = v`)
    into a tensor made from one of its nodes, through views or not: the mask's nodes alone
    would not give its value then. Conservative: any such write refuses the proof."""
    inside = set(ancestors)
    for node in ancestors[0].graph.nodes:
        name = _name(node)
        writes = name == "setitem" or (name.endswith("_") and not name.endswith("__"))
        target = node.args[0] if node.args else None
        if writes and node not in inside and isinstance(target, fx.Node) and inside & set(_ancestors(target)):
            return True
    return False


def _evaluate(gm: fx.GraphModule, ancestors: list, mask: fx.Node):
    """The mask's value: its ancestors copied into a graph of their own, run once."""
    graph = fx.Graph()
    copies: dict = {}
    for n in ancestors:
        copies[n] = graph.node_copy(n, lambda a: copies[a])
    graph.output(copies[mask])
    with torch.no_grad():
        return fx.GraphModule(gm, graph)()


def _drop_dead(graph: fx.Graph, masks: list) -> None:
    """Remove the mask computations no node uses any more (only those: other dead code is
    inductor's to judge)."""
    for mask in masks:
        for n in reversed(_ancestors(mask)):
            if not n.users:
                graph.erase_node(n)
