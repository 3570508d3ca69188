"""Library choices (cuBLASLt's fastest algorithm per problem): the database rule that decides
what serves, export and merge, the search loop with a fake runner, and gemmgen.compile's use
of them, all without a GPU."""
from dataclasses import replace

import pytest

import gemmgen
from gemmgen.compile import clear_cache
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.errors import GemmgenError, NoGPUError
from gemmgen.kernel import library_source
from gemmgen.measure.comparison import REPLICATE_NOISE
from gemmgen.measure.library import SEARCH, knob_changes
from gemmgen.torch_compile.graph_pass import estimated_gain_us
from gemmgen.tune import library_choice, library_search_s, tune_library
from gemmgen.tuning_db import Database, LibraryChoice, Trial
from gemmgen.tuning_db.exchange import export, export_lines, merge, read_any
from tuning_fakes import TEST_GPU
from tuning_fakes import library_choice as make_choice
from tuning_fakes import trial

GPU = TEST_GPU.name
P = Problem(8192, 16384, 512)


@pytest.fixture
def db(tmp_path):
    clear_cache()
    db = Database(tmp_path / "lib.sqlite")
    yield db
    db.close()
    clear_cache()


def _served(db) -> dict:
    return {c.problem.key: c for c in db.library_winners(GPU)}


def test_a_choice_serves_only_if_it_beats_torch_beyond_its_noise(db):
    fast, slow, noisy = Problem(4096, 4096, 512), Problem(4096, 4096, 1024), Problem(4096, 4096, 2048)
    db.record_library(make_choice(fast, device_ms=0.90, spread=0.02, torch_ms=1.0))
    db.record_library(make_choice(slow, device_ms=1.01, spread=0.01, torch_ms=1.0))
    db.record_library(make_choice(noisy, device_ms=0.98, spread=0.05, torch_ms=1.0))   # 0.98*1.05 > 1
    db.record_library(make_choice(P, device_ms=0.5, torch_ms=1.0, check_passed=False))
    assert set(_served(db)) == {fast.key}
    assert db.stats()["library_choices"] == 4 and db.stats()["library_winners"] == {GPU: 1}


def test_a_choice_with_its_speedup_noise_is_judged_by_that_not_by_its_spread(db):
    wide, steady, unsure = Problem(4096, 4096, 512), Problem(4096, 4096, 1024), Problem(4096, 4096, 2048)
    # 1.031x with a 5 % spread: the spread rule refuses it; a 1.6 % noise lets it serve
    db.record_library(replace(make_choice(wide, device_ms=0.97, spread=0.05, torch_ms=1.0), noise=0.016))
    db.record_library(make_choice(steady, device_ms=0.97, spread=0.05, torch_ms=1.0))        # older: no noise
    db.record_library(replace(make_choice(unsure, device_ms=0.97, spread=0.01, torch_ms=1.0), noise=0.04))
    assert set(_served(db)) == {wide.key}
    assert {c.problem.key: c.beats_torch() for c in db.library_choices()} == {
        wide.key: True, steady.key: False, unsure.key: False}
    assert _served(db)[wide.key].noise == 0.016


def test_a_choice_slower_than_torch_in_server_mode_beyond_its_noise_does_not_serve(db):
    slower, within = Problem(4096, 4096, 512), Problem(4096, 4096, 1024)
    timed = dict(device_ms=0.95, spread=0.05, torch_ms=1.0)
    db.record_library(replace(make_choice(slower, **timed), noise=0.016, server_ms=1.04, torch_server_ms=1.0,
                              server_noise=0.016))                       # 0.96x with idle gaps: a loss
    db.record_library(replace(make_choice(within, **timed), noise=0.016, server_ms=1.01, torch_server_ms=1.0,
                              server_noise=0.016))                       # 0.99x: within its noise
    assert set(_served(db)) == {within.key}
    assert {c.problem.key: c.beats_torch() for c in db.library_choices()} == {slower.key: False, within.key: True}


