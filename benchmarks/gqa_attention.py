"""Causal attention of grouped-query models: K and V repeated to every query head, against SDPA's
`enable_gqa=True`, which reads each KV head once for its group.

transformers repeats K and V (`repeat_kv`) whenever it hands SDPA a mask, which it always does
under tracing; once the mask is proven causal (gemmgen's torch pass), the repeat is no longer
needed. This times both forms, eager and under inductor, at the prefill shapes of the model
benchmark, with the kernels each runs. Times are medians of CUDA graph replays (no host cost,
which would hide the device time of a compiled call this short; L2 not flushed).

    python3 benchmarks/gqa_attention.py --out benchmarks/results/gqa_attention
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: (name, query heads, KV heads, head dim) of the model benchmark's decoders
MODELS = (("llama3_8b", 32, 8, 128), ("qwen2_5_7b", 28, 4, 128))
#: (batch, sequence) of the model benchmark's prefill cases
CASES = ((1, 2048), (8, 512))


def repeated(q, k, v):
    import torch
    groups = q.shape[1] // k.shape[1]
    b, h, s, d = k.shape
    k = k[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)
    v = v[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def grouped(q, k, v):
    import torch
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def kernels(fn, args) -> list:
    """Names of the CUDA kernels one call runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sorted({e.name[:120] for e in prof.events() if e.device_type.name == "CUDA"})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args(argv)
    import torch
    from triton.testing import do_bench_cudagraph
    if not torch.cuda.is_available():
        print("gqa_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    forms = {"repeated": repeated, "grouped": grouped}
    compiled = {name: torch.compile(fn) for name, fn in forms.items()}
    for model, hq, hkv, d in MODELS:
        for batch, seq in CASES:
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(batch, h, seq, d, device="cuda", dtype=torch.float16, generator=gen)
                       for h in (hq, hkv, hkv))
            # transformers' layout: (b, s, h, d) projections transposed to (b, h, s, d)
            q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
            reference = repeated(q.double(), k.double(), v.double())
            for mode, table in (("eager", forms), ("inductor", compiled)):
                for name, fn in table.items():
                    out = fn(q, k, v)
                    err = ((out.double() - reference).abs().max() / reference.abs().max()).item()
                    ms = do_bench_cudagraph(lambda: fn(q, k, v), rep=args.reps, return_mode="median")
                    row = {"model": model, "batch": batch, "seq": seq, "mode": mode, "form": name,
                           "ms": round(ms, 4), "max_rel_err": err, "kernels": kernels(fn, (q, k, v))}
                    rows.append(row)
                    print(f"{model:11s} {batch}x{seq:<5d} {mode:8s} {name:8s} {ms:8.4f} ms  err {err:.1e}  "
                          f"{'; '.join(row['kernels'])[:160]}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "command": "python3 " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
