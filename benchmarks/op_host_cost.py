"""Host time per call of a Triton kernel through gemmgen's launcher and its torch op, against torch.mm.

Why: in a compiled model each call brings fresh activation and output tensors, so the
launcher's fast path (the very tensors of the previous call) does not apply; this measures
the path a model takes. Host microseconds per call, launches queued without a sync (the
problems are small enough that the GPU keeps up), median of 7 loops of 200 calls.

    python benchmarks/op_host_cost.py --out benchmarks/results/op_host_cost
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

#: (M, N, K, activation): Llama-1B prefill and decode shapes, x @ W.T.
PROBLEMS = ((2048, 5632, 2048, "silu"), (2048, 2048, 2048, "none"), (8, 2048, 2048, "none"))
CALLS, LOOPS, POOL = 200, 7, 4


def host_us(fn) -> float:
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    loops = []
    for _ in range(LOOPS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        loops.append((time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(loops)


def measure(m: int, n: int, k: int, activation: str) -> dict:
    import torch

    from gemmgen import torch_ops
    from gemmgen.backends import triton as tb
    from gemmgen.dsl import diagnose, to_text
    from gemmgen.dsl.ir import Problem

    problem = Problem(m, n, k, "row", "col", epilogue=torch_ops.epilogue_of(False, False, activation, 1.0, 0.0))
    program = next(p for p in tb.space(problem) if not diagnose(p))
    launcher = tb.load(tb.build(tb.lower(program)), program)
    xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(POOL)]
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    b = w.t()
    outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(POOL)]
    key = torch_ops.kernel_key(m, n, k, "row", "col", False, False, activation, 1.0, 0.0, 0)
    torch_ops._LAUNCHERS[(key, xs[0].stride(), b.stride())] = launcher   # the op's warm path after one checked call
    it = iter(range(1 << 62))

    def fresh():                                    # a different activation each call, as in a model
        return xs[next(it) % POOL]

    def op():
        torch.ops.gemmgen.gemm(fresh(), b, None, None, "row", "col", activation, 1.0, 0.0)

    def launcher_fresh():
        i = next(it) % POOL
        launcher(xs[i], b, outs[i])

    row = {"problem": problem.key, "program": to_text(program),
           "torch_mm_us": host_us(lambda: torch.mm(fresh(), b)),
           "launcher_same_tensors_us": host_us(lambda: launcher(xs[0], b, outs[0])),
           "launcher_fresh_tensors_us": host_us(launcher_fresh),
           "op_us": host_us(op)}
    torch_ops.clear_kernels()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("op_host_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [measure(*p) for p in PROBLEMS]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "op_host_cost.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                                        "calls": CALLS, "loops": LOOPS, "rows": rows}, indent=1))
    cols = ("torch_mm_us", "launcher_same_tensors_us", "launcher_fresh_tensors_us", "op_us")
    print(f"{'problem':34s} " + " ".join(f"{c:>26s}" for c in cols))
    for r in rows:
        print(f"{r['problem']:34s} " + " ".join(f"{r[c]:26.1f}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
