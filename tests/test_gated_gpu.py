"""GPU tests of the gated epilogue, out = gate(A B_gate) * (A B_up) over a joined B, in both
backends that lower it: Triton and raw CUDA (on the H200: pytest -m gpu tests/test_gated_gpu.py).

The harness does not check gated problems yet (its references are plain GEMMs), so each
program here is judged against its own fp64 reference, at M = 1, 3, 17 and 100, on aligned and
unaligned N and K, both majors of B, every gate activation and output dtype.

The raw CUDA backend copies 16-byte chunks (cp.async, TMA), so it needs K a multiple of 8 (and,
for a row-major B, N too: the up half starts N columns into each row; its TMA family also wants
the output's N so); its unaligned widths are unaligned to its tiles instead (N=2999 or 3000,
K=4104: a last k tile of 8). It refuses Triton's K=4097 (tests/test_backend_cuda_gated.py checks
the message).
"""
from __future__ import annotations

import pytest

from cuda_backend_cases import hopper, joined
from gemmgen.dsl.ir import Epilogue, Instr, Problem, Program, Tile

pytestmark = pytest.mark.gpu

MS = (1, 3, 17, 100)
# (N, K): aligned, and unaligned N and K, per backend
WIDTHS = {"triton": ((4096, 4096), (2999, 4097), (1000, 77)),
          "cuda": ((4096, 4096), (2999, 4104), (1000, 72))}
# the unaligned shape every gate, output dtype and major of B runs at
UNALIGNED = {("triton", "col"): (17, 2999, 4097), ("triton", "row"): (17, 2999, 4097),
             ("cuda", "col"): (17, 2999, 4104), ("cuda", "row"): (17, 3000, 4104)}
GATES = (("silu", "f16"), ("gelu", "bf16"), ("relu", "f32"))


def _program(backend, shape, gate="silu", out="f16", b="col", tile=(64, 64, 64), warps=None,
             instr=None) -> Program:
    if warps is None:
        warps = (4, 1) if backend == "triton" else (2, 2)
    if backend == "cuda" and instr is None:
        instr = Instr("mma", 16, 8, 16)
    return Program(problem=Problem(*shape, b_major=b, epilogue=Epilogue(gate=gate, halves="stacked", out_dtype=out)),
                   backend=backend, tile=Tile(*tile), warps=warps, mainloop="multistage", stages=3,
                   raster="n", swizzle=8, instr=instr)


CASES = []
for _backend in ("triton", "cuda"):
    CASES += [_program(_backend, (m, n, k), gate, out) for m in MS for n, k in WIDTHS[_backend]
              for gate, out in GATES[:1]]
    CASES += [_program(_backend, UNALIGNED[_backend, b], gate, out, b=b) for gate, out in GATES for b in ("row", "col")]
# The CUDA backend's multistage ring read by wgmma (one warpgroup, its 128 columns of each half),
# and tiles whose halves split a thread's chunks at either boundary of the copier.
CASES += [_program("cuda", (m, 2999, 4104), "silu", "f16", tile=(64, 128, 64), warps=(4, 1),
                   instr=Instr("wgmma", 64, 128, 16)) for m in (1, 100)]
CASES += [_program("cuda", (100, 3000, 4104), "gelu", "bf16", b="row", tile=(64, 128, 64), warps=(4, 1),
                   instr=Instr("wgmma", 64, 128, 16)),
          _program("cuda", (100, 2999, 4104), "relu", "f32", tile=(32, 32, 64), warps=(2, 2)),
          # B tiles of 2 x 16 columns: fewer rows than a thread's chunks are apart (one chunk a thread)
          _program("cuda", (100, 2999, 4104), "silu", "f16", tile=(64, 16, 32), warps=(4, 1)),
          _program("cuda", (100, 3000, 4104), "gelu", "f16", b="row", tile=(64, 16, 32), warps=(4, 1)),
          _program("cuda", (100, 3000, 4104), "silu", "f16", b="row", tile=(128, 64, 32), warps=(2, 2))]
