"""The torch.compile pass's CUDA decision, on CPU: graphs of fake CUDA tensors (and one with a
symbolic M) through the pass, against tuning databases written here. Whether a matmul is taken
follows the records (a winner, its epilogue's own baseline, the gain it must save), and what is
taken computes what the op it replaces did."""
import pytest
import torch

from gemmgen.torch_compile import backend as torch_backend
from gemmgen.torch_compile.graph_pass import GemmgenPass, PassOptions


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def cuda_graph(m=64, n=48, k=32):
    """mm + relu and addmm(bias) of an nn.Linear-style weight, traced on fake CUDA tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w, b):
        return torch.relu(torch.mm(x, w.t())), torch.addmm(b, x, w.t())

    with FakeTensorMode():
        args = (torch.empty(m, k, dtype=torch.float16, device="cuda"),
                torch.empty(n, k, dtype=torch.float16, device="cuda"),
                torch.empty(n, dtype=torch.float16, device="cuda"))
        return make_fx(f)(*args).graph


def record_winner(path, problem, device_ms=0.010, baseline_ms=0.020):
    """A measured winner for `problem` on the default GPU name, as a tuning run would record it."""
    from gemmgen import backends
    from gemmgen.dsl import to_text
    from gemmgen.tuning_db import DEFAULT_DEVICE_NAME, BaselineTime, Database, Device, Trial

    program = backends.get("triton").space(problem)[0]
    with Database(path) as db:
        db.record(Trial(problem=problem, device=Device(DEFAULT_DEVICE_NAME), program=to_text(program),
                        backend=program.backend, status="ok", build_ok=True, check_passed=True,
                        device_ms=device_ms, spread=0.01, baselines={"torch": BaselineTime(baseline_ms, 0.01)}))


def gemm_nodes(graph):
    return [n for n in graph.nodes if n.target is torch.ops.gemmgen.gemm.default]


def test_cuda_matmuls_without_a_tuned_kernel_stay_with_inductor(tmp_path):
    from gemmgen.compile import clear_cache
    from gemmgen.torch_compile.ops import clear_kernels

    clear_cache(), clear_kernels(), torch_backend.reset_stats()
    db = str(tmp_path / "tuning.sqlite")
    graph = cuda_graph()
    GemmgenPass(PassOptions(db=db))(graph)
    stats = torch_backend.stats()
    assert stats["replaced"] == {} and stats["skipped"] == {"no_tuned_kernel": 2}
    assert set(stats["missing"]) == {"64x48x32:rcr:f16:f32:relu+f16", "64x48x32:rcr:f16:f32:bias_n+f16"}
    assert len(torch_backend.missing_keys()) == 2 and not gemm_nodes(graph)
    # baseline="op": through gemmgen's cuBLAS fallback anyway.
    graph = cuda_graph()
    GemmgenPass(PassOptions(db=db, baseline="op"))(graph)
    (relu, bias) = gemm_nodes(graph)
    assert relu.args[2:] == (None, None, "row", "col", "relu", 1.0, 0.0)
    assert bias.args[4:7] == ("row", "col", "none") and bias.args[2] is not None


def test_a_tuned_winner_is_taken(tmp_path):
    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Epilogue, Problem
    from gemmgen.torch_compile.ops import clear_kernels

    db = tmp_path / "tuning.sqlite"
    record_winner(db, Problem(64, 48, 32, "row", "col", epilogue=Epilogue(activation="relu")))
    clear_cache(), clear_kernels(), torch_backend.reset_stats()
    graph = cuda_graph()
    GemmgenPass(PassOptions(db=str(db)))(graph)
    stats = torch_backend.stats()
    assert stats["replaced"] == {"mm+relu": 1}           # the winner, fused relu and all
    assert stats["skipped"] == {"no_tuned_kernel": 1}    # the addmm has none
    (node,) = gemm_nodes(graph)
    assert not [n for n in graph.nodes if n.target is torch.ops.aten.relu.default]


def test_a_linear_bias_kernel_competes_with_its_own_baseline(tmp_path):
    """The baseline adds nn.Linear's bias inside the product, as inductor's addmm does, so a
    tuned addmm needs no bare matmul's time to be judged: its own baseline is the reference."""
    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Epilogue, Problem
    from gemmgen.torch_compile.ops import clear_kernels

    db = tmp_path / "tuning.sqlite"
    record_winner(db, Problem(64, 48, 32, "row", "col", epilogue=Epilogue(bias="n")),
                  device_ms=0.010, baseline_ms=0.020)
    clear_cache(), clear_kernels(), torch_backend.reset_stats()
    GemmgenPass(PassOptions(db=str(db)))(cuda_graph())
    stats = torch_backend.stats()
    assert stats["replaced"] == {"addmm": 1} and stats["skipped"] == {"no_tuned_kernel": 1}
    assert "64x48x32:rcr:f16:f32:f16" not in stats["missing"]


