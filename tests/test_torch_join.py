"""Joining sibling matmuls (backend option join_siblings), on CPU: which groups are found, the
decision from the database's times, and the rewritten graph's numbers against eager."""
import pytest
import torch

from gemmgen.torch_compile import backend as torch_backend
from gemmgen.torch_compile.graph_pass import GemmgenPass, PassOptions

transformers = pytest.importorskip("transformers")
from test_torch_backend import fresh, record_winner, rel_err, tiny_llama  # noqa: E402,F401 - fresh is a fixture

M, N, K = 64, 48, 32


def qkv(x, wq, wk, wv):
    """Three projections of one activation (each through its own view, as nn.Linear does)."""
    h = x.view(M, K)
    return torch.mm(h, wq.t()) + 1, torch.relu(torch.mm(x.view(M, K), wk.t())), torch.mm(h, wv.t())


def qkv_inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, M // 2, K, generator=g).to(torch.float16)
    ws = [(torch.randn(N, K, generator=g) / K ** 0.5).to(torch.float16) for _ in range(3)]
    return [t.to(device) for t in (x, *ws)]


def traced(device):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    if device == "cpu":
        return make_fx(qkv)(*qkv_inputs())
    with FakeTensorMode():
        return make_fx(qkv)(*[torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in qkv_inputs()])


def joined_nodes(graph):
    return [n for n in graph.nodes if n.target is torch.ops.gemmgen.gemm_joined.default]


@pytest.fixture
def clean():
    from gemmgen.compile import clear_cache
    from gemmgen.torch_compile.ops import clear_kernels

    clear_cache(), clear_kernels(), torch_backend.reset_stats()
    yield
    clear_cache(), clear_kernels()


def test_siblings_join_into_one_gemm_whose_slices_match_eager(clean):
    gm = traced("cpu")
    GemmgenPass(PassOptions(devices=("cuda", "cpu"), join_siblings=True))(gm.graph)
    gm.graph.lint()
    gm.recompile()
    (node,) = joined_nodes(gm.graph)
    assert node.args[2] == "row"
    assert [w.op for w in node.args[1]] == ["placeholder"] * 3      # the parameters, not their views
    stats = torch_backend.stats()
    assert stats["replaced"] == {"joined_mm": 3} and stats["joins"] == {"joined": 1}
    assert stats["problems"] == {f"{M}x{3 * N}x{K}:rcr:f16:f32:f16": 1}
    # The relu stays a graph op on k's slice (an activation cannot cover one slice of the join).
    assert [n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default]
    args = qkv_inputs()
    for out, ref in zip(gm(*args), qkv(*args)):
        assert out.stride(1) == 1 and (out.float() - ref.float()).abs().max().item() < 2e-2


def test_without_the_option_nothing_is_joined(clean):
    gm = traced("cpu")
    GemmgenPass(PassOptions(devices=("cuda", "cpu")))(gm.graph)
    assert not joined_nodes(gm.graph)
    assert torch_backend.stats()["replaced"] == {"mm": 2, "mm+relu": 1}


