"""End-to-end model benchmark: two 4-layer decoders and their LM heads under eager, inductor
default, max-autotune and gemmgen, each with and without CUDA graphs (docs/model_benchmark.md).

GPU (an H200); --tiny --device cpu is a smoke test of the script. Models, built from configs
with random weights, fp16, eval: `llama3_8b_4l` (Llama-3-8B's widths: hidden 4096, intermediate
14336, 32 heads, 8 KV heads, vocab 128256, rope theta 5e5) and `qwen2_5_7b_4l` (Qwen2.5-7B's:
hidden 3584, intermediate 18944, 28 heads, 4 KV heads, vocab 152064, q/k/v bias), 4 layers each.
Cases: prefill of 1 x 2048 and 8 x 512 tokens (the LM head at every position unless --logits
last), and one decode step at batch 1, 8 and 32 over a static KV cache (transformers'
StaticCache) holding --kv-tokens tokens.

All variants of a case are compiled, checked against eager (max |out - ref| / max |ref| of the
logits; over --tolerance the variant is reported as failing) and timed in turns in one run
(compile_timing.time_variants: balanced turn orders, each timed loop after an untimed one of its
own). Ratios are reference median / variant median from those turns, with the 95 % bootstrap
interval of that ratio (gemmgen.measure.comparison). Prefill compares without CUDA graphs on
both sides, decode with CUDA graphs on both sides (`COMPARISONS`).

The script runs in parts that fit one device call: --models, --cases, --variants and
--budget-s pick a part; every part merges into --out/results.json (a case measured again
replaces the old one whole, so its ratios stay from one run), and summary.json and the plot
are rebuilt from all parts after every case.

    python3 benchmarks/model_e2e.py --out benchmarks/results/model_e2e \\
        --models llama3_8b_4l --cases prefill_1x2048,prefill_8x512 --budget-s 500
"""

