"""Timing of whole models under torch.compile, shared by the model benchmarks
(`llama_compile.py`, `model_e2e.py`).

- `ModelCase`: a case's inputs and its call (prefill, or one decode step over a static KV cache);
- `time_interleaved`: the variants of a case take turns, loop by loop, in balanced orders;
- `versus`: a speedup from repeats paired by turn, with its 95 % intervals
  (`gemmgen.measure.comparison`);
- `time_variants`: all of that for a case's compiled variants, with the launch time, the SM
  clock, the host's load and, on CUDA, where the device time goes (`profile_split`);
- `kernel_split`: device time by kernel class from kernel records (pure, so CPU-testable).

GPU for the timings that matter; on CPU the loops fall back to the wall clock (smoke tests).
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

GEMM_WORDS = ("gemm", "nvjet", "cutlass", "xmma", "wgmma", "triton_tem", "gemmgen", "matmul", "_mm_")
ATTENTION_WORDS = ("flash", "fmha", "attention", "sdpa", "efficient")
#: inductor's fused pointwise and reduction kernels (norms, rotary, activations, residual adds):
#: named after the ops they fused, which can include an mm, so matched before the GEMM words
INDUCTOR_POINTWISE_WORDS = ("triton_poi", "triton_red", "triton_per")
#: eager's elementwise and reduction kernels; matched after the GEMM words (cuBLAS's split-K
#: reduction is a splitKreduce_kernel)
EAGER_POINTWISE_WORDS = ("elementwise", "reduce_kernel")
#: (class, words) in the order a kernel's name is matched; unmatched kernels are "other".
#: Attention first: the memory-efficient kernel is named fmha_cutlass...
KERNEL_CLASSES = (("attention", ATTENTION_WORDS), ("pointwise", INDUCTOR_POINTWISE_WORDS),
                  ("gemm", (*GEMM_WORDS, "splitk")), ("pointwise", EAGER_POINTWISE_WORDS))


class ModelCase:
    """Inputs and the call of one case; decode re-prefills a fresh static cache per variant.

    `logits_to_keep`: 0 computes the LM head at every position, 1 at the last one only."""

    def __init__(self, name, kind, batch, tokens, model, cfg, iters: int, logits_to_keep: int = 0):
        import torch

        self.name, self.kind, self.batch, self.tokens = name, kind, batch, tokens
        self.device = device = next(model.parameters()).device
        g = torch.Generator(device=device).manual_seed(1)
        self.ids = torch.randint(0, cfg.vocab_size, (batch, tokens), device=device, generator=g)
        self.step_ids = torch.randint(0, cfg.vocab_size, (batch, 1), device=device, generator=g)
        self.model, self.cfg, self.logits_to_keep = model, cfg, logits_to_keep
        self.iters = iters
        self.steps = self.iters + 4                           # cache slots a timed loop fills

    def call_for(self, fn):
        """(call, reset): reset puts a decode cache back at `tokens` cached tokens (not timed)."""
        import torch

        if self.kind == "prefill":
            keep = self.logits_to_keep
            return (lambda: fn(input_ids=self.ids, use_cache=False, logits_to_keep=keep).logits), (lambda: None)
        from transformers import StaticCache

        cache = StaticCache(config=self.cfg, max_cache_len=self.tokens + self.steps + 8)
        with torch.no_grad():     # eager prefill; the LM head of the last position only (it is discarded)
            self.model(input_ids=self.ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        pos = torch.full((self.batch, 1), self.tokens, device=self.device, dtype=torch.long)
        cache_position = torch.tensor([self.tokens], device=self.device)

        def reset():
            for layer in getattr(cache, "layers", ()):
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                    layer.cumulative_length.fill_(self.tokens)   # transformers >= 5.x keeps a counter

        return (lambda: fn(input_ids=self.step_ids, past_key_values=cache, use_cache=True, position_ids=pos,
                           cache_position=cache_position).logits), reset


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def max_rel_err(out, ref) -> float:
    """max |out - ref| / max |ref| (both fp32)."""
    return ((out - ref).abs().max() / ref.abs().max()).item()


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
                timed_loop(*calls[i], iters)
            times[i].append(timed_loop(*calls[i], iters, samplers[i] if samplers else None))
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


def timed_loop(call, reset, iters: int, sampler=None) -> float:
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


def kernel_class(name: str, classes: Sequence = KERNEL_CLASSES) -> str:
    """The first class whose words occur in a kernel's name (case-insensitive), else "other"."""
    low = name.lower()
    return next((cls for cls, words in classes if any(w in low for w in words)), "other")


#: kernels listed by name in a profile, the costliest first
TOP_KERNELS = 12


