"""Matching the joins inductor's freezing makes itself (its concat-linear pattern): sibling
matmuls of one activation by constant weights of one K become one `mm` (or `addmm`) over
`cat([W_1^T, W_2^T, ...], dim=1)`, a row-major K x sum(N) constant, whose output a split cuts
back into the members' parts. Llama's gate and up are joined so.

The pass keeps such a product only where the database's times say it beats its parts apart,
and then lays its weight out column-major again, the layout the model's own weights had (cuBLAS
ran the row-major one about 5 % slower: a Qwen2.5-7B-shaped prefill, 4096 x 37888 x 3584,
1.58 ms against 2 x 0.76 ms on the H200). Elsewhere it splits it back into one matmul a part,
what inductor runs without freezing (decide.decide_split).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx

from gemmgen.torch_compile import ops as torch_ops
from gemmgen.torch_compile.patterns import constant_of, cuda_index, major_of, split_dim

aten = torch.ops.aten
_SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)


@dataclass(frozen=True)
class InductorJoin:
    """A matmul `node` over the row-major joined constant `node.args[index]`, read only by splits
    along N."""

    node: fx.Node
    index: int

    @property
    def sizes(self) -> tuple | None:
        """The parts' widths, where one split alone reads the product and only its parts are
        used; else None (the product is then only relaid, never split)."""
        if self.node.target is not aten.mm.default or len(self.node.users) != 1:
            return None
        (split,) = self.node.users
        n, size = int(self.node.meta["val"].shape[1]), split.args[1]
        if split.target is aten.split.Tensor:
            sizes = [min(size, n - start) for start in range(0, n, size)]
        else:
            sizes = list(size)
        if not split.users or any(u.target is not operator.getitem for u in split.users):
            return None
        return tuple(int(s) for s in sizes)

    def keys(self) -> tuple | None:
        """(the joined product's op key, each part's), B column-major as the records are tuned:
        for a static CUDA product that can be split (`sizes`); else None."""
        sizes = self.sizes
        a = self.node.args[0].meta.get("val") if isinstance(self.node.args[0], fx.Node) else None
        if sizes is None or a is None or a.device.type != "cuda":
            return None
        m, k = a.shape
        a_major = major_of(tuple(a.shape), a.stride()) if isinstance(m, int) else None
        if a_major is None:
            return None

        def key(n):
            return torch_ops.kernel_key(int(m), n, int(k), a_major, "col", False, False, "none", 1.0, 0.0,
                                        cuda_index(a.device))
        return key(sum(sizes)), tuple(key(n) for n in sizes)


def inductor_joins(graph: fx.Graph, devices) -> list:
    """Each fp16 mm or addmm on one of `devices` ("cuda", "cpu") over a row-major constant B whose
    product only splits along N read: a join inductor's freezing made (module docstring)."""
    found = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        index = 2 if node.target is aten.addmm.default else 1
        value = constant_of(node.args[index])
        if (value is None or value.dim() != 2 or value.dtype != torch.float16 or min(value.shape) < 2
                or value.device.type not in devices or major_of(tuple(value.shape), value.stride()) != "row"):
            continue
        if node.users and all(u.op == "call_function" and u.target in _SPLITS and split_dim(u) in (1, -1)
                              for u in node.users):
            found.append(InductorJoin(node, index))
    return found
