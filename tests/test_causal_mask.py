"""The causal-mask rewrite on CPU: which masks are proven causal, which are left, and that the
rewritten graphs compute what eager does (transformers' Llama, Qwen2 and Mistral, and graphs
written here to fail each part of the proof)."""
import pytest
import torch
import torch.nn.functional as F

from gemmgen.torch_compile import backend as torch_backend
from gemmgen.torch_compile.causal_mask import is_causal_mask, make_masks_causal
from dynamo_rewrite import run_rewrite

transformers = pytest.importorskip("transformers")

L = 8


def tril(n=L, m=L):
    return torch.ones(n, m, dtype=torch.bool).tril()


def test_bool_and_additive_causal_masks_are_recognised_in_every_slice():
    assert is_causal_mask(tril(), L, L)
    assert is_causal_mask(tril().expand(2, 4, L, L), L, L)
    additive = torch.zeros(L, L).masked_fill(~tril(), float("-inf")).to(torch.float16)
    assert is_causal_mask(additive[None, None], L, L)


@pytest.mark.parametrize("mask, why", [
    (tril().tril(-1), "the diagonal masked"),
    (torch.ones(L, L, dtype=torch.bool).tril(1), "one above the diagonal let through"),
    (torch.stack([tril(), tril().tril(-2)]), "one batch's slice differs"),
    (torch.zeros(L, L).masked_fill(~tril(), torch.finfo(torch.float16).min), "a finite fill, not -inf"),
    (tril().to(torch.int64), "an integer mask"),
    (tril(L, L + 2)[:, :L], "the right shape but kv 2 longer"),
])
def test_anything_else_is_not_causal(mask, why):
    kv = L + 2 if "longer" in why else L
    assert not is_causal_mask(mask, L, kv), why


def rewritten(fn, *inputs):
    """(outcomes, SDPA kwargs after the rewrite, compiled output, eager output) of `fn`."""
    outcomes, calls, _, out, ref = run_rewrite(fn, lambda gm: make_masks_causal(gm, ("cpu",)), *inputs)
    return outcomes, [kwargs for _, kwargs in calls], out, ref


def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, L, 16, generator=g) for _ in range(3)]


def attend(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_a_constant_causal_mask_becomes_is_causal_and_computes_the_same():
    def fn(q, k, v):
        pos = torch.arange(L)
        return attend(q, k, v, pos[None, :] <= pos[:, None])

    outcomes, calls, out, ref = rewritten(fn, *qkv())
    assert outcomes == {"causal": 1}
    assert calls[0]["attn_mask"] is None and calls[0]["is_causal"] is True
    torch.testing.assert_close(out, ref)


def test_arguments_passed_by_name_are_read_and_kept():
    def fn(q, k, v):
        pos = torch.arange(L)
        return F.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=pos[None, :] <= pos[:, None],
                                              scale=0.5)

    outcomes, calls, out, ref = rewritten(fn, *qkv())
    assert outcomes == {"causal": 1}
    assert calls[0]["scale"] == 0.5 and calls[0]["is_causal"] is True
    torch.testing.assert_close(out, ref)


def test_a_shared_mask_is_judged_at_each_calls_lengths():
    """A (1, 1) mask is causal for one query over one key, and broadcasts to one query over many,
    where is_causal=True would keep only the first key."""
    def fn(q, k, v, k_long, v_long):
        keep = torch.ones(1, 1, dtype=torch.bool)
        return attend(q, k, v, keep) + attend(q, k_long, v_long, keep)

    q, k, v = (t[:, :, :1] for t in qkv())
    _, k_long, v_long = qkv()
    outcomes, calls, out, ref = rewritten(fn, q, k, v, k_long, v_long)
    assert outcomes == {"causal": 1, "not_causal": 1}
    assert calls[1]["attn_mask"] is not None
    torch.testing.assert_close(out, ref)


