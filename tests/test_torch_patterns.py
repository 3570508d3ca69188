"""The decoder patterns of transformers' Llama, Qwen2 and Mistral families, on CPU: what the pass
replaces in tiny models (counted per pattern), outputs against eager, and CUDA graphs settings
accepted with every fusion on.

fp16 models on CPU with `devices=("cuda", "cpu")`, as in test_torch_backend.py: the gemmgen ops
compute their fp32 torch reference. Joins need the weights as constants of the graph:
`torch._inductor.config.freezing` on, and the model compiled under `torch.no_grad()`.
"""
import pytest
import torch

from gemmgen.torch_compile import backend as torch_backend

transformers = pytest.importorskip("transformers")
from test_torch_backend import fresh, rel_err  # noqa: F401 - fresh is a fixture

LAYERS, HIDDEN, INTER, VOCAB = 2, 64, 128, 128
#: fp16 eager (fp16 products rounded per op) against fp32 references in the ops: the tolerance
#: of the other CPU tests, relative to the largest logit.
TOLERANCE = 1e-2
FAMILIES = ("Llama", "Qwen2", "Mistral")


def tiny(family: str):
    config = getattr(transformers, f"{family}Config")(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return getattr(transformers, f"{family}ForCausalLM")(config).to(torch.float16).eval()


def compiled_logits(model, ids, **options):
    import torch._inductor.config as inductor_config

    opts = {"devices": ("cuda", "cpu"), **options}
    with torch.no_grad(), inductor_config.patch(freezing=True):
        return torch.compile(model, backend="gemmgen", options=opts)(ids).logits


def ids_of(seed: int):
    return torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))


#: Per layer: gate and up as one gated GEMM; q, k, v joined (Qwen2's with their biases joined
#: too); o_proj and down_proj with the residual add in the epilogue. Plus the lm_head, plain.
EXPECTED = {
    "Llama": {"gated": LAYERS, "joined": LAYERS, "residual": 2 * LAYERS, "plain": 1},
    "Qwen2": {"gated": LAYERS, "joined": LAYERS, "bias": LAYERS, "residual": 2 * LAYERS, "plain": 1},
    "Mistral": {"gated": LAYERS, "joined": LAYERS, "residual": 2 * LAYERS, "plain": 1},
}


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_patterns_are_replaced_and_match_eager(fresh, family):
    model, ids = tiny(family), ids_of(1)
    with torch.no_grad():
        ref = model(ids).logits
    out = compiled_logits(model, ids, join_siblings=True)
    stats = torch_backend.stats()
    assert stats["patterns"] == EXPECTED[family], stats
    assert stats["replaced"] == {"gated_mm": 2 * LAYERS, "joined_mm": 3 * LAYERS, "mm+residual": 2 * LAYERS,
                                 "mm": 1}
    assert stats["skipped"] == {} and stats["joins"] == {"joined": LAYERS} and stats["gated"] == {"gated": LAYERS}
    qkv = {f"16x{HIDDEN + 2 * 32}x{HIDDEN}:rcr:f16:f32:{'bias_n+' if family == 'Qwen2' else ''}f16": LAYERS}
    lm_head = f"16x{VOCAB}x{HIDDEN}:rcr:f16:f32:f16"                 # q (64) + k, v (2 x 32) is 128 wide too
    assert stats["problems"] == {
        f"16x{INTER}x{HIDDEN}:rcr:f16:f32:gate_silu_stacked+f16": LAYERS,        # gate/up: N = INTER
        f"16x{HIDDEN}x{HIDDEN}:rcr:f16:f32:residual+f16": LAYERS,                    # o_proj
        f"16x{HIDDEN}x{INTER}:rcr:f16:f32:residual+f16": LAYERS,                     # down_proj
        **qkv, lm_head: qkv.get(lm_head, 0) + 1}
    assert rel_err(out, ref) < TOLERANCE


def test_without_joins_the_epilogues_still_fuse(fresh):
    """The default: no joins; bias (Qwen2's q, k, v), silu and the residual adds still fuse."""
    model, ids = tiny("Qwen2"), ids_of(2)
    with torch.no_grad():
        ref = model(ids).logits
    out = compiled_logits(model, ids)
    stats = torch_backend.stats()
    assert stats["patterns"] == {"bias": 3 * LAYERS, "activation": LAYERS, "residual": 2 * LAYERS,
                                 "plain": LAYERS + 1}, stats
    assert stats["joins"] == {} and stats["gated"] == {}
    assert rel_err(out, ref) < TOLERANCE


