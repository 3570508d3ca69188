"""gemmgen: searched fp16 GEMM kernels (fp32 accumulation) for NVIDIA Hopper.

`gemmgen.compile` and `gemmgen.Kernel` load on first use, so `import gemmgen` stays light.
"""
import importlib

from gemmgen.dsl.ir import Epilogue, Problem, Program
from gemmgen.errors import GemmgenError

__version__ = "0.1.0"

_LAZY = {"compile": ("gemmgen.compile", "compile"), "Kernel": ("gemmgen.kernel", "Kernel")}


def __getattr__(name):
    if name in _LAZY:

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gemmgen' has no attribute {name!r}")


__all__ = ["Epilogue", "GemmgenError", "Kernel", "Problem", "Program", "__version__", "compile"]
