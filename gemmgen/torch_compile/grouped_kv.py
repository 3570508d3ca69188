"""Key and value heads repeated for grouped-query attention become SDPA's `enable_gqa=True`.

Whenever it hands SDPA a mask, which it always does under tracing, transformers first repeats
each key and value head once per query head of its group (`repeat_kv`): the compiled graph
writes K and V out `groups` times wider and the attention kernel reads them so. Once the mask
is proven causal (causal_mask.py) the call has no mask, and SDPA can read each KV head once
for its group itself. On the H100 that saved 17-60 us a layer of attention under inductor at the
model benchmark's prefill shapes (benchmarks/results/gqa_attention_h100/).

For each SDPA call without a mask this proves, or leaves alone, that its key and value are
their sources with every head repeated `groups` times in place (head j is source head
j // groups, SDPA's own grouping): a chain of view ops whose value, computed once on a
tensor of distinct numbers of the source's shape, equals `repeat_interleave(groups, dim=-3)`.
A proven call takes the sources and `enable_gqa=True`. Calls with a mask are left alone: not
every attention kernel takes a mask and groups together. A repeat too large to prove here
(over MAX_PROOF_ELEMENTS) is left alone and counted.
"""
from __future__ import annotations

import operator
from collections import Counter

import torch
from torch import fx

from gemmgen.torch_compile.causal_mask import SDPA_TARGETS, example_value, sdpa_params

#: ops a repeat of the heads is spelled with in dynamo's graph (`repeat_kv`'s index, expand, reshape)
VIEW_METHODS = ("reshape", "view", "expand", "unsqueeze", "flatten", "contiguous")
VIEW_FUNCTIONS = (operator.getitem, torch.reshape, torch.unsqueeze, torch.flatten)
#: the most elements of a repeated K the proof computes on (int32, 256 MiB): 8 x 2048 tokens of
#: 32 heads of 128; a larger one is left alone
MAX_PROOF_ELEMENTS = 2 ** 26


def group_kv_heads(gm: fx.GraphModule, device_types: tuple) -> Counter:
    """Rewrite the unmasked SDPA calls of `gm` (on `device_types`) whose key and value are
    repeated heads; the outcome of every call with repeated heads, counted: `grouped` or why not."""
    outcomes: Counter = Counter()
    verdicts: dict = {}          # (source shape, chain signature) -> groups or why not: layers share one
    dropped: list = []           # the view chains of rewritten operands, to erase once unused
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in SDPA_TARGETS:
            continue
        params = sdpa_params(node)
        query = example_value(params.get("query"))
        if query is None or query.device.type not in device_types or params.get("enable_gqa"):
            continue
        found = [_repeat_of(params.get(name), verdicts) for name in ("key", "value")]
        if found == [None, None]:
            continue
        reasons = [f for f in found if isinstance(f, str)]
        if reasons:
            outcomes[reasons[0]] += 1
        elif None in found or found[0][1] != found[1][1]:
            outcomes["kv_not_both_repeated"] += 1
        elif isinstance(params.get("attn_mask"), fx.Node):
            outcomes["masked"] += 1
        elif query.dim() < 3 or query.shape[-3] != example_value(params["key"]).shape[-3]:
            outcomes["heads_differ"] += 1
        else:
            outcomes["grouped"] += 1
            dropped += [params["key"], params["value"]]
            params.update(key=found[0][0], value=found[1][0], enable_gqa=True)
            node.args = (params.pop("query"), params.pop("key"), params.pop("value"))
            node.kwargs = params
    if outcomes["grouped"]:
        # only the repeats, users before what they use: other dead code is inductor's to judge
        repeats = {n for last in dropped for n in _view_chain(last)}
        for n in reversed([n for n in gm.graph.nodes if n in repeats]):
            if not n.users:
                gm.graph.erase_node(n)
        gm.recompile()
    return outcomes


def _repeat_of(arg, verdicts: dict):
    """(source node, groups) if `arg` is its source with every head repeated `groups` times in
    place; None if it is not shaped so (no view chain that multiplies the heads); else why it
    was not proven (`repeat_not_proven`, `repeat_too_large_to_prove`)."""
    chain = _view_chain(arg)
    if not chain:
        return None
    source = chain[0].args[0]
    before, after = example_value(source), example_value(chain[-1])
    if before is None or after is None or before.dim() < 3 or after.dim() != before.dim():
        return None
    shapes = (tuple(before.shape), tuple(after.shape))
    if not all(isinstance(s, int) for s in shapes[0] + shapes[1]):
        return None                      # symbolic sizes: no value to prove it by
    heads, repeated = shapes[0][-3], shapes[1][-3]
    others = [s[:-3] + s[-2:] for s in shapes]          # every size but the heads'
    if repeated % heads or repeated == heads or others[0] != others[1]:
        return None
    key = (shapes[0], tuple(_signature(n) for n in chain))
    if key not in verdicts:
        verdicts[key] = _proven(chain, shapes[0], repeated // heads)
    return (source, verdicts[key]) if isinstance(verdicts[key], int) else verdicts[key]


def _view_chain(arg) -> list:
    """The view ops `arg` is made by, first to last, back to the first node that is not one."""
    chain = []
    while isinstance(arg, fx.Node) and _is_view(arg) and arg.args and arg.all_input_nodes == [arg.args[0]]:
        chain.append(arg)
        arg = arg.args[0]
    return chain[::-1]


def _is_view(node: fx.Node) -> bool:
    return ((node.op == "call_method" and node.target in VIEW_METHODS)
            or (node.op == "call_function" and node.target in VIEW_FUNCTIONS))


def _signature(node: fx.Node):
    """The op and its arguments other than the tensor it works on."""
    return node.op, node.target, repr(node.args[1:]), repr(sorted(node.kwargs.items()))


def _proven(chain: list, shape: tuple, groups: int) -> int | str:
    """`groups` if the chain maps a tensor of `shape` to its heads repeated in place, else why not."""
    if torch.Size(shape).numel() * groups > MAX_PROOF_ELEMENTS:
        return "repeat_too_large_to_prove"
    graph = fx.Graph()
    copies = {chain[0].args[0]: graph.placeholder("source")}
    for n in chain:
        copies[n] = graph.node_copy(n, lambda a: copies[a])
    graph.output(copies[chain[-1]])
    distinct = torch.arange(torch.Size(shape).numel(), dtype=torch.int32).reshape(shape)
    try:
        value = fx.GraphModule(torch.nn.Module(), graph)(distinct)
    except Exception:  # noqa: BLE001 - a chain we cannot compute here is one we do not rewrite
        return "repeat_not_proven"
    if type(value) is not torch.Tensor or value.shape != shape[:-3] + (shape[-3] * groups,) + shape[-2:]:
        return "repeat_not_proven"
    # head j of the value is source head j // groups, compared without building the repeat
    grouped = value.reshape(shape[:-3] + (shape[-3], groups) + shape[-2:])
    return groups if bool((grouped == distinct.unsqueeze(-3)).all()) else "repeat_not_proven"