def test_on_unaligned_rows_a_linear_bias_kernel_needs_the_bare_matmuls_time(tmp_path):
    """Where rows are not 16-byte aligned the baseline adds the bias after the product, which
    inductor's addmm does not pay: the kernel's own baseline is no reference there."""
    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Epilogue, Problem
    from gemmgen.torch_compile.ops import clear_kernels

    db = tmp_path / "tuning.sqlite"
    record_winner(db, Problem(64, 47, 32, "row", "col", epilogue=Epilogue(bias="n")),
                  device_ms=0.010, baseline_ms=0.020)
    clear_cache(), clear_kernels(), torch_backend.reset_stats()
    GemmgenPass(PassOptions(db=str(db)))(cuda_graph(n=47))
    stats = torch_backend.stats()
    assert stats["replaced"] == {}
    assert "64x47x32:rcr:f16:f32:f16" in stats["missing"]


def test_a_winner_that_saves_less_than_the_op_costs_is_not_taken(tmp_path):
    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Epilogue, Problem
    from gemmgen.torch_compile.ops import clear_kernels

    db = tmp_path / "tuning.sqlite"
    record_winner(db, Problem(64, 48, 32, "row", "col", epilogue=Epilogue(activation="relu")),
                  device_ms=0.0040, baseline_ms=0.0042)        # 0.2 us saved per call
    for min_gain_us, expected in ((5.0, {}), (0.0, {"mm+relu": 1})):
        clear_cache(), clear_kernels(), torch_backend.reset_stats()
        GemmgenPass(PassOptions(db=str(db), min_gain_us=min_gain_us))(cuda_graph())
        assert torch_backend.stats()["replaced"] == expected
    torch_backend.reset_stats()
    GemmgenPass(PassOptions(db=str(db)))(cuda_graph())
    assert torch_backend.stats()["skipped"] == {"gain_below_overhead": 1, "no_tuned_kernel": 1}


def swiglu_graph():
    """Llama's MLP gate: silu(x @ Wg.T) * (x @ Wu.T), on fake CUDA tensors: the silu feeds a mul."""
    import torch._inductor.decomposition
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, wg, wu):
        return torch.nn.functional.silu(torch.mm(x, wg.t())) * torch.mm(x, wu.t())

    with FakeTensorMode():
        args = [torch.empty(s, dtype=torch.float16, device="cuda") for s in ((64, 32), (48, 32), (48, 32))]
        return make_fx(f, decomposition_table=torch._inductor.decomposition.select_decomp_table())(*args).graph


def test_a_fused_activation_competes_with_the_bare_matmul_when_inductor_would_fuse_it(tmp_path):
    """Tuning timed mm+silu against cuBLAS plus a separate silu pass; in this graph inductor
    fuses the silu into the mul, so the kernel must beat the bare cuBLAS matmul instead."""
    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Epilogue, Problem
    from gemmgen.torch_compile.ops import clear_kernels

    def run():
        clear_cache(), clear_kernels(), torch_backend.reset_stats()
        GemmgenPass(PassOptions(db=str(db)))(swiglu_graph())
        return torch_backend.stats()

    db = tmp_path / "tuning.sqlite"
    fused, bare = (Problem(64, 48, 32, "row", "col", epilogue=Epilogue(activation=act)) for act in ("silu", None))
    record_winner(db, fused, device_ms=0.030, baseline_ms=0.040)     # 10 us ahead of mm + silu pass
    stats = run()
    assert stats["replaced"] == {}
    assert stats["skipped"] == {"reference_unmeasured": 1, "no_tuned_kernel": 1}
    assert stats["missing"] == {bare.key: 2}                       # tuning it gives the reference
    record_winner(db, bare, device_ms=0.040, baseline_ms=0.025)     # measured: cuBLAS alone, 25 us
    stats = run()
    assert stats["replaced"] == {} and stats["skipped"] == {"gain_below_overhead": 1, "no_tuned_kernel": 1}
    record_winner(db, fused, device_ms=0.015, baseline_ms=0.040)    # now 10 us ahead of cuBLAS alone
    stats = run()
    assert stats["replaced"] == {"mm+silu": 1}


