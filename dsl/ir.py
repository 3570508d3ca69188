"""The typed program IR: what a DSL program means, as frozen dataclasses.

A `Problem` says *what* is computed (shape, operand layouts, dtypes, epilogue);
a `Program` says *how* (tiles, pipeline, schedule, backend) and carries the
problem it was written for. A problem whose M, N or K is `None` is generic:
the program is bound to a concrete shape later with `Program.bind`.

Source positions (for located errors) live in `Program.spans`, which takes no
part in equality or hashing, so `parse(print(p)) == p` compares meaning only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, Mapping, Optional

from gemmgen.dsl.hardware import SM90A

Major = Literal["row", "col"]
DType = Literal["f16", "bf16", "f32"]
Backend = Literal["triton", "cutlass", "cuda"]
Mainloop = Literal["multistage", "ws_cooperative", "ws_pingpong", "direct"]
Scheduler = Literal["tile", "persistent", "stream_k"]
Activation = Literal["relu", "gelu", "silu"]
SplitKReduce = Literal["workspace", "atomic", "unordered", "cluster"]
Halves = Literal["stacked"]

MAJORS: tuple[str, ...] = ("row", "col")
DTYPES: tuple[str, ...] = ("f16", "bf16", "f32")
#: The input types gemmgen generates GEMMs for (fp16 A and B); every backend's SUPPORT agrees.
INPUT_DTYPES: tuple[str, ...] = ("f16",)
BACKENDS: tuple[str, ...] = ("triton", "cutlass", "cuda")
MAINLOOPS: tuple[str, ...] = ("multistage", "ws_cooperative", "ws_pingpong", "direct")
SCHEDULERS: tuple[str, ...] = ("tile", "persistent", "stream_k")
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "silu")
#: The split-K reduction whose K slices run as one thread-block cluster and sum their partials
#: through distributed shared memory, in slice order, in the same launch.
CLUSTER_REDUCE = "cluster"
SPLIT_K_REDUCES: tuple[str, ...] = ("workspace", "atomic", "unordered", CLUSTER_REDUCE)
#: How a gated epilogue's two halves lie in the joined B: `stacked`, the gate's N columns then
#: the up projection's (for x @ W.T: W = cat([W_gate, W_up]), 2N x K).
HALVES: tuple[str, ...] = ("stacked",)
#: Split-K reductions that add partials in arrival order (not bit-reproducible run to run):
#: `atomic` into the output itself, `unordered` into an fp32 buffer the epilogue then reads.
ARRIVAL_ORDER_REDUCES = frozenset({"atomic", "unordered"})
DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4}


@dataclass(frozen=True)
class Epilogue:
    """out = cast(act(alpha * acc + beta * C + bias) + residual).

    `bias="n"` is one value per output column (the nn.Linear bias),
    `bias="m"` one per output row. `gelu` is the exact (erf) GELU.
    A gated epilogue (`gate`, with `halves`) is out = cast(gate(acc_gate) * acc_up): B joins two
    K x N matrices side by side (K x 2N, as `halves` lays them out), the product gives both, and
    the epilogue multiplies the activated gate half into the up half (a gated MLP's
    act(x W_gate^T) * (x W_up^T), one GEMM over the joined weight).
    """

    alpha: float = 1.0
    beta: float = 0.0
    bias: Optional[Literal["m", "n"]] = None
    activation: Optional[Activation] = None
    residual: bool = False
    out_dtype: DType = "f16"
    gate: Optional[Activation] = None
    halves: Optional[Halves] = None

    @property
    def signature(self) -> str:
        """What the epilogue needs, without runtime scalars: a database key."""
        parts = []
        if self.alpha != 1.0:
            parts.append("alpha")
        if self.beta != 0.0:
            parts.append("beta")
        if self.bias:
            parts.append(f"bias_{self.bias}")
        if self.activation:
            parts.append(self.activation)
        if self.residual:
            parts.append("residual")
        if self.gate:
            parts.append(f"gate_{self.gate}_{self.halves}")
        parts.append(self.out_dtype)
        return "+".join(parts)

    @classmethod
    def from_signature(cls, signature: str) -> "Epilogue":
        """The epilogue a signature names; alpha=2.0 and beta=1.0 stand for "present" (a signature
        keeps which parts there are, not runtime values). ValueError if it is not one."""
        *parts, out_dtype = signature.split("+")
        items: dict = {"out_dtype": out_dtype}
        for part in parts:
            if part in ("alpha", "beta"):
                items[part] = 2.0 if part == "alpha" else 1.0
            elif part.startswith("bias_"):
                items["bias"] = part[len("bias_"):]
            elif part == "residual":
                items["residual"] = True
            elif part.startswith("gate_"):
                items["gate"], _, items["halves"] = part[len("gate_"):].partition("_")
            else:
                items["activation"] = part
        unknown = [f"{name}={items[name]}" for name, known in (("activation", ACTIVATIONS), ("gate", ACTIVATIONS),
                                                                 ("bias", ("m", "n")), ("halves", HALVES))
                   if items.get(name) not in (None, *known)]
        if unknown:
            raise ValueError(f"{signature!r} names {', '.join(unknown)}, which gemmgen does not know")
        epilogue = cls(**items)
        if epilogue.signature != signature:
            raise ValueError(f"{signature!r} reads back as {epilogue.signature!r}")
        return epilogue


@dataclass(frozen=True)
class Problem:
    """C[M, N] = A[M, K] @ B[K, N] followed by the epilogue.

    `a_major="row"` stores A as M x K with K contiguous; `b_major="col"` stores
    B as N x K (K contiguous), which is the weight of `x @ W.T`.
    """

    m: Optional[int]
    n: Optional[int]
    k: Optional[int]
    a_major: Major = "row"
    b_major: Major = "row"
    c_major: Major = "row"
    in_dtype: DType = "f16"
    acc_dtype: DType = "f32"
    epilogue: Epilogue = Epilogue()

    @property
    def is_bound(self) -> bool:
        return None not in (self.m, self.n, self.k)

    def with_shape(self, m: int, n: int, k: int) -> "Problem":
        return replace(self, m=m, n=n, k=k)

    def _shape(self) -> tuple[int, int, int]:
        if not self.is_bound:
            raise ValueError("the problem is shape-generic; bind M, N and K first")
        return self.m, self.n, self.k  # type: ignore[return-value]

    @property
    def b_cols(self) -> Optional[int]:
        """B's columns: N, or 2N with a gated epilogue (the two halves side by side)."""
        return None if self.n is None else self.n * (2 if self.epilogue.gate else 1)

    def rows(self) -> tuple[tuple[str, Major, str, Optional[int], DType], ...]:
        """How A, B and the output lie in memory: (operand, major, the dimension a row runs
        along, its extent, dtype). Copies of 16 bytes (TMA, cuBLAS's fast kernels) need each
        row's bytes to be a multiple of 16. An extent is None where the problem leaves it open."""
        e = self.epilogue
        return (("A", self.a_major, *(("K", self.k) if self.a_major == "row" else ("M", self.m)), self.in_dtype),
                ("B", self.b_major, *(("N", self.b_cols) if self.b_major == "row" else ("K", self.k)),
                 self.in_dtype),
                ("the output", self.c_major, *(("N", self.n) if self.c_major == "row" else ("M", self.m)),
                 e.out_dtype))

    def unaligned_rows(self, alignment_bytes: int) -> tuple[tuple[str, Major, str, Optional[int], DType], ...]:
        """The rows() whose bytes are not known to be a multiple of `alignment_bytes` (an open
        extent is not known)."""
        return tuple((operand, major, dim, extent, dtype) for operand, major, dim, extent, dtype in self.rows()
                     if extent is None or extent * DTYPE_BYTES[dtype] % alignment_bytes)

    @property
    def linear_bias(self) -> bool:
        """Whether the bias is nn.Linear's, `x @ W.T + b`: over N, with no C, on operands of the
        output's dtype. Libraries add such a bias inside the product (`torch.addmm`)."""
        e = self.epilogue
        return e.bias == "n" and e.beta == 0.0 and self.in_dtype == e.out_dtype

    @property
    def flops(self) -> int:
        m, n, k = self._shape()
        return 2 * m * self.b_cols * k

    @property
    def bytes(self) -> int:
        """Fewest bytes moved: each operand read once, the output written once."""
        m, n, k = self._shape()
        e = self.epilogue
        ib = DTYPE_BYTES[self.in_dtype]
        total = (m * k + k * self.b_cols) * ib + m * n * DTYPE_BYTES[e.out_dtype]
        if e.beta != 0.0:
            total += m * n * DTYPE_BYTES[e.out_dtype]
        if e.residual:
            total += m * n * DTYPE_BYTES[e.out_dtype]
        if e.bias:
            total += (m if e.bias == "m" else n) * DTYPE_BYTES[e.out_dtype]
        return total

    @property
    def floor_s(self) -> float:
        """Physical floor on one SM90A: max of compute time at peak and bytes at peak bandwidth."""
        return max(self.flops / SM90A.peak_flops_f16, self.bytes / SM90A.peak_bytes_per_s)

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def gflop(self) -> float:
        return self.flops / 1e9

    @property
    def key(self) -> str:
        """A stable text key: shape, majors, dtypes, epilogue signature."""
        dims = "x".join("*" if d is None else str(d) for d in (self.m, self.n, self.k))
        majors = f"{self.a_major[0]}{self.b_major[0]}{self.c_major[0]}"
        return f"{dims}:{majors}:{self.in_dtype}:{self.acc_dtype}:{self.epilogue.signature}"


