"""The ranking room: the roofline prior that orders candidates across backends, read from the
one hardware model (`gemmgen.dsl.hardware.SM90A`).

    t = max(compute, DRAM, L2) + split-K reduction + launch

where compute counts whole waves of CTAs on the SMs (fractional for stream-K, the one schedule
that splits a tile's K loop across SMs) at the tensor-core peak per SM, DRAM moves the
problem's bytes at the peak rate or at what the SMs its CTAs occupy can pull (a grid of 16
CTAs streams through 16 SMs), and L2 feeds every CTA its A and B panels; summing split-K's
partials costs what the backend's way of summing them was measured to cost (a cluster's sum,
not yet measured, as much as the arrival-order one), and a persistent
or stream-K kernel adds its start-up. A ranking aid, not a prediction: `benchmarks/prior_fit.py`
scores it against the shipped records. Within one backend, its
search space orders its own programs with the cost model of its family (each backend's
`search_space.py`, on the same hardware numbers).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from gemmgen.dsl.hardware import SM90A
from gemmgen.dsl.ir import CLUSTER_REDUCE, Program
from gemmgen.dsl.resources import b_tiles

SMS = SM90A.sms
PEAK_FLOPS = SM90A.peak_flops_f16
PEAK_BYTES_PER_S = SM90A.peak_bytes_per_s
L2_BYTES_PER_S = SM90A.l2_bytes_per_s
SM_LOAD_BYTES_PER_S = SM90A.sm_load_bytes_per_s
LAUNCH_S = 3e-6
#: what a persistent kernel costs more than a one-CTA-per-tile one when there is little work:
#: ~0.5 us on the H200 (`gemmgen.backends.triton.search_space.PERSISTENT_START_US`)
PERSISTENT_START_S = 0.5e-6
#: What summing split-K's partials costs beyond their bytes, by backend and `split_k_reduce`.
#: Raw CUDA's `workspace` is a second kernel: split-K's best cost 1.35 us more than the best
#: unsplit program at 64x64x256 and 0.9 us more at 64x64x512. The others are what the shipped
#: H200 records imply (`benchmarks/prior_fit.py`: the split programs' median of measured minus
#: estimated time, less the unsplit programs', at problems under 12 us): raw CUDA's sum by the
#: tile's last CTA (atomic adds, a fence, an arrival counter: trips to L2 after the last load)
#: 1.9 us over 15 problems, Triton's finalize kernel after atomic adds 3.5 us over 30, its
#: slice-ordered second kernel 5.9 us over 6.
SPLIT_REDUCE_S = {
    ("cuda", "workspace"): 1.5e-6,
    ("cuda", "unordered"): 2.0e-6,
    ("cuda", "atomic"): 2.0e-6,
    ("triton", "workspace"): 5.5e-6,
    ("triton", "unordered"): 3.5e-6,
    ("triton", "atomic"): 3.5e-6,
}
#: Raw CUDA's `cluster` sum (two cluster barriers and reads of the peers' shared memory, no trip
#: to L2) is not measured yet: charged what the arrival-order sum costs, so that the family's own
#: order, which alternates the two, decides.
SPLIT_REDUCE_S[("cuda", "cluster")] = SPLIT_REDUCE_S[("cuda", "unordered")]
#: a backend without a measured entry: a second launch
REDUCE_LAUNCH_S = 1.5e-6


def estimated_seconds(program: Program, *, sm_load_bytes_per_s: float = SM_LOAD_BYTES_PER_S,
                      split_reduce_s: dict = SPLIT_REDUCE_S) -> float:
    """The roofline prior of the module docstring (of the problem the program computes); the
    keywords let `benchmarks/prior_fit.py` score other rates."""
    program = program.computed
    p, t = program.problem, program.tile
    split = max(1, program.split_k)
    k_slice = math.ceil(p.k / split)
    ctas = math.ceil(p.m / t.m) * math.ceil(p.n / t.n) * split
    waves = ctas / SMS if program.scheduler == "stream_k" else math.ceil(ctas / SMS)
    halves = b_tiles(program)      # a gated tile multiplies its gate's and its up's B columns
    compute = waves * 2 * t.m * halves * t.n * k_slice / (PEAK_FLOPS / SMS)
    dram = p.bytes / min(PEAK_BYTES_PER_S, min(ctas, SMS) * sm_load_bytes_per_s)
    l2 = ctas * (t.m + halves * t.n) * k_slice * 2 / L2_BYTES_PER_S
    reduce = 0.0
    if split > 1:
        partial_bytes = split * p.m * p.n * 4
        summing = split_reduce_s.get((program.backend, program.split_k_reduce), REDUCE_LAUNCH_S)
        passes = {"workspace": 2, CLUSTER_REDUCE: 0}.get(program.split_k_reduce, 1)   # the cluster's stay on chip
        reduce = summing + passes * partial_bytes / PEAK_BYTES_PER_S
    start = PERSISTENT_START_S if program.scheduler in ("persistent", "stream_k") else 0.0
    return max(compute, dram, l2) + reduce + LAUNCH_S + start


def take_turns(lists: Sequence[Sequence]) -> list:
    """The first of each list, then the second of each, and so on."""
    return [items[rank] for rank in range(max((len(items) for items in lists), default=0))
            for items in lists if rank < len(items)]


def near_first(groups: Sequence[Sequence], firsts: Sequence[float], factor: float,
               best: Optional[float] = None) -> list:
    """`groups` (each best first) taking turns: those whose first estimate (`firsts`) is within
    `factor` of `best` (default: the least of `firsts`), then the others, also taking turns."""
    if not groups:
        return []
    best = min(firsts) if best is None else best
    near = [g for g, first in zip(groups, firsts) if first <= factor * best]
    far = [g for g, first in zip(groups, firsts) if first > factor * best]
    return take_turns(near) + take_turns(far)


def bucket(seconds: float) -> int:
    """5 % buckets: estimates this close are a tie."""
    return math.floor(math.log(seconds) / math.log(1.05))
