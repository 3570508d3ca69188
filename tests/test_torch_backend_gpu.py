"""The torch.compile backend on the GPU: the op path calls gemmgen Kernels inside inductor's
CUDA code, forward and backward, and untuned matmuls stay with inductor by default.
Tiny models (2 layers, hidden 64): well under a minute each on an H200."""
import pytest
import torch

from gemmgen.torch_compile import backend as torch_backend

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.gpu

LAYERS = 2


@pytest.fixture
def fresh():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    torch_backend.reset_stats()
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield
    torch._dynamo.reset()


def tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    with torch.device("cuda"):
        return transformers.LlamaForCausalLM(cfg).to(torch.float16)


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def record_winners(db: str, programs, device_ms: float) -> None:
    """Made-up winners: these tests check the plumbing, not speed. Recorded under this process's
    device and toolchain, as a tuning run records them (a winner measured under another one
    does not serve)."""
    from gemmgen.dsl import to_text
    from gemmgen.tune.adapters import this_device
    from gemmgen.tuning_db import BaselineTime, Database, Trial

    with Database(db) as database:
        for program in programs:
            database.record(Trial(problem=program.problem, device=this_device(),
                                  program=to_text(program), backend=program.backend, status="ok", build_ok=True,
                                  check_passed=True, device_ms=device_ms, spread=0.0,
                                  baselines={"torch": BaselineTime(1.0, 0.0)}))


def record_triton_winners(db: str, problems, device_ms: float) -> None:
    """The first Triton program of each problem's space, as a made-up winner."""
    from gemmgen import backends
    record_winners(db, [backends.get("triton").space(problem)[0] for problem in problems], device_ms)


def test_op_path_matches_eager_in_inference(fresh, tmp_path):
    model = tiny_llama().eval()
    ids = torch.randint(0, 256, (4, 16), device="cuda")
    opts = {"baseline": "op", "db": str(tmp_path / "user.sqlite")}
    with torch.no_grad():
        ref = model(ids).logits
        out = torch.compile(model, backend="gemmgen", dynamic=False, options=opts)(ids).logits
    assert torch_backend.stats()["replaced"] == {"mm": LAYERS * 4 + 1, "mm+silu": LAYERS, "mm+residual": 2 * LAYERS}
    assert rel_err(out, ref) < 1e-2


def test_op_path_trains(fresh, tmp_path):
    model = tiny_llama().train()
    ids = torch.randint(0, 256, (4, 16), device="cuda")
    model(ids, labels=ids).loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    opts = {"baseline": "op", "db": str(tmp_path / "user.sqlite")}
    torch.compile(model, backend="gemmgen", dynamic=False, options=opts)(ids, labels=ids).loss.backward()
    projections = LAYERS * 7 + 1
    replaced = torch_backend.stats()["replaced"]        # o, down and summed input gradients: residual
    assert sum(replaced.values()) == 3 * projections and set(replaced) == {"mm", "mm+residual"}, replaced
    for name, p in model.named_parameters():
        assert rel_err(p.grad, ref[name]) < 2e-2, name


def test_untuned_problems_stay_with_inductor_by_default(fresh, tmp_path):
    model = tiny_llama().eval()
    ids = torch.randint(0, 256, (4, 16), device="cuda")
    with torch.no_grad():
        ref = model(ids).logits
        out = torch.compile(model, backend="gemmgen", dynamic=False,
                            options={"db": str(tmp_path / "user.sqlite")})(ids).logits
    stats = torch_backend.stats()
    taken = sum(stats["replaced"].values())
    assert taken + stats["skipped"].get("no_tuned_kernel", 0) == LAYERS * 7 + 1, stats
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("graphs", [False, True], ids=["launches", "cuda_graphs"])
def test_generated_kernels_run_inside_the_compiled_model(fresh, tmp_path, graphs):
    """Every projection gets a Triton program from gemmgen's space, recorded as a winner in a
    scratch database (made-up times: this checks the plumbing, not speed); the compiled model
    then runs gemmgen-generated kernels for all of them and still matches eager. With CUDA
    graphs the calls go warm-up, recording, replays, and the replays follow new inputs."""
    from gemmgen.compile import clear_cache
    from gemmgen.torch_compile.ops import _SERVED, clear_kernels, problem_of

    clear_cache(), clear_kernels()      # the op's kernels are cached by key; the other case made them
    model = tiny_llama().eval()
    ids = torch.randint(0, 256, (4, 16), device="cuda")
    db = str(tmp_path / "user.sqlite")
    for _ in range(2):      # a fused epilogue's kernel then the bare matmul it competes with
        with torch.no_grad():
            torch.compile(model, backend="gemmgen", dynamic=False, options={"db": db})(ids)
        keys = torch_backend.missing_keys()
        if keys:
            record_triton_winners(db, [problem_of(key) for key in keys], device_ms=0.001)
        clear_cache(), clear_kernels(), torch._dynamo.reset(), torch_backend.reset_stats()
    opts = {"db": db, "inductor": {"triton.cudagraphs": True}} if graphs else {"db": db}
    compiled = torch.compile(model, backend="gemmgen", dynamic=False, options=opts)
    with torch.no_grad():
        for step in range(4):
            x = ids if step < 3 else torch.randint(0, 256, (4, 16), device="cuda")
            assert rel_err(compiled(x).logits, model(x).logits) < 1e-2
    assert sum(torch_backend.stats()["replaced"].values()) == LAYERS * 7 + 1
    used = set(torch_backend.stats()["problems"])
    assert {k.backend for key, k in _SERVED.items() if problem_of(key).key in used} == {"triton"}   # what ran