def test_a_serving_choice_without_its_server_time_is_searched_again(db):
    db.record_library(replace(make_choice(P), config={"algorithm_id": 6, "search": SEARCH}, noise=0.016))
    lost = Problem(1024, 1024, 1024)                                      # cannot serve: nothing to check
    db.record_library(replace(make_choice(lost, device_ms=1.1), config={"algorithm_id": 6, "search": SEARCH},
                              noise=0.016))
    runner = LibraryRunner({P.m: _found()})
    tune_library([P, lost], runner=runner, db=db, progress=False)
    assert runner.asked == [P] and db.library_choices(P.key)[-1].server_ms == 0.9


def test_the_latest_search_decides_not_the_best_of_several(db):
    db.record_library(make_choice(P, device_ms=0.8, created="2026-11-29T10:00:00.000000+00:00", algorithm="aa"))
    assert _served(db)[P.key].algorithm == "aa"
    db.record_library(make_choice(P, device_ms=1.02, created="2026-11-29T11:00:00.000000+00:00", algorithm="bb"))
    assert P.key not in _served(db)       # re-measured: no longer faster than torch.matmul


def test_export_and_merge_carry_library_choices(db, tmp_path):
    db.record(trial(P, device_ms=1.3, baseline_ms=1.2))               # a trial that lost
    db.record_library(make_choice(P))
    path = tmp_path / "export.jsonl"
    assert export(db, path) == 2
    lines = path.read_text().splitlines()
    assert '"kind":"library"' in lines[1] and '"kind"' not in lines[0]   # trials first, then the library
    assert export_lines(db, winners_only=True) == [lines[1]]         # the trial did not win
    other = Database(tmp_path / "other.sqlite")
    assert merge(other, path) == (2, 0) and merge(other, path) == (0, 2)
    assert other.library_choices() == db.library_choices()
    assert sorted(type(r).__name__ for r in read_any(tmp_path / "other.sqlite")) == ["LibraryChoice", "Trial"]
    other.close()


def test_export_writes_the_noise_only_where_it_was_measured(db, tmp_path):
    db.record_library(make_choice(P, created="2026-11-29T10:00:00.000000+00:00"))
    db.record_library(replace(make_choice(P, created="2026-11-29T11:00:00.000000+00:00"), noise=0.021,
                              server_ms=0.91, torch_server_ms=1.0, server_noise=0.02))
    older, newer = export_lines(db)
    assert '"noise"' not in older and '"server_ms"' not in older    # older lines stay byte for byte
    assert '"noise":0.021' in newer and '"server_ms":0.91' in newer
    path = tmp_path / "export.jsonl"
    export(db, path)
    other = Database(tmp_path / "other.sqlite")
    merge(other, path)
    assert [(c.noise, c.server_noise) for c in other.library_choices()] == [(None, None), (0.021, 0.02)]
    other.close()


class LibraryRunner:
    device = TEST_GPU

    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def library(self, problem):
        self.asked.append(problem)
        return self.answers[problem.m]


def _found(**kw):
    base = {"library": "cublaslt", "version": "130100", "candidates": 9, "config": {"algorithm_id": 6, "search": SEARCH},
            "algorithm": "abcd", "check_passed": True, "max_rel_err": 1e-4, "err_bound": 2e-3,
            "check_seed": 5, "device_ms": 0.9, "spread": 0.01, "torch_ms": 1.0, "torch_spread": 0.01, "noise": 0.016,
            "server_ms": 0.9, "torch_server_ms": 1.0, "server_noise": 0.016}
    return base | kw


def test_tune_library_records_searches_and_resumes(db):
    problems = [Problem(m, 4096, 512) for m in (1024, 2048, 4096)]
    runner = LibraryRunner({1024: _found(), 2048: {"error": "timeout: no answer within 240 s"},
                            4096: _found(check_passed=False, device_ms=None, torch_ms=None)})
    report = tune_library(problems, runner=runner, db=db, progress=False)
    assert report.recorded == 2 and report.statuses == {"ok": 1, "run_failed": 1, "check_failed": 1}
    assert report.failures == [(problems[1].key, "timeout: no answer within 240 s")]
    assert "timeout: no answer" in report.summary()
    assert set(_served(db)) == {problems[0].key}
    again = tune_library(problems, runner=runner, db=db, progress=False)
    assert [p.m for p in runner.asked[3:]] == [2048]    # only the failed search runs again
    assert again.skipped == 2


