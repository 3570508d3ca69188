"""Input sets and references for checks: logical tensors, laid out later in any majors.

A case holds the logical operands (A is M x K, B is K x N, as the problem states them) in
the input dtype, the epilogue operands, and the fp32 reference computed from exactly
those values (product in fp64, epilogue in fp32), the normwise bound and the elementwise
tolerance (numerics.py). Cases do not depend on the operand majors, so one set of cases
serves every layout of a shape (the bench checks cuBLAS NN and TN against the same
references).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.measure.errors import MeasureError
from gemmgen.measure.numerics import (
    ELEMENT_C,
    GATE_SLOPE,
    MANTISSA_SIGNIFICAND,
    PROBE_MIN_K,
    TINY,
    UNIT_ROUNDOFF,
    MANTISSA_TERMS,
    error_bound,
    gated_error_bound,
    gated_input_scale,
    mantissa_exponent,
    probe_offset,
)
from gemmgen.runtime.epilogue import bias_view, halves
from gemmgen.runtime.epilogue import reference as epilogue_reference
from gemmgen.runtime.tensors import TORCH_DTYPES, empty_laid_out, lay_out  # noqa: F401  (the harness's names)

# Integer views of the same width, for bitwise comparisons and sentinels.
BITS_DTYPES = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


@dataclass
class Case:
    """One input set: `name` is main, precision (the fp16-accumulation probe), mantissa (the
    input-rounding probe), second, or a timed call's set; `tol` is the elementwise tolerance."""

    name: str
    seed: int
    a: torch.Tensor
    b: torch.Tensor
    bias: Optional[torch.Tensor]
    residual: Optional[torch.Tensor]
    c: Optional[torch.Tensor]
    ref: torch.Tensor
    bound: float
    tol: Optional[torch.Tensor] = None

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a.shape[0], self.ref.shape[1], self.a.shape[1]     # N: a gated B has 2N columns