_FLIP = {"row": "col", "col": "row"}


def transposed(problem: Problem) -> Problem:
    """C^T = B^T A^T as a problem: N x M x K, B^T as the first operand and A^T as the second,
    every major flipped (a transposed row-major matrix is column-major), the bias on the
    other axis. The same bytes: only how they are read changes."""
    e = problem.epilogue
    bias = {"m": "n", "n": "m"}.get(e.bias) if e.bias else None
    return replace(problem, m=problem.n, n=problem.m, a_major=_FLIP[problem.b_major],
                   b_major=_FLIP[problem.a_major], c_major=_FLIP[problem.c_major],
                   epilogue=replace(e, bias=bias))


@dataclass(frozen=True)
class Tile:
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Instr:
    """A tensor-core instruction shape: wgmma m64nNk16 or mma.sync m16n8k16."""

    kind: Literal["wgmma", "mma"]
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Program:
    """How to compute a problem: the decisions a kernel engineer makes.

    `None` for `instr`, `stages`, `smem_swizzle` and `epilogue_tile` (`tile ... epilogue=MxN`)
    means the backend chooses; `grid_sms` (`scheduler persistent N`) caps the SMs a persistent
    grid uses, `None` meaning all of them.
    `swap_ab` computes C^T = B^T A^T: the operands trade places, so a small M (the batch of
    `x @ W.T`) becomes the narrow N of the tile and the weight's N fills its M side. Every
    schedule decision then describes the transposed problem; `computed` is that program.
    `warps` (WM, WN) are the math warps that share one CTA tile, WM along M and WN
    along N; warp-specialized mainloops add a producer warpgroup, and ws_pingpong
    runs two such consumer groups on alternating tiles (docs/dsl.md, "Resource model").
    """

    problem: Problem
    backend: Backend
    tile: Tile
    warps: tuple[int, int]
    mainloop: Mainloop
    instr: Optional[Instr] = None
    cluster: tuple[int, int] = (1, 1)
    stages: Optional[int] = None
    scheduler: Scheduler = "tile"
    grid_sms: Optional[int] = None
    raster: Literal["m", "n"] = "m"
    swizzle: int = 1
    smem_swizzle: Optional[int] = None
    split_k: int = 1
    split_k_reduce: SplitKReduce = "workspace"
    epilogue_tile: Optional[tuple[int, int]] = None
    swap_ab: bool = False
    spans: Mapping[str, tuple[int, int]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    @property
    def num_warps(self) -> int:
        return self.warps[0] * self.warps[1]

    @property
    def cluster_sum(self) -> bool:
        """`split_k N cluster`: the N K slices of each tile run as one thread-block cluster and
        sum their partials in shared memory."""
        return self.split_k > 1 and self.split_k_reduce == CLUSTER_REDUCE

    @property
    def deterministic(self) -> bool:
        """Bit-identical run to run: no split-K whose partials are added in arrival order."""
        return self.split_k == 1 or self.split_k_reduce not in ARRIVAL_ORDER_REDUCES

    def bind(self, problem_or_shape) -> "Program":
        """The same decisions for a concrete problem (or an (M, N, K) shape).

        Rebinding does not validate; call `gemmgen.dsl.validate` on the result.
        """
        if isinstance(problem_or_shape, Problem):
            problem = problem_or_shape
        else:
            m, n, k = problem_or_shape
            problem = self.problem.with_shape(int(m), int(n), int(k))
        return replace(self, problem=problem)

    @property
    def computed(self) -> "Program":
        """The program the backend lowers: itself, or with `swap_ab` the same decisions over the
        transposed problem (C^T = B^T A^T), which its launch is called with."""
        if not self.swap_ab:
            return self
        return replace(self, problem=transposed(self.problem), swap_ab=False)

    def ctas(self) -> int:
        """CTAs of the grid before persistence: output tiles times split-K slices."""
        p = self.computed.problem
        if not p.is_bound:
            raise ValueError("the program is shape-generic; bind it first")
        tiles = math.ceil(p.m / self.tile.m) * math.ceil(p.n / self.tile.n)  # type: ignore[operator]
        return tiles * self.split_k
