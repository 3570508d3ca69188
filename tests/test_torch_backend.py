"""The torch.compile backend on CPU: registration, the rewrite on real transformers models,
numerics against eager, backward graphs, and what is left alone.

What runs here: fp16 models on CPU with `devices=("cuda", "cpu")`, so the pass rewrites CPU
matmuls too and the gemmgen op computes its fp32 torch reference (the CUDA kernels cannot run
here). Eager runs the same fp16 model with torch's CPU fp16 matmuls. Each compile costs inductor
a C++ build, so the models are tiny (2 layers, hidden 64) and each test compiles once.
"""
from importlib.metadata import entry_points

import pytest
import torch

from gemmgen.torch_compile import backend as torch_backend
from gemmgen.torch_compile.graph_pass import GemmgenPass, PassOptions, _act_graph, _match_activation, major_of

transformers = pytest.importorskip("transformers")

CPU = {"devices": ("cuda", "cpu")}
LAYERS, HIDDEN, INTER, VOCAB = 2, 64, 128, 128


@pytest.fixture
def fresh():
    """A clean dynamo, empty stats, and no inductor caches (a cache hit would skip the pass)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    torch_backend.reset_stats()
    with inductor_config.patch(fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


def tiny_llama(layers: int = LAYERS):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(torch.float16)


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def test_registered_through_the_entry_point():
    (ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "gemmgen"]
    assert ep.load() is torch_backend.gemmgen_backend
    assert "gemmgen" in torch._dynamo.list_backends()
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("gemmgen") is torch_backend.gemmgen_backend


def test_bad_options_are_one_line_errors():
    with pytest.raises(torch_backend.TorchBackendError, match="unknown gemmgen backend options"):
        torch_backend.gemmgen_backend(None, [], options={"opz": ["mm"]})
    with pytest.raises(torch_backend.TorchBackendError, match="choose from"):
        torch_backend.make_backend(ops=("mm", "bmm"))
    with pytest.raises(torch_backend.TorchBackendError, match="choose from"):
        torch_backend.make_backend(devices=("tpu",))


def test_pass_uuid_follows_the_options():
    """Inductor's FX-graph cache keys on the uuid: different options must not share entries."""
    plain = GemmgenPass(PassOptions()).uuid()
    assert plain == GemmgenPass(PassOptions()).uuid()
    assert plain != GemmgenPass(PassOptions(devices=("cuda", "cpu"))).uuid()
    assert plain != GemmgenPass(PassOptions(ops=("mm",))).uuid()
    assert plain != GemmgenPass(PassOptions(join_siblings=True)).uuid()


def test_pass_uuid_follows_the_code_of_every_module_of_the_pass(monkeypatch, tmp_path):
    """Matching, deciding and rewriting are the pass's code too: a change to any must miss
    inductor's cache."""
    import shutil

    from gemmgen.torch_compile import graph_pass

    before = GemmgenPass(PassOptions()).uuid()
    copy = tmp_path / "torch_compile"
    shutil.copytree(__import__("pathlib").Path(graph_pass.__file__).parent, copy)
    monkeypatch.setattr(graph_pass, "__file__", str(copy / "graph_pass.py"))
    assert GemmgenPass(PassOptions()).uuid() == before
    (copy / "patterns.py").write_text((copy / "patterns.py").read_text() + "\n# edited\n")
    assert GemmgenPass(PassOptions()).uuid() != before


def test_majors_follow_the_strides():
    w = torch.empty(48, 32)                      # an nn.Linear weight (N, K)
    assert major_of(w.t().shape, w.t().stride()) == "col"
    assert major_of(w.shape, w.stride()) == "row"
    x = torch.empty(16, 64)[:, ::2]              # every other column: neither
    assert major_of(x.shape, x.stride()) is None
    padded = torch.empty(16, 40)[:, :32]         # a leading dimension wider than the row
    assert major_of(padded.shape, padded.stride()) is None


