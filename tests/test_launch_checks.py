"""Every launcher checks every argument: out apart from every input, out aligned and on the
kernel's device, finite alpha and beta, and no size past what the kernels index in 32-bit
integers; the validator refuses such a bound problem first, located at its `gemm` line.

The checks are pure functions over `TensorArg`s (pointers, shapes, strides, devices), so
they run here on fake values; the GPU test at the end calls each backend's real launcher.
"""
from __future__ import annotations

import math

import pytest

from gemmgen import backends, dsl
from gemmgen.backends.base import (
    INT32_LIMIT,
    BackendError,
    TensorArg,
    check_launch,
    int32_overflows,
    overlaps,
    refuse_nonfinite,
)
from gemmgen.backends.cuda import launch as cuda_launch
from gemmgen.backends.cutlass import rules as cutlass_rules
from gemmgen.backends.cutlass import runtime as cutlass_runtime
from gemmgen.backends.cutlass.emit import instance_spec
from gemmgen.dsl.ir import Problem

HUGE_M = 2**31 + 64      # wrapped to a negative C int in the CUDA launcher's arguments before
EXAMPLES = sorted(dsl.examples())


def _example(name: str):
    return dsl.parse(dsl.examples()[name].read_text())


def _gemm_line(name: str) -> int:
    lines = dsl.examples()[name].read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith("gemm "))


def _arg(name, ptr, shape, strides=None, itemsize=2, device=0):
    if strides is None:
        strides = (shape[1], 1) if len(shape) == 2 else (1,)
    return TensorArg(name, ptr, tuple(shape), tuple(strides), itemsize, device)


# ---- the validator: a bound problem the kernels cannot index is refused, located -------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_every_backend_refuses_m_past_int32_at_the_gemm_line(name):
    program = _example(name)
    n = program.problem.n or 256
    k = program.problem.k or 4096
    diagnostics = backends.diagnose(program.bind((HUGE_M, n, k)))
    limit = [d for d in diagnostics if "2^31" in d.message]
    assert limit, [d.message for d in diagnostics]
    assert all(d.statement == "gemm" and d.line == _gemm_line(name) for d in limit)
    assert str(INT32_LIMIT) in limit[0].message and "split the problem" in limit[0].message
    with pytest.raises(dsl.ProgramError, match=r"2\^31"):
        backends.validate(program.bind((HUGE_M, n, k)))


@pytest.mark.parametrize("name", [n for n in EXAMPLES if n.startswith("triton")])
def test_triton_refuses_large_k_times_n(name):
    # M, N and K each fit easily; B's K x N elements do not fit Triton's int32 offsets.
    program = _example(name).bind((64, 65536, 32768))
    messages = [d.message for d in backends.diagnose(program) if "2^31" in d.message]
    # swap_ab computes C^T = B^T A^T, whose first operand holds the weight
    weight = "M x K (A's elements)" if program.swap_ab else "K x N (B's elements)"
    assert any(f"{weight} is 2147483648" in m for m in messages), messages


@pytest.mark.parametrize("name", [n for n in EXAMPLES if not n.startswith("triton")])
def test_cuda_and_cutlass_take_m_just_under_the_limit(name):
    # Their element offsets are 64-bit: only the int counts bind, so the rule is not a blanket refusal.
    diagnostics = backends.diagnose(_example(name).bind((INT32_LIMIT - 1024, 256, 256)))
    assert not [d for d in diagnostics if "2^31" in d.message]


def test_the_direct_family_counts_its_tiles_in_int32():
    # Under swap_ab a huge M is the narrow side of 8-column tiles: with 16-row tiles, 16 x 268
    # million of them outnumber the grid's 32-bit count, which is refused where the gemm line is.
    from dataclasses import replace

    from gemmgen.dsl.ir import Tile

    example = _example("cuda_direct_decode")
    program = replace(example, tile=Tile(16, 8, 64), warps=(1, 1), split_k=1, split_k_reduce="workspace")
    limit = [d for d in backends.diagnose(program.bind((INT32_LIMIT - 1024, 256, 256))) if "2^31" in d.message]
    assert limit and "the output tiles" in limit[0].message and limit[0].line == _gemm_line("cuda_direct_decode")
    assert not [d for d in backends.diagnose(program.bind((16, 256, 256))) if "2^31" in d.message]