def kernel_split(kernels: Sequence[tuple[str, float, float]], calls: int, classes: Sequence = KERNEL_CLASSES) -> dict:
    """Per-call device ms by kernel class from (name, start_us, end_us) kernel records of
    `calls` calls; the kernel count; the span from the first kernel's start to the last one's
    end against the union of kernel time (idle_ms and idle_share: the device's idle share)
    and its gaps of 20 us or more."""
    split = dict.fromkeys((f"{cls}_ms" for cls, _ in classes), 0.0)
    split.update(other_ms=0.0, kernels=len(kernels) // calls)
    for name, start, end in kernels:
        split[f"{kernel_class(name, classes)}_ms"] += (end - start) / 1e3 / calls
    spans = sorted((s, e) for _, s, e in kernels)
    busy, gaps, end = 0.0, [], spans[0][0] if spans else 0
    for s, e in spans:
        if s > end:
            gaps.append(s - end)
        busy += max(0, e - max(s, end))
        end = max(end, e)
    span = (end - spans[0][0]) if spans else 0
    split["span_ms"] = span / 1e3 / calls
    split["idle_ms"] = (span - busy) / 1e3 / calls
    split["idle_share"] = (span - busy) / span if span else 0.0
    split["gaps_20us"] = sum(1 for g in gaps if g >= 20) / calls
    split["gaps_20us_ms"] = sum(g for g in gaps if g >= 20) / 1e3 / calls
    split = {k: round(v, 4) if isinstance(v, float) else v for k, v in split.items()}
    split["top_kernels"] = top_kernels(kernels, calls)
    return split


def top_kernels(kernels: Sequence[tuple[str, float, float]], calls: int, count: int = TOP_KERNELS) -> list:
    """The kernels with the most device time per call: name (cut to 120 characters), launches and
    ms per call, and the mean us a launch: which kernel of a class grew between two variants."""
    per_name: dict = {}
    for name, start, end in kernels:
        launches, us = per_name.get(name, (0, 0.0))
        per_name[name] = (launches + 1, us + (end - start))
    ranked = sorted(per_name.items(), key=lambda item: -item[1][1])[:count]
    return [{"kernel": name[:120], "launches": launches // calls, "ms": round(us / 1e3 / calls, 4),
             "us_each": round(us / launches, 2)} for name, (launches, us) in ranked]


def profile_split(call, calls: int = 3, trace: Path | None = None, classes: Sequence = KERNEL_CLASSES) -> dict:
    """Where a call's time goes, from `calls` profiled back-to-back calls (per-call figures):
    `kernel_split` of the CUDA kernels, and the host operations and runtime calls with the
    most self time (a synchronization or an allocation shows up there). `trace`: also write
    the Chrome trace there (gzipped)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    split = kernel_split(kernels, calls, classes)
    host = sorted((e for e in prof.key_averages() if e.self_device_time_total == 0 and e.self_cpu_time_total > 0),
                  key=lambda e: -e.self_cpu_time_total)[:12]
    split["host_top"] = [{"op": e.key, "count": e.count // calls, "self_ms": round(e.self_cpu_time_total / 1e3 / calls, 3)}
                         for e in host]
    if trace is not None:
        prof.export_chrome_trace(str(trace))     # a .gz path: the profiler gzips it
    return split


def process_times() -> dict:
    """pid -> (cpu seconds so far, command) for every process this user can read (Linux /proc)."""
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
    busy = sorted(((after[p][0] - before[p][0], p, after[p][1]) for p in after if p in before),
                  reverse=True)[:6]
    return {"seconds": round(seconds, 2), "cpus": os.cpu_count(),
            "busiest": [{"pid": p, "self": p == os.getpid(), "cpu_s": round(d, 2), "cmd": c}
                        for d, p, c in busy if d > 0]}


def time_variants(calls: list, iters: int, repeats: int, *, cuda: bool, warm: bool = True, profile: bool = True,
                  classes: Sequence = KERNEL_CLASSES, traces: Optional[list] = None) -> list[dict]:
    """Time a case's (call, reset) pairs in turns (`time_interleaved`), then per call: the median,
    best and spread of its repeats, the repeats themselves, the host's load while they ran
    and, where the calls run on `cuda`, the SM clock, the launch time and (with `profile`)
    `profile_split`. `traces`: a Chrome-trace path (or None) per call."""
    import torch

    before, t1 = (process_times(), time.perf_counter()) if sys.platform == "linux" else (None, None)
    samplers = [None] * len(calls)
    if cuda:
        from gemmgen.measure.clocks import ClockSampler, nvml_index

        samplers = [ClockSampler(nvml_index(torch.cuda.current_device())) for _ in calls]
    with torch.no_grad():
        timed = time_interleaved(calls, iters, repeats, samplers if cuda else None, warm=warm)
    load = host_load(before, process_times(), time.perf_counter() - t1) if before is not None else None
    rows = []
    for i, ((call, reset), ts, sampler) in enumerate(zip(calls, timed, samplers)):
        ms = statistics.median(ts)
        row = {"device_ms": ms, "best_ms": min(ts), "spread": round((max(ts) - min(ts)) / ms, 4), "times_ms": ts,
               "host_load": load, "split": None}
        if sampler is not None:
            row["clocks"] = sampler.summary()         # SM clock while this variant's loops ran
            sampler.close()
        if cuda:
            with torch.no_grad():
                row["launch_ms"] = round(launch_ms(call, reset), 3)
                if profile:
                    reset()
                    row["split"] = profile_split(call, trace=traces[i] if traces else None, classes=classes)
        rows.append(row)
    return rows


def gemmgen_reset() -> None:
    """Clear gemmgen's pass counts, so that a variant's row counts its own."""
    from gemmgen.torch_compile import backend as torch_backend

    torch_backend.reset_stats()


def gemmgen_report() -> dict:
    """What gemmgen's pass did since `gemmgen_reset`: its counts and the kernels the calls ran."""
    from gemmgen.torch_compile import backend as torch_backend
    from gemmgen.torch_compile import ops as torch_ops

    report = {"gemmgen": torch_backend.stats(),
              "kernels": [{"problem": torch_ops.problem_key(key), "backend": k.backend, "via": k.provenance.how}
                          for key, k in torch_ops.served_kernels().items()]}
    return report
