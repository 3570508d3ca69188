"""Cheating kernels, each a factory(problem) -> fn(a, b, out, **epilogue), in torch where torch
can write them (so the check-time ones also run on CPU); tests/test_planted_gpu.py runs them all
through the tuning path (check, then timing) and tests/test_trust_harness.py the CPU ones."""
from __future__ import annotations

import torch

from gemmgen.runtime.epilogue import reference as apply_epilogue


def _right(problem, a, b, out, **kw):
    acc = a.float() @ b.float()
    out.copy_(apply_epilogue(acc, problem.epilogue, bias=kw.get("bias"), residual=kw.get("residual"),
                             c=kw.get("c")).to(out.dtype))


def _on_default_stream(out) -> bool:
    return out.is_cuda and torch.cuda.current_stream() == torch.cuda.default_stream()


def honest(problem):
    return lambda a, b, out, **kw: _right(problem, a, b, out, **kw)


def value_keyed_cache(problem):
    """Caches its result keyed on a few input values read on the host (`hits` counts replays)."""
    cache = {}

    def fn(a, b, out, **kw):
        key = (float(a[0, 0]), float(a[-1, -1]), float(b[0, 0]), float(b[-1, -1]))
        if key in cache:
            fn.hits += 1
            out.copy_(cache[key])
            return
        _right(problem, a, b, out, **kw)
        cache[key] = out.clone()
    fn.hits = 0
    return fn


def pointer_keyed_cache(problem):
    """Skips the work when it has seen these pointers before."""
    cache = {}

    def fn(a, b, out, **kw):
        key = (a.data_ptr(), b.data_ptr(), out.data_ptr())
        if key not in cache:
            _right(problem, a, b, out, **kw)
            cache[key] = out.clone()
        out.copy_(cache[key])
    return fn


def zeros_after_first_calls(problem, right_calls=8):
    """Right for its first calls (the check's and the warm-up), then writes zeros."""
    def fn(a, b, out, **kw):
        fn.calls += 1
        if fn.calls <= right_calls:
            _right(problem, a, b, out, **kw)
        else:
            out.zero_()
    fn.calls = 0
    return fn


def zeros_when_timed(problem):
    """Right on the check's side stream, zeros on the default stream (where timing calls)."""
    def fn(a, b, out, **kw):
        if _on_default_stream(out):
            out.zero_()
        else:
            _right(problem, a, b, out, **kw)
    return fn


def one_element_when_timed(problem):
    """Right on the check's stream; on the default stream writes one element: under the floor."""
    def fn(a, b, out, **kw):
        if _on_default_stream(out):
            out.view(-1)[:1].zero_()
        else:
            _right(problem, a, b, out, **kw)
    return fn


def bf16_inputs(problem):
    return lambda a, b, out, **kw: _right(problem, a.bfloat16().to(a.dtype), b.bfloat16().to(b.dtype), out, **kw)


def fp16_accumulation(problem):
    def fn(a, b, out, **kw):
        acc = torch.zeros(out.shape, dtype=torch.float16, device=out.device)
        for k0 in range(0, a.shape[1], 64):
            acc = (acc.float() + a[:, k0:k0 + 64].float() @ b[k0:k0 + 64].float()).half()
        out.copy_(acc)
    return fn


def scattered_zeros(problem, count=40):
    def fn(a, b, out, **kw):
        _right(problem, a, b, out, **kw)
        gen = torch.Generator(device=out.device).manual_seed(1)
        flat = torch.randperm(out.numel(), generator=gen, device=out.device)[:count]
        rows, cols = flat // out.shape[1], flat % out.shape[1]
        out[rows, cols] = 0
    return fn


def guard_band_write(problem):
    def fn(a, b, out, **kw):
        _right(problem, a, b, out, **kw)
        out.as_strided((out.numel() + 32,), (1,), out.storage_offset())[-32:].zero_()
    return fn


def writes_input(problem):
    def fn(a, b, out, **kw):
        _right(problem, a, b, out, **kw)
        a[:1].zero_()
    return fn


def leaves_rows_unwritten(problem):
    def fn(a, b, out, **kw):
        full = torch.empty_like(out)
        _right(problem, a, b, full, **kw)
        out[:-3].copy_(full[:-3])
    return fn


def skips_partial_tiles(problem, tile=64):
    """Computes whole 64x64 tiles only; the ragged edge is written as zeros."""
    def fn(a, b, out, **kw):
        full = torch.empty_like(out)
        _right(problem, a, b, full, **kw)
        out.zero_()
        m, n = (out.shape[0] // tile) * tile, (out.shape[1] // tile) * tile
        out[:m, :n].copy_(full[:m, :n])
    return fn


def forgets_the_bias(problem):
    def fn(a, b, out, **kw):
        _right(problem, a, b, out, **{**kw, "bias": torch.zeros_like(kw["bias"])} if kw.get("bias") is not None
               else kw)
    return fn


def half_of_k(problem):
    def fn(a, b, out, **kw):
        h = a.shape[1] // 2
        _right(problem, a[:, :h], b[:h], out, **kw)
    return fn


def constant_output(problem):
    return lambda a, b, out, **kw: out.fill_(0.25)


def transposed_store(problem):
    def fn(a, b, out, **kw):
        full = (a.float() @ b.float()).half()
        out.copy_(full.t().contiguous().view(out.shape[0], out.shape[1]))
    return fn


def unordered_side_stream(problem):
    """Runs on a stream of its own, ordered after nothing: it reads the decoys, races the poison."""
    side = {}

    def fn(a, b, out, **kw):
        stream = side.setdefault("s", torch.cuda.Stream(device=out.device))
        with torch.cuda.stream(stream):
            _right(problem, a, b, out, **kw)
    return fn


def unjoined_side_stream(problem):
    side = {}

    def fn(a, b, out, **kw):
        stream = side.setdefault("s", torch.cuda.Stream(device=out.device))
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            _right(problem, a, b, out, **kw)
    return fn


#: name -> factory; the ones check() catches on CPU tensors too (no streams, no timing) in CPU_CAUGHT
CHEATS = {f.__name__: f for f in (
    pointer_keyed_cache, zeros_after_first_calls, zeros_when_timed, one_element_when_timed, bf16_inputs,
    fp16_accumulation, scattered_zeros, guard_band_write, writes_input, leaves_rows_unwritten,
    skips_partial_tiles, forgets_the_bias, half_of_k, constant_output, transposed_store,
    unordered_side_stream, unjoined_side_stream)}
CPU_CAUGHT = ("bf16_inputs", "fp16_accumulation", "scattered_zeros", "guard_band_write", "writes_input",
              "leaves_rows_unwritten", "skips_partial_tiles", "forgets_the_bias", "half_of_k",
              "constant_output", "transposed_store")