def test_no_cuda_candidate_validates_at_m_past_int32():
    problem = Problem(HUGE_M, 4096, 4096, "row", "col")
    candidates = backends.get("cuda").space(problem)
    assert candidates
    assert all(any("2^31" in d.message for d in backends.diagnose(p)) for p in candidates)


def test_the_limit_is_one_fact():
    from gemmgen.backends.triton import rules as triton_rules

    assert triton_rules.INT32_LIMIT is INT32_LIMIT
    assert int32_overflows({"x": INT32_LIMIT - 1}, "why") == []
    assert "x is 2147483648" in int32_overflows({"x": INT32_LIMIT}, "why")[0]


# ---- the pure checks on fake arguments -------------------------------------------------------

def test_out_that_is_an_input_or_overlaps_one_is_refused():
    a = _arg("a", 0x10000, (256, 256))
    assert overlaps(_arg("out", 0x10000, (256, 256)), a)                        # the same memory
    assert overlaps(_arg("out", 0x10000 + 512 * 100, (64, 256)), a)             # rows inside a
    assert overlaps(_arg("out", 0x10000, (256, 256), (1, 256)), a)              # a transposed view of it
    assert not overlaps(_arg("out", 0x10000 + 2 * 256 * 256, (256, 256)), a)    # just past a
    with pytest.raises(BackendError, match="out overlaps a in memory"):
        check_launch(_arg("out", 0x10000, (256, 256)), [a], 0, 1.0, 0.0)


def test_column_slices_of_one_buffer_do_not_alias():
    # out = buf[:, :128], residual = buf[:, 128:256] of one (64, 384) buffer: disjoint elements.
    base = 0x20000
    out = _arg("out", base, (64, 128), (384, 1))
    residual = _arg("residual", base + 2 * 128, (64, 128), (384, 1))
    assert not overlaps(out, residual)
    check_launch(out, [residual], 0, 1.0, 0.0)
    wider = _arg("residual", base + 2 * 64, (64, 128), (384, 1))          # columns 64..192 meet out's
    assert overlaps(out, wider)


def test_every_input_is_checked_for_aliasing():
    out = _arg("out", 0x40000, (128, 128))
    inputs = [_arg("a", 0x100000, (128, 64)), _arg("b", 0x200000, (64, 128)),
              _arg("bias", 0x40000 + 2 * 128 * 10, (128,))]
    with pytest.raises(BackendError, match="out overlaps bias"):
        check_launch(out, inputs, 0, 1.0, 0.0)


def test_misaligned_out_and_other_devices_are_refused():
    a = _arg("a", 0x100000, (128, 64))
    with pytest.raises(BackendError, match="out starts at 0x40002, not on a 16-byte boundary"):
        check_launch(_arg("out", 0x40002, (128, 128)), [a], 0, 1.0, 0.0)
    with pytest.raises(BackendError, match="out is on cuda:1, but this kernel runs on cuda:0"):
        check_launch(_arg("out", 0x40000, (128, 128), device=1), [a], 0, 1.0, 0.0)
    with pytest.raises(BackendError, match="a is on cpu"):
        check_launch(_arg("out", 0x40000, (128, 128)), [a._replace(device=-1)], 0, 1.0, 0.0)


@pytest.mark.parametrize("alpha,beta", [(math.nan, 0.0), (1.0, math.inf), (-math.inf, 0.0), (1e39, 0.0),
                                        (None, 0.0)])
def test_alpha_and_beta_must_be_finite_fp32(alpha, beta):
    with pytest.raises(BackendError, match="not a finite fp32 number"):
        refuse_nonfinite(alpha, beta)


