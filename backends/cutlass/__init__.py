"""The CUTLASS backend: DSL programs as CUTLASS 3.x SM90 TMA warp-specialized kernels.

    lower(program)  -> Source    pure: cutlass_library's 3.x emitter + a C-ABI wrapper (emit.py)
    build(source)   -> Artifact  nvcc to a shared library, cached on disk (backends/build.py)
    load(artifact, program) -> Launcher   ctypes, on torch's current stream (runtime.py)
    space(problem)  -> [Program] the expert's candidates, best first (search_space.py)

A program splits into a build key (the digest of its emitted source: tile,
cluster, stages, schedule, tile scheduler, majors, epilogue shape) and runtime
arguments (raster order, swizzle, splits, decomposition, reduction mode, alpha,
beta), so one build serves every program that differs only at runtime. What the backend
refuses, and why, is in rules.py (read by `gemmgen.backends.validate` through SUPPORT).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from functools import lru_cache
from pathlib import Path

from gemmgen.backends.base import Artifact, BackendError, Source, refuse_swapped
from gemmgen.backends.build import cached_build, lookup
from gemmgen.backends.cuda.compile import parse_resources
from gemmgen.backends.cutlass.emit import (
    WRAPPER_ENTRY,
    emit_source,
    instance_spec,
    runtime_args,
)
from gemmgen.backends.cutlass.rules import SUPPORT  # noqa: F401  (the backend contract)
from gemmgen.backends.cutlass.runtime import CutlassLauncher, describe, open_library
from gemmgen.backends.cutlass.search_space import library, space  # noqa: F401  (the backend contract)
from gemmgen.dsl.ir import Program

NAME = "cutlass"
ARCH = "sm_90a"
# Without -DNDEBUG, ptxas serialises the wgmma instructions (CUTLASS's debug asserts).
NVCC_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-shared", "-Xcompiler", "-fPIC",
              "-Xptxas", "-v")
NVCC_TIMEOUT_S = 1800

def lower(program: Program) -> Source:
    """The instance's translation unit; runtime choices stay out, so equal builds share a digest."""
    refuse_swapped(program)
    spec = instance_spec(program)
    return Source(backend=NAME, text=emit_source(spec), entry=WRAPPER_ENTRY, meta={"spec": spec.as_meta})


def build_key(program: Program) -> str:
    """Programs with the same build key run on the same shared library."""
    return lower(program).digest


def include_dir() -> Path:
    """CUTLASS's C++ headers, shipped inside the nvidia-cutlass wheel."""
    try:
        import cutlass_library
    except ImportError:
        raise BackendError("the CUTLASS backend needs `pip install nvidia-cutlass==4.2.0.0` "
                           "(its cutlass_library package and headers)") from None
    path = Path(cutlass_library.__file__).parent / "source" / "include"
    if not (path / "cutlass" / "cutlass.h").exists():
        raise BackendError(f"no CUTLASS headers under {path}; reinstall nvidia-cutlass")
    return path


@lru_cache(maxsize=1)
def toolchain() -> str:
    """nvcc's release and the CUTLASS version: both change the library, so both key the cache."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BackendError("the CUTLASS backend builds with nvcc, which is not on PATH (install the CUDA toolkit)")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    try:
        from importlib.metadata import version
        cutlass_version = version("nvidia-cutlass")
    except Exception:
        cutlass_version = "unknown"
    return f"nvcc-{m.group(1) if m else 'unknown'}+cutlass-{cutlass_version}"


def nvcc_command(source_path: Path, library_path: Path, arch: str = ARCH) -> list[str]:
    num = arch.removeprefix("sm_")
    return [shutil.which("nvcc") or "nvcc", *NVCC_FLAGS, f"-gencode=arch=compute_{num},code=sm_{num}",
            f"-I{include_dir()}", "-o", str(library_path), str(source_path)]


def compile_library(source: Source, key: str, work: Path, arch: str = ARCH) -> Artifact:
    """nvcc one instance to work/instance.so; the log is kept beside it. `work` is the build's
    own temporary folder (backends/build.py renames it into the cache when the build is whole)."""

    cu, so = work / "instance.cu", work / "instance.so"
    cu.write_text(source.text)
    started = time.monotonic()
    try:
        proc = subprocess.run(nvcc_command(cu, so, arch), capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BackendError(f"nvcc took over {NVCC_TIMEOUT_S} s on {cu}") from None
    log = proc.stdout + proc.stderr
    (work / "nvcc.log").write_text(log)
    if proc.returncode != 0:
        errors = [line for line in log.splitlines() if "error" in line]
        raise BackendError(f"nvcc could not compile the CUTLASS instance {cu}: "
                           f"{(errors or log.splitlines() or ['no output'])[0][:400]} (full log: {work / 'nvcc.log'})")
    seconds = time.monotonic() - started
    resources = {name: r.__dict__ for name, r in parse_resources(log).items()}
    meta = {"spec": dict(source.meta.get("spec", {})), "compile_s": round(seconds, 1), "resources": resources,
            **describe(open_library(str(so)))}
    return Artifact(backend=NAME, key=key, path=str(so), meta=meta)


def build(source: Source, arch: str = ARCH) -> Artifact:
    """The shared library for `source`, from the disk cache or nvcc (30-40 s per instance on 2 cores)."""

    if source.backend != NAME:
        raise BackendError(f"the CUTLASS backend cannot build a {source.backend} source")
    return cached_build(source, arch, toolchain(), NVCC_FLAGS,
                        lambda key, work: compile_library(source, key, work, arch))


def load(artifact: Artifact, program: Program):
    """A Launcher for `program` on `artifact` (built from any program with the same build key)."""

    spec = instance_spec(program)
    if artifact.meta.get("spec", spec.as_meta) != spec.as_meta:
        raise BackendError("this CUTLASS artifact was built for another instance (tile, schedule, majors or "
                           "epilogue differ); build the program's own source")
    return CutlassLauncher(library_path(artifact), spec, runtime_args(program))


def library_path(artifact: Artifact) -> str:
    """The artifact's library; found by key under this machine's cache root (and checked
    against its recorded hash there) if the cache moved."""

    if artifact.path and os.path.exists(artifact.path):
        return artifact.path
    moved = lookup(NAME, artifact.key)
    if moved is not None and moved.path:
        return moved.path
    raise BackendError(f"the CUTLASS library {artifact.path} is gone; rebuild it "
                       "(gemmgen build --backend cutlass ...)")
