"""A ~1 B-parameter Llama-style decoder under torch.compile: gemmgen against inductor.

GPU only (an H200). Random weights, fp16, eval. Cases: prefill 1 x 2048 and 8 x 512 tokens,
and one decode step for a batch of 8 over a static KV cache holding 512 tokens. Variants:
eager, torch.compile default (inductor), torch.compile(backend="gemmgen"), and
torch.compile(mode="max-autotune") while the time budget lasts (its CUDA graphs included:
that is what the mode does).

Per case and variant: max relative error of the logits against eager (max |out - ref| /
max |ref|; eager runs once for it when it is not among the variants), compile time (the
first call, wall clock), device time per call (CUDA events around a loop of calls, median of
repeats; a case's variants take turns loop by loop in a balanced order, each timed loop after
an untimed one of its own variant: `time_interleaved`), the speedup over the default with its
95 % intervals from the paired repeats (`vs_default`: the median of the per-repeat ratios and the ratio of the medians, as the
harness judges kernels, gemmgen.measure.comparison), and, unless --no-profile, where
the device time goes (GEMM / attention / other kernels, the device's idle share and the
host's busiest operations, from three profiled calls; --trace keeps their Chrome traces).
Writes results.json and llama_compile.png under --out and prints a table last.

    python benchmarks/llama_compile.py --out benchmarks/results/llama_compile
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compile_timing import (  # noqa: E402 - this folder's model timing, shared with model_e2e.py
    ATTENTION_WORDS,
    GEMM_WORDS,
    ModelCase,
    gemmgen_report,
    gemmgen_reset,
    max_rel_err,
    sync,
    time_interleaved,
    time_variants,
    versus,
)

CASES = (("prefill_b1_s2048", "prefill", 1, 2048), ("prefill_b8_s512", "prefill", 8, 512),
         ("decode_b8_kv512", "decode", 8, 512))
VARIANTS = ("eager", "inductor", "control", "gemmgen", "gemmgen-graphs", "max-autotune")
#: "control" is the default compiled again: timed beside it, it says what "level" reads as.
#: "gemmgen-graphs" is gemmgen with inductor's CUDA graphs (what max-autotune's mode adds), no joins.
DEFAULT_VARIANTS = ("eager", "inductor", "gemmgen", "max-autotune")
#: this benchmark's profile classes: GEMM words matched first, then attention, the rest "other"
KERNEL_CLASSES = (("gemm", GEMM_WORDS), ("attention", ATTENTION_WORDS))
__all__ = ["time_interleaved", "versus"]     # shared pieces the tests reach through this script


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for results.json and the plot")
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="wall-clock budget; max-autotune is skipped once it would overrun (default 300)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--iters", type=int, default=20, help="calls per timed loop (decode: 5x this)")
    p.add_argument("--repeats", type=int, default=15,
                   help="timed loops per variant, in turns (10 or more give the vs_default intervals)")
    p.add_argument("--cases", default=",".join(c[0] for c in CASES))
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"some of {','.join(VARIANTS)} (control: the default compiled again; "
                        "gemmgen-graphs: gemmgen with CUDA graphs)")
    p.add_argument("--db", default=None, help="gemmgen tuning database (default: GEMMGEN_DB or ~/.cache)")
    p.add_argument("--baseline", choices=("stock", "op"), default="stock",
                   help="gemmgen option: untuned matmuls stay with inductor (stock) or use gemmgen's fallback")
    p.add_argument("--min-gain-us", type=float, default=5.0,
                   help="gemmgen option: least device time a tuned kernel must save per call (default 5)")
    p.add_argument("--join-siblings", action="store_true",
                   help="gemmgen option: join q/k/v and gate/up matmuls where the database's times say it pays")
    p.add_argument("--tune-budget", type=int, default=0, metavar="N",
                   help="before timing, tune the problems gemmgen lacks with N trials each (default 0: no tuning)")
    p.add_argument("--tune-time-s", type=float, default=240.0, help="time budget of that tuning (default 240)")
    p.add_argument("--tune-backends", default="triton",
                   help="backends that tuning proposes (default triton: builds in seconds; a CUTLASS build "
                        "takes about a minute, and with 40 s to tune, a run with all backends recorded nothing); "
                        "add cublaslt to search cuBLASLt's own algorithms first")
    p.add_argument("--no-warm", action="store_true",
                   help="time each loop straight after the previous variant's, with no untimed loop of its "
                        "own first (the power cap then carries one variant's draw into the next one's clock)")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--trace", action="store_true", help="also write each profiled loop's Chrome trace (gzipped)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke test of this script with a tiny --hidden/--layers model (wall-clock timing)")
    return p.parse_args(argv)


def build_model(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(cfg)
    return model.to(torch.float16).eval(), cfg


def compiled(model, variant: str, args):
    import torch

    if variant == "eager":
        return model
    if variant in ("inductor", "control"):
        return torch.compile(model, dynamic=False)
    if variant == "max-autotune":
        return torch.compile(model, mode="max-autotune", dynamic=False)
    options = {"baseline": args.baseline, "min_gain_us": args.min_gain_us, "join_siblings": args.join_siblings}
    if args.device == "cpu":
        options["devices"] = ("cuda", "cpu")     # the CPU reference op: exercises the rewrite only
    if args.db:
        options["db"] = args.db
    if variant == "gemmgen-graphs":      # joins are refused with CUDA graphs (docs/torch_compile.md)
        options.update(join_siblings=False, inductor={"triton.cudagraphs": True})
    return torch.compile(model, backend="gemmgen", dynamic=False, options=options)


class Case(ModelCase):
    """A case of this benchmark: decode steps are short, so a timed loop takes 5x the calls."""

    def __init__(self, name, kind, batch, tokens, model, cfg, iters: int):
        super().__init__(name, kind, batch, tokens, model, cfg, iters * (5 if kind == "decode" else 1))


def prepare_variant(case: Case, variant: str, args, ref) -> tuple[dict, tuple, object]:
    """Compile one variant and check its first output: (row so far, (call, reset), output)."""
    import torch

    from torch._dynamo.utils import counters

    counters.clear()
    gemmgen_reset()
    fn = compiled(case.model, variant, args)
    call, reset = case.call_for(fn)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = call().float().clone()
        sync()
    row = {"case": case.name, "variant": variant, "compile_s": round(time.perf_counter() - t0, 2),
           "dynamo_graphs": counters["stats"]["unique_graphs"]}     # > 1 per graph break or recompile
    row["max_rel_err"] = None if ref is None else max_rel_err(out, ref)
    if not math.isfinite(row["max_rel_err"] or 0.0):
        row["note"] = "non-finite error"
    if variant.startswith("gemmgen"):
        row.update(gemmgen_report())
    return row, (call, reset), out


def run_variants(case: Case, variants: list[str], args, refs: dict) -> list[dict]:
    """Compile every variant of a case, then time them in turns, then profile each."""
    import torch

    torch._dynamo.reset()
    rows, calls = [], []
    if "eager" not in variants:          # the reference all the same, untimed
        refs[case.name] = prepare_variant(case, "eager", args, None)[2]
    for variant in variants:
        row, call, out = prepare_variant(case, variant, args, refs.get(case.name))
        if variant == "eager":
            refs[case.name] = out
        rows.append(row)
        calls.append(call)
    traces = [Path(args.out) / f"trace_{case.name}_{v}.json.gz" if args.trace else None for v in variants]
    timed = time_variants(calls, case.iters, args.repeats, cuda=args.device == "cuda", warm=not args.no_warm,
                          profile=not args.no_profile and args.device != "cpu", classes=KERNEL_CLASSES,
                          traces=traces)
    default = timed[variants.index("inductor")]["times_ms"] if "inductor" in variants else None
    for row, measured in zip(rows, timed):
        row.update(measured)
        row["vs_default"] = (versus(row["times_ms"], default) if default is not None and row["variant"] != "inductor"
                             else None)
    return rows


def pretune(cases, args) -> dict:
    """Compile each case with gemmgen once, collect the problems without a tuned kernel, tune them."""
    import torch

    from gemmgen.torch_compile import backend as torch_backend

    keys: dict = {}
    for case in cases:
        torch._dynamo.reset()
        torch_backend.reset_stats()
        with torch.no_grad():
            case.call_for(compiled(case.model, "gemmgen", args))[0]()
        keys.update(dict.fromkeys(torch_backend.missing_keys()))
    torch._dynamo.reset()
    t0 = time.perf_counter()
    backends = [b for b in args.tune_backends.split(",") if b]
    reports = (torch_backend.tune_keys(list(keys), args.db, args.tune_budget, args.tune_time_s, backends=backends)
               if keys else {})
    from gemmgen.torch_compile import ops as torch_ops
    from gemmgen.tune import reports_summary

    return {"problems": [torch_ops.problem_key(k) for k in keys], "tune_s": round(time.perf_counter() - t0, 1),
            "report": reports_summary(reports, empty="nothing to tune")}


def plot(rows, path: Path) -> None:
    import matplotlib

    from gemmgen.measure.plots import save_png

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        base = {r["case"]: r["device_ms"] for r in rows if r["variant"] == "inductor"}
        vals = [next((base[c] / r["device_ms"] for r in rows if r["case"] == c and r["variant"] == v
                      and c in base), 0.0) for c in cases]
        ax.bar([j + i * width for j in range(len(cases))], vals, width, label=v)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases)
    ax.set_ylabel("speedup over torch.compile default")
    ax.set_title("Llama-style ~1B decoder, fp16, H200 (higher is better)")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        print("llama_compile: needs a CUDA GPU (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, cfg = build_model(args)
    n_params = sum(p.numel() for p in model.parameters())
    variants = [v for v in args.variants.split(",") if v]
    rows, notes, tuning = [], [], None
    selected = [c for c in CASES if c[0] in args.cases.split(",")]
    if args.tune_budget > 0 and "gemmgen" in variants:
        tuning = pretune([Case(*c, model, cfg, iters=1) for c in selected], args)
        print(f"tuned {len(tuning['problems'])} problems in {tuning['tune_s']} s: {tuning['report']}", flush=True)
    cases = [Case(*c, model, cfg, iters=args.iters) for c in selected]
    refs: dict = {}

    def run(case, group):
        for row in run_variants(case, group, args, refs):
            rows.append(row)
            print(f"  {case.name:18s} {row['variant']:14s} {row['device_ms']:9.3f} ms  compile {row['compile_s']:7.1f} s",
                  flush=True)

    # Every variant of a case is compiled first, then all are timed in turns (so each gets the
    # paired intervals against the default). max-autotune compiles for minutes: a case takes
    # it only while the budget lasts, judged by the last case's compile.
    estimate = 180.0                       # seconds of max-autotune compile until one is measured
    for case in cases:
        group = [v for v in variants if v != "max-autotune"]
        if "max-autotune" in variants:
            elapsed = time.perf_counter() - start
            if elapsed + estimate > args.budget_s:
                notes.append(f"{case.name}: max-autotune skipped ({elapsed:.0f} s spent, about {estimate:.0f} s "
                             f"more needed, budget {args.budget_s:.0f} s)")
            else:
                group.append("max-autotune")
        run(case, group)
        estimate = next((r["compile_s"] for r in reversed(rows) if r["variant"] == "max-autotune"), estimate)
        busy = "; ".join(f"{b['cpu_s']:.1f} cpu-s {'(this process)' if b['self'] else b['cmd'][:60]}"
                         for b in (rows[-1].get("host_load") or {}).get("busiest", [])[:3])
        print(f"  busiest processes while {case.name} was timed: {busy or '-'}", flush=True)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (smoke test)"
    result = {"gpu": gpu, "torch": torch.__version__,
              "transformers": transformers.__version__, "params": n_params, "args": vars(args),
              "wall_s": round(time.perf_counter() - start, 1), "notes": notes, "tuning": tuning, "rows": rows}
    (out_dir / "results.json").write_text(json.dumps(result, indent=2))
    plot(rows, out_dir / "llama_compile.png")
    print_table(result)
    return 0


def print_table(result) -> None:
    order = {name: i for i, (name, *_rest) in enumerate(CASES)}
    rows = sorted(result["rows"], key=lambda r: (order[r["case"]], VARIANTS.index(r["variant"])))
    base = {r["case"]: r["device_ms"] for r in rows if r["variant"] == "inductor"}
    print(f"\n{result['gpu']}, torch {result['torch']}, {result['params'] / 1e9:.2f} B params, "
          f"{result['wall_s']} s")
    for note in result["notes"]:
        print("note:", note)
    print(f"{'case':18s} {'variant':14s} {'ms/call':>9s} {'best':>8s} {'spread':>6s} {'vs default':>10s} "
          f"{'per-repeat 95 %':>15s} {'max rel err':>11s} "
          f"{'compile s':>9s} {'gemm/attn/other/idle ms per call':>33s}  gemmgen")
    for r in rows:
        speed = f"{base[r['case']] / r['device_ms']:.3f}x" if r["case"] in base else "-"
        err = "-" if r["max_rel_err"] is None else f"{r['max_rel_err']:.2e}"
        sp = r["split"]
        split = "-" if not sp else (f"{sp['gemm_ms']:.3f}/{sp['attention_ms']:.3f}/{sp['other_ms']:.3f}/"
                                    f"{sp.get('idle_ms', float('nan')):.3f}")
        rep = ""
        if "gemmgen" in r:
            g = r["gemmgen"]
            rep = f"replaced {sum(g['replaced'].values())}, left {g['skipped']}"
            if g.get("joins"):
                rep += f", joins {g['joins']} ({r.get('joined_weights_mib', 0)} MiB of joined weights)"
        if r.get("launch_ms") is not None:
            rep = f"launch {r['launch_ms']:.2f} ms  " + rep
        clk = r.get("clocks") or {}
        if clk.get("samples"):
            rep = f"SM {clk['sm_mhz_median']} MHz ({','.join(clk['reasons']) or 'no cap'})  " + rep
        best = f"{r['best_ms']:8.3f}" if r.get("best_ms") else f"{'-':>8s}"
        vs = r.get("vs_default")
        interval = f"{vs['median_ratio'][0]:.3f}-{vs['median_ratio'][2]:.3f}" if vs else "-"
        print(f"{r['case']:18s} {r['variant']:14s} {r['device_ms']:9.3f} {best} {r['spread']:6.2f} {speed:>10s} "
              f"{interval:>15s} {err:>11s} "
              f"{r['compile_s']:9.1f} {split:>33s}  {rep}")


if __name__ == "__main__":
    sys.exit(main())
