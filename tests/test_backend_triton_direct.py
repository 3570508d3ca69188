"""The Triton backend's `mainloop direct` (FMA over row-contiguous K steps, for `x @ W.T` at a
batch of one or two under swap_ab): its rules, its space, its PTX for sm_90a, and its numbers under
Triton's interpreter. The GPU tests are in tests/test_direct_gpu.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gemmgen import backends
from gemmgen.backends import triton as tb
from gemmgen.backends.triton import search_space
from gemmgen.dsl.ir import Epilogue, Problem, Program, Tile
from test_backend_triton import assert_swapped_programs_compute


def direct(m, n, k, tile, warps=1, epilogue=Epilogue(), **kw) -> Program:
    kw = {"scheduler": "tile", **kw}
    return Program(problem=Problem(m, n, k, a_major="row", b_major="col", epilogue=epilogue), backend="triton",
                   tile=Tile(*tile), warps=(warps, 1), mainloop="direct", swap_ab=True, **kw)


FULL = Epilogue(alpha=2.0, beta=0.5, bias="n", activation="silu", residual=True)


@pytest.mark.parametrize("p, what", [
    (direct(1, 4096, 4096, (16, 1, 1024), 4), "128 a thread over 4 warps (most 64)"),
    (direct(1, 4096, 4096, (16, 32, 64), 4), "tile N=32 must be a power of two from 1 to 16"),
    (direct(1, 4096, 4096, (16, 1, 32), 4), "tile K=32 must be a power of two from 64 to 2048"),
    (direct(1, 4096, 4096, (16, 1, 256), 4, split_k=2, split_k_reduce="unordered"), "`split_k 1`"),
    (direct(1, 4096, 4096, (16, 1, 256), 4, scheduler="stream_k"), "`scheduler tile`"),
    (direct(1, 4096, 4096, (4, 1, 256), 8), "tile_m must be a multiple of 8"),
    (direct(1, 4096, 4096, (8, 1, 1024), 4, stages=9), "1 to 8 K steps of loads in flight, not 9"),
    (direct(2, 4096, 4096, (8, 2, 512), 4, stages=2), "only at tile N 1, not 2: write stages 1"),
    (direct(1, 4096, 4096, (8, 1, 1024), 4, stages=4), "take 144 registers a thread (most 128)"),
])
def test_what_direct_cannot_do_is_refused_with_what_to_write(p, what):
    found = backends.diagnose(p)
    assert found and any(what in d.message for d in found), found


def test_direct_needs_both_operands_k_contiguous():
    p = Program(problem=Problem(1, 4096, 4096, a_major="row", b_major="row"), backend="triton",
                tile=Tile(16, 1, 256), warps=(4, 1), mainloop="direct", scheduler="tile", swap_ab=True)
    assert any("a=row b=col" in d.message for d in backends.diagnose(p))
    gated = direct(1, 4096, 4096, (16, 1, 256), 4, epilogue=Epilogue(gate="silu"))
    assert backends.diagnose(gated)


def test_the_space_offers_direct_at_a_batch_of_one_or_two_and_columns_on_weights_l2_holds():
    for m in (1, 2):
        space = search_space.space(Problem(m, 4096, 14336, a_major="row", b_major="col"))
        heads = [p for p in space if p.mainloop == "direct"]
        assert len(heads) >= (6 if m == 1 else 4)
        for p in heads:
            assert p.swap_ab and p.tile.n == 1 << (m - 1).bit_length() and not backends.diagnose(p)
    for m in (3, 4, 8):   # a batch axis in the partial sums lost to torch.matmul (0.62x at M = 4)
        assert not any(p.mainloop == "direct" for p in search_space.space(Problem(m, 4096, 4096, a_major="row",
                                                                                  b_major="col")))
    # one batch column a CTA at M = 3-4, where a quarter of L2 holds the weight (8.4 MB, not 16.8)
    for m in (3, 4):
        space = search_space.space(Problem(m, 1024, 4096, a_major="row", b_major="col"))
        heads = space[:search_space.DIRECT_COLUMNS_PROGRAMS]
        assert all(p.mainloop == "direct" and p.tile.n == 1 and not backends.diagnose(p) for p in heads)
        assert sum(p.mainloop == "direct" for p in space) == len(heads)
    for m, n, k in ((4, 1024, 8192), (8, 1024, 4096)):
        assert not search_space.direct_head(Problem(m, n, k, a_major="row", b_major="col"))
    assert not search_space.direct_head(Problem(1, 4096, 4096, a_major="row", b_major="row"))


def test_direct_and_swapped_programs_alternate_by_the_weights_rows():
    def kinds(m, n):
        space = search_space.space(Problem(m, n, 4096, a_major="row", b_major="col"))
        assert all(p.swap_ab for p in space[:4])
        return [p.mainloop for p in space[:4]]

    direct_first = ["direct", "multistage"] * 2
    assert kinds(1, 4096) == kinds(1, 14336) == kinds(2, 4096) == direct_first
    assert kinds(2, search_space.SWAP_LEADS_MIN_N) == kinds(2, 14336) == direct_first[::-1]
    assert kinds(1, 1024) == kinds(2, 1024) == ["direct"] * 4      # narrow weights: every direct first


def _ptx(program: Program) -> str:
    """The PTX Triton writes for `program` on sm_90a (built through the disk cache)."""
    art = tb.build(backends.lower(program))
    return "\n".join(p.read_text() for p in Path(art.path).glob("*.ptx"))


def test_direct_lowers_to_fma_and_16_byte_streaming_loads_for_sm_90a():
    ptx = _ptx(direct(1, 4096, 4096, (16, 1, 1024), 8))
    assert ".target sm_90a" in ptx and "mma" not in ptx and "cp.async" not in ptx
    assert "ld.global.L1::evict_first.L2::cache_hint.v4.b32" in ptx    # the weight: 16 B a lane, streamed
    assert "fma.rn.f32" in ptx


def _loop_bodies(ptx: str) -> list[str]:
    """The PTX between each loop label and the branch back to it."""
    lines = ptx.splitlines()
    labels = {line.split(":")[0]: i for i, line in enumerate(lines) if re.match(r"^\$L__BB\w+:", line)}
    bodies = []
    for i, line in enumerate(lines):
        back = re.search(r"bra(?:\.uni)?\s+(\$L__BB\w+);", line)
        if back and labels.get(back.group(1), i) < i:
            bodies.append("\n".join(lines[labels[back.group(1)]:i + 1]))
    return bodies


def _k_loop(program: Program) -> str:
    (body,) = _loop_bodies(_ptx(program))
    return body


def test_the_spaces_direct_k_loops_stream_without_shared_memory_or_barriers():
    # The loop must only load, convert and FMA. Under a tile K of 8 x 32 x warps the batch
    # column's load gets a layout of its own, and Triton moves the weight through shared memory
    # behind two barriers every step; the space leaves those tiles out.
    for m, n in ((1, 4096), (2, 4096), (4, 1024)):
        for program in search_space.direct_head(Problem(m, n, 4096, a_major="row", b_major="col")):
            body = _k_loop(program)
            assert "bar.sync" not in body and "shared" not in body, program.tile
            assert "ld.global.L1::evict_first.L2::cache_hint.v4.b32" in body and "fma.rn.f32" in body
    assert "bar.sync" in _k_loop(direct(1, 4096, 4096, (16, 1, 1024), 8))    # the trap itself


CASES = [  # unaligned N and K, batches 1-4 and past the tile, every epilogue piece
    (direct(1, 100, 72, (16, 1, 64), 2), None),
    (direct(16, 70, 520, (1, 16, 64), 1, epilogue=FULL), None),
    (direct(7, 33, 1000, (2, 8, 64), 1), None),
    (direct(3, 45, 200, (8, 4, 64), 2, epilogue=FULL), None),
    (direct(2, 33, 130, (4, 2, 128), 1, epilogue=Epilogue(bias="n", activation="gelu", out_dtype="f32")), None),
    (direct(5, 64, 256, (16, 4, 64), 4, epilogue=Epilogue(residual=True)), None),
    (direct(None, None, None, (16, 1, 256), 4), (1, 77, 300)),
    # a ring of K steps in flight: K past one step, an uneven last step, K under the ring
    (direct(1, 100, 1000, (8, 1, 128), 2, stages=2, epilogue=FULL), None),
    (direct(1, 45, 520, (4, 1, 64), 1, stages=3), None),
    (direct(1, 33, 72, (8, 1, 64), 4, stages=4), None),
    (direct(None, None, None, (8, 1, 128), 4, stages=2), (1, 64, 1024)),
]


def test_direct_programs_compute_x_at_w_transposed_under_the_interpreter():
    assert_swapped_programs_compute(CASES, seed=300)
