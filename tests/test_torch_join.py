"""Joins (backend option join_siblings), on CPU: sibling matmuls of one activation (q, k, v) and
gate/up pairs, found only where the weights are constants of the graph; the weights joined once at
compile time into a constant; the decision from the database's times; numbers against eager."""
import types

import pytest
import torch
from test_torch_backend_decision import record_winner

from gemmgen.torch_compile import backend as torch_backend
from gemmgen.torch_compile.graph_pass import GemmgenPass, PassOptions

M, N, K = 64, 48, 32
CPU_JOINS = PassOptions(devices=("cuda", "cpu"), join_siblings=True)


def weights(device="cpu", n_up=N):
    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(n, K, generator=g) / K ** 0.5).to(torch.float16) for n in (N, N, N, n_up)]
    return [w.to(device) for w in ws]


def activation(device="cpu"):
    return torch.randn(2, M // 2, K, generator=torch.Generator().manual_seed(1)).to(torch.float16).to(device)


def traced(make, device="cpu", which=slice(0, 3)):
    """make(*weights)(x) traced with its weights closed over: get_attr constants, as freezing
    leaves them. On "cuda", fake CUDA tensors throughout (the decision runs; no kernel does)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    decomposed = dict(decomposition_table=select_decomp_table())      # silu as inductor sees it
    if device == "cpu":
        return make_fx(make(*weights()[which]), **decomposed)(activation())
    with FakeTensorMode():
        ws = [torch.empty(w.shape, dtype=w.dtype, device="cuda") for w in weights()[which]]
        return make_fx(make(*ws), **decomposed)(torch.empty(2, M // 2, K, dtype=torch.float16, device="cuda"))


def qkv_of(wq, wk, wv):
    def qkv(x):
        h = x.view(M, K)
        return torch.mm(h, wq.t()) + 1, torch.relu(torch.mm(x.view(M, K), wk.t())), torch.mm(h, wv.t())
    return qkv


def mlp_of(wg, wu):
    def mlp(x):
        h = x.view(M, K)
        return torch.nn.functional.silu(torch.mm(h, wg.t()).view(2, M // 2, -1)) * torch.mm(h, wu.t()).view(2, M // 2, -1)
    return mlp


def nodes(graph, op):
    return [n for n in graph.nodes if n.target is op]


@pytest.fixture
def clean():
    from gemmgen.compile import clear_cache
    from gemmgen.torch_compile.ops import clear_kernels

    clear_cache(), clear_kernels(), torch_backend.reset_stats()
    yield
    clear_cache(), clear_kernels()


def test_siblings_join_once_into_a_constant_whose_slices_match_eager(clean):
    wq, wk, wv, _ = weights()
    fn = qkv_of(wq, wk, wv)
    gm = traced(qkv_of)
    GemmgenPass(CPU_JOINS)(gm.graph)
    gm.graph.lint()
    gm.recompile()
    (node,) = nodes(gm.graph, torch.ops.gemmgen.gemm.default)
    const = node.args[1].args[0]                     # B = permute(get_attr joined)
    assert const.op == "get_attr" and getattr(gm, const.target).shape == (3 * N, K)
    assert torch.equal(getattr(gm, const.target), torch.cat([wq, wk, wv]))   # joined now, at compile time
    stats = torch_backend.stats()
    assert stats["replaced"] == {"joined_mm": 3} and stats["joins"] == {"joined": 1}
    assert stats["patterns"] == {"joined": 1}
    assert stats["problems"] == {f"{M}x{3 * N}x{K}:rcr:f16:f32:f16": 1}
    assert nodes(gm.graph, torch.ops.aten.relu.default)  # an activation on one slice stays a graph op
    x = activation()
    for out, ref in zip(gm(x), fn(x)):
        assert out.stride(1) == 1 and (out.float() - ref.float()).abs().max().item() < 2e-2


def test_without_the_option_nothing_is_joined(clean):
    gm = traced(qkv_of)
    GemmgenPass(PassOptions(devices=("cuda", "cpu")))(gm.graph)
    assert torch_backend.stats()["replaced"] == {"mm": 2, "mm+relu": 1}


def test_weights_that_are_graph_inputs_are_not_joined(clean):
    """Without freezing the weights are placeholders: their values are not the graph's to join."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, wq, wk, wg, wu):
        h = x.view(M, K)
        return torch.mm(h, wq.t()), torch.mm(h, wk.t()), torch.nn.functional.silu(h @ wg.t()) * (h @ wu.t())

    gm = make_fx(f)(activation(), *weights())
    GemmgenPass(CPU_JOINS)(gm.graph)
    assert not nodes(gm.graph, torch.ops.gemmgen.gemm_gated.default)
    # q, k, gate and up read one activation: one group the user is told freezing would join
    assert torch_backend.stats()["joins"] == {"weights_not_constant": 1}
    assert "joined_mm" not in torch_backend.stats()["replaced"]


def test_gate_and_up_become_one_gated_gemm_over_their_joined_weight(clean):
    wg, wu = weights()[2:]
    fn = mlp_of(wg, wu)
    gm = traced(mlp_of, which=slice(2, 4))
    GemmgenPass(CPU_JOINS)(gm.graph)
    gm.graph.lint()
    gm.recompile()
    (node,) = nodes(gm.graph, torch.ops.gemmgen.gemm_gated.default)
    assert not nodes(gm.graph, torch.ops.aten.mm.default) and not nodes(gm.graph, torch.ops.aten.mul.Tensor)
    assert torch.equal(getattr(gm, node.args[1].args[0].target), torch.cat([wg, wu]))   # [W_gate; W_up]
    stats = torch_backend.stats()
    assert stats["replaced"] == {"gated_mm": 2} and stats["patterns"] == {"gated": 1}
    assert stats["problems"] == {f"{M}x{N}x{K}:rcr:f16:f32:gate_silu_stacked+f16": 1}
    x = activation()
    assert (gm(x).float() - fn(x).float()).abs().max().item() < 2e-2


def test_the_gated_reference_is_the_runtimes_formula():
    from gemmgen.torch_compile.ops import gated_epilogue

    acc = torch.randn(8, 2 * N)
    expected = torch.nn.functional.silu(acc[:, :N]) * acc[:, N:]
    assert torch.allclose(gated_epilogue(acc, "silu"), expected)


# -- the CUDA decision, on CPU: fake CUDA graphs and made-up database records --------------------------


@pytest.mark.parametrize("apart_ms, joined_ms, graphs, expected", [
    (0.100, (0.200, 0.220), False, {"joined": 1}),                 # 300 us apart, 200 joined
    (0.050, (0.146, 0.150), False, {"gain_below_overhead": 1}),    # 4 us saved: under the host's 5 us
    (0.050, (0.146, 0.150), True, {"joined": 1}),                  # under CUDA graphs: 2.7 % of 150 us, taken
    (0.100, (0.297, 0.298), True, {"gain_below_overhead": 1}),     # 1 % of 300 us: within the sessions' noise
    (0.100, None, False, {"unmeasured": 1}),                       # never measured: noted for tuning
])
def test_a_join_is_taken_only_where_measured_times_say_it_pays(clean, tmp_path, apart_ms, joined_ms, graphs,
                                                                expected):
    from gemmgen.dsl.ir import Problem

    db = tmp_path / "tuning.sqlite"
    # Losing trials: each member's time is its torch.matmul baseline, apart_ms.
    record_winner(db, Problem(M, N, K, "row", "col"), device_ms=1.2 * apart_ms, baseline_ms=apart_ms)
    if joined_ms:
        record_winner(db, Problem(M, 3 * N, K, "row", "col"), *joined_ms)
    gm = traced(qkv_of, "cuda")
    GemmgenPass(PassOptions(db=str(db), join_siblings=True, graphs=graphs))(gm.graph)
    stats = torch_backend.stats()
    assert stats["joins"] == expected
    assert bool(nodes(gm.graph, torch.ops.gemmgen.gemm.default)) == ("joined" in expected)
    if "unmeasured" in expected:
        assert f"{M}x{3 * N}x{K}:rcr:f16:f32:f16" in stats["missing"]


def fake_gated_kernel(device_ms):
    if device_ms in ("lost", "never tuned"):      # served by its torch fallback
        baseline_ms = 0.21 if device_ms == "lost" else None
        provenance = types.SimpleNamespace(device_ms=None, best_baseline_ms=baseline_ms, baseline_ms_here=baseline_ms,
                                           how="baseline", measured_here=False)
        return types.SimpleNamespace(backend="torch", provenance=provenance)
    provenance = types.SimpleNamespace(device_ms=device_ms, best_baseline_ms=1.0, baseline_ms_here=None, how="exact",
                                       measured_here=True)
    return types.SimpleNamespace(backend="triton", provenance=provenance)


@pytest.mark.parametrize("gated_ms, graphs, expected", [
    (None, False, {"not_served": 1}),            # gemmgen.compile refuses the gated problem
    (0.150, False, {"gated": 1}),                # 200 us apart + the pointwise kernel, 150 gated
    (0.201, False, {"gain_below_overhead": 1}),  # 200 us + ~2 us pointwise vs 201: under min_gain_us
    (0.196, True, {"gated": 1}),                 # under CUDA graphs 6 us, 2.9 % of 202 us: taken
    (0.199, True, {"gain_below_overhead": 1}),   # 3 us, 1.5 %: within the sessions' noise
    ("lost", False, {"no_winner": 1}),           # tuned: its unfused baselines were timed, nothing beat them
    ("never tuned", False, {"unmeasured": 1}),   # to tune (listed in missing)
])
def test_gate_up_is_taken_only_where_the_gated_kernel_beats_two_matmuls_and_the_pointwise(
        clean, tmp_path, monkeypatch, gated_ms, graphs, expected):
    from gemmgen.dsl.ir import Problem

    from gemmgen.errors import GemmgenError
    from gemmgen.torch_compile import decide
    from gemmgen.torch_compile import ops as torch_ops

    db = tmp_path / "tuning.sqlite"
    record_winner(db, Problem(M, N, K, "row", "col"), device_ms=0.12, baseline_ms=0.100)
    real = torch_ops.resolve

    def resolve(key, db=None):
        if key[-1] != "silu":
            return real(key, db)
        if gated_ms is None:
            raise GemmgenError("gated: not served")
        return fake_gated_kernel(gated_ms)

    monkeypatch.setattr(torch_ops, "resolve", resolve)
    assert decide.pointwise_us(M, N) == decide.POINTWISE_FLOOR_US      # a tiny product: the floor
    gm = traced(mlp_of, "cuda", slice(2, 4))
    GemmgenPass(PassOptions(db=str(db), join_siblings=True, graphs=graphs))(gm.graph)
    stats = torch_backend.stats()
    assert stats["gated"] == expected
    assert bool(nodes(gm.graph, torch.ops.gemmgen.gemm_gated.default)) == ("gated" in expected)
    # only a gated problem never tuned is listed for tuning
    assert (f"{M}x{N}x{K}:rcr:f16:f32:gate_silu_stacked+f16" in stats["missing"]) == (gated_ms == "never tuned")


# -- products inductor's freezing joined itself: kept only where measured faster than the parts ----


def inductor_joined_mlp(w_cat, sizes):
    """silu(gate) * up over one product of a row-major K x 2N constant cut by a split, the form
    inductor's freezing (concat-linear) leaves; `sizes`: an int (aten.split) or a list
    (aten.split_with_sizes)."""
    def mlp(x):
        parts = torch.mm(x.view(M, K), w_cat).split(sizes, dim=1)
        if len(parts) != 2:
            return parts
        return torch.nn.functional.silu(parts[0]) * parts[1]
    return mlp


def traced_inductor_join(device, sizes=N):
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    decomposed = dict(decomposition_table=select_decomp_table())
    wg, wu = weights()[2:]
    if device == "cpu":
        w_cat = torch.cat([wg.t(), wu.t()], dim=1)
        gm = make_fx(inductor_joined_mlp(w_cat, sizes), **decomposed)(activation())
        gm.graph.eliminate_dead_code()     # the decomposition's unused reads of the constant
        return gm, (wg, wu)
    with FakeTensorMode():
        w_cat = torch.empty(K, 2 * N, dtype=torch.float16, device="cuda")       # row-major
        x = torch.empty(2, M // 2, K, dtype=torch.float16, device="cuda")
        return make_fx(inductor_joined_mlp(w_cat, sizes), **decomposed)(x), None


@pytest.mark.parametrize("sizes", [N, [N, N]])
def test_a_product_inductor_joined_splits_into_its_parts_with_the_models_weights(clean, sizes):
    """The rewrite alone, on CPU: one mm a part over its own (N, K) weight read transposed (the
    layout the model had), copied out of the joined constant, which leaves the graph."""
    from gemmgen.torch_compile import rewrite
    from gemmgen.torch_compile.inductor_joins import inductor_joins

    gm, (wg, wu) = traced_inductor_join("cpu", sizes)
    x = activation()
    ref = gm(x)
    (join,) = inductor_joins(gm.graph, ("cpu",))
    assert join.sizes == (N, N)
    joined_name = join.node.args[1].target
    parts = rewrite.split_join(gm.graph, join)
    gm.graph.lint()
    gm.recompile()
    assert len(parts) == 2 and not nodes(gm.graph, torch.ops.aten.split.Tensor)
    assert not nodes(gm.graph, torch.ops.aten.split_with_sizes.default)
    for part, w in zip(parts, (wg, wu)):
        const = getattr(gm, part.args[1].args[0].target)            # B = permute(get_attr (N, K))
        assert const.is_contiguous() and torch.equal(const, w)
    assert not hasattr(gm, joined_name)
    # the same products, now apart; to fp16's default tolerance, since the CPU's GEMM may sum a
    # column block of the joined weight in another order than the part alone (1 ulp on AMD EPYC)
    torch.testing.assert_close(gm(x), ref)


def test_the_parts_of_a_join_are_read_off_its_split():
    from gemmgen.torch_compile.inductor_joins import inductor_joins

    gm, _ = traced_inductor_join("cpu", [N, N // 2, N // 2])
    (join,) = inductor_joins(gm.graph, ("cpu",))
    assert join.sizes == (N, N // 2, N // 2)
    assert join.keys() is None                      # a CPU product: never decided by CUDA records
    assert inductor_joins(gm.graph, ("cuda",)) == []


@pytest.mark.parametrize("apart_ms, joined_ms, graphs, expected", [
    (0.100, 0.250, False, "inductor_join_split"),          # 200 us apart against 250 joined
    (0.100, 0.190, False, "inductor_join_column_major"),   # the join saves 10 us: kept
    (0.050, 0.096, False, "inductor_join_split"),          # 4 us: under the host's 5 us
    (0.050, 0.096, True, "inductor_join_column_major"),    # under CUDA graphs 4 % of 100 us counts
    (0.100, 0.197, True, "inductor_join_split"),           # 1.5 % of 200 us: within the sessions' noise
    (None, 0.190, False, "inductor_join_split"),           # the parts never measured: split, listed
])
def test_a_product_inductor_joined_is_kept_only_where_it_measured_faster_than_its_parts(
        clean, tmp_path, apart_ms, joined_ms, graphs, expected):
    from gemmgen.dsl.ir import Problem

    db = tmp_path / "tuning.sqlite"
    # Losing trials: each problem's time is its torch.matmul baseline.
    record_winner(db, Problem(M, 2 * N, K, "row", "col"), device_ms=1.2 * joined_ms, baseline_ms=joined_ms)
    if apart_ms:
        record_winner(db, Problem(M, N, K, "row", "col"), device_ms=1.2 * apart_ms, baseline_ms=apart_ms)
    gm, _ = traced_inductor_join("cuda")
    GemmgenPass(PassOptions(db=str(db), graphs=graphs))(gm.graph)
    gm.graph.lint()
    stats = torch_backend.stats()
    assert stats["joins"] == {expected: 1}
    mms = nodes(gm.graph, torch.ops.aten.mm.default)
    if expected == "inductor_join_split":
        assert [tuple(mm.meta["val"].shape) for mm in mms] == [(M, N), (M, N)]
    else:
        (mm,) = mms
        assert mm.args[1].meta["val"].stride() == (1, K)    # K x 2N, laid out column-major again
    if apart_ms is None:                                     # listed for tuning
        assert f"{M}x{N}x{K}:rcr:f16:f32:f16" in stats["missing"]


def test_a_split_gate_and_up_compete_as_two_matmuls_for_the_gated_kernel(clean, tmp_path, monkeypatch):
    """Split back, gate and up are the two-matmul form of a gated MLP: the gated kernel's
    reference is then their times apart (200 us + the pointwise), not the joined product's."""
    from gemmgen.dsl.ir import Problem
    from gemmgen.torch_compile import ops as torch_ops

    db = tmp_path / "tuning.sqlite"
    record_winner(db, Problem(M, 2 * N, K, "row", "col"), device_ms=0.3, baseline_ms=0.250)
    record_winner(db, Problem(M, N, K, "row", "col"), device_ms=0.12, baseline_ms=0.100)
    real = torch_ops.resolve
    monkeypatch.setattr(torch_ops, "resolve",
                        lambda key, db=None: fake_gated_kernel(0.150) if key[-1] == "silu" else real(key, db))
    gm, _ = traced_inductor_join("cuda")
    GemmgenPass(PassOptions(db=str(db), join_siblings=True))(gm.graph)
    stats = torch_backend.stats()
    assert stats["joins"] == {"inductor_join_split": 1} and stats["gated"] == {"gated": 1}
    assert nodes(gm.graph, torch.ops.gemmgen.gemm_gated.default)
