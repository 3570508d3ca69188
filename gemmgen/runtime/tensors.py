"""Tensors in a problem's layout: torch dtypes of the DSL's names, row- or column-major
storage, and random normal operands for planning and timing."""
from __future__ import annotations

from typing import Any

import torch

from gemmgen.dsl.ir import Problem

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def lay_out(t: torch.Tensor, major: str) -> torch.Tensor:
    """The logical 2-D tensor stored row- or column-major (a transposed view of a copy)."""
    if major == "row":
        return t.contiguous()
    return t.t().contiguous().t()


def empty_laid_out(rows: int, cols: int, major: str, dtype, device) -> torch.Tensor:
    if major == "row":
        return torch.empty((rows, cols), dtype=dtype, device=device)
    return torch.empty((cols, rows), dtype=dtype, device=device).t()


def operands(problem: Problem, seed: int, device) -> tuple[tuple, dict]:
    """Random normal operands laid out in the problem's majors: (a, b, out) and the epilogue's
    keyword operands."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    m, n, k = problem.m, problem.n, problem.k
    ep = problem.epilogue
    in_dt, out_dt = TORCH_DTYPES[problem.in_dtype], TORCH_DTYPES[ep.out_dtype]

    def filled(rows, cols, major, dt):
        t = empty_laid_out(rows, cols, major, dt, device)
        t.copy_(torch.randn((rows, cols), generator=gen, device=device))
        return t

    a = filled(m, k, problem.a_major, in_dt)
    b = filled(k, problem.b_cols, problem.b_major, in_dt)
    out = empty_laid_out(m, n, problem.c_major, out_dt, device)
    kwargs: dict[str, Any] = {"alpha": ep.alpha, "beta": ep.beta}
    if ep.bias:
        kwargs["bias"] = torch.randn((n if ep.bias == "n" else m,), generator=gen, device=device).to(out_dt)
    if ep.residual:
        kwargs["residual"] = filled(m, n, problem.c_major, out_dt)
    if ep.beta != 0.0:
        kwargs["c"] = filled(m, n, problem.c_major, out_dt)
    return (a, b, out), kwargs