def test_a_search_expected_to_end_past_the_budget_is_not_begun(db):
    head, small = Problem(2048, 128256, 4096), Problem(64, 4096, 4096)
    assert library_search_s(head) > 60 > library_search_s(small)      # 2.2 TFLOP and 1.6 GB: ~110 s
    runner = LibraryRunner({head.m: _found(), small.m: _found()})
    report = tune_library([head, small], runner=runner, db=db, progress=False, time_budget_s=60)
    assert runner.asked == [small] and report.recorded == 1       # the smaller one after it still fits
    assert report.stopped_by_time and "stopped: time budget" in report.summary()


def test_a_problem_searched_by_an_older_method_is_searched_again(db):
    old = make_choice(P)                          # no "search" in its config: the heuristic list only
    assert "search" not in old.config
    db.record_library(old)
    runner = LibraryRunner({P.m: _found()})
    report = tune_library([P], runner=runner, db=db, progress=False)
    assert runner.asked == [P] and report.recorded == 1
    assert tune_library([P], runner=runner, db=db, progress=False).skipped == 1


def test_a_choice_of_the_current_search_without_its_noise_is_searched_again(db):
    db.record_library(replace(make_choice(P), config={"algorithm_id": 6, "search": SEARCH}))
    runner = LibraryRunner({P.m: _found()})
    assert tune_library([P], runner=runner, db=db, progress=False).recorded == 1
    assert runner.asked == [P] and db.library_choices()[-1].noise == 0.016


def test_library_choice_refuses_incomplete_searches():
    assert library_choice({"error": "crash"}, P, TEST_GPU) is None
    assert library_choice(_found(device_ms=None), P, TEST_GPU) is None      # passed, but never timed
    choice = library_choice(_found(), P, TEST_GPU)
    assert isinstance(choice, LibraryChoice) and choice.beats_torch()


def test_compile_serves_the_library_choice_where_no_program_won(db):
    db.record(trial(P, device_ms=1.3, baseline_ms=1.2))
    db.record_library(make_choice(P, device_ms=0.85, torch_ms=1.0))
    k = gemmgen.compile((8192, 16384, 512), device=GPU, db=db)
    assert k.provenance.how == "library" and k.backend == "cublaslt" and k.program is None
    assert k.provenance.speedups["torch"] == pytest.approx(1 / 0.85)
    assert k.provenance.baseline_ms_here == pytest.approx(1.0)
    assert "cuBLASLt 130100" in k.source and "algorithm_id=66" in k.source
    assert "1.176x" in k.describe() and "cuBLASLt algorithm" in k.describe()
    assert estimated_gain_us(k) == pytest.approx(150.0)
    a = b = None
    with pytest.raises(NoGPUError):
        k(a, b)


def test_the_provenance_of_a_library_kernel_gives_its_noise_and_server_mode(db):
    db.record_library(replace(make_choice(P, device_ms=0.85, torch_ms=1.0), noise=0.019, server_ms=0.9,
                              torch_server_ms=1.0, server_noise=0.02))
    k = gemmgen.compile((8192, 16384, 512), device=GPU, db=db)
    assert k.provenance.speedups == pytest.approx({"torch": 1 / 0.85, "torch, server mode": 1 / 0.9})
    assert k.provenance.noise == 0.019
    assert "(noise 1.9 %)" in k.describe() and "server mode (idle gaps before each call): 1.111x" in k.describe()


def test_the_larger_speedup_over_torch_serves_of_a_winner_and_a_library_choice(db):
    # trial(): torch.matmul at 1.05 x baseline_ms, so this program is 1.5x torch.matmul
    db.record(trial(P, device_ms=0.7, baseline_ms=1.0))
    db.record_library(make_choice(P, device_ms=0.85, torch_ms=1.0))          # 1.18x
    assert gemmgen.compile(P, device=GPU, db=db).provenance.how == "exact"
    clear_cache()
    db.record_library(make_choice(P, device_ms=0.6, torch_ms=1.0, created="2026-11-29T21:00:00.000000+00:00"))
    assert gemmgen.compile(P, device=GPU, db=db).provenance.how == "library"   # 1.67x


