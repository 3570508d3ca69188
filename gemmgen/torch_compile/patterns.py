"""Matching: which matmul nodes of a post-grad graph the pass may replace, and with what.

- a matmul (`aten.mm`, `aten.addmm`) on 2-D fp16 operands whose strides say their major-ness
  (a `permute` of an (N, K) weight is a column-major B: no copy is ever inserted): a `Candidate`;
- its epilogue, read off the graph: addmm's bias (Qwen2's q/k/v) or C; an activation that is the
  matmul's only consumer (through reshapes), recognised by comparing the graph with inductor's
  own decomposition of it; an add into the residual stream (o_proj and down_proj of a decoder
  layer: `residual + x @ W.T`);
- `Siblings`: matmuls of one activation by several constant weights (q, k, v);
- `Gated`: silu(x W_gate^T) * (x W_up^T), the gate and up projections of a gated MLP, as two
  matmuls of one activation or as one matmul over weights inductor's freezing already joined
  (`aten.split_with_sizes` of its output).

Joins need the weights' values at compile time: they are `get_attr` constants of the graph
when inductor freezes parameters (`torch._inductor.config.freezing`, inference only).
"""
from __future__ import annotations

import math
import operator
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import fx

from gemmgen.torch_compile import ops as torch_ops

aten = torch.ops.aten
MATMULS = (aten.mm.default, aten.addmm.default)
BATCHED = (aten.bmm.default, aten.baddbmm.default)
RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
_WEIGHT_VIEWS = (aten.permute.default, aten.t.default)
OP_KINDS = ("mm", "addmm", "relu", "gelu", "silu", "residual", "gated")
#: 16-byte alignment of fp16 operands, in elements.
ALIGN_ELEMS = 8


@dataclass
class Candidate:
    """One matmul node the pass may rewrite, with everything the op needs."""

    node: fx.Node
    a: fx.Node
    b: fx.Node
    a_major: str
    b_major: str
    bias: fx.Node | None = None
    bias_1xn: bool = False
    c: fx.Node | None = None
    alpha: float = 1.0
    beta: float = 0.0
    activation: str = "none"
    act_nodes: list = field(default_factory=list)
    act_out: fx.Node | None = None
    chain_last: fx.Node | None = None
    residual: fx.Node | None = None       # the tensor added to the product (through reshapes)
    res_add: fx.Node | None = None        # the add node the residual epilogue replaces
    res_index: int = 0                       # where the residual is among the add's arguments
    standalone: bool = False    # inductor would run the epilogue item as a kernel of its own
    device: int | None = None
    chosen: bool = False
    dynamic_m: bool = False             # M is symbolic: its key has M = None (a dispatch over M)

    @property
    def shape(self) -> tuple:
        m, k = self.a.meta["val"].shape
        return m, self.b.meta["val"].shape[1], k

    def key(self, fused: bool = True, bare: bool = False) -> tuple:
        """The op key with the epilogue's fusions (activation, residual) or without; bare: no
        epilogue at all."""
        m, n, k = self.shape
        m = None if self.dynamic_m else int(m)
        if bare:
            return torch_ops.kernel_key(m, int(n), int(k), self.a_major, self.b_major,
                                        False, False, "none", 1.0, 0.0, self.device)
        act = self.activation if fused else "none"
        return torch_ops.kernel_key(m, int(n), int(k), self.a_major, self.b_major,
                                    self.bias is not None, self.c is not None, act, self.alpha,
                                    self.beta, self.device, fused and self.residual is not None)

    @property
    def kind(self) -> str:
        base = "addmm" if (self.bias is not None or self.c is not None) else "mm"
        for item, on in ((self.activation, self.activation != "none"), ("residual", self.residual is not None)):
            if on:
                base += f"+{item}"
        return base

    @property
    def pattern(self) -> str:
        """The pattern `stats()["patterns"]` counts it under: residual, activation, bias or plain."""
        if self.residual is not None:
            return "residual"
        if self.activation != "none":
            return "activation"
        return "bias" if self.bias is not None else "plain"

    def refresh(self) -> None:
        """Read the operands off the graph again: an earlier rewrite may have replaced a node
        this one reads (a residual that was another matmul's residual add)."""
        if self.node.target is aten.addmm.default:
            inp, self.a, self.b = self.node.args[:3]
            if self.bias is not None:
                self.bias = inp
            if self.c is not None:
                self.c = inp
        else:
            self.a, self.b = self.node.args[:2]
        if self.res_add is not None:
            self.residual = self.res_add.args[self.res_index]

    def drop_fusions(self) -> None:
        """Leave the activation and the residual add to inductor (the bias stays: cuBLAS has it too)."""
        self.activation, self.act_out, self.act_nodes, self.chain_last = "none", None, [], None
        self.residual, self.res_add, self.standalone = None, None, False


