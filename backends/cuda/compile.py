"""CUDA C text -> sm_90a cubin, with ptxas's resource report; and the SASS of a cubin.

NVRTC (through cuda-bindings) when its library loads, else the `nvcc` on PATH.
Both get the same flags; the report is parsed into per-kernel numbers so tests
and the notes can say "0 bytes spilled" from data, not from eyeballing a log.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from gemmgen.backends.base import BackendError

NVCC_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "-Xptxas", "-v")


@dataclass(frozen=True)
class Resources:
    """ptxas's report for one kernel."""

    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    smem_static: int = 0


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    log: str
    compiler: str
    resources: dict  # kernel name -> Resources


def gencode(arch: str) -> str:
    num = arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def nvrtc_usable() -> bool:
    try:
        from cuda.bindings import nvrtc
        err, _, _ = nvrtc.nvrtcVersion()
        return err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    except Exception:
        return False


def toolchain() -> str:
    """Which compiler builds here, with its version: part of the cache key."""
    if os.environ.get("GEMMGEN_CUDA_COMPILER", "") != "nvcc" and nvrtc_usable():
        # Deferred: cuda (optional, heavy to import).
        from cuda.bindings import nvrtc
        _, major, minor = nvrtc.nvrtcVersion()
        return f"nvrtc-{major}.{minor}"
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "none"
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return f"nvcc-{m.group(1) if m else 'unknown'}"


def compile_cubin(text: str, arch: str = "sm_90a", name: str = "gemm.cu") -> Compiled:
    """Compile with NVRTC where its library loads, else nvcc; raise BackendError with the log on failure."""
    if os.environ.get("GEMMGEN_CUDA_COMPILER", "") != "nvcc" and nvrtc_usable():
        log, cubin = _nvrtc(text, arch, name)
        compiler = "nvrtc"
    else:
        log, cubin = _nvcc(text, arch, name)
        compiler = "nvcc"
    return Compiled(cubin=cubin, log=log, compiler=compiler, resources=parse_resources(log))


def _nvrtc(text: str, arch: str, name: str) -> tuple[str, bytes]:
    # Deferred: cuda (optional, heavy to import).
    from cuda.bindings import nvrtc

    def ok(result):
        err, *rest = result
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BackendError(f"NVRTC failed: {nvrtc.nvrtcGetErrorString(err)[1].decode()}")
        return rest[0] if len(rest) == 1 else rest

    prog = ok(nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []))
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"-DNDEBUG",
            b"--ptxas-options=-v", b"-default-device"]
    err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    size = ok(nvrtc.nvrtcGetProgramLogSize(prog))
    buf = b" " * size
    ok(nvrtc.nvrtcGetProgramLog(prog, buf))
    log = buf.decode(errors="replace").rstrip("\x00")
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BackendError(f"NVRTC could not compile {name}:\n{log[-4000:]}")
    size = ok(nvrtc.nvrtcGetCUBINSize(prog))
    cubin = b" " * size
    ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
    nvrtc.nvrtcDestroyProgram(prog)
    return log, bytes(cubin)


def _nvcc(text: str, arch: str, name: str) -> tuple[str, bytes]:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BackendError("neither NVRTC (pip install nvidia-cuda-nvrtc) nor nvcc is available to compile CUDA C")
    with tempfile.TemporaryDirectory(prefix="gemmgen_cuda_") as tmp:
        src, out = os.path.join(tmp, name), os.path.join(tmp, "out.cubin")
        with open(src, "w") as f:
            f.write(text)
        cmd = [nvcc, "-cubin", gencode(arch), *NVCC_FLAGS, "-o", out, src]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise BackendError(f"nvcc could not compile {name}:\n{log[-4000:]}")
        with open(out, "rb") as f:
            return log, f.read()


_FUNC = re.compile(r"Compiling entry function '([^']+)'|Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_resources(log: str) -> dict:
    """Per-kernel registers, stack and spills from ptxas -v output (nvcc or NVRTC)."""
    out: dict[str, Resources] = {}
    current, stack = None, (0, 0, 0)
    for line in log.splitlines():
        m = _FUNC.search(line)
        if m:
            current = m.group(1) or m.group(2)
            continue
        m = _STACK.search(line)
        if m and current:
            stack = tuple(int(x) for x in m.groups())
            continue
        m = _REGS.search(line)
        if m and current:
            out[current] = Resources(int(m.group(1)), *stack, smem_static=int(m.group(2) or 0))
            stack = (0, 0, 0)
    return out


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    try:
        import triton
        cand = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        if os.path.exists(cand):
            return cand
    except ImportError:
        pass
    raise BackendError(f"{name} not found (install the CUDA toolkit or triton, which ships one)")


def sass(cubin: bytes) -> str:
    """The disassembly of a cubin (cuobjdump --dump-sass)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        proc = subprocess.run([_tool("cuobjdump"), "--dump-sass", f.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BackendError(f"cuobjdump failed: {proc.stderr.strip()}")
    return proc.stdout


def sass_summary(text: str) -> dict[str, int]:
    """Counts of the opcodes that say whether a GEMM kernel is on the fast path."""
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text)
    def count(prefix: str) -> int:
        return sum(1 for op in ops if op == prefix or op.startswith(prefix + "."))
    names = ("HGMMA", "HMMA", "LDSM", "LDGSTS", "UTMALDG", "SYNCS", "LDL", "STL",
             "ATOMG", "UCGABAR_ARV")     # global atomics (split-K in arrival order), cluster barriers
    return {name: count(name) for name in names}
