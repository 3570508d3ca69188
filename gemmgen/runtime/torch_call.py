"""torch.matmul (or addmm: with alpha and beta, or with a bias over N as nn.Linear calls it, on
16-byte rows) followed by the rest of the epilogue as torch ops: the baseline every program is
measured against, and what gemmgen serves where nothing won."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import Problem
from gemmgen.runtime.epilogue import apply_in_place, in_place_source, product_problem, with_gate_tail


def torch_call(problem: Problem, *, fp32_reduction: bool = True) -> Callable:
    """`fn(a, b, out, *, bias, residual, c, alpha, beta)` through cuBLAS as torch calls it.

    fp32_reduction (what gemmgen serves): during the product cuBLAS may not sum split-K
    partials in fp16, which torch's default `allow_fp16_reduced_precision_reduction` permits
    and which failed gemmgen's own check (the fp32-accumulation probe at 1454x1757x2854).
    torch reads the flag when it launches the product, so it is turned off for the launch and
    restored after: one C getter call per product, two setter calls more where it was on.
    False: torch's setting as the user has it (the `torch` baseline).

    A gated epilogue: the product over the joined B into a scratch, then the gate's tail as torch
    ops (runtime.epilogue.with_gate_tail)."""
    if problem.epilogue.gate:
        return with_gate_tail(torch_call(product_problem(problem), fp32_reduction=fp32_reduction), problem)
    epilogue = problem.epilogue
    fused_bias = bias_in_product(problem)
    after = replace(epilogue, bias=None) if fused_bias else epilogue
    plain = epilogue.alpha == 1.0 and epilogue.beta == 0.0 and not fused_bias

    def product(a, b, out, bias, c, alpha, beta):
        # nn.Linear's bias inside the product: cuBLASLt adds it in fp32 in its epilogue; an add
        # after it would cost a pass over M x N that no model pays.
        if fused_bias:
            torch.addmm(bias, a, b, alpha=alpha, out=out)
        elif plain:
            torch.matmul(a, b, out=out)
        else:
            torch.addmm(c if beta != 0.0 else out, a, b, beta=beta, alpha=alpha, out=out)

    def fn(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        state = _get_reduction() if fp32_reduction else None
        if state is None or not _allowed(state):
            product(a, b, out, bias, c, alpha, beta)
        else:
            _set_reduction(state, allowed=False)
            try:
                product(a, b, out, bias, c, alpha, beta)
            finally:
                _set_reduction(state)
        apply_in_place(out, after, bias, residual)

    return fn


def bias_in_product(problem: Problem) -> bool:
    """nn.Linear's bias, added inside the product by `torch.addmm`, where every row is 16-byte
    aligned. Elsewhere it is added after: at 17x4611x3583 on the H100 `addmm` with the bias took
    1.045 ms summing in fp32, where the product and an add after it took 0.035 ms."""
    return problem.linear_bias and not problem.unaligned_rows(SM90A.copy_alignment_bytes)


_get_reduction = torch._C._get_cublas_allow_fp16_reduced_precision_reduction


def _allowed(state) -> bool:
    """torch's flag: a bool, or (allow reduced precision, allow split-K) in newer torch."""
    return bool(state[0] if isinstance(state, tuple) else state)


def _set_reduction(state, allowed=None) -> None:
    """Restore `state`, or set its first part to `allowed` (keeping a split-K part as it was)."""
    parts = list(state) if isinstance(state, tuple) else [state]
    if allowed is not None:
        parts[0] = allowed
    torch._C._set_cublas_allow_fp16_reduced_precision_reduction(*parts)


def torch_call_source(problem: Problem) -> str:
    """What `torch_call` runs, as the Python a user would write."""
    e = problem.epilogue
    lines = ["# gemmgen baseline: cuBLAS through torch (fp16 in, fp32 accumulate), epilogue as torch ops"]
    if e.gate:
        lines.append("product = torch.matmul(a, b)")
    elif bias_in_product(problem):
        lines.append("torch.addmm(bias, a, b, alpha=alpha, out=out)   # the bias in cuBLAS's epilogue")
        e = replace(e, bias=None)
    elif e.alpha == 1.0 and e.beta == 0.0:
        lines.append("torch.matmul(a, b, out=out)")
    else:
        lines.append("torch.addmm(c if beta != 0 else out, a, b, alpha=alpha, beta=beta, out=out)")
    return "\n".join(lines + in_place_source(e)) + "\n"