def major_of(shape, stride) -> str | None:
    """'row' or 'col' by the rules gemmgen kernels check, or None (a strided view)."""
    rows, cols = shape
    if (stride[1] == 1 or cols == 1) and (stride[0] == cols or rows == 1):
        return "row"
    if (stride[0] == 1 or rows == 1) and (stride[1] == rows or cols == 1):
        return "col"
    return None


def is_static(t) -> bool:
    return all(isinstance(d, int) for d in (*t.shape, *t.stride(), t.storage_offset()))


def _dynamic_m(a, b) -> bool:
    """A symbolic M alone: A row-major (M x K) with static K, strides and offset; B all static.
    (Read without comparing the symbol, so that no guard on M is added.)"""
    rows, cols = a.shape
    return (not isinstance(rows, int) and isinstance(cols, int) and is_static(b)
            and all(isinstance(d, int) for d in (*a.stride(), a.storage_offset()))
            and tuple(a.stride()) == (cols, 1))


def cuda_index(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def candidate(node: fx.Node, ops, devices):
    """A Candidate, or the reason the node stays with inductor."""
    is_addmm = node.target is aten.addmm.default
    if is_addmm:
        inp, a, b = node.args[:3]
        beta = float(node.kwargs.get("beta", 1.0))
        alpha = float(node.kwargs.get("alpha", 1.0))
    else:
        (a, b), inp, alpha, beta = node.args[:2], None, 1.0, 0.0
    if ("addmm" if is_addmm else "mm") not in ops:
        return "not_selected"
    if not all(isinstance(x, fx.Node) and "val" in x.meta for x in (a, b, node)):
        return "no_metadata"
    va, vb, vout = a.meta["val"], b.meta["val"], node.meta["val"]
    if any(v.dtype != torch.float16 for v in (va, vb, vout)):
        return "dtype"
    if va.device.type not in devices:
        return f"device_{va.device.type}"
    dynamic = not (is_static(va) and is_static(vb))
    if dynamic and not _dynamic_m(va, vb):
        return "dynamic_shape"
    a_major = "row" if dynamic else major_of(va.shape, va.stride())
    b_major = major_of(vb.shape, vb.stride())
    if a_major is None or b_major is None:
        return "layout"
    if va.storage_offset() % ALIGN_ELEMS or vb.storage_offset() % ALIGN_ELEMS:
        return "misaligned"
    cand = Candidate(node, a, b, a_major, b_major, alpha=alpha, device=cuda_index(va.device), dynamic_m=dynamic)
    if is_addmm and beta != 0.0:
        reason = _addmm_input(cand, inp, beta, va.shape[0], vb.shape[1])
        if reason:
            return reason
    _find_activation(cand, ops)
    if "residual" in ops and not dynamic:
        _find_residual(cand)
    return cand


def settle_residuals(candidates: list) -> None:
    """One residual add, one product: where two matmuls meet in one add (relu(x W1^T) + x W2^T),
    the first in graph order takes it, and the other's product is its residual."""
    claimed = set()
    for cand in candidates:
        if cand.res_add is None:
            continue
        if cand.res_add in claimed:
            cand.residual, cand.res_add = None, None
            if cand.activation == "none":
                cand.standalone = False
        else:
            claimed.add(cand.res_add)


def _addmm_input(cand: Candidate, inp, beta: float, m: int, n: int) -> str | None:
    """Place addmm's input as the bias (a row vector) or as C (an M x N matrix)."""
    if not isinstance(inp, fx.Node) or "val" not in inp.meta:
        return "no_metadata"
    v = inp.meta["val"]
    if v.dtype != torch.float16:
        return "dtype"
    if not is_static(v):
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


# -- the residual add: out + residual, the product's only consumer (through reshapes) ------------


def _single_chain(node: fx.Node) -> fx.Node:
    """Follow a node's only consumer through reshapes: the last reshape (or the node)."""
    while len(node.users) == 1:
        (user,) = node.users
        if user.op == "call_function" and user.target in RESHAPES and user.args[0] is node:
            node = user
            continue
        break
    return node


def _find_residual(cand: Candidate) -> None:
    """`add(residual, mm)` (either order, through reshapes of the product, no alpha), fp16, the
    same shape as the product's view, with a residual that is row-major once viewed as M x N."""
    if cand.c is not None or cand.alpha != 1.0:
        return
    last = _single_chain(cand.act_out if cand.act_out is not None else cand.node)
    if len(last.users) != 1:
        return
    (add,) = last.users
    if add.op != "call_function" or add.target is not aten.add.Tensor or add.kwargs or len(add.args) != 2:
        return
    others = [x for x in add.args if x is not last]
    if len(others) != 1 or not isinstance(others[0], fx.Node) or "val" not in others[0].meta:
        return
    other, vl, vo, vadd = others[0], last.meta["val"], others[0].meta["val"], add.meta["val"]
    m, n, _ = cand.shape
    if (vo.dtype != torch.float16 or vadd.dtype != torch.float16 or tuple(vo.shape) != tuple(vl.shape)
            or not is_static(vo) or not vo.is_contiguous() or vo.storage_offset() % ALIGN_ELEMS
            or math.prod(vo.shape) != m * n or vo.shape[-1] != n):
        return
    if other is cand.node or other in cand.act_nodes:
        return
    cand.residual, cand.res_add, cand.res_index = other, add, list(add.args).index(other)
    if cand.activation == "none":
        cand.standalone = all(_unfusable(u) for u in _through_reshapes(add))


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


def _find_activation(cand: Candidate, ops) -> None:
    """If the matmul's one consumer (through reshapes) is an activation, fuse it."""
    node = _single_chain(cand.node)
    for name in ("relu", "gelu", "silu"):
        if name not in ops:
            continue
        matched = _match_activation(node, _act_graph(name))
        if matched is not None:
            cand.activation, cand.act_out, cand.act_nodes = name, matched[0], matched[1]
            cand.chain_last = node
            cand.standalone = all(_unfusable(user) for user in _through_reshapes(matched[0]))
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


# -- constants: weights whose values the graph owns ----------------------------------------------


def constant_of(node) -> torch.Tensor | None:
    """The tensor a `get_attr` node (a frozen parameter, a folded view of one) holds, else None."""
    if not (isinstance(node, fx.Node) and node.op == "get_attr" and node.graph.owning_module is not None):
        return None
    value = node.graph.owning_module
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def weight_constant(cand: Candidate) -> fx.Node | None:
    """The get_attr node of a column-major B that is a constant (N, K) weight's transpose, folded
    by freezing into one constant or a `permute`/`t` of one; else None."""
    b = cand.b
    if cand.b_major != "col":
        return None
    if b.op == "call_function" and b.target in _WEIGHT_VIEWS:
        if b.target is aten.permute.default and list(b.args[1]) != [1, 0]:
            return None
        base = b.args[0]
        return base if constant_of(base) is not None else None
    return b if constant_of(b) is not None else None


def weight_nk(cand: Candidate) -> torch.Tensor:
    """The (N, K) weight whose transpose is the candidate's constant B (`weight_constant`)."""
    node = weight_constant(cand)
    value = constant_of(node)
    return value.t() if node is cand.b else value


def _source(node: fx.Node):
    """What a node computes, so that equal views of one tensor compare equal."""
    if node.op == "call_function" and node.target in RESHAPES:
        return (node.target, _source(node.args[0]), tuple(node.args[1]))
    return node


@dataclass(frozen=True)
class Siblings:
    """Matmuls of one A by constant weights, to be computed as one GEMM on their joined weight."""

    members: tuple

    def key(self) -> tuple:
        """The op key of the joined problem: M x sum(N) x K, B column-major, a bias if they have one."""
        first = self.members[0]
        m, _, k = first.shape
        n = sum(int(c.shape[1]) for c in self.members)
        return torch_ops.kernel_key(int(m), n, int(k), first.a_major, "col", first.bias is not None, False,
                                    "none", 1.0, 0.0, first.device)


def sibling_groups(candidates: list) -> list:
    """Joins of two or more matmuls with one A, constant weights for B, and all a bias or none
    (no C, no alpha)."""
    groups = defaultdict(list)
    for cand in candidates:
        if (cand.c is None and cand.alpha == 1.0 and not cand.dynamic_m and weight_constant(cand) is not None
                and (cand.bias is None or constant_of(cand.bias) is not None)):
            groups[(_source(cand.a), cand.a_major, cand.device, cand.bias is not None)].append(cand)
    return [Siblings(tuple(members)) for members in groups.values() if len(members) > 1]


def siblings_of_inputs(candidates: list) -> int:
    """Groups of two or more matmuls of one A whose weights are not all constants of the graph
    (freezing was off as the model was traced): what join_siblings cannot join there."""
    groups = defaultdict(list)
    for cand in candidates:
        if not cand.dynamic_m:
            groups[(_source(cand.a), cand.a_major, cand.device)].append(cand)
    return sum(1 for members in groups.values()
               if len(members) > 1 and any(weight_constant(c) is None for c in members))


def split_dim(split: fx.Node):
    """The dim argument of an aten split node (0 where not given)."""
    return split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)