def _split_k_program(problem, backend: str):
    from gemmgen.dsl.ir import Program, Tile
    if backend == "triton":
        return Program(problem=problem, backend="triton", tile=Tile(64, 64, 32), warps=(4, 1), mainloop="multistage",
                       stages=2, split_k=2, split_k_reduce="unordered")
    from cuda_backend_cases import multistage
    return multistage(problem, tile=(64, 64, 64), warps=(2, 2), stages=4, split_k=4, reduce="unordered")


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_split_k_workspaces_stay_out_of_the_cuda_graph_pool(fresh, tmp_path, backend):
    """A split-K kernel makes its workspace (the CUDA one zero-filled, with arrival counters) on
    its first call, which with CUDA graphs is the graph's warm-up; it must not land in the
    graph's pool, which inductor checks, and the replays must stay right on new inputs."""
    from gemmgen.compile import clear_cache
    from gemmgen.torch_compile.ops import _SERVED, clear_kernels, problem_of

    clear_cache(), clear_kernels()      # the op's kernels are cached by key; the other backend's case made one
    w = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    def model(x):
        return x @ w.T

    db = str(tmp_path / "user.sqlite")
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    torch.compile(model, backend="gemmgen", dynamic=False, options={"db": db})(x)
    keys = torch_backend.missing_keys()
    assert len(keys) == 1
    record_winners(db, [_split_k_program(problem_of(keys[0]), backend)], device_ms=0.001)
    clear_cache(), clear_kernels(), torch._dynamo.reset(), torch_backend.reset_stats()
    compiled = torch.compile(model, backend="gemmgen", dynamic=False,
                             options={"db": db, "inductor": {"triton.cudagraphs": True}})
    for step in range(4):
        x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
        assert rel_err(compiled(x), model(x)) < 1e-2, step
    [kernel] = _SERVED.values()                   # the kernel the calls ran
    assert kernel.backend == backend and kernel.ir.split_k > 1


def test_library_choices_stay_out_of_the_cuda_graph_pool(fresh, tmp_path):
    """A cuBLASLt choice plans (over operands of the problem's size) and makes its workspace on
    its first call, the graph's warm-up under CUDA graphs: inductor refused such a graph
    ("tensor(s) in the cudagraph pool not tracked as outputs") in a decode step at batch 32."""
    from dataclasses import replace

    from gemmgen.compile import clear_cache
    from gemmgen.measure.library import search_cublaslt
    from gemmgen.torch_compile.ops import _SERVED, clear_kernels, problem_of
    from gemmgen.tune import library_choice
    from gemmgen.tune.adapters import this_device
    from gemmgen.tuning_db import Database

    clear_cache(), clear_kernels()
    w = torch.randn(1288, 2056, device="cuda", dtype=torch.float16)     # no shipped record has it
    def model(x):
        return x @ w.T

    db = str(tmp_path / "user.sqlite")
    torch.compile(model, backend="gemmgen", dynamic=False, options={"db": db})(
        torch.randn(24, 2056, device="cuda", dtype=torch.float16))
    [key] = torch_backend.missing_keys()
    problem = problem_of(key)
    choice = library_choice(search_cublaslt(problem), problem, this_device())
    with Database(db) as database:      # a made-up win: this test checks the plumbing, not speed
        database.record_library(replace(choice, device_ms=choice.torch_ms / 2, created=""))
    clear_cache(), clear_kernels(), torch._dynamo.reset(), torch_backend.reset_stats()
    compiled = torch.compile(model, backend="gemmgen", dynamic=False,
                             options={"db": db, "inductor": {"triton.cudagraphs": True}})
    for step in range(4):                         # warm-up, recording, replays
        x = torch.randn(24, 2056, device="cuda", dtype=torch.float16)
        assert rel_err(compiled(x), model(x)) < 1e-2, step
    [kernel] = _SERVED.values()
    assert kernel.provenance.how == "library" and kernel.backend == "cublaslt"


