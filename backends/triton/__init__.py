"""The Triton backend: DSL programs lowered to Triton kernels for Hopper (sm_90a).

    lower(program) -> Source     pure: readable Triton module text (lowering.py)
    build(source)  -> Artifact   CPU: ahead-of-time triton.compile to a cubin, no GPU needed
    load(artifact, program)      GPU: the cubin loaded, a thin launcher on torch's current stream
    space(problem) -> [Program]  the candidates an expert would try, best first (search_space.py)

What maps and what is refused (docs/backends.md, "Triton"):
mainloop multistage only. Triton 3.6 ignores `warp_specialize` on Hopper (its
automatic warp specialization is a Blackwell feature), so ws_cooperative and
ws_pingpong cannot be expressed honestly and are refused. scheduler tile is a
pointer kernel pipelined with cp.async; scheduler persistent is one CTA per SM
loading through TMA tensor descriptors. Triton picks the instruction (wgmma),
the shared-memory swizzle and the warp layout itself: `instr auto`,
`smem_swizzle auto`, `cluster 1x1`; `warps WMxWN` counts warps (WM*WN), the
arrangement is Triton's.

The package imports without triton or a GPU: rules.py holds what it supports, build.py
compiles, launch.py (imported on `load`, for torch and triton's driver) launches.
"""
from __future__ import annotations

import os

from gemmgen.backends.base import Artifact
from gemmgen.backends.triton.compiler import ARCH, NAME, TARGET, build, toolchain
from gemmgen.backends.triton.launch import JitLauncher, TritonLauncher
from gemmgen.backends.triton.lowering import lower
from gemmgen.backends.triton.rules import SUPPORT, tma_misaligned
from gemmgen.backends.triton.search_space import space
from gemmgen.dsl.ir import Program

__all__ = ["ARCH", "NAME", "SUPPORT", "TARGET", "build", "load", "lower", "space", "tma_misaligned", "toolchain"]


def load(artifact: Artifact, program: Program):
    """A launcher for `program` on the current CUDA device (needs a GPU).

    GEMMGEN_TRITON_LAUNCH=jit swaps in the JIT fallback (same kernels, Triton's own dispatch).
    """
    # Deferred: the launchers import torch and triton's driver.

    if os.environ.get("GEMMGEN_TRITON_LAUNCH", "aot") == "jit":
        return JitLauncher(artifact, program)
    return TritonLauncher(artifact, program)
