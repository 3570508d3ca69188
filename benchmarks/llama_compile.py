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
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

CASES = (("prefill_b1_s2048", "prefill", 1, 2048), ("prefill_b8_s512", "prefill", 8, 512),
         ("decode_b8_kv512", "decode", 8, 512))
VARIANTS = ("eager", "inductor", "control", "gemmgen", "gemmgen-graphs", "max-autotune")
#: "control" is the default compiled again: timed beside it, it says what "level" reads as.
#: "gemmgen-graphs" is gemmgen with inductor's CUDA graphs (what max-autotune's mode adds), no joins.
DEFAULT_VARIANTS = ("eager", "inductor", "gemmgen", "max-autotune")
GEMM_WORDS = ("gemm", "nvjet", "cutlass", "xmma", "wgmma", "triton_tem", "gemmgen", "matmul", "_mm_")
ATTN_WORDS = ("flash", "fmha", "attention", "sdpa", "efficient")


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


class Case:
    """Inputs and the call for one case; decode re-prefills a fresh static cache per variant."""

    def __init__(self, name, kind, batch, tokens, model, cfg, iters: int):
        import torch

        self.name, self.kind, self.batch, self.tokens = name, kind, batch, tokens
        self.device = device = next(model.parameters()).device
        g = torch.Generator(device=device).manual_seed(1)
        self.ids = torch.randint(0, cfg.vocab_size, (batch, tokens), device=device, generator=g)
        self.step_ids = torch.randint(0, cfg.vocab_size, (batch, 1), device=device, generator=g)
        self.model, self.cfg = model, cfg
        self.iters = iters * (5 if kind == "decode" else 1)   # decode steps are short: time more of them
        self.steps = self.iters + 4                           # cache slots a timed loop fills

    def call_for(self, fn):
        """(call, reset): reset puts a decode cache back at `tokens` cached tokens (not timed)."""
        import torch

        if self.kind == "prefill":
            return (lambda: fn(input_ids=self.ids, use_cache=False).logits), (lambda: None)
        from transformers import StaticCache

        cache = StaticCache(config=self.cfg, max_cache_len=self.tokens + self.steps + 8)
        with torch.no_grad():
            self.model(input_ids=self.ids, past_key_values=cache, use_cache=True)   # eager prefill
        pos = torch.full((self.batch, 1), self.tokens, device=self.device, dtype=torch.long)
        cache_position = torch.tensor([self.tokens], device=self.device)

        def reset():
            for layer in getattr(cache, "layers", ()):
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                    layer.cumulative_length.fill_(self.tokens)   # transformers >= 5.x keeps a counter

        return (lambda: fn(input_ids=self.step_ids, past_key_values=cache, use_cache=True, position_ids=pos,
                           cache_position=cache_position).logits), reset


def time_interleaved(calls: list, iters: int, repeats: int, samplers: list | None = None,
                     warm: bool = True) -> list[list[float]]:
    """Per (call, reset): ms per call of each repeat, in repeat order (so repeat r of every
    call was timed in the same turn).

    CUDA events around loops of `iters` calls; the events enclose the host's launches too
    (decode steps are bound by them). The variants take turns, one loop each per repeat. The
    H200 machine's host speed drifted by up to 2x from one block of loops to the next (two
    compiles of one graph measured 5.1 and 9.4 ms per decode step in one run); turns spread a
    slow spell over every variant instead of charging it to one. The power cap carries what
    ran before into a loop's clock, so with `warm` each timed loop follows an untimed loop of
    its own variant (each is timed in its own steady state, as a model serving runs), and the
    order of the turns is balanced (`turn_orders`). `samplers` (one ClockSampler per call)
    read the SM clock at the end of each loop's launches."""
    from gemmgen.measure.turns import in_turns

    for call, reset in calls:
        reset()
        for _ in range(3):
            call()
    times: list[list[float]] = [[] for _ in calls]
    gc.collect()
    gc.disable()          # as timeit does: a collection inside a host-bound loop is not the model's cost
    try:
        for _, i in in_turns(range(len(calls)), repeats):
            if warm:
                _timed_loop(*calls[i], iters)
            times[i].append(_timed_loop(*calls[i], iters, samplers[i] if samplers else None))
    finally:
        gc.enable()
    return times


