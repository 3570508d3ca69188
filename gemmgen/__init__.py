"""gemmgen: searched fp16 GEMM kernels (fp32 accumulation) for NVIDIA Hopper."""
from gemmgen.dsl.ir import Epilogue, Problem, Program
from gemmgen.errors import GemmgenError

__version__ = "0.1.0"

__all__ = ["Epilogue", "GemmgenError", "Problem", "Program", "__version__"]
