"""Runs one rewrite of dynamo's graph (the attention rewrites of gemmgen.torch_compile) under
torch.compile, and reports what it did next to eager's answer."""
import torch

from gemmgen.torch_compile.causal_mask import SDPA_TARGETS


def run_rewrite(fn, rewrite, *inputs):
    """(the rewrite's outcomes, the SDPA calls after it as (args, kwargs), the graph's op targets
    after it, the compiled output, the eager output) of `fn` on `inputs`."""
    seen = {}

    def backend(gm, example_inputs):
        seen["outcomes"] = rewrite(gm)
        seen["calls"] = [(n.args, n.kwargs) for n in gm.graph.nodes if n.target in SDPA_TARGETS]
        seen["targets"] = [n.target for n in gm.graph.nodes]
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, dynamic=False)(*inputs)
    return seen["outcomes"], seen["calls"], seen["targets"], out, fn(*inputs)