def test_fused_decoder_under_cuda_graphs_replays_right_on_new_inputs(fresh, tmp_path):
    """join_siblings with mode="reduce-overhead": q/k/v joined, gate/up one gated GEMM, the
    residual adds in the epilogues, all over weights joined at compile time (freezing). The
    first compile notes the problems the database lacks; with made-up winners for them
    (plumbing, not speed; min_gain_us=0) the second takes every fusion, and the CUDA graph
    replays right on two different input batches (warm-up, recording, replays)."""
    import torch._inductor.config as inductor_config

    from gemmgen.compile import clear_cache
    from gemmgen.torch_compile.ops import clear_kernels, problem_of

    clear_cache(), clear_kernels()
    model = tiny_llama().eval()
    opts = {"db": str(tmp_path / "user.sqlite"), "join_siblings": True, "min_gain_us": 0.0,
            "mode": "reduce-overhead"}
    batches = [torch.randint(0, 256, (4, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(s))
               for s in (1, 2)]
    with torch.no_grad(), inductor_config.patch(freezing=True):
        torch.compile(model, backend="gemmgen", dynamic=False, options=opts)(batches[0])
        problems = [problem_of(key) for key in torch_backend.missing_keys()]
        assert problems, torch_backend.stats()
        record_triton_winners(opts["db"], problems, device_ms=0.001)
        clear_cache(), clear_kernels(), torch._dynamo.reset(), torch_backend.reset_stats()
        compiled = torch.compile(model, backend="gemmgen", dynamic=False, options=opts)
        for ids in batches:
            ref = model(ids).logits
            for call in range(3):
                assert rel_err(compiled(ids).logits, ref) < 1e-2, (ids.sum().item(), call)
    stats = torch_backend.stats()
    assert stats["patterns"].get("gated") == LAYERS and stats["patterns"].get("residual") == 2 * LAYERS, stats


def test_operands_made_by_pointwise_kernels_keep_the_majors_the_pass_chose(fresh, tmp_path):
    """x.t() + y and w.t() + v are column-major in eager, and the pass compiles them so. Inductor
    must hand them over so (unpinned, it made them row-major). A first graph of
    true column-major views warms the same kernel's launcher, whose later calls skip the checks."""
    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Problem
    from gemmgen.torch_compile.ops import clear_kernels

    m, n, k = 512, 384, 256
    db = str(tmp_path / "user.sqlite")
    record_triton_winners(db, [Problem(m, n, k, "col", "col"), Problem(m, n, k, "row", "col")], device_ms=0.001)
    clear_cache(), clear_kernels()
    g = torch.Generator(device="cuda").manual_seed(5)
    x, y, w, v = (torch.randn(*s, generator=g, device="cuda").half() for s in ((k, m), (m, k), (n, k), (k, n)))

    def views(x, w):
        return x.t() @ w.t()

    def pointwise_operands(x, y, w, v):
        return (x.t() + y) @ w.t(), y @ (w.t() + v)

    opts = {"db": db}
    assert rel_err(torch.compile(views, backend="gemmgen", dynamic=False, options=opts)(x, w), views(x, w)) < 1e-2
    out = torch.compile(pointwise_operands, backend="gemmgen", dynamic=False, options=opts)(x, y, w, v)
    stats = torch_backend.stats()
    assert stats["replaced"] == {"mm": 3}
    assert set(stats["problems"]) == {f"{m}x{n}x{k}:ccr:f16:f32:f16", f"{m}x{n}x{k}:rcr:f16:f32:f16"}
    for o, r in zip(out, pointwise_operands(x, y, w, v)):
        assert rel_err(o, r) < 1e-2



def test_a_dynamic_batch_runs_kernels_served_per_m(fresh, tmp_path):
    """dynamic=True: the projections' M is a symbol. With made-up winners for each projection's
    plain problem at M = 16 and 48 (plumbing, not speed), one compiled graph runs every batch:
    at 16 and 48 the winners, at 32 the same program re-bound, elsewhere torch.matmul; all
    matching eager."""
    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Problem
    from gemmgen.torch_compile.ops import _SERVED, clear_kernels

    model = tiny_llama().eval()
    db = str(tmp_path / "user.sqlite")
    widths = {(64, 64), (32, 64), (128, 64), (64, 128), (256, 64)}       # q/o, k/v, gate/up, down, lm_head
    from gemmgen import backends
    programs = []
    for n, k in widths:              # one program per width, won at both Ms
        program = backends.get("triton").space(Problem(48, n, k, "row", "col"))[0]
        programs += [program, program.bind(Problem(16, n, k, "row", "col"))]
    assert not any(backends.diagnose(p) for p in programs)
    record_winners(db, programs, device_ms=0.001)
    clear_cache(), clear_kernels(), torch._dynamo.reset(), torch_backend.reset_stats()
    compiled = torch.compile(model, backend="gemmgen", dynamic=True, options={"db": db})
    with torch.no_grad():
        for batch, seq in ((2, 8), (4, 8), (2, 16), (3, 7)):              # M = 16, 32, 32, 21
            ids = torch.randint(0, 256, (batch, seq), device="cuda")
            assert rel_err(compiled(ids).logits, model(ids).logits) < 1e-2
    stats = torch_backend.stats()
    assert sum(stats["replaced"].values()) >= LAYERS * 7 + 1 and "dynamic_shape" not in stats["skipped"]
    served = {key[0]: kernel.provenance.how for key, kernel in _SERVED.items()}
    assert served[16] == "exact" and served[32] == "range" and served[21] == "range"


@pytest.mark.parametrize("graphs", [False, True], ids=["plain", "cuda_graphs"])
def test_prefill_masks_proven_causal_and_grouped_kv_heads_match_eager(fresh, tmp_path, graphs):
    """The mask transformers materializes under tracing becomes is_causal=True on the GPU too,
    and the repeated KV heads enable_gqa, with and without CUDA graphs, and the logits stay
    eager's (a causal kernel that skipped wrongly, a mask dropped that was not causal, or KV
    heads matched to the wrong query heads would move them far past fp16 noise)."""
    model = tiny_llama().eval()
    options = {"db": str(tmp_path / "none.sqlite"), "mode": "reduce-overhead" if graphs else None}
    ids = torch.randint(0, 256, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        compiled = torch.compile(model, backend="gemmgen", options={k: v for k, v in options.items() if v})
        for _ in range(3):      # CUDA graph trees record on the second call and replay after
            out = compiled(ids, use_cache=False).logits
    assert torch_backend.stats()["masks"] == {"causal": LAYERS}
    assert torch_backend.stats()["kv_heads"] == {"grouped": LAYERS}
    assert rel_err(out, ref) < 5e-3


def test_gate_up_inductor_joined_splits_where_the_parts_are_faster_and_matches_eager(fresh, tmp_path):
    """Under freezing inductor joins gate and up into one product; with made-up records where the
    two parts apart beat it (plumbing, not speed), the pass splits it back, each part runs its
    recorded kernel, and the logits stay eager's."""
    import torch._inductor.config as inductor_config

    from gemmgen.compile import clear_cache
    from gemmgen.dsl.ir import Problem
    from gemmgen.torch_compile.ops import clear_kernels

    clear_cache(), clear_kernels()
    model = tiny_llama().eval()
    db = str(tmp_path / "user.sqlite")
    ids = torch.randint(0, 256, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    m, inter, hidden = ids.numel(), model.config.intermediate_size, model.config.hidden_size
    record_triton_winners(db, [Problem(m, 2 * inter, hidden, "row", "col")], device_ms=0.010)
    record_triton_winners(db, [Problem(m, inter, hidden, "row", "col")], device_ms=0.001)
    with torch.no_grad(), inductor_config.patch(freezing=True):
        ref = model(ids).logits
        out = torch.compile(model, backend="gemmgen", dynamic=False, options={"db": db})(ids).logits
    stats = torch_backend.stats()
    assert stats["joins"].get("inductor_join_split") == LAYERS, stats
    assert stats["problems"].get(f"{m}x{inter}x{hidden}:rcr:f16:f32:f16") == 2 * LAYERS, stats
    assert rel_err(out, ref) < 1e-2