def test_a_library_choice_that_lost_leaves_the_baseline(db):
    db.record(trial(P, device_ms=1.3, baseline_ms=1.2))
    db.record_library(make_choice(P, device_ms=1.0, torch_ms=0.99))
    k = gemmgen.compile(P, device=GPU, db=db)
    assert k.provenance.how == "baseline" and k.backend == "torch"


def test_library_source_names_the_epilogue_in_torch():
    p = replace(P, epilogue=replace(P.epilogue, bias="m", activation="gelu"))
    text = library_source(p, make_choice(p))
    assert "out.add_(bias[:, None])" in text and "gelu" in text and "fastest of 12 algorithms" in text
    assert "epilogue" not in library_source(P, make_choice(P))
    # nn.Linear's bias: in cuBLASLt's epilogue, the product planned transposed, the rest in torch
    linear = replace(P, epilogue=replace(P.epilogue, bias="n", activation="gelu"))
    text = library_source(linear, make_choice(linear))
    assert "epilog=MatmulEpilog.BIAS" in text and "Matmul(b.t(), a.t()" in text
    assert "add_(bias" not in text and "gelu" in text


def test_trial_lines_still_read_as_trials(db, tmp_path):
    db.record(trial(P))
    path = tmp_path / "t.jsonl"
    export(db, path)
    assert [type(r) for r in read_any(path)] == [Trial]


class _Algo:
    """What the search reads of an nvmath Algorithm."""
    tile, stages, custom_option, cta_swizzling = "(128, 256)", "auto", 0, False

    def __init__(self, algorithm_id=21, split_k=1, tag=b"\x01", capabilities=None):
        self.algorithm_id, self.split_k, self.tag = algorithm_id, split_k, tag
        if capabilities is not None:
            self.capabilities = capabilities

    def as_numpy(self):
        import numpy as np
        return np.frombuffer(self.tag, dtype=np.uint8)


class _Timed:
    def __init__(self, ms):
        self.device_ms, self.spread, self.host_ms, self.clocks = ms, 0.01, ms + 0.01, {"samples": 3}
        self.samples_ms = (ms,) * 12


def _stub_search(monkeypatch, *, neighbours=(), session=None, failing=()):
    """search_cublaslt with the GPU stubbed: the heuristic offers two algorithms (the second faster),
    `neighbours` are (changes, algorithm) of every base, `session` the second timing's device ms by
    entry index, `failing` the hex texts whose check fails. Returns the hex texts checked, in order."""
    import gemmgen.measure.library as library
    from gemmgen.measure.checking import CheckResult

    class Plan:
        def __init__(self, problem, algorithms):
            self.algorithms = tuple(algorithms)

        def fn(self, algorithm):
            return algorithm

    heuristic = [_Algo(tag=b"\x01"), _Algo(tag=b"\x02")]
    checked = []
    monkeypatch.setattr(library, "autotune_lt", lambda problem, options: (
        None, heuristic, 1, {"algo0": _Timed(1.0), "algo1": _Timed(0.9)}))
    monkeypatch.setattr(library, "LtMatmul", Plan)
    monkeypatch.setattr(library, "cublaslt_version", lambda: "130100")
    monkeypatch.setattr(library, "neighbours", lambda lt, base, k: list(neighbours) if base is heuristic[1] else [])
    monkeypatch.setattr(library, "library_launcher", lambda p, text, version: checked.append(text) or text)
    monkeypatch.setattr(library, "check", lambda fn, problem, seed=None: CheckResult(
        passed=fn not in failing, max_rel_err=1e-4, bound=2e-3, seed=9, failures=("planted",) if fn in failing else ()))

    def time_many(kernels, mode, options=None):
        if kernels[0][0] == "library":
            return {"library": _Timed(0.8), "torch": _Timed(1.0)}
        return {name: _Timed(session[int(name)]) for name, _, _ in kernels}
    monkeypatch.setattr(library, "time_many", time_many)
    return checked