def test_cuda_launcher_refuses_m_past_int32_and_a_misaligned_out():
    program = _example("cuda_multistage_mma")
    a = _arg("a", 1 << 40, (HUGE_M, 64))
    b = _arg("b", 0x2000000, (64, 128), (1, 64))
    out = _arg("out", 3 << 40, (HUGE_M, 128))
    with pytest.raises(BackendError, match=r"M \+ tile M .* 2\^31"):
        cuda_launch.check_call(program, 0, HUGE_M, 128, 64, out, [a, b], 1.0, 0.0)
    small = (_arg("a", 0x1000000, (256, 64)), _arg("b", 0x2000000, (64, 128), (1, 64)))
    cuda_launch.check_call(program, 0, 256, 128, 64, _arg("out", 0x3000000, (256, 128)), list(small), 1.0, 0.0)
    with pytest.raises(BackendError, match="16-byte"):
        cuda_launch.check_call(program, 0, 256, 128, 64, _arg("out", 0x3000002, (256, 128)), list(small), 1.0, 0.0)
    with pytest.raises(BackendError, match="runs on cuda:0"):
        cuda_launch.check_call(program, 0, 256, 128, 64, _arg("out", 0x3000000, (256, 128), device=1),
                               list(small), 1.0, 0.0)
    with pytest.raises(BackendError, match="alpha=nan"):
        cuda_launch.check_call(program, 0, 256, 128, 64, _arg("out", 0x3000000, (256, 128)), list(small),
                               math.nan, 0.0)