def test_activation_matching_needs_the_exact_decomposition():
    """gelu(tanh) is not exact gelu: the constants differ, so it must not match."""
    from torch._inductor.pattern_matcher import fwd_only

    def graph_of(fn):
        return fwd_only(fn, [torch.empty(8, dtype=torch.float16)]).graph

    def head(graph):
        return [n for n in graph.nodes if n.op == "placeholder"][0]

    exact = graph_of(lambda x: torch.nn.functional.gelu(x))
    tanh = graph_of(lambda x: torch.nn.functional.gelu(x, approximate="tanh"))
    assert _match_activation(head(exact), _act_graph("gelu")) is not None
    assert _match_activation(head(tanh), _act_graph("gelu")) is None
    assert _match_activation(head(exact), _act_graph("silu")) is None


def test_llama_inference_rewrites_every_projection(fresh):
    model = tiny_llama().eval()
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        out = torch.compile(model, backend="gemmgen", options=CPU)(ids).logits
    # By hand: q, k, v, o, gate, up, down per layer, plus lm_head; gate's silu fuses (eval: one
    # user); o and down add into the residual stream, which fuses as the residual epilogue.
    expected = {"mm": LAYERS * 4 + 1, "mm+silu": LAYERS, "mm+residual": 2 * LAYERS}
    stats = torch_backend.stats()
    assert stats["replaced"] == expected, stats
    assert stats["skipped"] == {}
    # Weights are x @ W.T: A row-major, B a transposed (N, K) weight, i.e. column-major.
    assert all(":rcr:" in key for key in stats["problems"]), stats["problems"]
    assert f"16x{INTER}x{HIDDEN}:rcr:f16:f32:silu+f16" in stats["problems"]
    assert rel_err(out, ref) < 1e-2


def compiled_twice_with_inductors_cache(tmp_path, monkeypatch, options, *, freezing=False, autograd_cache=False):
    """The tiny Llama compiled twice (dynamo reset between, as in a new process) with inductor's
    FX-graph cache on, in an empty folder: (eager logits, [(logits, stats()) of each compile])."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = tiny_llama().eval()
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
    runs = []
    with inductor_config.patch(fx_graph_cache=True, force_disable_caches=False, freezing=freezing), \
            functorch_config.patch(enable_autograd_cache=autograd_cache), torch.no_grad():
        for _ in range(2):
            torch._dynamo.reset()
            torch_backend.reset_stats()
            out = torch.compile(model, backend="gemmgen", options=options)(ids).logits
            runs.append((out, torch_backend.stats()))
    torch._dynamo.reset()
    return ref, runs


def test_a_graph_from_inductors_cache_is_counted_as_such(tmp_path, monkeypatch):
    """On an FX-graph cache hit the pass does not run: the stats say so instead of reading 0."""
    _, runs = compiled_twice_with_inductors_cache(tmp_path, monkeypatch, CPU)
    counts = [(sum(stats["replaced"].values()), stats["graphs"], stats["from_cache"]) for _, stats in runs]
    assert counts == [(LAYERS * 7 + 1, 1, 0), (0, 0, 1)], counts


def test_a_frozen_graph_with_joined_weights_compiles_again_with_the_cache_on(tmp_path, monkeypatch):
    """Under freezing inductor's cache keeps constants by name, to read off the graph module at a
    hit; the joined weights the pass adds are not on it then. The pass bypasses the cache there,
    so a second compile (a new process, or after dynamo's reset) works and computes right."""
    ref, runs = compiled_twice_with_inductors_cache(tmp_path, monkeypatch, {**CPU, "join_siblings": True},
                                                    freezing=True, autograd_cache=True)
    graphs = [(stats["graphs"], stats["from_cache"], stats["joins"].get("joined", 0)) for _, stats in runs]
    assert graphs == [(1, 0, LAYERS)] * 2, graphs
    for out, _ in runs:
        assert rel_err(out, ref) < 1e-2


def test_llama_training_forward_and_backward(fresh):
    model = tiny_llama().train()
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
    model(ids, labels=ids).loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(model, backend="gemmgen", options=CPU)
    loss = compiled(ids, labels=ids).loss
    loss.backward()
    # Forward: the 15 projections (silu's input is saved for backward, so no fusion; o and down
    # add into the residual stream). Backward: two matmuls per projection (grad of its input,
    # grad of its weight); input gradients that add up (q, k and v read one x) take the add as
    # a residual epilogue.
    projections = LAYERS * 7 + 1
    replaced = torch_backend.stats()["replaced"]
    assert sum(replaced.values()) == 3 * projections and set(replaced) == {"mm", "mm+residual"}, replaced
    problems = torch_backend.stats()["problems"]
    assert any(":crr:" in key for key in problems), problems   # grad W = dY.T @ X: A is a transposed view
    for name, p in model.named_parameters():
        assert rel_err(p.grad, ref_grads[name]) < 2e-2, name


def test_gpt2_conv1d_is_addmm_with_a_row_major_weight(fresh):
    layers = 1                                 # one block shows every GPT-2 matmul; keeps CI short
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=HIDDEN, n_layer=layers, n_head=4,
                                  activation_function="gelu", bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).to(torch.float16).eval()
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids).logits
        out = torch.compile(model, backend="gemmgen", options=CPU)(ids).logits
    # Per layer: c_attn, attn c_proj and mlp c_proj (each added into the residual stream), c_fc
    # (+ exact gelu fused); lm_head is a plain mm.
    assert torch_backend.stats()["replaced"] == {"addmm": layers, "addmm+residual": 2 * layers,
                                                 "addmm+gelu": layers, "mm": 1}
    problems = torch_backend.stats()["problems"]
    assert f"16x{3 * HIDDEN}x{HIDDEN}:rrr:f16:f32:bias_n+f16" in problems, problems
    assert f"16x{4 * HIDDEN}x{HIDDEN}:rrr:f16:f32:bias_n+gelu+f16" in problems, problems
    assert rel_err(out, ref) < 1e-2


