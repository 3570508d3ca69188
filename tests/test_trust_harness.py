"""The harness holes a planted cheat found, closed and reproduced on CPU: timing over a rotation
of fresh inputs with sampled checks, the elementwise bound, the mantissa (bf16) probe, and the
fp32 reduction of the served torch fallback."""
import pytest
import torch

from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.measure import check, numerics, timing
from gemmgen.measure.cases import make_case
from gemmgen.measure.checking import judge_out
from gemmgen.measure.rotation import Rotation
from gemmgen.runtime.epilogue import reference as apply_epilogue

P = Problem(40, 24, 96, b_major="col", epilogue=Epilogue(bias="n", activation="gelu"))


def honest(problem):
    def fn(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        acc = a.float() @ b.float()
        out.copy_(apply_epilogue(acc, problem.epilogue, bias=bias, residual=residual, c=c).to(out.dtype))
    return fn


def bf16_inputs(problem):
    def fn(a, b, out, **kw):
        honest(problem)(a.bfloat16().half(), b.bfloat16().half(), out, **kw)
    return fn


def timed_loop(kernels, problem=P, reps=12):
    """The device-timed loop on CPU (no profiler; the call itself stands in for the timer):
    inputs, checked rounds, then the verdict. name -> the error (None: the timing stands)."""
    rotation = Rotation(problem, 4321, "cpu")
    entries = [timing._Entry(name, fn, problem, (), {}, rotation=rotation, reps=reps) for name, fn in kernels]
    options = timing.TimingOptions()
    timing.plan_checks(entries, options)
    timing._schedule(entries, "offline", options, lambda: None, lambda i: entries[i].call(), lambda: None)
    for entry in entries:
        timing.conclude_checks(entry)
    return {e.name: e.error for e in entries}


# ---- timing that cannot be told from checking -----------------------------------------------

def test_every_timed_call_gets_fresh_inputs_in_rotating_buffers():
    seen = []

    def spy(a, b, out, **kw):
        seen.append((a.data_ptr(), float(a[0, 0]), float(a[3, 5]), bool(torch.isnan(out).all())))
        honest(P)(a, b, out, **kw)

    assert timed_loop([("spy", spy)]) == {"spy": None}
    assert len(seen) == 12
    assert len({(x, y) for _, x, y, _ in seen}) == 12          # no two calls saw the same values
    assert len({ptr for ptr, *_ in seen}) == 3                 # three buffers in turn
    assert all(poisoned for *_, poisoned in seen)              # out is NaN before every call


def test_right_for_the_first_calls_then_zeros_fails_the_timing():
    calls = {"n": 0}

    def fn(a, b, out, **kw):
        calls["n"] += 1
        if calls["n"] <= 4:                                    # as many calls as check() makes
            honest(P)(a, b, out, **kw)
        else:
            out.zero_()
    errors = timed_loop([("honest", honest(P)), ("zeros", fn)])
    assert errors["honest"] is None
    assert isinstance(errors["zeros"], timing.MeasureError)
    message = str(errors["zeros"])
    assert "checked timed calls failed the check (timed call" in message and "elementwise bound" in message


def test_a_result_cache_keyed_on_host_read_values_never_hits():
    cache, hits = {}, []

    def fn(a, b, out, **kw):
        key = (float(a[0, 0]), float(a[1, 1]), float(b[0, 0]))      # a few values read on the host
        if key in cache:
            hits.append(key)
            out.copy_(cache[key])
            return
        honest(P)(a, b, out, **kw)
        cache[key] = out.clone()
    assert timed_loop([("cache", fn)])["cache"] is None and hits == []


def test_a_result_cache_keyed_on_pointers_fails_the_timing():
    cache = {}

    def fn(a, b, out, **kw):
        key = (a.data_ptr(), b.data_ptr())
        if key not in cache:
            honest(P)(a, b, out, **kw)
            cache[key] = out.clone()
        out.copy_(cache[key])
    assert "failed the check" in str(timed_loop([("ptr_cache", fn)])["ptr_cache"])


def test_checked_rounds_include_every_kernels_last_and_are_seeded():
    from gemmgen.measure.rotation import CHECKED_CALLS, checked_rounds

    rounds = checked_rounds([30, 30, 200], seed=3)
    assert {29, 199} <= rounds and len(rounds) == CHECKED_CALLS + 2
    assert rounds == checked_rounds([30, 30, 200], seed=3) != checked_rounds([30, 30, 200], seed=4)


def test_a_one_off_calls_reference_is_not_kept_but_its_check_is_read():
    """The checked rounds' references stay for every kernel; a call outside the loop (one seed)
    gets its own, dropped after its numbers are queued: kept, those held 67 GB at an LM head."""
    rotation = Rotation(P, 99, "cpu")
    planned = rotation.round_seed(0)
    rotation.case(planned)
    zeros = lambda a, b, out, **kw: out.zero_()       # noqa: E731
    for seed, fn, fails in ((planned, honest(P), False), (rotation.untimed_seed(), honest(P), False),
                            (rotation.untimed_seed(), zeros, True)):
        (a, b, out), kw = rotation.prepare(seed)
        fn(a, b, out, **kw)
        stats = rotation.stats(out, seed)
        assert bool(rotation.failures(stats, seed)) == fails
    assert list(rotation._cases) == [planned]


# ---- the elementwise bound ------------------------------------------------------------------

def test_forty_zeroed_elements_of_a_4096x4096x64_output_fail():
    problem = Problem(4096, 4096, 64)
    case = make_case(problem, "main", seed=2, device="cpu")
    out = case.ref.half()
    gen = torch.Generator().manual_seed(0)
    flat = torch.randperm(out.numel(), generator=gen)[:40]
    out.view(-1)[flat] = 0
    failures, rel_err = judge_out(out, case, problem)
    assert rel_err < case.bound                                 # the normwise bound alone passes it
    assert len(failures) == 1 and "elementwise bound" in failures[0] and "worst at" in failures[0]
    assert int(failures[0].split(" of ")[0]) >= 38
    assert judge_out(case.ref.half(), case, problem)[0] == []   # rounding once is fine


def test_elementwise_tolerance_follows_the_formula():
    problem = Problem(8, 6, 100, epilogue=Epilogue(alpha=-2.0))
    case = make_case(problem, "main", seed=1, device="cpu")
    acc = case.a.double() @ case.b.double()
    abs_ab = case.a.double().abs() @ case.b.double().abs()
    scale = case.ref.double().abs() + (2 * acc).abs()
    want = numerics.ELEMENT_C * (2 ** -11 * scale + 10 * 2 ** -24 * 2 * abs_ab) + 2 ** -24
    assert torch.allclose(case.tol.double(), want, rtol=1e-5)


@pytest.mark.parametrize("epilogue", [Epilogue(), Epilogue(alpha=0.5, beta=1.5, bias="m", activation="silu",
                                                            residual=True)])
def test_unfused_epilogue_in_fp16_passes_the_elementwise_bound(epilogue):
    """Rounding after the product, the bias, the activation and the residual (as the torch
    baseline does it) stays inside the bound."""
    problem = Problem(64, 48, 512, epilogue=epilogue)

    def unfused(a, b, out, *, bias=None, residual=None, c=None, alpha=1.0, beta=0.0):
        x = (alpha * (a.float() @ b.float()) + (beta * c.float() if c is not None else 0)).half()
        if bias is not None:
            x = (x.float() + bias.float()[:, None]).half()
        if epilogue.activation:
            x = torch.nn.functional.silu(x.float()).half()
        if residual is not None:
            x = (x.float() + residual.float()).half()
        out.copy_(x)
    assert check(unfused, problem, device="cpu").passed


# ---- the mantissa probe: bf16-rounded inputs fail at every K --------------------------------

def test_mantissa_probe_values_are_exact_in_fp16_and_halfway_in_bf16():
    case = make_case(Problem(8, 8, 64), "mantissa", seed=4, device="cpu")
    support = (case.a != 0).any(dim=0)
    assert int(support.sum()) == numerics.MANTISSA_TERMS        # the same K positions in every row
    assert torch.equal(support, (case.b != 0).any(dim=1)) and (case.a[:, support] != 0).all()
    for t in (case.a[:, support], case.b[support, :]):
        assert torch.equal(t.float().half(), t)
        magnitudes = t.float().abs()
        significand = magnitudes / torch.exp2(torch.floor(torch.log2(magnitudes)))
        assert torch.allclose(significand, torch.full_like(significand, numerics.MANTISSA_SIGNIFICAND))
        assert (t.bfloat16().float() != t.float()).all()
    assert (case.a.float() @ case.b.float() > 0).all()          # every product positive


@pytest.mark.parametrize("k", [8, 64, 1024, 8192, 65536])
def test_bf16_rounded_inputs_fail_the_mantissa_probe_at_every_k(k):
    problem = Problem(4, 6, k)
    case = make_case(problem, "mantissa", seed=k, device="cpu")
    acc = case.a.float() @ case.b.float()
    assert judge_out(acc.half(), case, problem)[0] == []                     # fp32 accumulation passes
    nearest = (case.a.bfloat16().float() @ case.b.bfloat16().float()).half()
    truncated_a = (case.a.float().view(torch.int32) & ~0xFFFF).view(torch.float32)
    truncated_b = (case.b.float().view(torch.int32) & ~0xFFFF).view(torch.float32)
    for out in (nearest, (truncated_a @ truncated_b).half()):
        failures, _ = judge_out(out, case, problem)
        assert any("elementwise" in f and "bf16" in f for f in failures), (k, failures)


def test_bf16_inputs_fail_check_where_the_normwise_bound_let_them_pass():
    """The planted miss: at K = 8192 bf16 inputs stay under the normwise bound of the main case."""
    problem = Problem(16, 16, 8192)
    main = make_case(problem, "main", seed=9, device="cpu")
    rounded = (main.a.bfloat16().float() @ main.b.bfloat16().float()).half()
    rel = float((rounded.double() - main.ref.double()).norm() / main.ref.double().norm())
    assert rel < main.bound
    r = check(bf16_inputs(problem), problem, device="cpu")
    assert not r.passed and any(f.startswith("mantissa:") for f in r.failures), r.failures


# ---- the fallback gemmgen serves reduces in fp32 --------------------------------------------

def test_served_fallback_turns_off_fp16_reduction_for_its_call_and_the_baseline_keeps_torchs(monkeypatch):
    from gemmgen.measure.baselines import make
    from gemmgen.runtime.torch_call import torch_call

    flags, real = [], torch.matmul

    def spy(*args, **kwargs):
        flags.append(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "matmul", spy)
    before = torch._C._get_cublas_allow_fp16_reduced_precision_reduction()
    problem = Problem(8, 8, 8)
    a, b, out = torch.randn(8, 8).half(), torch.randn(8, 8).half(), torch.empty(8, 8).half()
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True
    try:
        torch_call(problem)(a, b, out)
        make("torch", problem).fn(a, b, out)
    finally:
        torch._C._set_cublas_allow_fp16_reduced_precision_reduction(*(
            before if isinstance(before, tuple) else (before,)))
    assert flags == [False, True]
    assert torch._C._get_cublas_allow_fp16_reduced_precision_reduction() == before


# ---- the planted cheats that check() catches on CPU tensors ---------------------------------

@pytest.mark.parametrize("name", __import__("planted_cheats").CPU_CAUGHT)
def test_planted_cheat_fails_check_on_cpu(name):
    from planted_cheats import CHEATS

    problem = Problem(72, 80, 160, epilogue=Epilogue(bias="n"))
    r = check(CHEATS[name](problem), problem, device="cpu")
    assert not r.passed, name
    assert check(__import__("planted_cheats").honest(problem), problem, device="cpu").passed


def _truncating_fp32_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with every fp32 partial sum chopped toward zero, as tensor cores accumulate."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    for k in range(a.shape[1]):
        exact = acc.double() + a[:, k, None].double() * b[None, k, :].double()
        rounded = exact.float()
        over = rounded.double().abs() > exact.abs()
        acc = torch.where(over, torch.nextafter(rounded, torch.zeros_like(rounded)), rounded)
    return acc


@pytest.mark.parametrize("out_dtype", ["f16", "f32"])
def test_a_truncating_fp32_accumulator_passes_the_mantissa_probe_at_long_k(out_dtype, monkeypatch):
    """On the H200 a correct CUDA program with an f32 output failed a dense same-sign probe at
    K = 4096 (tensor cores chop, so the drift grows with K); the probe's sparse K keeps it in."""
    from gemmgen.dsl.ir import Epilogue
    from gemmgen.measure import cases

    problem = Problem(3, 5, 4096, epilogue=Epilogue(out_dtype=out_dtype))

    def judged(case):
        out = _truncating_fp32_dot(case.a.float(), case.b.float())
        return judge_out(out.half() if out_dtype == "f16" else out, case, problem)[0]

    assert judged(make_case(problem, "mantissa", seed=7, device="cpu")) == []
    if out_dtype == "f32":         # a dense probe refuses the correct kernel
        monkeypatch.setattr(cases, "MANTISSA_TERMS", problem.k)
        assert judged(make_case(problem, "mantissa", seed=7, device="cpu")) != []