def test_the_search_returns_what_the_loop_records(monkeypatch):
    """search_cublaslt's dict, with the GPU parts stubbed, reads back as a LibraryChoice."""
    from gemmgen.measure import library

    checked = _stub_search(monkeypatch)
    found = library.search_cublaslt(P)
    assert checked == ["02"] == [found["algorithm"]]          # the heuristic's faster one, no neighbours
    choice = library_choice(found, P, TEST_GPU)
    assert choice.beats_torch() and choice.torch_ms == 1.0 and choice.config["algorithm_id"] == 21
    assert choice.candidates == 2 and choice.check_seed == 9
    assert choice.config["search"] == SEARCH and choice.config["from"] == "heuristic #1"
    assert choice.config["selection"] == {"heuristic_best_ms": 0.9, "selected_ms": 0.9, "neighbours": 0}
    assert choice.noise == REPLICATE_NOISE          # twelve identical rounds: only the floor is left
    assert (choice.server_ms, choice.torch_server_ms, choice.server_noise) == (0.8, 1.0, REPLICATE_NOISE)


def test_a_torch_baseline_failing_its_timed_check_gives_way_to_the_served_call(monkeypatch):
    """Where torch.matmul under torch's default reduction fails the check in its timed calls, the
    choice is timed against what gemmgen serves there (the same call summing in fp32), said in
    its config; a baseline failing for another reason still records nothing."""
    from gemmgen.measure import library
    from gemmgen.measure.errors import MeasureError, TimedCheckFailure

    _stub_search(monkeypatch)
    served = object()
    monkeypatch.setattr(library, "torch_call", lambda problem: served)
    pairs = []

    def time_many(kernels, mode, options=None):
        pairs.append([fn for _, fn, _ in kernels])
        if kernels[1][1] is served:
            return {"library": _Timed(0.8), "torch": _Timed(0.95)}
        return {"library": _Timed(0.8), "torch": TimedCheckFailure("torch: 2 of 3 checked timed calls failed")}
    monkeypatch.setattr(library, "time_many", time_many)
    found = library.search_cublaslt(P)
    # offline once with torch's own call, then offline and server mode with the served one
    assert [p[1] is served for p in pairs] == [False, True, True]
    choice = library_choice(found, P, TEST_GPU)
    assert choice.torch_ms == 0.95 and choice.torch_server_ms == 0.95
    assert choice.config["torch_baseline"].startswith("fp32 reduction, as served: torch: 2 of 3")

    monkeypatch.setattr(library, "time_many", lambda kernels, mode, options=None: {
        "library": _Timed(0.8), "torch": MeasureError("torch: the call raised RuntimeError: out of memory")})
    found = library.search_cublaslt(P)
    assert "out of memory" in found["error"] and library_choice(found, P, TEST_GPU) is None


def test_a_faster_neighbour_is_chosen_in_one_session_with_its_bases(monkeypatch):
    from gemmgen.measure import library

    split = _Algo(split_k=4, tag=b"\x03")
    # entries: the two bases (fastest first), then the neighbour; timed again together
    _stub_search(monkeypatch, neighbours=[({"split_k": 4, "reduction_scheme": 2}, split)],
                 session={0: 0.92, 1: 0.95, 2: 0.7})
    found = library.search_cublaslt(P)
    assert found["algorithm"] == "03" and found["candidates"] == 3
    assert found["config"]["from"] == "heuristic #1 with split_k=4, reduction_scheme=2"
    assert found["config"]["selection"] == {"heuristic_best_ms": 0.92, "selected_ms": 0.7, "neighbours": 1}


def test_a_neighbour_that_fails_its_check_falls_back_to_the_heuristic(monkeypatch):
    from gemmgen.measure import library

    wrong = _Algo(split_k=8, tag=b"\x04")
    checked = _stub_search(monkeypatch, neighbours=[({"split_k": 8, "reduction_scheme": 1}, wrong)],
                           session={0: 0.92, 1: 0.95, 2: 0.7}, failing=("04",))
    found = library.search_cublaslt(P)
    assert checked == ["04", "02"] and found["algorithm"] == "02" and found["check_passed"]
    assert found["config"]["rejected"] == [{"from": "heuristic #1 with split_k=8, reduction_scheme=1",
                                            "failures": ["planted"]}]