def test_an_activation_or_a_bias_operand_is_not_a_sibling(clean):
    """Matmuls whose B is computed in the graph (not a weight) are never joined."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        h = x.view(M, K)
        return torch.mm(h, w.t()), torch.mm(h, (w * 2).t())

    gm = make_fx(f)(*qkv_inputs()[:2])
    GemmgenPass(PassOptions(devices=("cuda", "cpu"), join_siblings=True))(gm.graph)
    assert not joined_nodes(gm.graph)


@pytest.mark.parametrize("apart_ms, joined_ms, expected", [
    (0.100, (0.200, 0.220), {"joined": 1}),                 # 300 us apart, 200 joined
    (0.100, (0.297, 0.298), {"gain_below_overhead": 1}),    # 3 us saved: under min_gain_us
    (0.010, (0.020, 0.022), {"host_bound": 1}),             # 20 us joined: the op's host time bounds it
    (0.100, None, {"unmeasured": 1}),                       # never measured: left, and noted for tuning
])
def test_a_join_is_taken_only_where_measured_times_say_it_pays(clean, tmp_path, apart_ms, joined_ms, expected):
    from gemmgen.dsl.ir import Epilogue, Problem

    db = tmp_path / "tuning.sqlite"
    # Losing trials: each member's time is its torch.matmul baseline, apart_ms.
    record_winner(db, Problem(M, N, K, "row", "col"), device_ms=1.2 * apart_ms, baseline_ms=apart_ms)
    record_winner(db, Problem(M, N, K, "row", "col", epilogue=Epilogue(activation="relu")), 1.2 * apart_ms,
                  apart_ms)
    if joined_ms:
        record_winner(db, Problem(M, 3 * N, K, "row", "col"), *joined_ms)
    gm = traced("cuda")
    GemmgenPass(PassOptions(db=str(db), join_siblings=True))(gm.graph)
    stats = torch_backend.stats()
    assert stats["joins"] == expected
    assert bool(joined_nodes(gm.graph)) == ("joined" in expected)
    if "joined" not in expected:                 # the members go their own way
        assert sum(stats["replaced"].values()) + sum(stats["skipped"].values()) == 3
    if "unmeasured" in expected:
        assert f"{M}x{3 * N}x{K}:rcr:f16:f32:f16" in stats["missing"]


def test_llama_joins_qkv_and_gate_up_and_matches_eager(fresh):
    """Also after the weights change in place: the op must see each parameter's version
    counter (a transposed view handed over by inductor carried a counter of its own)."""
    model = tiny_llama().eval()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        opts = {"devices": ("cuda", "cpu"), "join_siblings": True}
        compiled = torch.compile(model, backend="gemmgen", options=opts)
        out = compiled(ids).logits
        for layer in model.model.layers:                   # as an optimizer step would
            layer.self_attn.k_proj.weight.mul_(-0.5)
            layer.mlp.up_proj.weight.add_(0.01)
        out_after, ref_after = compiled(ids).logits, model(ids).logits
    stats = torch_backend.stats()
    # Per layer q, k, v join (64 + 32 + 32) and gate, up join (2 x 128); o, down, lm_head stay alone.
    assert stats["joins"] == {"joined": 4}
    assert stats["replaced"] == {"joined_mm": 10, "mm": 5}
    assert stats["problems"]["16x128x64:rcr:f16:f32:f16"] == 3      # two q/k/v joins and the lm_head
    assert stats["problems"]["16x256x64:rcr:f16:f32:f16"] == 2      # two gate/up joins
    assert rel_err(out, ref) < 1e-2
    assert rel_err(out_after, ref_after) < 1e-2


def test_joined_weights_are_made_once_per_version_and_freed_with_the_weights():
    import gc

    from gemmgen.torch_compile import ops as torch_ops

    torch_ops.clear_kernels()
    ws = [torch.randn(n, K, dtype=torch.float16) for n in (16, 8)]     # (N_i, K) parameters
    first = torch_ops.joined_weights(ws)
    assert first.shape == (K, 24) and first.stride() == (1, K)           # K x sum(N), column-major
    assert torch.equal(first, torch.cat([w.t() for w in ws], dim=1))
    assert torch_ops.joined_weights(ws).data_ptr() == first.data_ptr()  # cached
    assert torch_ops.joined_bytes() == 24 * K * 2
    with torch.no_grad():
        ws[1].add_(1)                                                 # an in-place update (optimizer step)
    second = torch_ops.joined_weights(ws)
    assert second.data_ptr() != first.data_ptr()
    assert torch.equal(second, torch.cat([w.t() for w in ws], dim=1))
    assert torch_ops.joined_bytes() == 24 * K * 2                     # the stale copy was dropped
    other = [ws[0].clone(), ws[1]]                                    # another tensor: another copy
    assert torch.equal(torch_ops.joined_weights(other), second)
    assert torch_ops.joined_bytes() == 2 * 24 * K * 2
    del other
    gc.collect()
    assert torch_ops.joined_bytes() == 24 * K * 2                     # freed with its weight
    del ws, first, second
    gc.collect()
    assert torch_ops.joined_bytes() == 0                              # the cache keeps no weight alive


def test_joins_in_training_leave_the_gradients_right(fresh):
    """The forward graph joins q/k/v and gate/up; the backward graph has no siblings (each
    matmul there has its own A); every gradient matches eager, also after an optimizer step
    (the joined copy is remade for the new weights)."""
    model = tiny_llama(layers=1).train()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(2))
    compiled = torch.compile(model, backend="gemmgen", options={"devices": ("cuda", "cpu"), "join_siblings": True})
    for step in range(2):
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        ref = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        compiled(ids, labels=ids).loss.backward()
        for name, p in model.named_parameters():
            assert rel_err(p.grad, ref[name]) < 2e-2, (step, name)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)              # an SGD step: every weight changes in place
    assert torch_backend.stats()["joins"] == {"joined": 2}
