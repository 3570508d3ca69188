"""The GPU scripts' plumbing on CPU: benchmarks/policy_eval.py and benchmarks/policy_grpo.py with the
GPU parts (the tuning loop's PoolBuilder and WorkerRunner) replaced by STUBS that make up times from
the tile size. What this checks is the flow (proposing, measuring through the loop, reusing the
database, the JSON, plots and table), not any speed."""
import json

import pytest

from benchmark_scripts import load_script
from gemmgen.tune import BuildOutcome, Measurement
from gemmgen.tuning_db import BaselineTime, Database, Device


class StubPoolBuilder:
    """STUB builder: no compiler; every program 'builds'."""

    def __init__(self, *args, **kwargs):
        pass

    def build_many(self, programs):
        return [BuildOutcome(p, artifact="stub", seconds=0.0) for p in programs]


class StubWorkerRunner:
    """STUB runner: torch 1 ms, a kernel 128/(tile M + tile N) ms; split-K programs 'fail the check'."""

    measured = 0

    def __init__(self, *args, **kwargs):
        self.device = Device("Stub GPU", "9.0", 132)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def baselines(self, problem):
        return {"torch": BaselineTime(1.0, 0.01), "lt_autotune": BaselineTime(0.95, 0.01)}

    def measure(self, program, artifact, *, seed=None):
        StubWorkerRunner.measured += 1
        if program.split_k > 1:
            return Measurement(check_passed=False, check_msg="stub failure", seed=1)
        ms = 128.0 / (program.tile.m + program.tile.n)
        return Measurement(check_passed=True, max_rel_err=1e-3, err_bound=4e-3, seed=1, device_ms=ms, spread=0.01)


_load = load_script


@pytest.fixture
def stub_gpu(monkeypatch):
    import torch

    torch.set_num_threads(1)
    import gemmgen.policy.training.grpo as grpo
    import gemmgen.tune.adapters as adapters

    # grpo binds the names at import, which an earlier test file may have done
    for module in (adapters, grpo):
        monkeypatch.setattr(module, "PoolBuilder", StubPoolBuilder)
        monkeypatch.setattr(module, "WorkerRunner", StubWorkerRunner)


def test_policy_eval_flow_with_stub_measurements(stub_gpu, tmp_path, capsys):
    ev = _load("policy_eval")
    db = tmp_path / "tuning.sqlite"
    args = ["--out", str(tmp_path / "eval"), "--db", str(db), "--max-problems", "2", "-k", "3"]
    assert ev.main(args) == 0
    report = json.loads((tmp_path / "eval" / "policy_eval.json").read_text())
    rows = report["rows"]
    assert [r["m"] for r in rows] == [1, 7]                      # the off-grid problems come first
    for r in rows:
        assert r["db_prior"] is None and r["db_best"] >= max(r[m] or 0 for m in ev.METHODS[:4])
        assert len(r["candidates"]["policy_b8"]) <= 3 and r["candidates"]["policy_b1"] == r["candidates"]["policy_b8"][:1]
        for method, group in r["candidates"].items():          # each candidate's speedup, in order
            speedups = r["candidate_speedups"][method]
            assert len(speedups) == len(group) and r[method] == max((x for x in speedups if x), default=None)
    assert (tmp_path / "eval" / "policy_eval.png").is_file()

    # blend: the heuristic's first 1 of 3, then the model's ranking; best-of-1 the model's own first
    assert ev.main(args[:1] + [str(tmp_path / "blend")] + args[2:] + ["--policy-mode", "blend"]) == 0
    from gemmgen.dsl import parse, to_text
    from gemmgen.policy.lm_proposer import PolicyProposer

    ranker = PolicyProposer(mode="rank", backends=("triton", "cutlass", "cuda"))
    for r in json.loads((tmp_path / "blend" / "policy_eval.json").read_text())["rows"]:
        group = r["candidates"]
        assert group["policy_b8"][:1] == group["heuristic_b8"][:1] and len(group["policy_b8"]) == 3
        problem = parse(group["policy_b8"][0]).problem
        assert group["policy_b1"] == [to_text(p) for p in ranker.propose(problem, 1)]
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("heuristic_b8 / space_all: -")   # no space measured
    assert "policy_b8 / heuristic_b8: " in out
    first = StubWorkerRunner.measured
    assert ev.main(args) == 0                                    # a second run re-times nothing
    assert StubWorkerRunner.measured == first
    again = json.loads((tmp_path / "eval" / "policy_eval.json").read_text())["rows"]
    assert all(r["db_prior"] == r["db_best"] for r in again)