def test_neighbours_meet_in_sessions_then_the_finalists_and_bases_together(monkeypatch):
    from gemmgen.measure import library

    class Plan:
        def __init__(self, problem, algorithms):
            self.algorithms = tuple(algorithms)

        def fn(self, algorithm):
            return algorithm

    sessions = []

    def time_many(kernels, mode, options=None):
        sessions.append([int(name) for name, _, _ in kernels])
        return {name: _Timed(1.0 / (1 + int(name))) for name, _, _ in kernels}   # later entries are faster

    monkeypatch.setattr(library, "LtMatmul", Plan)
    monkeypatch.setattr(library, "time_many", time_many)
    size, n = library.SESSION_SIZE, library.SESSION_SIZE * 2 + 5
    entries = [(f"e{i}", i) for i in range(n)]
    planned, times = library._tournament(P, entries, 2, None)
    assert planned == entries
    assert sessions[:3] == [list(range(2, 2 + size)), list(range(2 + size, 2 + 2 * size)), list(range(2 + 2 * size, n))]
    last = [1 + size, size, 1 + 2 * size, 2 * size, n - 1, n - 2]            # two fastest of each session
    assert sessions[3] == [0, 1] + last and set(times) == set(sessions[3])


def test_knob_changes_follow_the_capabilities():
    from types import SimpleNamespace

    caps = SimpleNamespace(splitk_support=1, reduction_scheme_mask=0b011, cta_swizzling_support=1,
                           tile_ids=("(128, 256)", "(64, 128)"), stages_ids=("auto",), custom_option_max=1)
    changes = knob_changes(_Algo(capabilities=caps), k=1024)
    splits = [c for c in changes if "split_k" in c]
    # K=1024 leaves 128 per slice up to split 8; of the mask 0b011, the fp32 workspace (2) is preferred
    assert {c["split_k"] for c in splits} == {2, 3, 4, 6, 8}
    assert {c["reduction_scheme"] for c in splits} == {2}
    inplace_only = SimpleNamespace(**{**vars(caps), "reduction_scheme_mask": 0b001})
    assert {c["reduction_scheme"] for c in knob_changes(_Algo(capabilities=inplace_only), k=1024) if "split_k" in c} == {1}
    assert {"cta_swizzling": True} in changes and {"tile": "(64, 128)"} in changes
    assert {"custom_option": 1} in changes and {"tile": "(128, 256)"} not in changes
    assert not [c for c in changes if "stages" in c]        # the only stage count is the algorithm's own
    assert {"split_k": 1, "reduction_scheme": 0} in knob_changes(_Algo(split_k=4, capabilities=caps), k=1024)
    assert knob_changes(_Algo(), k=1024) == []              # capabilities unreadable: no neighbours


def test_tune_backends_runs_the_library_search_then_the_programs(db):
    from gemmgen.tune import split_library, tune_backends
    from tuning_fakes import FakeBuilder, FakeRunner, ListProposer

    class Both(FakeRunner):
        def library(self, problem):
            return _found()

    assert split_library(["triton", "cublaslt", "cuda"]) == (True, ("triton", "cuda"))
    assert split_library(["triton"]) == (False, ("triton",))
    lines = []
    problems = [Problem(1024, 1024, 512), Problem(2048, 1024, 512)]
    reports = tune_backends(problems, library=True, proposer=ListProposer([((128, 128, 64), 4)]),
                            builder=FakeBuilder(), runner=Both(), db=db, budget=1, progress=False,
                            announce=lines.append)
    assert set(reports) == {"cublaslt", "programs"}
    assert reports["cublaslt"].recorded == 2 and "2 library choices recorded" in reports["cublaslt"].summary()
    assert reports["programs"].recorded == 2 and len(db.trials()) == 2
    assert lines[0].startswith("searching cuBLASLt") and "backends all" in lines[2]
    only = tune_backends(problems, library=True, proposer=None, builder=FakeBuilder(), runner=Both(), db=db,
                         budget=1, progress=False)
    assert set(only) == {"cublaslt"} and only["cublaslt"].skipped == 2     # searched already