def mixed(x16, w16, b16, x32, w32, q, k, wide):
    """Two matmuls gemmgen takes and three it must leave to inductor."""
    taken = torch.relu(x16 @ w16.t()) + torch.nn.functional.gelu(torch.addmm(b16, x16, w16.t()))
    fp32 = x32 @ w32.t()                       # not fp16
    batched = torch.bmm(q, k.transpose(1, 2))  # a bmm
    strided = wide[:, ::2] @ w16.t()           # A with strides (2K, 2): neither row nor col major
    return taken, fp32, batched, strided


def mixed_inputs(dtype=torch.float16):
    g = torch.Generator().manual_seed(4)

    def r(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(dt)

    return (r(16, 32), r(24, 32), r(24), r(16, 32, dt=torch.float32), r(24, 32, dt=torch.float32),
            r(2, 8, 16), r(2, 8, 16), r(16, 64))


def test_unsupported_cases_are_left_alone_and_counted(fresh):
    args = mixed_inputs()
    ref = mixed(*args)
    out = torch.compile(mixed, backend="gemmgen", options=CPU)(*args)
    stats = torch_backend.stats()
    # relu(x w^T) + gelu(addmm): the two products meet in one add; the first takes it as its
    # residual epilogue, the other's (fused) output is that residual.
    assert stats["replaced"] == {"mm+relu+residual": 1, "addmm+gelu": 1}
    assert stats["skipped"] == {"dtype": 1, "batched_matmul": 1, "layout": 1}
    for o, r in zip(out, ref):
        assert rel_err(o, r) < 1e-2


def pointwise_operands(x, y, w, v):
    """Matmuls whose operands come from pointwise kernels: their layout is inductor's to choose."""
    return (x.t() + y) @ w.t(), y @ (w.t() + v)


def test_the_op_gets_the_strides_the_pass_saw(fresh):
    """Eager gives x.t() + y column-major and w.t() + v column-major, and the pass chose the
    majors from those. Unpinned, inductor made both row-major (torch 2.13): the kernel would
    have read them with the wrong major. The CPU op checks the majors as the CUDA kernel does."""
    g = torch.Generator().manual_seed(5)
    x, y, w, v = (torch.randn(*s, generator=g).half() for s in ((32, 64), (64, 32), (48, 32), (32, 48)))
    ref = pointwise_operands(x, y, w, v)
    out = torch.compile(pointwise_operands, backend="gemmgen", options=CPU)(x, y, w, v)
    stats = torch_backend.stats()
    assert stats["replaced"] == {"mm": 2}
    assert set(stats["problems"]) == {"64x48x32:ccr:f16:f32:f16", "64x48x32:rcr:f16:f32:f16"}
    for o, r in zip(out, ref):
        assert rel_err(o, r) < 1e-2


def test_cpu_stays_on_the_stock_path_by_default(fresh):
    args = mixed_inputs()
    ref = mixed(*args)
    out = torch.compile(mixed, backend=torch_backend.make_backend())(*args)
    stats = torch_backend.stats()
    assert stats["replaced"] == {}
    assert stats["skipped"]["device_cpu"] == 3      # every fp16 CPU matmul, counted by its reason
    assert rel_err(out[0], ref[0]) < 1e-2


# -- a symbolic M (dynamic=True): one graph for every batch, each call served at its M -----------


def test_a_dynamic_batch_is_rewritten_once_and_runs_every_m(fresh):
    """With dynamic=True the projections' M is a symbol; the pass rewrites them all the same, and
    one compiled graph serves every batch and sequence length, matching eager."""
    model = tiny_llama().eval()
    compiled = torch.compile(model, backend="gemmgen", dynamic=True, options=CPU)
    with torch.no_grad():
        for batch, seq in ((2, 8), (3, 5), (2, 11)):     # (batch 1 is a size dynamo specialises)
            ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seq))
            assert rel_err(compiled(ids).logits, model(ids).logits) < 1e-2
    stats = torch_backend.stats()
    assert "dynamic_shape" not in stats["skipped"] and sum(stats["replaced"].values()) >= LAYERS * 7 + 1
    assert all(key.startswith("*x") for key in stats["problems"]), stats["problems"]
    assert stats["graphs"] == 1          # one graph for every M: no recompilation per batch


