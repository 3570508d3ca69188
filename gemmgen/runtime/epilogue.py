"""The one torch reference of the epilogue, `out = act(alpha * acc + beta * c + bias) + residual`,
or, gated, `out = gate(acc[:, :N]) * acc[:, N:]` over the two halves of a joined B.

Every torch rendering of an epilogue reads the table below: the checks' fp32 reference
(`reference`), the baselines' in-place ops after the product (`apply_in_place`, what a
user would write; for a gated epilogue `with_gate_tail`, the product into a scratch of
both halves and `gate_tail` after it), the text `Kernel.source` shows for the baseline
(`in_place_source`), and the torch.compile op's CPU path.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.runtime.tensors import TORCH_DTYPES, empty_laid_out

#: activation -> (out-of-place function, in-place step on `out`, that step as text).
#: GELU is the exact erf form, as every backend lowers it.
ACTIVATIONS = {
    "relu": (torch.relu, lambda out: out.relu_(), "out.relu_()"),
    "gelu": (F.gelu, lambda out: out.copy_(F.gelu(out)), "out.copy_(F.gelu(out))"),
    "silu": (F.silu, lambda out: F.silu(out, inplace=True), "F.silu(out, inplace=True)"),
}


def bias_view(bias: torch.Tensor, where: str) -> torch.Tensor:
    """A bias over N broadcasts along rows; one over M along columns."""
    return bias[None, :] if where == "n" else bias[:, None]


def reference(acc: torch.Tensor, epilogue: Epilogue, *, bias=None, residual=None, c=None) -> torch.Tensor:
    """The epilogue in fp32 on an accumulator, out of place (no final cast). A gated epilogue's
    accumulator holds both halves (M x 2N); the result is M x N."""
    if epilogue.gate:
        gate, up = halves(acc.float())
        return ACTIVATIONS[epilogue.gate][0](gate) * up
    x = acc.float() * epilogue.alpha
    if epilogue.beta != 0.0:
        x = x + epilogue.beta * c.float()
    if epilogue.bias:
        x = x + bias_view(bias.float(), epilogue.bias)
    if epilogue.activation:
        x = ACTIVATIONS[epilogue.activation][0](x)
    if epilogue.residual:
        x = x + residual.float()
    return x


def apply_in_place(out: torch.Tensor, epilogue: Epilogue, bias=None, residual=None) -> None:
    """bias, activation and residual as torch ops in place on `out`, after a product that
    already applied alpha and beta (a gated epilogue: `with_gate_tail`)."""
    if epilogue.gate:
        raise ValueError("a gated epilogue reads a product of both halves, not `out`: use with_gate_tail")
    if epilogue.bias:
        out.add_(bias_view(bias, epilogue.bias))
    if epilogue.activation:
        ACTIVATIONS[epilogue.activation][1](out)
    if epilogue.residual:
        out.add_(residual)


def halves(acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate and up halves of a gated product (halves=stacked: the gate's N columns first)."""
    n = acc.shape[1] // 2
    return acc[:, :n], acc[:, n:]


def gate_tail(product: torch.Tensor, out: torch.Tensor, gate: str) -> None:
    """out = gate(product's gate half) * its up half, as a user writes it after one product over the
    joined weight: the activation in place on the gate half, then one multiply into `out`."""
    g, u = halves(product)
    ACTIVATIONS[gate][1](g)
    torch.mul(g, u, out=out)


def product_problem(problem: Problem) -> Problem:
    """The plain GEMM a gated problem's unfused baseline runs first: M x 2N x K into a scratch of
    the output dtype, both halves side by side."""
    return replace(problem, n=problem.b_cols, c_major="row", epilogue=Epilogue(out_dtype=problem.epilogue.out_dtype))


def with_gate_tail(product_fn: Callable, problem: Problem) -> Callable:
    """A gated problem's unfused call from `product_fn`, a plain call of `product_problem`: the
    product into a scratch from torch's caching allocator (as `a @ b` would take it, and safe on
    any stream), then `gate_tail` into `out`."""
    gate = problem.epilogue.gate
    plain = product_problem(problem)
    dtype = TORCH_DTYPES[plain.epilogue.out_dtype]

    def fn(a, b, out, **_):
        scratch = empty_laid_out(plain.m, plain.n, "row", dtype, out.device)
        product_fn(a, b, scratch)
        gate_tail(scratch, out, gate)

    return fn


def in_place_source(epilogue: Epilogue) -> list[str]:
    """`apply_in_place`'s steps as the Python a user would write, one line each."""
    if epilogue.gate:
        return ["g, u = product[:, :N], product[:, N:]   # product = a @ b, b = [B_gate B_up] (K x 2N)",
                ACTIVATIONS[epilogue.gate][2].replace("out", "g"), "torch.mul(g, u, out=out)"]
    lines = []
    if epilogue.bias:
        lines.append("out.add_(bias)" if epilogue.bias == "n" else "out.add_(bias[:, None])")
    if epilogue.activation:
        lines.append(ACTIVATIONS[epilogue.activation][2])
    if epilogue.residual:
        lines.append("out.add_(residual)")
    return lines