def test_direct_cublaslt_call_passes_the_operands_in_cublasLt_order():
    """DirectLt.call with the binding stubbed: the pointers and descriptors reach cublasLtMatmul
    in its order (A, B, C = out, D = out), alpha/beta land in the host scalars, and operands on
    another GPU are refused."""
    import numpy as np

    from gemmgen.errors import GemmgenError
    from gemmgen.runtime.cublaslt import DirectLt

    class T:                                   # a tensor's face: pointer and device only
        def __init__(self, ptr, index=0):
            self.ptr, self.device = ptr, type("D", (), {"index": index})()

        def data_ptr(self):
            return self.ptr

    def direct(problem, transposed=False):
        calls = []
        lt = object.__new__(DirectLt)
        lt.problem, lt._device, lt._after = problem, 0, Epilogue()
        lt._transposed, lt._desc = transposed, (type("Desc", (), {})() if transposed else None)
        lt._alpha, lt._beta = np.zeros(1, np.float32), np.zeros(1, np.float32)
        lt._static = ("handle", "desc", "alpha*", "a_layout", "b_layout", "beta*", "c_layout", "d_layout",
                      "algo*", "ws*", 4096)
        lt._matmul = lambda *args: calls.append(args)
        lt._stream = lambda: type("S", (), {"cuda_stream": 77})()
        return lt, calls

    lt, calls = direct(P)
    lt.call(T(1), T(2), T(3), alpha=0.5)
    assert calls == [("handle", "desc", "alpha*", 1, "a_layout", 2, "b_layout", "beta*", 3, "c_layout", 3,
                      "d_layout", "algo*", "ws*", 4096, 77)]
    assert lt._alpha[0] == 0.5 and lt._beta[0] == 0.0
    with pytest.raises(GemmgenError, match="planned on cuda:0; the operands are on"):
        lt.call(T(1, index=1), T(2, index=1), T(3, index=1))
    # nn.Linear's bias in the epilogue: planned as D^T = B^T A^T, B's pointer first, the bias's
    # pointer set on the descriptor before the call
    lt, calls = direct(Problem(64, 48, 32, "row", "col", epilogue=Epilogue(bias="n")), transposed=True)
    lt.call(T(1), T(2), T(3), bias=T(9))
    assert calls[0][3:6] == (2, "a_layout", 1) and calls[0][8] == 3 and lt._desc.bias_pointer == 9


def test_auto_backends_search_the_library_only_where_the_records_say_it_wins(db):
    """`--backends auto` (gemmgen tune's default): cuBLASLt's search for the problems
    `library_first` picks (M >= 32 over 1 GFLOP), every backend's programs for all."""
    from gemmgen.backends import registry
    from gemmgen.cli import build_parser
    from gemmgen.tune import AUTO_BACKENDS, library_first, parse_backends, tune_backends
    from tuning_fakes import FakeBuilder, FakeRunner, ListProposer

    assert build_parser().parse_args(["tune", "--shapes", "s.csv"]).backends == AUTO_BACKENDS
    assert parse_backends("auto") == (library_first, registry.NAMES)
    assert parse_backends("triton, cublaslt") == (True, ("triton",))
    for bad in ("auto,triton", "tritn", ","):
        with pytest.raises(GemmgenError, match="--backends .* not understood"):
            parse_backends(bad)
    asked = []

    class Both(FakeRunner):
        def library(self, problem):
            asked.append(problem.m)
            return _found()

    decode, batch = Problem(1, 4096, 4096, b_major="col"), Problem(64, 4096, 4096, b_major="col")
    reports = tune_backends([decode, batch], library=library_first, proposer=ListProposer([((128, 128, 64), 4)]),
                            builder=FakeBuilder(), runner=Both(), db=db, budget=1, progress=False)
    assert asked == [64] and reports["cublaslt"].shapes == 1
    assert {t.problem.m for t in db.trials()} == {1, 64}
