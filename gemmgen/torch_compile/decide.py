"""Deciding: a pattern is replaced only where the database's times say the gemmgen kernel beats
what inductor would run in its place, by at least `min_gain_us` per call.

Tuning measured each problem against cuBLAS with the bias inside the product (addmm, as in the
graph, where every row is 16-byte aligned) and the rest of the epilogue as separate torch passes;
inside a graph those passes are mostly free: inductor fuses an activation or a residual add into
the pointwise or reduction kernel that consumes it (Llama's silu(gate) * up; the RMSNorm after
each residual add). So unless the epilogue's one item feeds nothing inductor can fuse into (a
matmul, the graph's output), the reference is the baseline of the matmul with its bias alone, or
of the bare matmul, measured at the same M, N, K and majors.

Joins and gated products compete with what inductor runs in their place, on times from
different tuning sessions, so they must also beat it by more than two sessions differ with
nothing changed (`SESSION_NOISE` of the reference's time; `required_gain_us`):

- a product inductor's freezing joined itself (inductor_joins.py): kept only where it measured
  faster than its parts apart, which is what inductor runs without freezing;
- siblings (q, k, v): the members' own times (their tuned kernels or baselines) added up,
  against the joined problem's time;
- gate and up: the two matmuls' times added up (or, where inductor's freezing already joined
  them, the joined matmul's), plus `pointwise_us`, an estimate of inductor's fused
  silu(gate) * up kernel (it reads 2 M N and writes M N fp16 values), against the gated kernel's
  measured time. A gated problem `gemmgen.compile` cannot serve, or with no measured kernel, is
  not taken: its fallback in the op is the torch product and the torch epilogue, never faster
  than inductor's.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from gemmgen.measure.comparison import REPLICATE_NOISE
from gemmgen.runtime.torch_call import bias_in_product
from gemmgen.torch_compile import counts
from gemmgen.torch_compile import ops as torch_ops
from gemmgen.torch_compile.patterns import Candidate, Gated, Siblings

#: Least device time a tuned kernel must save per call to be taken, where the user set no
#: `min_gain_us`. A call dispatched from the host costs the op's few microseconds more than
#: inductor's own cuBLAS call; a CUDA graph replays with no host work per kernel, so there every
#: measured win is taken (winners are confirmed beyond their noise when tuned). Llama-3-8B-shaped
#: decode at one token under CUDA graphs: 1.097x inductor default with 5 us, 1.145x with 0.
HOST_MIN_GAIN_US = 5.0
GRAPH_MIN_GAIN_US = 0.0

#: Share of a time by which two tuning sessions differ with nothing changed (the speedup's
#: replicate noise, gemmgen.measure.comparison; raw times move at least as much). A join, a kept
#: inductor join or a gated product is judged on times from different sessions and must beat
#: inductor's own form by more: on the H100 a gate/up join 0.5 % ahead in the records measured
#: 3 % behind when timed again and 9 % behind in the model (docs/model_benchmark.md).
SESSION_NOISE = REPLICATE_NOISE

#: Inductor's fused silu(gate) * up kernel, estimated (not measured): a memory-bound pass at
#: this share of the H200's 4.8 TB/s, and no shorter than a small kernel's device time.
POINTWISE_BYTES_PER_S = 3.3e12
POINTWISE_FLOOR_US = 2.0


def time_ms(kernel) -> float | None:
    """Device time of what would run for a key: the tuned kernel or the baseline, as measured."""
    if kernel is None:
        return None
    p = kernel.provenance
    times = [t for t in (p.baseline_ms_here, p.device_ms if p.measured_here else None) if t]
    return min(times) if times else None


def pointwise_us(m: int, n: int) -> float:
    """Estimated device time of inductor's fused gate * up kernel on M x N fp16 halves."""
    return max(POINTWISE_FLOOR_US, 3 * m * n * 2 / POINTWISE_BYTES_PER_S * 1e6)


def estimated_gain_us(kernel, reference_ms: float | None = None) -> float:
    """Device time a tuned kernel saves per call against `reference_ms` (default: the best
    baseline of its tuning run), as measured at this very shape (a winner or a library choice);
    0 for the baseline."""
    p = kernel.provenance
    if kernel.backend == "torch" or not p.device_ms or not p.best_baseline_ms:
        return 0.0
    reference = p.best_baseline_ms if reference_ms is None else min(reference_ms, p.best_baseline_ms)
    return (reference - p.device_ms) * 1e3


def required_gain_us(reference_us: float, min_gain_us: float) -> float:
    """What a join or gated product must save against inductor's form taking `reference_us`:
    `min_gain_us`, and more than the sessions' noise on that time."""
    return max(min_gain_us, SESSION_NOISE * reference_us)


def _own_baseline_is_reference(cand: Candidate, key: tuple) -> bool:
    """Whether what inductor runs in the kernel's place is what tuning measured it against: a bare
    matmul, a matmul with nn.Linear's bias (both add it inside the product: inductor's addmm,
    the baseline's `torch.addmm` where rows are 16-byte aligned), or one epilogue item (an
    activation or a residual add) alone that inductor would run as a kernel of its own."""
    if key == cand.key(bare=True):
        return True
    if key == cand.key(False) and cand.bias is not None and cand.c is None:
        return bias_in_product(torch_ops.problem_of(key))
    alone = cand.bias is None and cand.c is None and cand.alpha == 1.0
    one_item = (cand.activation != "none") != (cand.residual is not None)
    return alone and one_item and key == cand.key(True) and cand.standalone


