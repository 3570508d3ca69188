"""The one torch reference of the epilogue, `out = act(alpha * acc + beta * c + bias) + residual`.

Every torch rendering of an epilogue reads the table below: the checks' fp32 reference
(`reference`), the baselines' in-place ops after the product (`apply_in_place`, what a
user would write), the text `Kernel.source` shows for the baseline (`in_place_source`),
and the torch.compile op's CPU path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gemmgen.dsl.ir import Epilogue
from gemmgen.errors import refuse_gated

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
    """The epilogue in fp32 on an accumulator, out of place (no final cast)."""
    refuse_gated(epilogue, "the epilogue's reference")
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
    already applied alpha and beta."""
    refuse_gated(epilogue, "a library call's epilogue")
    if epilogue.bias:
        out.add_(bias_view(bias, epilogue.bias))
    if epilogue.activation:
        ACTIVATIONS[epilogue.activation][1](out)
    if epilogue.residual:
        out.add_(residual)


def in_place_source(epilogue: Epilogue) -> list[str]:
    """`apply_in_place`'s steps as the Python a user would write, one line each."""
    lines = []
    if epilogue.bias:
        lines.append("out.add_(bias)" if epilogue.bias == "n" else "out.add_(bias[:, None])")
    if epilogue.activation:
        lines.append(ACTIVATIONS[epilogue.activation][2])
    if epilogue.residual:
        lines.append("out.add_(residual)")
    return lines
