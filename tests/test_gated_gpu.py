"""GPU tests of the Triton gated epilogue, out = gate(A B_gate) * (A B_up) over a joined B (on
the H200: pytest -m gpu tests/test_gated_gpu.py).

The harness does not check gated problems yet (its references are plain GEMMs), so each
program here is judged against its own fp64 reference, at M = 1, 3, 17 and 100, on aligned and
unaligned N and K, both majors of B, every gate activation and output dtype.
"""
from __future__ import annotations

import pytest

from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile

pytestmark = pytest.mark.gpu

MS = (1, 3, 17, 100)
WIDTHS = ((4096, 4096), (2999, 4097), (1000, 77))
GATES = (("silu", "f16"), ("gelu", "bf16"), ("relu", "f32"))


def _program(shape, gate="silu", out="f16", b="col", tile=(64, 64, 64), warps=(4, 1)) -> Program:
    return Program(problem=Problem(*shape, b_major=b, epilogue=Epilogue(gate=gate, halves="stacked", out_dtype=out)),
                   backend="triton", tile=Tile(*tile), warps=warps, mainloop="multistage", stages=3,
                   raster="n", swizzle=8)


CASES = [_program((m, n, k), gate, out) for m in MS for n, k in WIDTHS for gate, out in GATES[:1]]
CASES += [_program((17, 2999, 4097), gate, out, b=b) for gate, out in GATES for b in ("row", "col")]


def _operands(p: Program, seed: int):
    import torch

    m, n, k = p.problem.m, p.problem.n, p.problem.k
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=gen).half()
    w = torch.randn(2 * n, k, device="cuda", generator=gen).half()          # cat([W_gate, W_up])
    b = w.t() if p.problem.b_major == "col" else w.t().contiguous()
    return a, b


@pytest.mark.parametrize("index", range(len(CASES)))
def test_gated_programs_match_an_fp64_reference(index):
    import torch
    import torch.nn.functional as F

    from gemmgen import backends

    p = CASES[index]
    assert not backends.diagnose(p), backends.diagnose(p)
    fn = backends.load(backends.get("triton").build(backends.lower(p)), p)
    a, b = _operands(p, index)
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[p.problem.epilogue.out_dtype]
    out = torch.full((p.problem.m, p.problem.n), float("nan"), device="cuda", dtype=dtype)
    fn(a, b, out)
    acc = a.double() @ b.double()
    n = p.problem.n
    act = {"silu": F.silu, "gelu": F.gelu, "relu": torch.relu}[p.problem.epilogue.gate]
    ref = act(acc[:, :n]) * acc[:, n:]
    assert not out.isnan().any()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2 if dtype == torch.bfloat16 else err < 2e-3, (p, err)


def test_a_b_of_one_half_is_refused():
    import torch

    from gemmgen import backends
    from gemmgen.backends.base import BackendError

    p = CASES[0]
    fn = backends.load(backends.get("triton").build(backends.lower(p)), p)
    m, n, k = p.problem.m, p.problem.n, p.problem.k
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half().t()                         # N columns, not 2N
    with pytest.raises(BackendError, match="2N"):
        fn(a, b, torch.empty(m, n, device="cuda", dtype=torch.float16))