def fresh_seed() -> int:
    """A seed nobody chose: each check sees inputs no kernel could have been tuned to."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def reference(a: torch.Tensor, b: torch.Tensor, epilogue: Epilogue, **operands) -> torch.Tensor:
    """The product in fp64 from the very input values, then the epilogue in fp32."""
    acc = a.double() @ b.double()
    return epilogue_reference(acc, epilogue, **operands)


def _randn(shape, gen: torch.Generator, device, dtype) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def _mantissa_operands(m: int, n: int, k: int, gen: torch.Generator, device, dtype):
    """The mantissa probe (numerics.py): |values| 2^(e0 + {-1, 0, 1}) * MANTISSA_SIGNIFICAND at
    MANTISSA_TERMS random positions of K (zero elsewhere, so the accumulation adds exact zeros),
    with A's column k and B's row k sharing one random sign, so every product is positive."""
    terms = min(k, MANTISSA_TERMS)
    e0 = mantissa_exponent(terms)

    def magnitudes(shape):
        r = torch.randint(-1, 2, shape, generator=gen, device=device)
        return MANTISSA_SIGNIFICAND * torch.pow(2.0, (e0 + r).float())

    sign = torch.zeros(k, device=device)
    support = torch.randperm(k, generator=gen, device=device)[:terms]
    sign[support] = torch.randint(0, 2, (terms,), generator=gen, device=device).float() * 2 - 1
    a = (magnitudes((m, k)) * sign[None, :]).to(dtype)
    b = (magnitudes((k, n)) * sign[:, None]).to(dtype)
    return a, b


def a_scale(problem: Problem, case: str) -> float:
    """What A's values are scaled by in a case: a power of two for a gated problem (numerics.py),
    else 1."""
    return gated_input_scale(problem.k, case) if problem.epilogue.gate else 1.0


def make_case(problem: Problem, name: str, seed: int, device="cuda") -> Case:
    """Build one case. `precision`: A = a0*s_k + noise, B = a0 + noise with s_k = +1 on the
    first half of K and -1 on the second, so that running sums climb to PROBE_PEAK and
    cancel back: a result near sqrt(K) carried by partial sums an fp16 accumulator cannot hold.
    `mantissa`: values fp16 holds exactly and bf16 cannot (numerics.py)."""
    m, n, k = problem.m, problem.n, problem.k
    b_cols = problem.b_cols         # 2N with a gated epilogue: both halves of the joined B
    ep = problem.epilogue
    in_dt = TORCH_DTYPES[problem.in_dtype]
    out_dt = TORCH_DTYPES[ep.out_dtype]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    if name == "precision":
        offset = probe_offset(k)
        sign = torch.ones(k, device=device, dtype=torch.float32)
        sign[k // 2:] = -1.0
        noise_a = torch.randn((m, k), generator=gen, device=device, dtype=torch.float32)
        noise_b = torch.randn((k, b_cols), generator=gen, device=device, dtype=torch.float32)
        a = (offset * sign[None, :] + noise_a).to(in_dt)
        b = (offset + noise_b).to(in_dt)
    elif name == "mantissa":
        a, b = _mantissa_operands(m, b_cols, k, gen, device, in_dt)
    elif name in ("main", "second"):
        a = _randn((m, k), gen, device, in_dt)
        b = _randn((k, b_cols), gen, device, in_dt)
    else:
        raise MeasureError(f"unknown check case {name!r}; use main, precision, mantissa or second")
    a = a * a_scale(problem, name)
    bias = _randn((n if ep.bias == "n" else m,), gen, device, out_dt) if ep.bias else None
    residual = _randn((m, n), gen, device, out_dt) if ep.residual else None
    c = _randn((m, n), gen, device, out_dt) if ep.beta != 0.0 else None
    return case_from(problem, name, seed, a, b, bias=bias, residual=residual, c=c)


def case_from(problem: Problem, name: str, seed: int, a: torch.Tensor, b: torch.Tensor, *,
              bias=None, residual=None, c=None) -> Case:
    """The case of these logical operands: reference, normwise bound, elementwise tolerance."""
    ep = problem.epilogue
    acc = a.double() @ b.double()
    ref = epilogue_reference(acc, ep, bias=bias, residual=residual, c=c)
    if ep.gate:
        scale, product = gated_scales(a, b, acc, ref)
        bound = gated_error_bound(problem.k, out_dtype=ep.out_dtype, acc_dtype=problem.acc_dtype,
                                  norm_scale=float(scale.double().norm()), norm_product=float(product.double().norm()),
                                  norm_ref=float(ref.double().norm()))
        tol = _tolerance(problem, scale, product)
        return Case(name, seed, a, b, bias, residual, c, ref, bound, tol)
    bound = error_bound(
        problem.k, out_dtype=ep.out_dtype, acc_dtype=problem.acc_dtype, alpha=ep.alpha,
        norm_a=float(a.double().norm()), norm_b=float(b.double().norm()),
        norm_ref=float(ref.double().norm()),
    )
    tol = element_tolerance(problem, a, b, acc, ref, bias=bias, residual=residual, c=c)
    return Case(name, seed, a, b, bias, residual, c, ref, bound, tol)


def element_tolerance(problem: Problem, a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor,
                      ref: torch.Tensor, *, bias=None, residual=None, c=None) -> torch.Tensor:
    """The elementwise bound of numerics.py, per output element (fp32, on the operands' device):
    |A||B| in fp32, the output-rounding scale from every value an unfused epilogue rounds."""
    ep = problem.epilogue
    scale = ref.abs() + (acc * abs(ep.alpha)).abs().float()
    if c is not None:
        scale += abs(ep.beta) * c.float().abs()
    if bias is not None:
        scale += bias_view(bias.float().abs(), ep.bias)
    if residual is not None:
        scale += residual.float().abs()
    abs_ab = a.float().abs() @ b.float().abs()
    return _tolerance(problem, scale, abs_ab * abs(ep.alpha))


def gated_scales(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor, ref: torch.Tensor):
    """S and P of a gated case (numerics.py), elementwise in fp32: the output-rounding scale and
    the accumulation-error scale of gate(x) * y with x, y the halves of the product."""
    x, y = (h.abs().float() for h in halves(acc))
    abs_x, abs_y = halves(a.float().abs() @ b.float().abs())
    scale = ref.abs() + (2.0 + GATE_SLOPE) * x * y
    return scale, GATE_SLOPE * abs_x * y + x * abs_y


def _tolerance(problem: Problem, scale: torch.Tensor, product: torch.Tensor) -> torch.Tensor:
    """ELEMENT_C (u_out S + sqrt(K) u_acc P) + TINY, per element."""
    out = problem.epilogue.out_dtype
    growth = math.sqrt(max(problem.k, 1)) * UNIT_ROUNDOFF[problem.acc_dtype]
    return ELEMENT_C * (UNIT_ROUNDOFF[out] * scale + growth * product) + TINY[out]


def case_names(problem: Problem) -> tuple[str, ...]:
    """The precision probe needs a K long enough for partial sums to climb (short K has no room
    to cheat); the mantissa probe works at any K, for fp16 inputs (the values it needs)."""
    names = ("main",)
    if problem.k >= PROBE_MIN_K:
        names += ("precision",)
    if problem.in_dtype == "f16":
        names += ("mantissa",)
    return names + ("second",)


def make_cases(problem: Problem, seed: int, device="cuda") -> list[Case]:
    """All cases of one check; seeds derive from `seed` so the record replays exactly."""
    if not problem.is_bound:
        raise MeasureError(f"problem {problem.key} is shape-generic; bind M, N and K before checking")
    return [make_case(problem, name, seed + i, device) for i, name in enumerate(case_names(problem))]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers (contiguous), for exact comparisons."""
    return t.contiguous().view(BITS_DTYPES[t.dtype])