def versus(times: list[float], reference: list[float]) -> dict | None:
    """reference/variant over repeats taken in the same turns: the median per-repeat ratio and
    the ratio of medians, each with a 95 % interval; None with too few repeats. A speedup is
    beyond noise when both intervals lie above 1."""
    from gemmgen.measure.comparison import MIN_PAIRS, median_interval, ratio_of_medians_interval

    rounds = [(t, r) for t, r in zip(times, reference) if t > 0 and r > 0]
    if len(rounds) < MIN_PAIRS:
        return None
    return {"repeats": len(rounds),
            "median_ratio": [round(x, 4) for x in median_interval([r / t for t, r in rounds])],
            "ratio_of_medians": [round(x, 4) for x in ratio_of_medians_interval(rounds)]}


def _timed_loop(call, reset, iters: int, sampler=None) -> float:
    """Mean ms a call over `iters` calls after `reset()`, from an idle GPU (so a host-bound
    variant cannot hide behind work queued before the loop)."""
    import torch

    from gemmgen.measure.turns import loop_ms

    reset()
    if not torch.cuda.is_available():            # the CPU smoke test: wall clock
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        return (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda.synchronize()
    return loop_ms(lambda i: call(), iters, sampler)


def launch_ms(call, reset, n: int = 7) -> float:
    """Median host ms to launch one call onto an idle GPU: the host's share of a call, with
    no full launch queue to wait on. A variant is host-bound once this nears its device time;
    it is how a slow host (the H200 machine's drifts 2x) can make one variant lose and not another."""
    import torch

    times = []
    for _ in range(n):
        reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_split(call, calls: int = 3, trace: Path | None = None) -> dict:
    """Where a call's time goes, from `calls` profiled back-to-back calls (per-call figures).

    Device ms by kernel family (GEMM, attention, other) and the kernel count; the span from
    the first kernel's start to the last one's end against the union of kernel time (the
    device's idle share) and its gaps of 20 us or more; the host operations and runtime
    calls with the most self time (a synchronization or an allocation shows up there).
    `trace`: also write the Chrome trace there (gzipped)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync()
    split = {"gemm_ms": 0.0, "attention_ms": 0.0, "other_ms": 0.0, "kernels": 0}
    spans = []
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = evt.name.lower()
        family = ("gemm_ms" if any(w in name for w in GEMM_WORDS)
                  else "attention_ms" if any(w in name for w in ATTN_WORDS) else "other_ms")
        split[family] += evt.time_range.elapsed_us() / 1e3 / calls
        split["kernels"] += 1
        spans.append((evt.time_range.start, evt.time_range.end))
    split["kernels"] //= calls
    spans.sort()
    busy, gaps, end = 0.0, [], spans[0][0] if spans else 0
    for s, e in spans:
        if s > end:
            gaps.append(s - end)
        busy += max(0, e - max(s, end))
        end = max(end, e)
    span = (end - spans[0][0]) if spans else 0
    split["span_ms"] = span / 1e3 / calls
    split["idle_ms"] = (span - busy) / 1e3 / calls
    split["gaps_20us"] = sum(1 for g in gaps if g >= 20) / calls
    split["gaps_20us_ms"] = sum(g for g in gaps if g >= 20) / 1e3 / calls
    host = sorted((e for e in prof.key_averages() if e.self_device_time_total == 0 and e.self_cpu_time_total > 0),
                  key=lambda e: -e.self_cpu_time_total)[:12]
    split["host_top"] = [{"op": e.key, "count": e.count // calls, "self_ms": round(e.self_cpu_time_total / 1e3 / calls, 3)}
                         for e in host]
    if trace is not None:
        prof.export_chrome_trace(str(trace))     # a .gz path: the profiler gzips it
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in split.items()}


def _process_times() -> dict:
    """pid -> (cpu seconds so far, command) for every process this user can read (Linux /proc)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        found[int(entry.name)] = ((int(fields[11]) + int(fields[12])) / tick, cmd.strip())
    return found


def host_load(before: dict, after: dict, seconds: float) -> dict:
    """Which processes used the CPU while the loops were timed (a busy neighbour slows host-bound
    launches: the variants share one process and machine)."""
    import os

    busy = sorted(((after[p][0] - before[p][0], p, after[p][1]) for p in after if p in before),
                  reverse=True)[:6]
    return {"seconds": round(seconds, 2), "cpus": os.cpu_count(),
            "busiest": [{"pid": p, "self": p == os.getpid(), "cpu_s": round(d, 2), "cmd": c}
                        for d, p, c in busy if d > 0]}


def prepare_variant(case: Case, variant: str, args, ref) -> tuple[dict, tuple, object]:
    """Compile one variant and check its first output: (row so far, (call, reset), output)."""
    import torch

    from gemmgen.torch_compile import backend as torch_backend

    from torch._dynamo.utils import counters

    counters.clear()
    torch_backend.reset_stats()
    if variant.startswith("gemmgen"):
        from gemmgen.torch_compile.ops import clear_joined

        clear_joined()          # so joined_weights_mib counts this case's joins only
    fn = compiled(case.model, variant, args)
    call, reset = case.call_for(fn)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = call().float().clone()
        sync()
    row = {"case": case.name, "variant": variant, "compile_s": round(time.perf_counter() - t0, 2),
           "dynamo_graphs": counters["stats"]["unique_graphs"]}     # > 1 per graph break or recompile
    row["max_rel_err"] = None if ref is None else ((out - ref).abs().max() / ref.abs().max()).item()
    if not math.isfinite(row["max_rel_err"] or 0.0):
        row["note"] = "non-finite error"
    if variant.startswith("gemmgen"):
        from gemmgen.torch_compile.ops import joined_bytes

        row["gemmgen"] = torch_backend.stats()
        row["kernels"] = kernels_used()
        row["joined_weights_mib"] = round(joined_bytes() / 2 ** 20, 1)   # the memory join_siblings costs
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
    before, t1 = (_process_times(), time.perf_counter()) if sys.platform == "linux" else (None, None)
    from gemmgen.measure.clocks import ClockSampler, nvml_index

    samplers = [ClockSampler(nvml_index(torch.cuda.current_device())) if args.device == "cuda" else None
                for _ in calls]
    with torch.no_grad():
        timed = time_interleaved(calls, case.iters, args.repeats, samplers, warm=not args.no_warm)
    load = host_load(before, _process_times(), time.perf_counter() - t1) if before is not None else None
    default = timed[variants.index("inductor")] if "inductor" in variants else None
    for row, (call, reset), ts, sampler in zip(rows, calls, timed, samplers):
        ms = statistics.median(ts)
        row.update(device_ms=ms, best_ms=min(ts), spread=round((max(ts) - min(ts)) / ms, 4), times_ms=ts,
                   vs_default=versus(ts, default) if default is not None and row["variant"] != "inductor" else None,
                   host_load=load, split=None)
        if sampler is not None:
            row["clocks"] = sampler.summary()         # SM clock while this variant's loops ran
            sampler.close()
        if args.device == "cuda":
            with torch.no_grad():
                row["launch_ms"] = round(launch_ms(call, reset), 3)
        if not args.no_profile and args.device != "cpu":
            reset()
            trace = Path(args.out) / f"trace_{case.name}_{row['variant']}.json.gz" if args.trace else None
            with torch.no_grad():
                row["split"] = profile_split(call, trace=trace)
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

    return {"problems": [torch_ops.problem_key(k) for k in keys], "tune_s": round(time.perf_counter() - t0, 1),
            "report": "; ".join(f"{part}: {r.summary()}" for part, r in reports.items()) or "nothing to tune"}


def kernels_used() -> list:
    from gemmgen.torch_compile import ops as torch_ops

    return [{"problem": torch_ops.problem_key(key), "backend": k.backend, "via": k.provenance.how}
            for key, k in torch_ops.served_kernels().items()]


def plot(rows, path: Path) -> None:
    import matplotlib

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
    fig.savefig(path, dpi=120)


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
