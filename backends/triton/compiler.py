"""Build: Triton modules compiled ahead of time to sm_90a cubins, without a GPU; triton
is imported inside the functions, so that reading the backend needs no triton."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from gemmgen.backends import build as builds
from gemmgen.backends.base import Artifact, BackendError, Source
from gemmgen.dsl.hardware import SM90A

NAME = "triton"
ARCH = "sm_90a"
TARGET = ("cuda", 90, 32)   # triton's GPUTarget for sm_90a; compiles without a GPU


def toolchain() -> str:
    # Deferred: triton (optional, heavy to import).
    import triton

    return f"triton-{triton.__version__}"


def import_text(text: str, name: str, directory: Path):
    """Import generated text from a real file: triton's JIT reads kernel source through inspect."""
    path = directory / f"{name}.py"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # dataclass/inspect lookups inside triton expect a registered module
    spec.loader.exec_module(module)
    return module


def _json_metadata(compiled) -> dict:
    meta = compiled.metadata._asdict()
    meta["target"] = {"backend": meta["target"].backend, "arch": meta["target"].arch,
                      "warp_size": meta["target"].warp_size}
    return json.loads(json.dumps(meta, default=lambda o: list(o) if isinstance(o, (tuple, set)) else str(o)))


def compile_kernels(source: Source, directory: Path, hinted: bool = True) -> list[dict]:
    """triton.compile every kernel of the module for sm_90a; one dict (cubin, metadata) per kernel.

    `hinted=False` drops the divisibility hints (the variant a shape-generic program
    falls back to when called with unaligned strides).
    """
    os.environ.setdefault("TRITON_CACHE_DIR", str(builds.cache_root() / "work" / "triton-cache"))
    # Deferred: triton (optional, heavy to import).
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = import_text(source.text, f"gemmgen_triton_{source.digest}", directory)
    built = []
    for k in source.meta["kernels"]:
        fn = getattr(module, k["name"])
        signature = {name: ty for name, ty, _ in k["params"]}
        hints = k["hints"] if hinted else {n: v for n, v in k["hints"].items() if n not in k["assumed"]}
        attrs = {(i,): [["tt.divisibility", hints[name]]]
                 for i, (name, _, _) in enumerate(k["params"]) if name in hints}
        compiled = triton.compile(ASTSource(fn, signature, constexprs=dict(k["constexprs"]), attrs=attrs),
                                  target=GPUTarget(*TARGET),
                                  options={"num_warps": k["num_warps"], "num_stages": k["num_stages"]})
        shared = compiled.metadata.shared
        if shared > SM90A.max_smem_per_block:
            raise BackendError(f"{k['name']} needs {shared} B of shared memory, more than the "
                               f"{SM90A.max_smem_per_block} B a CTA may use: use fewer stages or a smaller tile")
        suffix = "" if hinted else ".unhinted"
        (directory / f"{k['name']}{suffix}.ptx").write_text(compiled.asm["ptx"])
        (directory / f"{k['name']}{suffix}.cubin").write_bytes(compiled.asm["cubin"])
        built.append({"name": compiled.metadata.name, "cubin": compiled.asm["cubin"],
                      "metadata": _json_metadata(compiled)})
    return built


def build(source: Source, arch: str = ARCH) -> Artifact:
    """Compile ahead of time to sm_90a cubins (cached on disk; no GPU needed)."""
    if source.backend != NAME:
        raise BackendError(f"the triton backend cannot build a {source.backend} source")
    if arch != ARCH:
        raise BackendError(f"the triton backend targets {ARCH} only, not {arch}")
    def compile_fn(key: str, directory: Path) -> Artifact:
        kernels = compile_kernels(source, directory)
        return Artifact(backend=NAME, key=key, path=str(directory),
                        meta={"kernels": tuple(kernels), "source": source, "arch": arch})

    return builds.cached_build(source, arch, toolchain(), (), compile_fn)
