"""torch.matmul (or addmm with alpha and beta) followed by the epilogue as torch ops: the
baseline every program is measured against, and what gemmgen serves where nothing won."""
from __future__ import annotations

from typing import Callable

import torch

from gemmgen.dsl.ir import Problem
from gemmgen.runtime.epilogue import apply_in_place, in_place_source


def torch_call(problem: Problem) -> Callable:
    """`fn(a, b, out, *, bias, residual, c, alpha, beta)` through cuBLAS as torch calls it."""
    plain = problem.epilogue.alpha == 1.0 and problem.epilogue.beta == 0.0
    epilogue = problem.epilogue

    def fn(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        if plain:
            torch.matmul(a, b, out=out)
        else:
            torch.addmm(c if beta != 0.0 else out, a, b, beta=beta, alpha=alpha, out=out)
        apply_in_place(out, epilogue, bias, residual)

    return fn


def torch_call_source(problem: Problem) -> str:
    """What `torch_call` runs, as the Python a user would write."""
    e = problem.epilogue
    lines = ["# gemmgen baseline: cuBLAS through torch (fp16 in, fp32 accumulate), epilogue as torch ops"]
    if e.alpha == 1.0 and e.beta == 0.0:
        lines.append("torch.matmul(a, b, out=out)")
    else:
        lines.append("torch.addmm(c if beta != 0 else out, a, b, alpha=alpha, beta=beta, out=out)")
    return "\n".join(lines + in_place_source(e)) + "\n"
