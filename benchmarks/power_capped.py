"""Isolated against sustained: do the records' orderings of a product's forms hold under the power cap?

The tuning records time each kernel as the harness does (`offline`: L2 flushed before every call,
a flush's worth of idle SMs between calls). In a whole model's prefill the GPU runs large GEMMs
back to back and sits at its power cap, with SM clocks far below their maximum (the model
benchmark's clock samples: 1,200-1,600 of 1,980 MHz on the H100, reason sw_power_cap), and
kernels slow down by different amounts. This times each form of a few model products both ways:
`isolated` with the harness (`gemmgen.measure.timing.time_many`, offline), and `sustained`: after
a second of back-to-back work, rounds of each form's calls back to back without flushes, forms
in a shuffled order each round, timed with CUDA events, with the SM clock sampled every round.

    python3 benchmarks/power_capped.py --out benchmarks/results/power_capped
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

#: product -> form -> the (problem key, kernel) calls it makes; kernel "torch" is the torch
#: baseline, "gemmgen" what gemmgen.compile serves from the records
GROUPS = {
    "qwen 8x512 q/k/v": {
        "joined, gemmgen": [("4096x4608x3584:rcr:f16:f32:bias_n+f16", "gemmgen")],
        "joined, torch": [("4096x4608x3584:rcr:f16:f32:bias_n+f16", "torch")],
        "apart, torch": [("4096x3584x3584:rcr:f16:f32:bias_n+f16", "torch"),
                         ("4096x512x3584:rcr:f16:f32:bias_n+f16", "torch"),
                         ("4096x512x3584:rcr:f16:f32:bias_n+f16", "torch")],
    },
    "qwen 8x512 gate/up": {
        "joined, torch": [("4096x37888x3584:rcr:f16:f32:f16", "torch")],
        "apart, torch": [("4096x18944x3584:rcr:f16:f32:f16", "torch")] * 2,
    },
    "llama 1x2048 gate/up": {
        "joined, torch": [("2048x28672x4096:rcr:f16:f32:f16", "torch")],
        "apart, torch": [("2048x14336x4096:rcr:f16:f32:f16", "torch")] * 2,
    },
    "qwen 1x2048 gated": {
        "gated, gemmgen": [("2048x18944x3584:rcr:f16:f32:gate_silu_stacked+f16", "gemmgen")],
        "joined + tail, torch": [("2048x18944x3584:rcr:f16:f32:gate_silu_stacked+f16", "torch")],
    },
}
WARM_S = 1.0


def make_call(key: str, kernel: str, seed: int):
    """(a no-argument call of `kernel` on fresh inputs of the problem `key`, the problem, the
    kernel in the harness's calling convention)."""
    from gemmgen.compile import bench_candidate
    from gemmgen.measure import baselines
    from gemmgen.measure.rotation import Rotation
    from gemmgen.tuning_db.records import problem_from_key

    problem = problem_from_key(key)
    fn = baselines.make("torch", problem).fn if kernel == "torch" else bench_candidate(problem)
    args, kwargs = Rotation(problem, seed, "cuda").prepare(seed)
    return (lambda: fn(*args, **kwargs)), problem, fn


def sustained(forms: dict, rounds: int, calls: int, sampler) -> dict:
    """Form -> per-round milliseconds of all its calls, back to back under the power cap."""
    import time

    import torch
    rng = random.Random(0)
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_S:
        for calls_of in forms.values():
            for call in calls_of:
                call()
        torch.cuda.synchronize()
    times: dict = {name: [] for name in forms}
    for _ in range(rounds):
        order = list(forms)
        rng.shuffle(order)
        for name in order:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(calls):
                for call in forms[name]:
                    call()
            end.record()
            sampler.sample()
            end.synchronize()
            times[name].append(begin.elapsed_time(end) / calls)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    import torch

    from gemmgen.measure.clocks import ClockSampler, nvml_index
    from gemmgen.measure.numerics import median
    from gemmgen.measure.timing import time_many
    if not torch.cuda.is_available():
        print("power_capped: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for group, spec in GROUPS.items():
        forms, isolated, served = {}, {}, {}
        for name, parts in spec.items():
            made = [make_call(key, kernel, seed) for seed, (key, kernel) in enumerate(parts, start=1)]
            forms[name] = [call for call, _, _ in made]
            # the harness's own timing of each distinct part, summed over the form's calls
            timed = time_many([(f"{i}", fn, problem) for i, (_, problem, fn) in enumerate(made)], "offline")
            failed = [str(t) for t in timed.values() if isinstance(t, Exception)]
            if failed:
                raise SystemExit(f"power_capped: {group} / {name}: {failed}")
            isolated[name] = sum(t.device_ms for t in timed.values())
            served[name] = [fn.kernel.provenance.how if hasattr(fn, "kernel") else "torch" for _, _, fn in made]
        sampler = ClockSampler(nvml_index(torch.cuda.current_device()))
        per_round = sustained(forms, args.rounds, args.calls, sampler)
        clocks = sampler.summary()
        sampler.close()
        for name in spec:
            row = {"group": group, "form": name, "isolated_ms": round(isolated[name], 4),
                   "sustained_ms": round(median(per_round[name]), 4), "sustained_rounds_ms": per_round[name],
                   "clocks": clocks, "served": served[name]}
            rows.append(row)
            print(f"{group:22s} {name:22s} isolated {row['isolated_ms']:8.4f}  sustained {row['sustained_ms']:8.4f}"
                  f"  x{row['sustained_ms'] / row['isolated_ms']:.3f}  SM {clocks.get('sm_mhz_median')} MHz",
                  flush=True)
        del forms
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "warm_s": WARM_S,
            "rounds": args.rounds, "calls": args.calls,
            "command": "python3 " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