# The TMA family (ws_cooperative 128 x 128, persistent): TMA wants every row 16-byte aligned, so its
# unaligned widths are unaligned to its tiles (N = 3000, K = 4104); both majors of B, a cluster
# of two CTAs sharing B by multicast, every gate and output dtype, and a prefill-sized product.
CASES += [hopper(Problem(m, 3000, 4104, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked")))
          for m in MS]
CASES += [hopper(Problem(100, 3000, 4104, b_major=b, epilogue=Epilogue(gate=gate, halves="stacked", out_dtype=out)),
                 cluster=cluster)
          for b, (gate, out), cluster in (("row", GATES[1], (1, 1)), ("col", GATES[2], (2, 1)), ("row", GATES[0], (2, 1)))]
CASES += [hopper(Problem(2048, 4096, 4096, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked")), stages=3)]
# The same family with one wgmma over the gate's and the up's columns (instr 64x256x16): every M,
# both majors of B, a cluster of two, every gate and output dtype, and the prefill-sized product.
CASES += [joined(hopper(Problem(m, 3000, 4104, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked"))))
          for m in MS]
CASES += [joined(hopper(Problem(100, 3000, 4104, b_major=b, epilogue=Epilogue(gate=gate, halves="stacked",
                                                                               out_dtype=out)), cluster=cluster))
          for b, (gate, out), cluster in (("row", GATES[1], (2, 1)), ("col", GATES[2], (1, 1)),
                                          ("col", GATES[0], (2, 1)))]
CASES += [joined(hopper(Problem(2048, 4096, 4096, b_major="row", epilogue=Epilogue(gate="silu", halves="stacked"))))]
# Ping-pong: two consumer warpgroups take whole tiles in turn, one's epilogue under the other's
# products; the gated tiles 64 x 128 (one wgmma over both halves) and 128 x 64 (one each), every M,
# both majors of B, a cluster of two, every gate and output dtype, and prefill-sized products whose
# CTAs walk odd and even numbers of tiles.


def _pingpong(problem: Problem, tile=(64, 128, 64), joined_halves=True, cluster=(1, 1)) -> Program:
    program = hopper(problem, tile=tile, mainloop="ws_pingpong", warps=(4, 1), cluster=cluster)
    return joined(program) if joined_halves else program


CASES += [_pingpong(Problem(m, 3000, 4104, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked")))
          for m in MS]
CASES += [_pingpong(Problem(100, 3000, 4104, b_major=b, epilogue=Epilogue(gate=gate, halves="stacked",
                                                                           out_dtype=out)), tile, tile[1] == 128,
                    cluster)
          for b, (gate, out), tile, cluster in (("row", GATES[1], (64, 128, 64), (2, 1)),
                                                ("col", GATES[2], (128, 64, 64), (1, 1)),
                                                ("row", GATES[0], (128, 64, 64), (1, 1)),
                                                ("col", GATES[0], (64, 128, 64), (2, 1)))]
CASES += [_pingpong(Problem(2048, 4096, 4096, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked"))),
          _pingpong(Problem(1000, 4096, 4096, b_major="col", epilogue=Epilogue(gate="silu", halves="stacked")),
                    (128, 64, 64), False, (2, 1))]


def _case_id(p: Program) -> str:
    pr = p.problem
    kind = f"{p.instr.kind}{p.instr.n}" if p.instr else "auto"
    return (f"{p.backend}-{pr.m}x{pr.n}x{pr.k}-b{pr.b_major}-{pr.epilogue.gate}-{pr.epilogue.out_dtype}-"
            f"{p.tile.m}x{p.tile.n}x{p.tile.k}-{kind}-{p.mainloop}-cluster{p.cluster[0]}")


def _operands(p: Program, seed: int):
    import torch

    m, n, k = p.problem.m, p.problem.n, p.problem.k
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=gen).half()
    w = torch.randn(2 * n, k, device="cuda", generator=gen).half()          # cat([W_gate, W_up])
    b = w.t() if p.problem.b_major == "col" else w.t().contiguous()
    return a, b


def _launcher(p: Program):
    from gemmgen import backends

    assert not backends.diagnose(p), backends.diagnose(p)
    return backends.load(backends.get(p.backend).build(backends.lower(p)), p)


@pytest.mark.parametrize("p", CASES, ids=[_case_id(p) for p in CASES])
def test_gated_programs_match_an_fp64_reference(p):
    import torch
    import torch.nn.functional as F

    fn = _launcher(p)
    a, b = _operands(p, p.problem.m + p.problem.n + p.problem.k)
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


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_a_b_of_one_half_is_refused(backend):
    import torch

    from gemmgen.backends.base import BackendError

    p = next(q for q in CASES if q.backend == backend)
    fn = _launcher(p)
    m, n, k = p.problem.m, p.problem.n, p.problem.k
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half().t()                         # N columns, not 2N
    with pytest.raises(BackendError, match="2N"):
        fn(a, b, torch.empty(m, n, device="cuda", dtype=torch.float16))
