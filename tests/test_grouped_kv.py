"""The grouped-KV rewrite on CPU: which repeated K and V are proven to be their heads repeated
per query group (and handed to SDPA once, with enable_gqa), which are left, and that the
rewritten graphs compute what eager does."""
import pytest
import torch
import torch.nn.functional as F

from gemmgen.torch_compile import backend as torch_backend
from gemmgen.torch_compile.grouped_kv import group_kv_heads
from dynamo_rewrite import run_rewrite

transformers = pytest.importorskip("transformers")

B, HEADS, KV_HEADS, L, D = 2, 4, 2, 8, 16


def repeat_kv(x, groups):
    """transformers' spelling: a new axis after the heads, expanded, merged into the heads."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def tile_kv(x, groups):
    """Heads repeated in the other order (0 1 0 1, not 0 0 1 1): not SDPA's grouping."""
    b, h, s, d = x.shape
    return x[:, None].expand(b, groups, h, s, d).reshape(b, groups * h, s, d)


def rewritten(fn, *inputs):
    """(outcomes, SDPA calls as (args, kwargs) after the rewrite, compiled output, eager output);
    the graph's op targets after the rewrite in `rewritten.targets`."""
    outcomes, calls, rewritten.targets, out, ref = run_rewrite(fn, lambda gm: group_kv_heads(gm, ("cpu",)), *inputs)
    return outcomes, calls, out, ref


def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, h, L, D, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS)]


def test_repeated_heads_are_handed_once_with_enable_gqa_and_compute_the_same():
    def fn(q, k, v):
        groups = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), is_causal=True)

    outcomes, calls, out, ref = rewritten(fn, *qkv())
    assert outcomes == {"grouped": 1}
    (args, kwargs), = calls
    assert kwargs["enable_gqa"] is True and kwargs["is_causal"] is True
    assert [a.meta["example_value"].shape[1] for a in args[1:]] == [KV_HEADS, KV_HEADS]   # the sources
    assert "expand" not in rewritten.targets and "reshape" not in rewritten.targets     # the repeats dropped
    torch.testing.assert_close(out, ref)


def test_one_repeat_used_as_key_and_value_is_grouped_once():
    def fn(q, k):
        kv = repeat_kv(k, 2)
        return F.scaled_dot_product_attention(q, kv, kv, is_causal=True)

    q, k, _ = qkv()
    outcomes, calls, out, ref = rewritten(fn, q, k)
    assert outcomes == {"grouped": 1} and calls[0][0][1] is calls[0][0][2]
    assert "expand" not in rewritten.targets
    torch.testing.assert_close(out, ref)


def test_heads_tiled_in_the_other_order_are_not_sdpas_grouping_and_stay():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, tile_kv(k, 2), tile_kv(v, 2), is_causal=True)

    outcomes, calls, out, ref = rewritten(fn, *qkv())
    assert outcomes == {"repeat_not_proven": 1}
    assert "enable_gqa" not in calls[0][1]
    torch.testing.assert_close(out, ref)


def test_a_call_with_a_mask_or_one_repeated_operand_is_left_alone():
    def masked(q, k, v, mask):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask)

    def one_repeated(q, k, v):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 2), v.repeat(1, 2, 1, 1), is_causal=True)

    q, k, v = qkv()
    outcomes, calls, out, ref = rewritten(masked, q, k, v, torch.rand(L, L) > 0.3)
    assert outcomes == {"masked": 1} and "enable_gqa" not in calls[0][1]
    torch.testing.assert_close(out, ref)
    outcomes, calls, out, ref = rewritten(one_repeated, q, k, v)
    assert outcomes == {"kv_not_both_repeated": 1} and "enable_gqa" not in calls[0][1]
    torch.testing.assert_close(out, ref)


def test_a_repeat_too_large_to_prove_is_left_alone_and_counted(monkeypatch):
    monkeypatch.setattr("gemmgen.torch_compile.grouped_kv.MAX_PROOF_ELEMENTS", B * HEADS * L * D - 1)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), is_causal=True)

    outcomes, calls, out, ref = rewritten(fn, *qkv())
    assert outcomes == {"repeat_too_large_to_prove": 1} and "enable_gqa" not in calls[0][1]
    assert rewritten.targets.count("expand") == 2
    torch.testing.assert_close(out, ref)


def tiny(family: str, kv_heads: int):
    cfg = getattr(transformers, f"{family}Config")(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=64)
    torch.manual_seed(0)
    return getattr(transformers, f"{family}ForCausalLM")(cfg).to(torch.float16).eval()


CPU = {"devices": ("cuda", "cpu"), "ops": ()}


@pytest.mark.parametrize("family", ["Llama", "Qwen2", "Mistral"])
def test_decoder_prefill_groups_its_kv_heads_after_the_mask_is_proven_causal(fresh_dynamo, family):
    model = tiny(family, kv_heads=2)
    ids = torch.randint(0, 128, (2, L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        out = torch.compile(model, backend="gemmgen", options=CPU)(ids, use_cache=False).logits
    assert torch_backend.stats()["kv_heads"] == {"grouped": 2}        # one per layer
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-3, rtol=2e-3)


def test_padding_keeps_the_repeat_the_option_turns_it_off_and_full_heads_have_none(fresh_dynamo):
    ids = torch.randint(0, 128, (2, L), generator=torch.Generator().manual_seed(1))
    padded = torch.ones(2, L, dtype=torch.long)
    padded[1, :3] = 0
    with torch.no_grad():
        model = tiny("Llama", kv_heads=2)
        torch.compile(model, backend="gemmgen", options=CPU)(ids, attention_mask=padded)
        assert torch_backend.stats()["kv_heads"] == {"masked": 2}
        for model, options in ((model, {**CPU, "grouped_kv": False}), (tiny("Llama", kv_heads=4), CPU)):
            torch._dynamo.reset()
            torch_backend.reset_stats()
            torch.compile(model, backend="gemmgen", options=options)(ids, use_cache=False)
            assert torch_backend.stats()["masks"] == {"causal": 2}
            assert torch_backend.stats()["kv_heads"] == {}


def test_grouped_kv_must_be_a_bool():
    with pytest.raises(torch_backend.TorchBackendError, match="grouped_kv must be True or False"):
        torch_backend.make_backend(grouped_kv="yes")