def test_cuda_walking_kernels_count_k_tiles_too():
    stream_k = _example("cuda_multistage_stream_k")
    tile = stream_k.tile
    # 2^31 k-tile iterations with every dimension small enough on its own.
    m, n = 65536, 65536
    k = (INT32_LIMIT // ((m // tile.m) * (n // tile.n)) + 1) * tile.k
    counts = cuda_launch.index_counts(stream_k, m, n, k)
    assert max(counts.values()) >= INT32_LIMIT
    assert max(cuda_launch.index_counts(_example("cuda_multistage_mma"), m, n, k).values()) < INT32_LIMIT


def test_cutlass_launcher_refuses_m_past_int32():
    program = _example("cutlass_ws_pingpong")
    spec = instance_spec(program)
    a, b = _arg("a", 1 << 40, (HUGE_M, 64)), _arg("b", 0x2000000, (64, 128), (1, 64))
    with pytest.raises(BackendError, match=r"2\^31"):
        cutlass_runtime.check_call(spec, 0, HUGE_M, 128, 64, _arg("out", 3 << 40, (HUGE_M, 128)), [a, b], 1.0, 0.0)
    assert cutlass_rules.index_counts(spec.tile, 256, 128, 64)["M + tile M (the rows the last tile reaches)"] == \
        256 + program.tile.m


def test_triton_launcher_counts_the_real_extent_of_a_strided_view():
    pytest.importorskip("triton")
    from gemmgen.backends.triton import launch as triton_launch

    program = _example("triton_multistage").bind((64, 64, 64))
    a, b = _arg("a", 0x1000000, (64, 64)), _arg("b", 0x2000000, (64, 64))
    triton_launch.check_call(program, 0, 64, 64, 64, _arg("out", 0x3000000, (64, 64)), [a, b], 1.0, 0.0)
    # 64 x 64 elements, but rows 2^26 apart: offsets up to 63 * 2^26 > 2^31 wrap in int32.
    padded = _arg("out", 0x3000000, (64, 64), (2**26, 1))
    with pytest.raises(BackendError, match=r"out's extent .* 2\^31"):
        triton_launch.check_call(program, 0, 64, 64, 64, padded, [a, b], 1.0, 0.0)


# ---- the Triton launcher itself, on CPU tensors (its C launch replaced by a parser) ----------

def test_triton_launcher_refuses_aliased_out_misaligned_out_and_nan(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from test_backend_triton_launcher import _launcher, _operands, program
    from gemmgen.dsl.ir import Epilogue

    # alpha 1: a NaN is refused as not finite, before the check that alpha cannot vary here.
    p = program(256, 256, 256, b="row", epilogue=Epilogue(beta=0.5, residual=True))
    fn, fakes = _launcher(p, monkeypatch)
    a, b, out, extra = _operands(p, 256, 256, 256)
    fn(a, b, out, **extra)
    assert len(fakes[0].launches) == 1
    with pytest.raises(BackendError, match="out overlaps a"):
        fn(a, b, a, **extra)
    with pytest.raises(BackendError, match="out overlaps residual"):
        fn(a, b, extra["residual"], residual=extra["residual"], c=extra["c"])
    with pytest.raises(BackendError, match="out overlaps c"):
        fn(a, b, extra["c"], residual=extra["residual"], c=extra["c"])
    shifted = torch.empty(256 * 256 + 8, dtype=torch.float16)[1:1 + 256 * 256].view(256, 256)
    with pytest.raises(BackendError, match="16-byte"):
        fn(a, b, shifted, **extra)
    with pytest.raises(BackendError, match="alpha=nan"):
        fn(a, b, out, alpha=math.nan, **extra)
    with pytest.raises(BackendError, match="beta=inf"):
        fn(a, b, out, beta=math.inf, **extra)
    assert len(fakes[0].launches) == 1     # nothing refused was launched


# ---- on the GPU: each backend's real launcher ---------------------------------------------------

GPU_PROGRAMS = ["triton_multistage", "triton_persistent", "cuda_multistage_mma", "cuda_ws_cooperative",
                "cutlass_ws_pingpong"]


def test_the_loader_opts_in_when_static_and_dynamic_shared_memory_pass_48_kb():
    """The driver's default dynamic limit is what static shared memory leaves of 48 KB: a ring
    of exactly 48 KB beside a 128-byte static flag must opt in, one of 48 KB alone need not."""
    limit = cuda_launch.SMEM_WITHOUT_OPT_IN
    assert limit == 48 * 1024
    assert cuda_launch.needs_smem_opt_in(limit, 128)
    assert not cuda_launch.needs_smem_opt_in(limit, 0)
    assert not cuda_launch.needs_smem_opt_in(limit - 128, 128)
    assert cuda_launch.needs_smem_opt_in(64 * 1024, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_PROGRAMS)
def test_each_backend_refuses_aliased_and_misaligned_out_on_the_gpu(name):
    import torch

    program = backends.validate(_example(name).bind((256, 256, 256)))
    module = backends.get(program.backend)
    fn = module.load(module.build(module.lower(program)), program)
    pr = program.problem
    a = torch.randn(256, 256, device="cuda").half()
    b = torch.randn(256, 256, device="cuda").half()
    b = b if pr.b_major == "row" else b.t().contiguous().t()
    extra = {"residual": torch.randn(256, 256, device="cuda").half()} if pr.epilogue.residual else {}
    out = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    fn(a, b, out, **extra)
    torch.cuda.synchronize()
    reference = a.float() @ b.float() + (extra["residual"].float() if extra else 0)
    assert torch.allclose(out.float(), reference, rtol=2e-2, atol=2e-1)

    a_before = a.clone()
    with pytest.raises(BackendError, match="out overlaps a"):
        fn(a, b, a, **extra)
    if extra:
        with pytest.raises(BackendError, match="out overlaps residual"):
            fn(a, b, extra["residual"], **extra)
    shifted = torch.empty(256 * 256 + 8, device="cuda", dtype=torch.float16)[1:1 + 256 * 256].view(256, 256)
    with pytest.raises(BackendError, match="16-byte"):
        fn(a, b, shifted, **extra)
    with pytest.raises(BackendError, match="alpha=nan"):
        fn(a, b, out, alpha=math.nan, **extra)
    with pytest.raises(BackendError, match="cpu"):
        fn(a, b, out.cpu(), **extra)
    torch.cuda.synchronize()                 # no refused call reached the GPU and faulted it
    assert torch.equal(a, a_before)