# -- gated MLPs: silu(x W_gate^T) * (x W_up^T) ----------------------------------------------------


@dataclass(frozen=True)
class Gated:
    """A gated MLP's gate and up: two matmuls (`gate`, `up`), or one matmul (`gate` is `up`) over
    weights inductor joined, whose output `split` cuts into halves (`gate_first`: which comes
    first). `mul` is the node the gated op replaces; `act` the activation's nodes."""

    gate: Candidate
    up: Candidate
    mul: fx.Node
    act: tuple
    split: fx.Node | None = None
    gate_first: bool = True

    @property
    def n(self) -> int:
        n = int(self.gate.shape[1])
        return n // 2 if self.split is not None else n

    def key(self) -> tuple:
        m, _, k = self.gate.shape
        return torch_ops.gated_key(int(m), self.n, int(k), self.gate.a_major, self.gate.device, "silu")

    @property
    def members(self) -> tuple:
        return (self.gate,) if self.split is not None else (self.gate, self.up)


def _mul_partner(act_out: fx.Node):
    """(mul node, the other operand through reshapes) where act_out's only consumer is an fp16
    elementwise product of two same-shaped tensors; else None."""
    last = _single_chain(act_out)
    if len(last.users) != 1:
        return None
    (mul,) = last.users
    if mul.op != "call_function" or mul.target is not aten.mul.Tensor or len(mul.args) != 2 or mul.kwargs:
        return None
    others = [x for x in mul.args if x is not last]
    if len(others) != 1 or not isinstance(others[0], fx.Node) or "val" not in others[0].meta:
        return None
    other = others[0]
    if tuple(other.meta["val"].shape) != tuple(last.meta["val"].shape) or mul.meta["val"].dtype != torch.float16:
        return None
    while other.op == "call_function" and other.target in RESHAPES and len(other.users) == 1:
        other = other.args[0]
    return mul, other


