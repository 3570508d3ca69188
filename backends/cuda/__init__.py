"""The raw CUDA C backend: our own sm_90a kernels, generated from the program.

Three families, chosen by the program's `mainloop`:
  * multistage      - cp.async + ldmatrix + mma.sync m16n8k16, or wgmma from the same
                      ring (multistage.py)
  * ws_cooperative  - TMA + mbarrier pipeline + wgmma, warp-specialized and
    ws_pingpong       persistent (hopper.py)
  * direct          - operands from global memory straight into mma.sync registers, K split
                      over CTAs: skinny products under swap_ab, the weight as A (direct.py)
All but direct take the gated epilogue.
lower() is pure (program -> CUDA C text), build() compiles to an sm_90a cubin on
the CPU (NVRTC, else nvcc) and caches it on disk, load() needs the GPU.
"""
from __future__ import annotations

import importlib

from gemmgen.backends.base import Artifact, BackendError, Source, Support, refuse_swapped
from gemmgen.backends.build import cached_build
from gemmgen.backends.cuda.compile import (
    NVCC_FLAGS,
    compile_cubin,
    sass,
    sass_summary,
    toolchain,
)
from gemmgen.backends.cuda.launch import index_rules
from gemmgen.backends.cuda.search_space import space
from gemmgen.dsl.ir import CLUSTER_REDUCE, INPUT_DTYPES, Program

from gemmgen.errors import NoGPUError

NAME = "cuda"

_FAMILIES = {"multistage": "gemmgen.backends.cuda.multistage",
             "ws_cooperative": "gemmgen.backends.cuda.hopper",
             "ws_pingpong": "gemmgen.backends.cuda.hopper",
             "direct": "gemmgen.backends.cuda.direct"}
# The mainloops whose split-K slices of a tile can run as one cluster and sum in shared memory.
CLUSTER_SUM_MAINLOOPS = ("direct", "multistage", "ws_cooperative")


def _family(program: Program):
    try:
        return importlib.import_module(_FAMILIES[program.mainloop])
    except KeyError:
        raise BackendError(f"backend cuda has no mainloop {program.mainloop!r}") from None


def _family_rules(program: Program) -> list[tuple[str, str]]:
    """Dispatch to the rules of the program's family (what it refuses, and why)."""
    if program.mainloop not in _FAMILIES:
        return []  # SUPPORT.mainloops already refuses it
    out = []
    if program.problem.c_major != "row" and program.mainloop not in ("direct", "ws_cooperative"):
        out.append(("gemm", f"backend cuda's mainloop {program.mainloop} writes row-major outputs only: write c=row "
                            "(mainloops direct and ws_cooperative store C either way)"))
    if program.cluster_sum and program.mainloop not in CLUSTER_SUM_MAINLOOPS:
        out.append(("split_k", f"backend cuda sums split-K partials across a cluster in mainloops "
                               f"{', '.join(CLUSTER_SUM_MAINLOOPS)}: write `split_k {program.split_k} workspace` "
                               f"for mainloop {program.mainloop}"))
    if program.problem.epilogue.gate and program.mainloop == "direct":
        out.append(("mainloop", f"backend cuda lowers a gated epilogue (gate={program.problem.epilogue.gate}) in mainloop "
                                "multistage or the TMA family, not direct: write `mainloop multistage` with `scheduler "
                                "tile` (e.g. tile 64x64x64, warps 2x2, instr mma 16x8x16, stages 3) or `mainloop "
                                "ws_cooperative` (tile 128x128x64, warps 8x1)"))
        return out
    return out + _family(program).rules(program) + index_rules(program)


SUPPORT = Support(
    mainloops=frozenset(_FAMILIES),
    schedulers=frozenset({"tile", "persistent", "stream_k"}),
    instr_kinds=frozenset({None, "mma", "wgmma"}),
    split_k_reduces=frozenset({"workspace", "atomic", "unordered", CLUSTER_REDUCE}),   # cluster: CLUSTER_SUM_MAINLOOPS
    activations=frozenset({"relu", "gelu", "silu"}),
    bias=True,
    residual=True,
    beta=True,
    gated=True,          # multistage (scheduler tile, split_k 1: multistage.gate_rules) and the TMA family
    max_cluster=2,
    smem_swizzles=frozenset({None, 128}),
    auto_stages=True,
    majors_a=frozenset({"row", "col"}),
    majors_b=frozenset({"row", "col"}),
    majors_c=frozenset({"row", "col"}),   # col: direct, and the TMA family's cluster sum (_family_rules)
    out_dtypes=frozenset({"f16", "bf16", "f32"}),
    in_dtypes=frozenset(INPUT_DTYPES),
    extra_rules=(_family_rules,),
)


def lower(program: Program) -> Source:
    """Program -> CUDA C text (pure). Refuses what SUPPORT refuses, with the rule's message."""
    refuse_swapped(program)
    if program.backend != NAME:
        raise BackendError(f"program is for backend {program.backend!r}, not {NAME!r}")
    problems = _family_rules(program)
    if problems:
        field, msg = problems[0]
        raise BackendError(f"{field}: {msg}")
    fam = _family(program)
    return Source(backend=NAME, text=fam.lower_text(program), entry=fam.ENTRY,
                  meta={"mainloop": program.mainloop, "entries": fam.entries(program)})


def build(source: Source, arch: str = "sm_90a") -> Artifact:
    """Compile to an sm_90a cubin on the CPU, through the shared disk cache (backends/build.py)."""

    def compile_fn(key: str, work_dir) -> Artifact:
        name = f"gemmgen_{source.digest}.cu"
        (work_dir / name).write_text(source.text)
        compiled = compile_cubin(source.text, arch=arch, name=name)
        (work_dir / "kernel.cubin").write_bytes(compiled.cubin)
        (work_dir / "ptxas.log").write_text(compiled.log)
        meta = {"arch": arch, "compiler": compiled.compiler, "entries": tuple(source.meta["entries"]),
                "resources": {k: vars(v) for k, v in compiled.resources.items()}}
        return Artifact(backend=NAME, key=key, path=str(work_dir / "kernel.cubin"), data=compiled.cubin, meta=meta)

    return cached_build(source, arch, toolchain(), NVCC_FLAGS, compile_fn)


def load(artifact: Artifact, program: Program):
    """A launcher for the built program on the current CUDA device (needs the GPU)."""
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        raise NoGPUError("loading a cuda-backend kernel")
    if artifact.data is None:
        with open(artifact.path, "rb") as f:
            artifact = Artifact(backend=artifact.backend, key=artifact.key, path=artifact.path,
                                data=f.read(), meta=artifact.meta)
    return _family(program).launcher(artifact, program)




def compile_program(program: Program, arch: str = "sm_90a") -> Artifact:
    """lower + build in one call: the common path for tools and tests."""
    return build(lower(program), arch=arch)


def kernel_report(artifact: Artifact) -> dict:
    """Per-kernel registers/stack/spills (from ptxas) and SASS opcode counts of a built program."""
    return {"resources": artifact.meta.get("resources", {}), "sass": sass_summary(sass(artifact.data))}


__all__ = ["NAME", "SUPPORT", "build", "compile_program", "kernel_report", "load", "lower", "space"]
