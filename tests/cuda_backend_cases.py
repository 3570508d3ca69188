"""Programs the raw CUDA backend's tests build: one source of truth for CPU and GPU tests."""
from __future__ import annotations

import random
from dataclasses import replace

from gemmgen.dsl.ir import Epilogue, Instr, Problem, Program, Tile


def multistage(problem: Problem, tile=(128, 128, 32), warps=(2, 2), stages=4, split_k=1,
               reduce="workspace", raster="m", swizzle=8, scheduler="tile", wgmma=False) -> Program:
    """A multistage program; `wgmma`: its ring read by wgmma across each warpgroup's columns."""
    instr = Instr("wgmma", 64, tile[1] // warps[1], 16) if wgmma else Instr("mma", 16, 8, 16)
    return Program(problem=problem, backend="cuda", tile=Tile(*tile), warps=warps, mainloop="multistage",
                   instr=instr, stages=stages, raster=raster, swizzle=swizzle,
                   split_k=split_k, split_k_reduce=reduce, scheduler=scheduler)


def hopper(problem: Problem, tile=(128, 128, 64), stages=4, cluster=(1, 1), scheduler="persistent",
           raster="m", swizzle=8, mainloop="ws_cooperative", warps=(8, 1)) -> Program:
    return Program(problem=problem, backend="cuda", tile=Tile(*tile), warps=warps, mainloop=mainloop,
                   instr=Instr("wgmma", 64, tile[1] // warps[1], 16), cluster=cluster, stages=stages,
                   scheduler=scheduler, raster=raster, swizzle=swizzle, smem_swizzle=128)


def define(text: str, name: str) -> str:
    """The value a generated source #defines `name` as."""
    line = next(l for l in text.splitlines() if l.split()[:2] == ["#define", name])
    return line.split()[-1]


def joined(program: Program) -> Program:
    """A gated TMA program whose one wgmma spans its gate's and its up's columns."""
    return replace(program, instr=Instr("wgmma", 64, 2 * program.instr.n, 16))


EPILOGUES = (
    Epilogue(),
    Epilogue(bias="n", activation="gelu"),
    Epilogue(bias="m", activation="relu"),
    Epilogue(alpha=0.5, beta=0.75, activation="silu"),
    Epilogue(residual=True),
    Epilogue(alpha=2.0, bias="n", residual=True, out_dtype="f32"),
    Epilogue(out_dtype="bf16", activation="gelu"),
)

# (M, N, K, a_major, b_major): aligned, unaligned M and N (K-contiguous operands), skinny, long-K.
SHAPES = (
    (512, 512, 512, "row", "row"),
    (1000, 1000, 1000, "row", "col"),
    (129, 257, 72, "row", "col"),
    (4097, 127, 256, "row", "col"),
    (256, 384, 520, "col", "row"),
    (1, 4096, 1024, "row", "col"),
    (96, 200, 4096, "col", "col"),
    (256, 256, 8192, "row", "col"),
)

MS_CONFIGS = (
    dict(tile=(128, 128, 32), warps=(2, 2), stages=4),
    dict(tile=(128, 256, 64), warps=(2, 4), stages=3),
    dict(tile=(64, 64, 64), warps=(2, 2), stages=5),
    dict(tile=(64, 128, 32), warps=(2, 4), stages=3, raster="n", swizzle=4),
    dict(tile=(128, 64, 64), warps=(4, 2), stages=4, swizzle=1),
    dict(tile=(256, 128, 32), warps=(4, 2), stages=3),
    dict(tile=(64, 64, 64), warps=(2, 2), stages=4, split_k=4),
    dict(tile=(128, 128, 64), warps=(2, 4), stages=3, split_k=3),
    dict(tile=(64, 64, 64), warps=(4, 1), stages=2),
    dict(tile=(64, 64, 128), warps=(4, 1), stages=5),
    dict(tile=(128, 128, 128), warps=(2, 4), stages=3),
    dict(tile=(64, 128, 128), warps=(1, 4), stages=4, split_k=2),
    dict(tile=(64, 16, 64), warps=(4, 1), stages=4),
    dict(tile=(32, 64, 128), warps=(2, 2), stages=3),
    dict(tile=(64, 32, 64), warps=(2, 2), stages=4, split_k=4),
    dict(tile=(32, 32, 64), warps=(2, 2), stages=6),
    dict(tile=(16, 64, 64), warps=(1, 4), stages=4),
    dict(tile=(128, 128, 64), warps=(2, 2), stages=3, scheduler="persistent"),
    dict(tile=(256, 128, 64), warps=(4, 2), stages=2, scheduler="persistent"),
    dict(tile=(32, 64, 32), warps=(2, 2), stages=4, scheduler="persistent", raster="n", swizzle=4),
    dict(tile=(64, 128, 64), warps=(2, 2), stages=3, scheduler="stream_k"),
    dict(tile=(64, 64, 32), warps=(4, 1), stages=4, scheduler="stream_k", raster="n", swizzle=4),
)


# `instr wgmma`: one or two warpgroups, tiles of 64-deep k, every schedule and split-K.
WGMMA_CONFIGS = (
    dict(tile=(64, 128, 64), warps=(4, 1), stages=4),
    dict(tile=(128, 128, 64), warps=(4, 1), stages=4),
    dict(tile=(128, 256, 64), warps=(8, 1), stages=4),
    dict(tile=(128, 128, 64), warps=(4, 2), stages=3, raster="n", swizzle=4),
    dict(tile=(64, 64, 64), warps=(4, 1), stages=5),
    dict(tile=(128, 64, 64), warps=(8, 1), stages=4, swizzle=1),
    dict(tile=(64, 128, 64), warps=(4, 1), stages=4, split_k=3),
    dict(tile=(128, 128, 64), warps=(8, 1), stages=4, split_k=2),
    dict(tile=(128, 128, 64), warps=(4, 1), stages=4, scheduler="persistent"),
    dict(tile=(64, 256, 64), warps=(4, 1), stages=3, scheduler="persistent", raster="n", swizzle=4),
    dict(tile=(64, 128, 64), warps=(4, 1), stages=4, scheduler="stream_k"),
    dict(tile=(128, 64, 64), warps=(4, 1), stages=5, scheduler="stream_k"),
)


def random_multistage(count: int, seed: int = 6, configs=MS_CONFIGS, wgmma: bool = False) -> list[Program]:
    """Seeded random multistage programs x shapes x epilogues, always including split-K and both majors
    (`configs` and `wgmma`: WGMMA_CONFIGS read by wgmma)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        m, n, k, am, bm = SHAPES[i % len(SHAPES)]
        cfg = dict(configs[rng.randrange(len(configs))], wgmma=wgmma)
        epi = EPILOGUES[rng.randrange(len(EPILOGUES))]
        if cfg.get("split_k", 1) > 1 and rng.random() < 0.5:
            if rng.random() < 0.5:
                cfg["reduce"] = "atomic"
                epi = replace(epi, activation=None, out_dtype="f32")   # the validator's rule for atomics
            else:
                cfg["reduce"] = "unordered"                            # the same kernel, any epilogue
        out.append(multistage(Problem(m, n, k, a_major=am, b_major=bm, epilogue=epi), **cfg))
    return out