def gated_pairs(candidates: list) -> list:
    """The gated MLPs among the candidates, in either form (module docstring)."""
    by_node = {c.node: c for c in candidates}
    found = []
    for gate in candidates:
        if gate.activation != "silu" or gate.residual is not None or not _plain_weight_mm(gate):
            continue
        partner = _mul_partner(gate.act_out)
        if partner is None:
            continue
        mul, other = partner
        up = by_node.get(other)
        if (up is None or up is gate or up.activation != "none" or not _plain_weight_mm(up)
                or _single_chain(up.node).users.keys() != {mul}
                or _source(up.a) != _source(gate.a) or up.a_major != gate.a_major
                or up.shape[1:] != gate.shape[1:]):
            continue
        found.append(Gated(gate, up, mul, tuple(gate.act_nodes)))
    found.extend(_prejoined(candidates))
    return found


def _plain_weight_mm(cand: Candidate) -> bool:
    return (cand.bias is None and cand.c is None and cand.alpha == 1.0 and not cand.dynamic_m
            and weight_constant(cand) is not None)


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else x


def _prejoined(candidates: list) -> list:
    """One matmul over a constant B of 2N columns, split in two halves by inductor's freezing
    pass (concat_linear; `split_with_sizes` on torch 2.13's CPU graphs, `split` by N on torch
    2.11's CUDA ones), whose halves meet as silu(half) * other half."""
    found = []
    for cand in candidates:
        if (cand.bias is not None or cand.c is not None or cand.alpha != 1.0 or cand.dynamic_m
                or constant_of(cand.b) is None or len(cand.node.users) != 1):
            continue
        (split,) = cand.node.users
        n2 = int(cand.shape[1])
        halves = {aten.split_with_sizes.default: [n2 // 2] * 2, aten.split.Tensor: n2 // 2}
        if split.target not in halves or n2 % 2 or _as_list(split.args[1]) != halves[split.target]:
            continue
        if split_dim(split) not in (1, -1):
            continue
        items = {u.args[1]: u for u in split.users if u.target is operator.getitem}
        if set(items) != {0, 1} or len(split.users) != 2:
            continue
        for gate_idx in (0, 1):
            half = _single_chain(items[gate_idx])
            matched = _match_activation(half, _act_graph("silu"))
            if matched is None:
                continue
            partner = _mul_partner(matched[0])
            if partner is None or partner[1] is not items[1 - gate_idx]:
                continue
            if _single_chain(items[1 - gate_idx]).users.keys() != {partner[0]}:
                continue
            found.append(Gated(cand, cand, partner[0], tuple(matched[1]), split, gate_idx == 0))
            break
    return found