def _reference_unmeasured(cand: Candidate, kernels: dict) -> bool:
    """A tuned kernel with an epilogue, but the bare matmul it competes with in-graph was never timed."""
    return (kernels[cand.key(bare=True)].provenance.baseline_ms_here is None
            and not all(_own_baseline_is_reference(cand, k) for k in (cand.key(True), cand.key(False))))


def in_graph_gain_us(cand: Candidate, key: tuple, kernels: dict) -> float:
    """Device microseconds the tuned kernel for `key` saves per call against what inductor
    would run in its place (module docstring); 0 where that is unknown."""
    kernel = kernels[key]
    if _own_baseline_is_reference(cand, key):
        return estimated_gain_us(kernel)
    reference = kernels[cand.key(bare=True)].provenance.baseline_ms_here
    return estimated_gain_us(kernel, reference) if reference else 0.0


def choose_single(cand: Candidate, kernels: dict, min_gain_us: float, baseline: str, skipped: Counter) -> None:
    """Mark a static CUDA candidate chosen (with its fusions, or without them) or count why not."""
    fused, plain = cand.key(True), cand.key(False)

    def worth(key):
        return kernels[key].backend != "torch" and in_graph_gain_us(cand, key, kernels) >= min_gain_us

    if baseline == "op" or worth(fused):
        cand.chosen = True
    elif fused != plain and worth(plain):
        cand.drop_fusions()
        cand.chosen = True
    elif kernels[fused].backend == "torch" and kernels[plain].backend == "torch":
        skipped["no_tuned_kernel"] += 1
        counts.note_missing(fused)
    elif _reference_unmeasured(cand, kernels):
        skipped["reference_unmeasured"] += 1
        counts.note_missing(cand.key(bare=True))
    else:
        skipped["gain_below_overhead"] += 1


def choose_dynamic(cand: Candidate, resolve: Callable, baseline: str, skipped: Counter) -> None:
    """A symbolic-M matmul: taken, without its fusions, when some batch size of its (., N, K)
    is served by a measured program or algorithm (graph_pass's docstring)."""
    cand.drop_fusions()
    if baseline == "op" or resolve(cand.key(fused=False)).serves_measured:
        cand.chosen = True
    else:
        skipped["dynamic_m_untuned"] += 1


def join_keys(join: Siblings) -> list:
    return [join.key(), *(c.key(fused=False) for c in join.members)]


def _join_pays(joined_key: tuple, part_keys, kernels: dict, min_gain_us: float) -> bool | None:
    """Whether the joined product's time beats its parts' added up by `required_gain_us`; None
    where a time is missing."""
    joined = time_ms(kernels[joined_key])
    apart = [time_ms(kernels[key]) for key in part_keys]
    if joined is None or None in apart:
        return None
    return (sum(apart) - joined) * 1e3 >= required_gain_us(sum(apart) * 1e3, min_gain_us)


def decide_join(join: Siblings, kernels: dict, min_gain_us: float) -> str:
    """joined, or why not: unmeasured (a time is missing), gain_below_overhead (it saves under
    `required_gain_us`). The members' reference keeps their bias (cuBLAS applies it in the matmul)."""
    pays = _join_pays(join.key(), [c.key(fused=False) for c in join.members], kernels, min_gain_us)
    return "unmeasured" if pays is None else "joined" if pays else "gain_below_overhead"


def decide_split(joined_key: tuple, part_keys: tuple, kernels: dict, min_gain_us: float) -> str:
    """kept (inductor's joined product measured `required_gain_us` faster than its parts
    apart), else split: the parts are what inductor runs without the freezing the pass asked
    for, so the join has to earn its place as any rewrite does; unmeasured where a time is
    missing (split too)."""
    pays = _join_pays(joined_key, part_keys, kernels, min_gain_us)
    return "unmeasured" if pays is None else "kept" if pays else "split"


def gated_keys(pair: Gated) -> list:
    return [pair.key(), *(c.key(bare=True) for c in pair.members)]


def gated_reference_us(pair: Gated, kernels: dict) -> float | None:
    """What inductor runs in the gated kernel's place: the matmul(s) and the fused pointwise kernel."""
    times = [time_ms(kernels[c.key(bare=True)]) for c in pair.members]
    if None in times:
        return None
    m = int(pair.gate.shape[0])
    return sum(times) * 1e3 + pointwise_us(m, pair.n)


def decide_gated(pair: Gated, kernels: dict, min_gain_us: float) -> str:
    """gated, or why not: not_served (gemmgen.compile refuses the gated problem), no_winner (it was
    tuned and no gated kernel beat its unfused baselines), unmeasured (it was never tuned, or the
    matmuls it replaces were never timed), gain_below_overhead."""
    kernel = kernels[pair.key()]
    if kernel is None:
        return "not_served"
    if kernel.backend == "torch" and time_ms(kernel) is not None:
        return "no_winner"
    reference = gated_reference_us(pair, kernels)
    if kernel.backend == "torch" or not kernel.provenance.device_ms or reference is None:
        return "unmeasured"
    gain = reference - kernel.provenance.device_ms * 1e3
    return "gated" if gain >= required_gain_us(reference, min_gain_us) else "gain_below_overhead"