import argparse
import datetime
import json
import math
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compile_timing import (  # noqa: E402 - this folder's model timing, shared with llama_compile.py
    ModelCase,
    gemmgen_report,
    gemmgen_reset,
    max_rel_err,
    sync,
    time_variants,
    versus,
)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder's widths (a published model's config) with fewer layers; random weights."""

    family: str          # "llama" or "qwen2" (q/k/v with bias)
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float
    rms_eps: float
    layers: int = 4


MODELS = {
    "llama3_8b_4l": ModelSpec("llama", 4096, 14336, 32, 8, 128256, 500000.0, 1e-5),
    "qwen2_5_7b_4l": ModelSpec("qwen2", 3584, 18944, 28, 4, 152064, 1000000.0, 1e-6),
}
#: --tiny: each family at CPU size (a test of the script, not a benchmark)
TINY = {"hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2, "vocab": 256, "layers": 2}
#: --tiny also divides every case's token count by this
TINY_TOKEN_DIVISOR = 32


@dataclass(frozen=True)
class CaseSpec:
    name: str
    kind: str            # "prefill" or "decode"
    batch: int
    tokens: int          # prefill: the sequence; decode: 0, the cache holds --kv-tokens


CASES = (CaseSpec("prefill_1x2048", "prefill", 1, 2048), CaseSpec("prefill_8x512", "prefill", 8, 512),
         CaseSpec("decode_b1", "decode", 1, 0), CaseSpec("decode_b8", "decode", 8, 0),
         CaseSpec("decode_b32", "decode", 32, 0))


@dataclass(frozen=True)
class Variant:
    name: str
    compiler: str        # "eager", "inductor" or "gemmgen"
    graphs: bool         # CUDA graphs
    mode: Optional[str] = None     # inductor's mode


VARIANTS = (Variant("eager", "eager", False), Variant("eager+graphs", "eager", True),
            Variant("default", "inductor", False), Variant("default+graphs", "inductor", True, "reduce-overhead"),
            Variant("max-autotune", "inductor", False, "max-autotune-no-cudagraphs"),
            Variant("max-autotune+graphs", "inductor", True, "max-autotune"),
            Variant("gemmgen", "gemmgen", False), Variant("gemmgen+graphs", "gemmgen", True))
BY_NAME = {v.name: v for v in VARIANTS}

#: gemmgen's torch.compile options without and with CUDA graphs: the one place to change them.
#: join_siblings joins q/k/v and gate/up (a gated GEMM) where measured times say it pays; it needs
#: the weights as constants, so gemmgen's variants trace under inductor's freezing (GEMMGEN_FREEZING).
GEMMGEN_OPTIONS = {False: {"join_siblings": True},
                   True: {"join_siblings": True, "inductor": {"triton.cudagraphs": True}}}
GEMMGEN_FREEZING = True

#: summary key -> (variant, reference) per case kind; decode compares CUDA graphs on both sides
COMPARISONS = {
    "prefill": {"gemmgen_vs_default": ("gemmgen", "default"),
                "gemmgen_vs_max_autotune": ("gemmgen", "max-autotune")},
    "decode": {"gemmgen_vs_default": ("gemmgen+graphs", "default+graphs"),
               "gemmgen_vs_max_autotune": ("gemmgen+graphs", "max-autotune+graphs")},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder of results.json, summary.json and model_e2e.png "
                                                "(an earlier part's results there are merged, not replaced)")
    p.add_argument("--models", default=",".join(MODELS), help=f"some of {','.join(MODELS)}")
    p.add_argument("--cases", default=",".join(c.name for c in CASES), help=f"some of {','.join(c.name for c in CASES)}")
    p.add_argument("--variants", default=",".join(v.name for v in VARIANTS),
                   help=f"some of {','.join(v.name for v in VARIANTS)}")
    p.add_argument("--skip-max-autotune", default="", metavar="CASES",
                   help="cases (comma-separated, or 'all') that leave out both max-autotune variants: their "
                        "compile autotunes every GEMM shape (minutes); recorded as skipped")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="wall-clock budget: a case that the last case's time says would overrun it is not "
                        "started (recorded as skipped); default 540, under a 600 s device call")
    p.add_argument("--repeats", type=int, default=15, help="timed loops per variant, in turns (10 or more give "
                                                            "the intervals; default 15)")
    p.add_argument("--prefill-iters", type=int, default=5, help="calls per timed prefill loop (default 5)")
    p.add_argument("--decode-iters", type=int, default=40, help="steps per timed decode loop (default 40)")
    p.add_argument("--kv-tokens", type=int, default=512, help="tokens in the decode cases' KV cache (default 512)")
    p.add_argument("--logits", choices=("all", "last"), default="all",
                   help="prefill's LM head at every position (default) or at the last one only")
    p.add_argument("--tolerance", type=float, default=2e-2,
                   help="largest max relative error of the logits against eager that passes (default 2e-2)")
    p.add_argument("--db", default=None, help="gemmgen tuning database (default: GEMMGEN_DB or ~/.cache)")
    p.add_argument("--gemmgen-options", default="{}", metavar="JSON",
                   help="gemmgen backend options laid over GEMMGEN_OPTIONS, e.g. '{\"min_gain_us\": 2}'")
    p.add_argument("--no-profile", action="store_true", help="skip the profile per kernel class")
    p.add_argument("--trace", action="store_true", help="also write each profiled call's Chrome trace (gzipped)")
    p.add_argument("--no-warm", action="store_true", help="no untimed loop of its own before each timed loop")
    p.add_argument("--tiny", action="store_true", help=f"tiny models ({TINY}) and token counts / "
                                                       f"{TINY_TOKEN_DIVISOR}: a smoke test of the script")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: with --tiny, a smoke test")
    args = p.parse_args(argv)
    for flag, names, valid in (("--models", args.models, MODELS), ("--cases", args.cases, [c.name for c in CASES]),
                               ("--variants", args.variants, BY_NAME)):
        bad = [n for n in names.split(",") if n and n not in valid]
        if bad or not names.strip(","):
            p.error(f"{flag}: {','.join(bad) or 'nothing'} not understood; choose from {','.join(valid)}")
    skip = [c for c in args.skip_max_autotune.split(",") if c]
    if any(c not in ("all", *(x.name for x in CASES)) for c in skip):
        p.error(f"--skip-max-autotune: choose cases from {','.join(c.name for c in CASES)}, or 'all'")
    try:
        extra = json.loads(args.gemmgen_options)
    except json.JSONDecodeError as exc:
        p.error(f"--gemmgen-options is not JSON ({exc}); e.g. '{{\"min_gain_us\": 2}}'")
    if not isinstance(extra, dict):
        p.error("--gemmgen-options must be a JSON object of backend options")
    if args.repeats < 1 or args.prefill_iters < 1 or args.decode_iters < 1:
        p.error("--repeats, --prefill-iters and --decode-iters must be positive")
    return args


def picked(names: str, table) -> list:
    chosen = set(names.split(","))
    return [x for x in table if (x if isinstance(x, str) else x.name) in chosen]


def model_spec(name: str, tiny: bool) -> ModelSpec:
    spec = MODELS[name]
    return ModelSpec(**{**asdict(spec), **TINY}) if tiny else spec


def case_shape(case: CaseSpec, args) -> dict:
    """What a case runs: batch, tokens (prefill) or cached tokens (decode), logits kept."""
    div = TINY_TOKEN_DIVISOR if args.tiny else 1
    if case.kind == "prefill":
        return {"kind": "prefill", "batch": case.batch, "tokens": case.tokens // div, "logits": args.logits}
    return {"kind": "decode", "batch": case.batch, "kv_tokens": args.kv_tokens // div, "logits": "all"}


def build_model(spec: ModelSpec, device: str):
    """The decoder with random weights (seed 0), fp16, eval, on `device`; and its config."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = ((LlamaConfig, LlamaForCausalLM) if spec.family == "llama"
                                 else (Qwen2Config, Qwen2ForCausalLM))   # Qwen2's q/k/v carry a bias
    cfg = config_class(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                       num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                       num_key_value_heads=spec.kv_heads, rms_norm_eps=spec.rms_eps, max_position_embeddings=4096,
                       rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = model_class(cfg)
    return model.to(torch.float16).eval(), cfg


def gemmgen_options(graphs: bool, args) -> dict:
    """GEMMGEN_OPTIONS for this variant with --gemmgen-options and --db laid over them."""
    options = json.loads(json.dumps(GEMMGEN_OPTIONS[graphs]))       # a deep copy
    for key, value in json.loads(args.gemmgen_options).items():
        options[key] = {**options.get(key, {}), **value} if key == "inductor" else value
    if args.db:
        options["db"] = args.db
    if args.device == "cpu":
        options["devices"] = ("cuda", "cpu")     # the CPU reference op: exercises the rewrite only
    return options


def compiled(model, variant: Variant, options: Optional[dict]):
    import torch

    if variant.compiler == "eager":
        return model
    if variant.compiler == "inductor":
        return torch.compile(model, mode=variant.mode, dynamic=False)
    return torch.compile(model, backend="gemmgen", dynamic=False, options=options)


def graphed(call, reset):
    """(replay, reset): `call` captured once into a CUDA graph (eager with CUDA graphs)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):          # warm-up off the capture, as torch.cuda.graph asks
        for _ in range(2):
            reset()
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    reset()
    with torch.cuda.graph(graph):
        out = call()
    reset()                                  # the capture ran nothing, but keep the cache at its start

    def replay():
        graph.replay()
        return out

    return replay, reset


def prepare_variant(case: ModelCase, variant: Variant, args, ref) -> tuple[dict, Optional[tuple], object]:
    """Compile one variant and check its first output: (row, (call, reset) or None if it broke, output)."""
    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    row = {"variant": variant.name, "graphs": variant.graphs, "compiler": variant.compiler, "mode": variant.mode}
    if variant.graphs and args.device != "cuda":
        row["skipped"] = "CUDA graphs need --device cuda"
        return row, None, None
    counters.clear()
    gemmgen_reset()
    frozen = variant.compiler == "gemmgen" and GEMMGEN_FREEZING
    row["freezing"] = frozen
    t0 = time.perf_counter()
    options = gemmgen_options(variant.graphs, args) if variant.compiler == "gemmgen" else None
    try:
        call, reset = case.call_for(compiled(case.model, variant, options))
        with torch.no_grad(), inductor_config.patch(freezing=frozen):    # read as the first call traces
            if variant.compiler == "eager" and variant.graphs:
                call, reset = graphed(call, reset)
            elif variant.graphs:
                # CUDA graph trees warm up on the first call and record on the second: a variant
                # that breaks there breaks here, and the output checked is a replay's
                for _ in range(2):
                    call()
                    reset()
            out = call().float().clone()
            sync()
    except Exception as exc:  # noqa: BLE001 - a variant that breaks is its row, not the run's
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        row["error"] = f"{type(exc).__name__}: {' | '.join(lines[:3])[:500]}"
        return row, None, None
    row.update(compile_s=round(time.perf_counter() - t0, 2),
               dynamo_graphs=counters["stats"]["unique_graphs"])     # > 1 per graph break or recompile
    if options is not None:
        row["options"] = options
    err = None if ref is None else max_rel_err(out, ref)
    row["max_rel_err"] = err
    row["passed"] = err is not None and math.isfinite(err) and err <= args.tolerance
    if variant.compiler == "gemmgen":
        row.update(gemmgen_report())
    return row, (call, reset), out


def comparisons(kind: str, rows: dict) -> dict:
    """Each COMPARISONS entry of a case kind from the case's timed rows: the ratio of medians
    (reference / variant), its 95 % interval, the median per-repeat ratio; or why there is none."""
    found = {}
    for key, (variant, reference) in COMPARISONS[kind].items():
        entry = {"variant": variant, "reference": reference}
        a, b = rows.get(variant, {}), rows.get(reference, {})
        missing = [n for n, r in ((variant, a), (reference, b)) if "device_ms" not in r]
        if missing:
            reasons = [rows.get(n, {}).get("error") or rows.get(n, {}).get("skipped") or "not run" for n in missing]
            entry.update(ratio=None, ci95=None, why="; ".join(f"{n}: {r}" for n, r in zip(missing, reasons)))
        else:
            vs = versus(a["times_ms"], b["times_ms"])
            if vs is None:         # too few repeats for intervals: the ratio of medians alone
                entry.update(ratio=round(statistics.median(b["times_ms"]) / statistics.median(a["times_ms"]), 4),
                             ci95=None, median_ratio=None)
            else:
                lo, value, hi = vs["ratio_of_medians"]
                entry.update(ratio=value, ci95=[lo, hi], median_ratio=vs["median_ratio"], repeats=vs["repeats"])
        found[key] = entry
    return found


def run_case(case_spec: CaseSpec, model, cfg, variants: list, args, skipped: dict) -> dict:
    """Compile, check, time in turns and profile every variant of one case: its record."""
    import torch

    torch._dynamo.reset()
    shape = case_shape(case_spec, args)
    tokens = shape["tokens"] if case_spec.kind == "prefill" else shape["kv_tokens"]
    iters = args.prefill_iters if case_spec.kind == "prefill" else args.decode_iters
    case = ModelCase(case_spec.name, case_spec.kind, case_spec.batch, tokens, model, cfg, iters,
                     logits_to_keep=1 if args.logits == "last" else 0)
    rows: dict = {name: {"variant": name, "skipped": why} for name, why in skipped.items()}
    live, calls = [], []
    ref = None
    order = variants if any(v.name == "eager" for v in variants) else [BY_NAME["eager"], *variants]
    for variant in order:          # eager first: the reference (untimed when not among the variants)
        row, call, out = prepare_variant(case, variant, args, ref)
        if variant.name == "eager" and not variant.graphs:
            ref = out
            row["max_rel_err"], row["passed"] = 0.0, True
            if variant not in variants:
                continue
        rows[variant.name] = row
        say(f"{case_spec.name} {variant.name}: " + (
            f"skipped ({row['skipped']})" if "skipped" in row else f"ERROR {row['error']}" if "error" in row
            else f"compiled in {row['compile_s']:.1f} s, max rel err {row['max_rel_err']:.2e}"
                 f"{'' if row['passed'] else ' FAILING'}"))
        if call is not None:
            live.append(variant.name)
            calls.append(call)
        del out
    if calls:
        traces = [Path(args.out) / f"trace_{case_spec.name}_{n}.json.gz" if args.trace else None for n in live]
        say(f"{case_spec.name}: timing {len(calls)} variants in turns, {args.repeats} repeats of {iters} calls")
        measured = time_variants(calls, iters, args.repeats, cuda=args.device == "cuda", warm=not args.no_warm,
                                 profile=not args.no_profile and args.device == "cuda", traces=traces)
        load = measured[0]["host_load"]
        for name, m in zip(live, measured):
            m.pop("host_load")
            rows[name].update(m)
    else:
        load = None
    for name in live:              # each variant against the default and max-autotune of its own graphs
        graphs = BY_NAME[name].graphs
        for key, ref_name in (("vs_default", "default"), ("vs_max_autotune", "max-autotune")):
            ref_name += "+graphs" if graphs else ""
            rows[name][key] = (versus(rows[name]["times_ms"], rows[ref_name]["times_ms"])
                               if ref_name in live and ref_name != name else None)
    calls.clear()
    torch._dynamo.reset()          # frees compiled graphs and CUDA-graph pools before the next case
    failing = {n: (r.get("error") or f"max rel err {r['max_rel_err']:.3g} > {args.tolerance:g}")
               for n, r in rows.items() if "skipped" not in r and not r.get("passed", False)}
    return {"shape": shape, "variants": rows, "host_load": load, "failing": failing,
            "comparisons": comparisons(case_spec.kind, rows)}


def merge(results: dict, run: dict, model: str, config: dict, case: str, record: dict) -> dict:
    """results with `record` as the case's current result (replacing an earlier run's whole)."""
    runs = results.setdefault("runs", [])
    if not runs or runs[-1]["id"] != run["id"]:
        runs.append(run)
    else:
        runs[-1] = run
    entry = results.setdefault("models", {}).setdefault(model, {"config": config, "cases": {}})
    entry["config"] = config
    entry["cases"][case] = {**record, "run": run["id"]}
    return results


def summary(results: dict) -> dict:
    """The issue's summary.json: per model and case the two ratios and their 95 % intervals,
    from the runs that measured the cases now in `results`."""
    runs = {r["id"]: r for r in results.get("runs", [])}
    used = sorted({c["run"] for m in results.get("models", {}).values() for c in m["cases"].values()})
    models = {}
    for model in [m for m in MODELS if m in results.get("models", {})]:
        cases = results["models"][model]["cases"]
        models[model] = {}
        for case in [c.name for c in CASES if c.name in cases]:
            record, out = cases[case], {}
            for key, cmp in record["comparisons"].items():
                out[key] = cmp["ratio"]
                out[f"{key}_ci95"] = cmp["ci95"]
                if cmp["ratio"] is None:
                    out[f"{key}_why"] = cmp["why"]
            if record.get("failing"):
                out["failing"] = record["failing"]
            models[model][case] = out
    return {"gpu": ", ".join(sorted({runs[i]["gpu"] for i in used})),
            "date": max((runs[i]["date"] for i in used), default=None),
            "command": " && ".join(runs[i]["command"] for i in used),
            "models": models}


#: seconds a case's max-autotune variants are taken to add until a case with them was measured
MAX_AUTOTUNE_GUESS_S = 150.0


def case_plan(elapsed: float, budget: float, autotune: bool, last: dict) -> str:
    """What of the next case fits the budget: "all", "no-max-autotune" or "none", judged by the
    last case measured with max-autotune (`last[True]`, seconds) and without (`last[False]`)."""
    with_it = last[True] or (last[False] + MAX_AUTOTUNE_GUESS_S if last[False] else None)
    without = last[False] or (max(last[True] - MAX_AUTOTUNE_GUESS_S, last[True] / 2) if last[True] else None)
    if autotune and (with_it is None or elapsed + with_it <= budget):
        return "all"
    if without is None or elapsed + without <= budget:
        return "no-max-autotune"
    return "none"


def load_results(path: Path, tiny: bool) -> dict:
    if not path.exists():
        return {"benchmark": "model_e2e", "tiny": tiny, "runs": [], "models": {}}
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SystemExit(f"model_e2e: {path} is not JSON ({exc}); move it away or pick another --out")
    if results.get("benchmark") != "model_e2e":
        raise SystemExit(f"model_e2e: {path} is not this benchmark's; pick another --out")
    if results.get("tiny") != tiny:
        raise SystemExit(f"model_e2e: {path} holds {'tiny' if results.get('tiny') else 'full-size'} models; "
                         f"a {'tiny' if tiny else 'full-size'} run needs another --out")
    return results


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))    # a stats value JSON lacks: its text
    tmp.replace(path)             # a run killed at its time limit leaves the previous file whole


def plot(summ: dict, path: Path) -> None:
    import matplotlib

    from gemmgen.measure.plots import save_png

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{model}\n{case}", key, entry.get(key), entry.get(f"{key}_ci95"))
            for model, cases in summ["models"].items() for case, entry in cases.items()
            for key in ("gemmgen_vs_default", "gemmgen_vs_max_autotune")]
    labels = list(dict.fromkeys(b[0] for b in bars))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels) + 2), 4.5))
    for j, (key, color) in enumerate((("gemmgen_vs_default", "tab:blue"), ("gemmgen_vs_max_autotune", "tab:orange"))):
        xs, ys, errs = [], [], [[], []]
        for i, label in enumerate(labels):
            value, ci = next(((v, c) for lab, k, v, c in bars if lab == label and k == key), (None, None))
            if value is None:
                continue
            xs.append(i + (j - 0.5) * 0.38)
            ys.append(value)
            errs[0].append(value - ci[0] if ci else 0)
            errs[1].append(ci[1] - value if ci else 0)
        if xs:            # a comparison no case ran (max-autotune skipped) gets no legend entry
            ax.bar(xs, ys, 0.38, yerr=errs, capsize=3, color=color, label=key.replace("_", " "))
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("speedup (ratio of medians, 95 % interval)")
    ax.set_title(f"gemmgen end to end, 4-layer decoders, fp16, {summ['gpu']}\n(decode: CUDA graphs on both sides)",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


_START = time.perf_counter()


def say(text: str) -> None:
    print(f"[model_e2e {time.perf_counter() - _START:6.0f} s] {text}", flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    import torch
    import transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        print("model_e2e: needs a CUDA GPU (or --tiny --device cpu for a smoke test)", file=sys.stderr)
        return 2
    limits = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):   # 7 compiled variants of one forward per case
        if hasattr(limits, name):
            setattr(limits, name, max(64, getattr(limits, name)))
    start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = load_results(out_dir / "results.json", args.tiny)
    run = {"id": max((r["id"] for r in results["runs"]), default=-1) + 1,
           "command": shlex.join(["python3", "benchmarks/model_e2e.py", *argv]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (smoke test)",
           "torch": torch.__version__, "transformers": transformers.__version__,
           "python": sys.version.split()[0], "args": vars(args), "skipped_cases": [], "wall_s": 0.0}
    variants = picked(args.variants, VARIANTS)
    skip_cases = set(args.skip_max_autotune.split(","))
    status, last = 0, {True: None, False: None}
    for model_name in picked(args.models, list(MODELS)):
        spec = model_spec(model_name, args.tiny)
        t0 = time.perf_counter()
        model, cfg = build_model(spec, args.device)
        config = {**asdict(spec), "params": sum(p.numel() for p in model.parameters())}
        say(f"{model_name}: {config['params'] / 1e9:.2f} B parameters built in {time.perf_counter() - t0:.0f} s")
        for case_spec in picked(args.cases, CASES):
            autotune = [v for v in variants if v.name.startswith("max-autotune")]
            skipped = {v.name: "--skip-max-autotune" for v in autotune
                       if "all" in skip_cases or case_spec.name in skip_cases}
            elapsed = time.perf_counter() - start
            plan = case_plan(elapsed, args.budget_s, len(skipped) < len(autotune), last)
            if plan == "none":
                run["skipped_cases"].append(f"{model_name}/{case_spec.name}: not started, {elapsed:.0f} s of "
                                            f"the {args.budget_s:.0f} s budget spent")
                say(run["skipped_cases"][-1])
                continue
            if plan == "no-max-autotune":
                skipped.update({v.name: f"budget: {elapsed:.0f} s of {args.budget_s:.0f} s spent"
                                for v in autotune if v.name not in skipped})
            t1 = time.perf_counter()
            record = run_case(case_spec, model, cfg, [v for v in variants if v.name not in skipped], args, skipped)
            last_case_s = time.perf_counter() - t1
            last[len(skipped) < len(autotune)] = last_case_s
            record["wall_s"] = round(last_case_s, 1)
            run["wall_s"] = round(time.perf_counter() - start, 1)
            merge(results, run, model_name, config, case_spec.name, record)
            summ = summary(results)
            write_json(out_dir / "results.json", results)
            write_json(out_dir / "summary.json", summ)
            plot(summ, out_dir / "model_e2e.png")
            print_case(model_name, case_spec.name, record)
            if record["failing"]:
                status = 3
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    say(f"done in {time.perf_counter() - start:.0f} s; wrote {out_dir / 'results.json'} and summary.json"
        + ("; some variants FAILED (see 'failing')" if status else ""))
    return status


def print_case(model: str, case: str, record: dict) -> None:
    print(f"\n{model} {case} {record['shape']}  ({record['wall_s']} s)")
    print(f"{'variant':20s} {'ms/call':>9s} {'vs default':>11s} {'vs max-at':>10s} {'max rel err':>11s} "
          f"{'compile s':>9s}  gemm/attn/pointwise/other ms, idle")
    for name, r in record["variants"].items():
        if "device_ms" not in r:
            print(f"{name:20s} {'-':>9s}  {r.get('skipped') or r.get('error')}")
            continue
        vs = [f"{x['ratio_of_medians'][1]:.3f}x" if x else "-" for x in (r.get("vs_default"), r.get("vs_max_autotune"))]
        sp = r.get("split")
        split = (f"{sp['gemm_ms']:.3f}/{sp['attention_ms']:.3f}/{sp['pointwise_ms']:.3f}/{sp['other_ms']:.3f}, "
                 f"{sp['idle_share']:.0%}") if sp else "-"
        flag = "" if r["passed"] else "  FAILING"
        print(f"{name:20s} {r['device_ms']:9.3f} {vs[0]:>11s} {vs[1]:>10s} {r['max_rel_err']:11.2e} "
              f"{r['compile_s']:9.1f}  {split}{flag}")
    for key, c in record["comparisons"].items():
        ci = f" ({c['ci95'][0]:.3f}-{c['ci95'][1]:.3f})" if c.get("ci95") else ""
        print(f"  {key}: " + (f"{c['ratio']:.3f}x{ci}" if c["ratio"] is not None else f"none ({c['why']})"))


if __name__ == "__main__":
    sys.exit(main())