def test_addmm_bias_c_alpha_beta_are_honoured():
    """A (1, N) bias, C with alpha/beta, a scaled bias (left alone), beta = 0 (input ignored)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w, b, c):
        return (torch.addmm(b.view(1, -1), x, w.t()), torch.addmm(c, x, w.t(), beta=0.5, alpha=2.0),
                torch.addmm(b, x, w.t(), beta=2.0), torch.addmm(b, x, w.t(), beta=0.0))

    shapes = ((64, 32), (48, 32), (48,), (64, 48))
    with FakeTensorMode():
        gm = make_fx(f)(*(torch.empty(s, dtype=torch.float16) for s in shapes))
    torch_backend.reset_stats()
    GemmgenPass(PassOptions(devices=("cpu",)))(gm.graph)
    gm.recompile()
    stats = torch_backend.stats()
    assert stats["replaced"] == {"addmm": 2, "mm": 1} and stats["skipped"] == {"scaled_bias": 1}
    assert "64x48x32:rcr:f16:f32:alpha+beta+f16" in stats["problems"]
    g = torch.Generator().manual_seed(5)
    real = [torch.randn(s, generator=g).half() for s in shapes]
    for out, ref in zip(gm(*real), f(*real)):
        assert rel_err(out, ref) < 1e-2


def test_tune_keys_proposes_only_the_backends_asked_for(tmp_path, monkeypatch, capsys):
    """A short tuning budget spent on one-minute CUTLASS builds recorded nothing on the H200;
    tune_keys(backends=("triton",)) keeps the proposals to what builds in seconds."""
    import gemmgen.tune
    from gemmgen.torch_compile import ops as torch_ops
    from gemmgen.tune import on_demand

    seen = {}

    from tuning_fakes import FakeRunner

    class NoGPU(FakeRunner):                   # measures nothing here: the loop is fake_tune
        def library(self, problem):
            seen["library"] = problem.key
            return {"error": "no GPU here"}

    def fake_tune(problems, *, proposer, **kwargs):
        seen["backends"] = proposer.backends
        seen["problems"] = [p.key for p in problems]
        seen["proposed"] = {prog.backend for p in problems for prog in proposer.propose(p, 6)}
        return gemmgen.tune.TuneReport(shapes=len(problems))

    monkeypatch.setattr(on_demand, "WorkerRunner", lambda **kw: NoGPU())
    monkeypatch.setattr(gemmgen.tune, "tune", fake_tune)
    key = torch_ops.kernel_key(2048, 5632, 2048, "row", "col", False, False, "silu", 1.0, 0.0, 0)
    torch_backend.tune_keys([key, key], tmp_path / "t.sqlite", budget=6, time_budget_s=40, backends=("triton",))
    assert "gemmgen: 1 GEMMs found, 1 tuned, 0 won," in capsys.readouterr().err     # one line per compile
    assert seen == {"backends": ("triton",), "problems": ["2048x5632x2048:rcr:f16:f32:silu+f16"],
                    "proposed": {"triton"}}
    torch_backend.tune_keys([key], tmp_path / "t.sqlite")     # no limits: the library's search, then every backend
    assert set(seen["backends"]) >= {"triton", "cutlass", "cuda"} and seen["library"] == seen["problems"][0]


def test_the_gain_a_kernel_must_save_follows_cuda_graphs(monkeypatch):
    """Unset, min_gain_us is the host dispatch's 5 us, or 0 where the graph replays as a CUDA graph
    (mode="reduce-overhead" or inductor's triton.cudagraphs); a value the user set is kept."""
    from gemmgen.torch_compile import backend as torch_backend_module
    from gemmgen.torch_compile.backend import compile_with_pass, pass_options
    from gemmgen.torch_compile.decide import GRAPH_MIN_GAIN_US, HOST_MIN_GAIN_US

    seen = []

    def fake_compile_fx(gm, example_inputs, config_patches):
        seen.append(config_patches[torch_backend_module.PASS_SLOT].options)
        return gm

    monkeypatch.setattr("torch._inductor.compile_fx.compile_fx", fake_compile_fx)
    for kwargs, options, expected in (({}, {}, HOST_MIN_GAIN_US), ({"mode": "reduce-overhead"}, {}, GRAPH_MIN_GAIN_US),
                                      ({"inductor": {"triton.cudagraphs": True}}, {}, GRAPH_MIN_GAIN_US),
                                      ({"mode": "reduce-overhead"}, {"min_gain_us": 2}, 2.0)):
        no_graph = pass_options(causal_masks=False, grouped_kv=False, **options)    # the rewrites need one
        compile_with_pass(None, [], no_graph, **kwargs)
        assert seen[-1].gain_threshold_us == expected
    assert (HOST_MIN_GAIN_US, GRAPH_MIN_GAIN_US) == (5.0, 0.0)
    for bad in (-1, True, "5", float("nan")):
        with pytest.raises(torch_backend_module.TorchBackendError, match="min_gain_us"):
            pass_options(min_gain_us=bad)


def test_tune_seconds_is_a_positive_number():
    from gemmgen.torch_compile.backend import TorchBackendError, pass_options

    assert pass_options(tune_seconds=90).tune_seconds == 90.0
    for bad in (0, -5, True, "90", float("inf")):
        with pytest.raises(TorchBackendError, match="tune_seconds"):
            pass_options(tune_seconds=bad)


def symbolic_graph():
    """cuda_graph's mm + relu and addmm(bias), traced with a symbolic M (the weight static)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    def f(x, w, b):
        return torch.relu(torch.mm(x, w.t())), torch.addmm(b, x, w.t())

    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic_rows = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.empty(64, 32, dtype=torch.float16), symbolic_context=dynamic_rows)
    w, b = (mode.from_tensor(torch.empty(*s, dtype=torch.float16), static_shapes=True) for s in ((48, 32), (48,)))
    with mode:
        return make_fx(f)(x, w, b).graph


def test_a_symbolic_m_is_taken_where_some_batch_size_has_a_winner(tmp_path, monkeypatch):
    """The CUDA decision for a symbolic M, on CPU (the graph's device read as CUDA 0): the plain
    matmul is taken once a batch size of its (., N, K) has a winner, its relu left to inductor;
    the addmm, whose epilogue nobody tuned, stays with inductor."""
    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Problem
    from gemmgen.torch_compile import patterns
    from gemmgen.torch_compile.ops import clear_kernels, resolve, serve

    monkeypatch.setattr(patterns, "cuda_index", lambda device: 0)
    db = tmp_path / "tuning.sqlite"
    options = PassOptions(db=str(db), devices=("cuda", "cpu"))
    clear_cache(), clear_kernels(), torch_backend.reset_stats()
    graph = symbolic_graph()
    GemmgenPass(options)(graph)
    assert torch_backend.stats()["skipped"] == {"dynamic_m_untuned": 2} and not gemm_nodes(graph)

    for m in (8, 16):
        record_winner(db, Problem(m, 48, 32, "row", "col"))
    clear_cache(), clear_kernels(), torch_backend.reset_stats()
    graph = symbolic_graph()
    GemmgenPass(options)(graph)
    stats = torch_backend.stats()
    assert stats["replaced"] == {"mm": 1} and stats["skipped"] == {"dynamic_m_untuned": 1}
    (node,) = gemm_nodes(graph)
    assert node.args[6] == "none"                                    # the relu stays for inductor
    assert [n for n in graph.nodes if n.target is torch.ops.aten.relu.default]
    # at run time each M is served from the table: the winners, the program between them, cuBLAS
    key = lambda m: (m, 48, 32, "row", "col", False, False, "none", 1.0, 0.0, 0, False, "none")  # noqa: E731
    assert [serve(key(m)).provenance.how for m in (8, 12, 16, 40)] == ["exact", "range", "exact", "baseline"]
    assert serve(key(8)) is resolve(key(8), str(db))      # at a measured M: exactly what compile serves
