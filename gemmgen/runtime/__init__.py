"""The runtime: what a served kernel runs besides a backend's own launcher.

- `tensors`: dtypes and operands laid out in a problem's majors;
- `epilogue`: the one torch reference of the epilogue (alpha, beta, bias, activation,
  residual), as the checks' fp32 reference and as the in-place ops a user would write;
- `torch_call`: torch.matmul with that epilogue, the fallback every winner was measured against;
- `cublaslt`: a recorded cuBLASLt algorithm called directly (one cublasLtMatmul per product).

Every module here needs torch; the face imports them when a kernel is loaded.
"""