def test_policy_eval_on_unseen_problems_measures_the_spaces_where_asked(stub_gpu, tmp_path):
    from gemmgen.policy.proposers import HeuristicProposer
    from gemmgen.policy.training import data

    ev = _load("policy_eval")
    picked = ev.pick_problems(8, which="unseen")
    layers = {p.key for p in data.heldout_layer_problems()}
    assert sum(p.key in layers for p in picked) == 4                       # half held-out layers
    others = [p for p in picked if p.key not in layers]
    assert [p.b_major for p in others] == ["row", "col"] * 2               # a random shape's two majors together
    training = set(data.training_problems())
    assert not any(p in training for p in picked)
    order = ev.pick_problems(40, which="unseen")
    median = sorted(p.flops for p in order)[len(order) // 2]
    assert any(p.flops > median for p in order[:10])                      # a cut-short run still sees large ones
    assert len(ev.pick_problems(None, which="unseen")) == len(data.unseen_problems())
    args = ["--out", str(tmp_path / "eval"), "--db", str(tmp_path / "t.sqlite"), "--problems", "unseen",
            "--max-problems", "2", "-k", "2", "--space-problems", "1", "--backends", "triton"]
    assert ev.main(args) == 0
    report = json.loads((tmp_path / "eval" / "policy_eval.json").read_text())
    first, second = report["rows"]
    assert report["summary"]["problem_set"] == "unseen"
    space = first["candidates"]["space_all"]
    assert space and len(space) == len(HeuristicProposer(("triton",)).ranked(picked[0]))
    assert first["space_all"] >= max(first[m] or 0 for m in ("policy_b8", "random_b8", "heuristic_b8")
                                     if first["candidates"][m] and set(first["candidates"][m]) <= set(space))
    assert "space_all" not in second["candidates"] and second.get("space_all") is None
    assert report["summary"]["space_all"]["measured"] == 1


def test_each_trial_is_judged_against_its_own_sessions_torch_time():
    from types import SimpleNamespace as NS

    from gemmgen.dsl.ir import Problem
    from tuning_fakes import trial as measured

    ev = _load("policy_eval")

    def trial(program, ms, torch_ms, status="ok"):      # the fake's torch.matmul is 1.05 x its baseline_ms
        return measured(Problem(64, 64, 64), program=program, device_ms=ms, baseline_ms=torch_ms / 1.05,
                        status=status, check_passed=status == "ok")

    # "a" ran fastest in a session whose torch.matmul was fast too; "b" beat its own torch.matmul more
    db = NS(trials=lambda key, device: [trial("a", 1.0, 1.0), trial("b", 1.1, 1.32), trial("b", 1.2, 1.2),
                                        trial("c", 0.5, 1.0, status="check_failed")])
    speedups = ev.best_speedups(db, NS(key="p"), "gpu")
    assert speedups == pytest.approx({"a": 1.0, "b": 1.2})
    assert ev.method_speedup(["a", "b"], speedups) == pytest.approx(1.2)
    assert ev.method_speedup(["a"], speedups) <= ev.method_speedup(list(speedups), speedups)
    assert ev.method_speedup(["c", "unmeasured"], speedups) is None


def test_policy_eval_shards_split_the_problems_and_merge_into_one_table(stub_gpu, tmp_path, capsys):
    ev = _load("policy_eval")
    both = ev.pick_problems(9)
    shards = [ev.pick_problems(9, f"{i}/2") for i in range(2)]
    assert sorted(p.key for s in shards for p in s) == sorted(p.key for p in both)      # a split, no overlap
    assert all(p.m in (1, 7, 33, 1000, 3000) for p in shards[0][:3])                    # off-grid still first
    db = tmp_path / "tuning.sqlite"
    for i in range(2):
        args = ["--out", str(tmp_path / f"s{i}"), "--db", str(db), "--max-problems", "4", "-k", "2",
                "--shard", f"{i}/2"]
        assert ev.main(args) == 0
    parts = [json.loads((tmp_path / f"s{i}" / "policy_eval.json").read_text()) for i in range(2)]
    assert ev.main(["--out", str(tmp_path / "all"), "--merge"] +
                   [str(tmp_path / f"s{i}" / "policy_eval.json") for i in range(2)]) == 0
    merged = json.loads((tmp_path / "all" / "policy_eval.json").read_text())
    assert [r["problem"] for r in merged["rows"]] == [r["problem"] for d in parts for r in d["rows"]]
    assert merged["summary"]["problems"] == 4 and merged["summary"]["shards"] == ["0/2", "1/2"]
    assert (tmp_path / "all" / "policy_eval.png").is_file()
    parts[1]["summary"]["policy_version"] = "another"
    (tmp_path / "s1" / "policy_eval.json").write_text(json.dumps(parts[1]))
    with pytest.raises(SystemExit, match="different policies"):
        ev.main(["--out", str(tmp_path / "bad"), "--merge", str(tmp_path / "s0" / "policy_eval.json"),
                 str(tmp_path / "s1" / "policy_eval.json")])


def test_policy_grpo_flow_with_stub_measurements(stub_gpu, tmp_path, capsys):
    gr = _load("policy_grpo")
    db = tmp_path / "tuning.sqlite"
    args = ["--out", str(tmp_path / "run"), "--db", str(db), "--minutes", "5", "--max-steps", "1",
            "--problems", "4", "--prompts-per-step", "2", "--generations", "4", "--backends", "triton,cutlass,cuda",
            "--sft-minutes", "0.02"]
    assert gr.main(args) == 0
    report = json.loads((tmp_path / "run" / "policy_grpo.json").read_text())
    assert report["sft"]["steps"] >= 1 and report["sft"]["heuristic_programs"] > 1000     # the shipped snapshot
    assert report["grpo"]["steps"] == 1 and len(report["reward_curve"]) == 1
    assert (tmp_path / "run" / "reward_curve_grpo.png").is_file()
    assert (tmp_path / "run" / "grpo" / "model.safetensors").is_file()
    with Database(db) as d:
        assert d.stats()["trials"] == report["grpo"]["measured_pairs"] > 0
    assert "mean reward" in capsys.readouterr().out


def test_the_offline_proxy_scores_against_a_recorded_gpu_evaluation(tmp_path, capsys):
    """`--recorded`: the problems and timed candidates of a policy_eval.py report; every proposer
    is narrowed to that run's backends; a candidate timed twice keeps its best speedup; the run's
    own lists blended (the heuristic's first k // 2, then the policy's) against its heuristic's."""
    import gzip

    from gemmgen.dsl import to_text
    from gemmgen.dsl.ir import Problem
    from gemmgen.policy.proposers import HeuristicProposer

    script = load_script("policy_offline_eval")
    problem = Problem(16, 4096, 4096, b_major="col")
    first, second, third = (to_text(p) for p in HeuristicProposer(("triton",)).propose(problem, 3))
    row = {"problem": problem.key,
           "candidates": {"heuristic_b8": [first, second], "random_b8": [first, third], "policy_b8": [third, first]},
           "candidate_speedups": {"heuristic_b8": [0.9, 1.1], "random_b8": [0.95, None], "policy_b8": [1.3, 0.9]}}
    report = tmp_path / "policy_eval.json.gz"
    with gzip.open(report, "wt") as f:
        json.dump({"summary": {"backends": ["triton"], "policy_mode": "rank"}, "rows": [row]}, f)
    measured_of, backends = script.recorded_problems(script.read_report(report))
    assert backends == ["triton"] and measured_of == {problem: {first: 0.95, second: 1.1, third: 1.3}}

    assert script.main(["--recorded", str(report), "-k", "2", "--out", str(tmp_path / "out")]) == 0
    with gzip.open(tmp_path / "out" / "policy_offline_eval.json.gz", "rt") as f:
        written = json.load(f)
    assert written["problems"] == str(report) and written["summary"]["heuristic"]["problems"] == 1
    assert written["rows"][0]["heuristic"] == {"hit_best": False, "measured": 2,
                                                "known_b8": pytest.approx(1.1 / 1.3), "proposed": 2}
    # k = 2: the heuristic's first (0.95), then the policy's first (1.3), against the heuristic's best 1.1
    assert written["run_lists_blend"] == {"policy_mode": "rank", "problems": 1,
                                          "over_heuristic_best": round(1.3 / 1.1, 4), "better": 1, "worse": 0}
    assert "1.182x the heuristic's best of 2" in capsys.readouterr().out

    for bad, words in ((tmp_path / "missing.json", "no such file"), (tmp_path / "out" / "policy_offline_eval.json.gz",
                                                                     "not a policy_eval.py report")):
        with pytest.raises(SystemExit) as stop:
            script.main(["--recorded", str(bad), "--out", str(tmp_path / "x")])
        assert stop.value.code == 2 and words in capsys.readouterr().err
