"""On the H200: every planted cheat is caught by the path tuning uses (check, then timing, as the
worker runs a job), and correct kernels (the served torch fallback, one program of each
backend) still pass.

Run: python -m pytest -q -m gpu tests/test_planted_gpu.py
"""
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import planted_cheats  # noqa: E402
from gemmgen.dsl.ir import Epilogue, Problem  # noqa: E402
from gemmgen.measure.checking import check  # noqa: E402
from gemmgen.measure.timing import TimingOptions  # noqa: E402
from gemmgen.measure.worker import Job, _execute  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)

ODD = Problem(333, 777, 999, epilogue=Epilogue(bias="n", activation="gelu"))
FAST = TimingOptions(min_reps=20, max_reps=40, host_reps=10)
#: the shapes each cheat was caught at on the H200 by the planting, besides ODD
SHAPES = {"scattered_zeros": Problem(4096, 4096, 64), "bf16_inputs": Problem(1024, 1024, 8192),
          "one_element_when_timed": Problem(4096, 4096, 4096)}


def _loaded(fn):
    return lambda: fn


def tuned(fn, problem):
    """What the worker does with a tuning job: check, then (if passed) time beside nothing."""
    return _execute(Job("planted", _loaded(fn), problem=problem, timing=FAST))


@pytest.mark.parametrize("name", sorted(planted_cheats.CHEATS))
def test_planted_cheat_is_caught(name):
    problem = SHAPES.get(name, ODD)
    result = tuned(planted_cheats.CHEATS[name](problem), problem)
    assert result.status in ("failed_check", "error"), (name, result)
    print(name, result.status, result.message[:200])


def test_fp16_accumulation_on_tensor_cores_is_caught():
    from planted_gpu import matmul_f16_acc
    p = Problem(512, 384, 2048)
    assert tuned(matmul_f16_acc, p).status == "failed_check"


@pytest.mark.parametrize("problem", [ODD, Problem(333, 777, 999)])
def test_a_value_keyed_result_cache_never_replays_a_result(problem):
    """The planted miss (1.82x torch.matmul at 333x777x999): fresh inputs for every call leave
    it nothing to replay, so it times what it computes."""
    fn = planted_cheats.value_keyed_cache(problem)
    result = tuned(fn, problem)
    assert fn.hits == 0 and result.status == "ok", result


def test_correct_kernels_still_pass():
    from gemmgen.runtime.torch_call import torch_call

    for problem in (ODD, Problem(4096, 4096, 64), Problem(1024, 1024, 8192, b_major="col")):
        for fn in (torch_call(problem), planted_cheats.honest(problem)):
            result = tuned(fn, problem)
            assert result.status == "ok", (problem.key, result.message)


@pytest.mark.parametrize("backend", ["triton", "cutlass", "cuda"])
def test_one_program_of_each_backend_passes(backend):
    from gemmgen.policy.proposers import HeuristicProposer
    from gemmgen.tune.adapters import PoolBuilder
    from gemmgen.measure.worker import load_backend
    from gemmgen.dsl import to_text

    problem = Problem(1024, 2048, 4096, b_major="col")
    programs = HeuristicProposer((backend,)).propose(problem, 1)
    assert programs, backend
    built = PoolBuilder().build_many(programs)[0]
    assert built.ok, built.error
    fn = load_backend(backend, built.artifact, to_text(programs[0]))
    result = tuned(fn, problem)
    assert result.status == "ok", (backend, result.message)


def test_served_fallback_passes_check_where_torchs_default_failed():
    """1454x1757x2854: torch.matmul with torch's default (fp16 split-K reduction allowed) failed
    the fp32-accumulation probe; the fallback gemmgen serves sums in fp32."""
    from gemmgen.kernel import baseline_launcher

    problem = Problem(1454, 1757, 2854)
    for seed in (1, 2, 3):
        r = check(baseline_launcher(problem), problem, seed=seed)
        assert r.passed, r.failures