def test_tuning_missing_shapes_without_a_gpu_says_it_tunes_nothing(fresh):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU to tune on")
    model = torch.nn.Linear(16, 32)
    compiled = torch.compile(model, backend="gemmgen", options={**CPU, "tune_missing": True})
    x = torch.randn(4, 16)
    with pytest.warns(UserWarning, match="tune_missing=True needs a CUDA GPU"):
        out = compiled(x)
    assert torch.allclose(out, model(x), atol=1e-5)


def test_the_cpu_example_of_the_docs_prints_what_its_comments_say(fresh, capsys):
    """docs/torch_compile.md's CPU example: each printed dict is the one its comment shows, and
    the logits stay within fp16 noise of eager's."""
    import ast
    import pathlib
    import re

    text = (pathlib.Path(__file__).parent.parent / "docs" / "torch_compile.md").read_text()
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "LlamaConfig" in b]
    exec(compile(example, "docs/torch_compile.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    comments = [line.split("#", 1)[1] for line in example.splitlines() if line.startswith("print(")]
    assert len(printed) == len(comments) == 6
    for out, comment in zip(printed, comments):
        if "{" in comment:            # e.g. "{'causal': 2}: each layer's mask proven causal"
            assert ast.literal_eval(out) == ast.literal_eval(comment[comment.index("{"):comment.index("}") + 1])
        else:                          # "about 5e-4": the largest difference from eager
            assert float(out) < 1e-2