def test_gate_up_already_joined_by_inductor_is_recognised(fresh):
    """On CUDA, inductor's freezing joins sibling matmuls itself (concat_linear: one mm over
    cat(W_gate^T, W_up^T), then a split); the pass finds the gated MLP in that form too. On CPU
    that inductor pass is behind cpp.enable_concat_linear."""
    import torch._inductor.config as inductor_config

    model, ids = tiny("Llama"), ids_of(3)
    with torch.no_grad():
        ref = model(ids).logits
    with inductor_config.patch({"cpp.enable_concat_linear": True}):
        out = compiled_logits(model, ids, join_siblings=True)
    stats = torch_backend.stats()
    assert stats["patterns"]["gated"] == LAYERS and stats["gated"] == {"gated": LAYERS}, stats
    assert rel_err(out, ref) < TOLERANCE


def test_cuda_graphs_settings_are_accepted_with_every_fusion(fresh):
    """mode="reduce-overhead"'s settings (CUDA graphs) with joins, gated and residual fusions on:
    accepted, and the joined weights are constants of the graph (no per-call work to replay). On
    CPU inductor records no CUDA graph; tests/test_torch_backend_gpu.py replays one."""
    import torch._inductor

    model, ids = tiny("Llama"), ids_of(4)
    with torch.no_grad():
        ref = model(ids).logits
    graphs = torch._inductor.list_mode_options("reduce-overhead")
    assert graphs.get("triton.cudagraphs") is True
    backend = torch_backend.make_backend(devices=("cuda", "cpu"), join_siblings=True, inductor=graphs)
    import torch._inductor.config as inductor_config

    with torch.no_grad(), inductor_config.patch(freezing=True):
        compiled = torch.compile(model, backend=backend)
        outs = [compiled(ids).logits for _ in range(2)]
    assert torch_backend.stats()["patterns"] == EXPECTED["Llama"]
    for out in outs:
        assert rel_err(out, ref) < TOLERANCE
    # the registered backend takes the mode among its options (torch.compile: mode= or options=)
    torch._dynamo.reset()
    torch_backend.reset_stats()
    out = compiled_logits(model, ids, join_siblings=True, mode="reduce-overhead")
    assert torch_backend.stats()["patterns"] == EXPECTED["Llama"]
    assert rel_err(out, ref) < TOLERANCE


@pytest.mark.parametrize("family", ("Llama", "Qwen2"))
def test_weights_inductor_joined_are_laid_out_column_major_again(fresh, family):
    """Inductor's freezing joins sibling weights as cat(W_1^T, W_2^T, dim=1): a row-major B, which
    cuBLAS ran slower than the unjoined products in the model's own layout. The pass lays each
    such constant out column-major again, where the pass leaves the product to inductor too, so
    the products it forms are `x @ W.T` problems (rcr), the layout the database is tuned in."""
    import torch._inductor.config as inductor_config

    model, ids = tiny(family), ids_of(5)
    with torch.no_grad():
        ref = model(ids).logits
    with inductor_config.patch({"cpp.enable_concat_linear": True}):
        out = compiled_logits(model, ids, join_siblings=False)
    stats = torch_backend.stats()
    assert stats["joins"].get("inductor_join_column_major", 0) >= LAYERS, stats     # gate/up at least
    gate_up = f"{ids.numel()}x{2 * INTER}x{HIDDEN}:rcr:f16:f32:f16"
    assert gate_up in stats["problems"], stats["problems"]
    assert not [key for key in stats["problems"] if ":rr" in key], stats["problems"]
    assert rel_err(out, ref) < TOLERANCE
    # only on the devices the pass is given: CPU weights stay as inductor made them by default
    torch._dynamo.reset(), torch_backend.reset_stats()
    with inductor_config.patch({"cpp.enable_concat_linear": True}):
        compiled_logits(model, ids, devices=("cuda",))
    assert "inductor_join_column_major" not in torch_backend.stats()["joins"]