def test_a_mask_from_the_inputs_is_left_alone():
    def fn(q, k, v, keep):
        return attend(q, k, v, tril() & keep[:, None, None, :])

    keep = torch.ones(2, L, dtype=torch.bool)
    outcomes, calls, out, ref = rewritten(fn, *qkv(), keep)
    assert outcomes == {"mask_from_inputs": 1}
    assert not calls[0].get("is_causal") and calls[0]["attn_mask"] is not None
    torch.testing.assert_close(out, ref)


def test_a_constant_mask_that_is_not_causal_is_left_alone():
    def fn(q, k, v):          # a sliding window of 3: causal, and more
        pos = torch.arange(L)
        diff = pos[:, None] - pos[None, :]
        return attend(q, k, v, (diff >= 0) & (diff < 3))

    outcomes, calls, out, ref = rewritten(fn, *qkv())
    assert outcomes == {"not_causal": 1}
    assert calls[0]["attn_mask"] is not None
    torch.testing.assert_close(out, ref)


def test_a_mask_made_with_random_numbers_is_no_constant():
    def fn(q, k, v):          # causal with probability ~1, but not a constant of the graph
        return attend(q, k, v, tril() & (torch.rand(L, L) < 2.0))

    outcomes, calls, _, _ = rewritten(fn, *qkv())
    assert outcomes == {"mask_not_constant": 1}
    assert calls[0]["attn_mask"] is not None


def test_a_mask_written_in_place_after_it_is_made_is_no_constant():
    def fn(q, k, v):
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        mask[0, 1] = True       # a write the mask's own inputs do not show: tril alone would pass
        return attend(q, k, v, mask)

    outcomes, calls, out, ref = rewritten(fn, *qkv())
    assert outcomes == {"mask_not_constant": 1}
    assert calls[0]["attn_mask"] is not None
    torch.testing.assert_close(out, ref)


def test_a_mask_written_through_a_view_is_no_constant():
    def fn(q, k, v):
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        mask.view(-1)[1] = True       # the same write as above, through a view of the mask
        return attend(q, k, v, mask)

    outcomes, calls, out, ref = rewritten(fn, *qkv())
    assert outcomes == {"mask_not_constant": 1}
    torch.testing.assert_close(out, ref)


def tiny(family: str):
    cfg = getattr(transformers, f"{family}Config")(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return getattr(transformers, f"{family}ForCausalLM")(cfg).to(torch.float16).eval()


@pytest.mark.parametrize("family", ["Llama", "Qwen2", "Mistral"])
def test_decoder_prefill_masks_become_causal_and_logits_match_eager(fresh_dynamo, family):
    model = tiny(family)
    ids = torch.randint(0, 128, (2, L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        out = torch.compile(model, backend="gemmgen", options={"devices": ("cuda", "cpu"), "ops": ()})(
            ids, use_cache=False).logits
    assert torch_backend.stats()["masks"] == {"causal": 2}        # one per layer
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-3, rtol=2e-3)


def test_padding_keeps_the_mask_and_the_option_turns_the_rewrite_off(fresh_dynamo):
    model = tiny("Llama")
    ids = torch.randint(0, 128, (2, L), generator=torch.Generator().manual_seed(1))
    padded = torch.ones(2, L, dtype=torch.long)
    padded[1, :3] = 0
    cpu = {"devices": ("cuda", "cpu"), "ops": ()}
    with torch.no_grad():
        ref = model(ids, attention_mask=padded).logits
        out = torch.compile(model, backend="gemmgen", options=cpu)(ids, attention_mask=padded).logits
        assert torch_backend.stats()["masks"] == {"mask_from_inputs": 2}
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-3, rtol=2e-3)
        torch._dynamo.reset()
        torch_backend.reset_stats()
        torch.compile(model, backend="gemmgen", options={**cpu, "causal_masks": False})(ids)
    assert torch_backend.stats()["masks"] == {}


def test_causal_masks_must_be_a_bool():
    with pytest.raises(torch_backend.TorchBackendError, match="causal_masks must be True or False"):
        torch_backend.make_backend(causal_masks="yes")
