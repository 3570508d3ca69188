"""benchmarks/prior_fit.py on made-up records: the scores and implied costs it reports follow from
the times it is given (no GPU, no shipped records)."""
import json
from dataclasses import replace

import pytest

from benchmark_scripts import load_script
from gemmgen.backends import ranking
from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db.records import trial_to_json
from tuning_fakes import program_text, trial, triton_program

TILES = [(16, 32, 64), (32, 32, 64), (64, 64, 64), (128, 128, 64)]


def _records(path, *, time_of, problems=8):
    lines = []
    for i in range(problems):
        problem = Problem(16 * (i + 1), 1024, 4096)
        programs = [triton_program(problem, tile, 3) for tile in TILES]
        programs.append(replace(programs[0], split_k=4, split_k_reduce="unordered"))
        for program in programs:
            lines.append(trial_to_json(trial(problem, device_ms=time_of(program) * 1e3,
                                             program=program_text(program))))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_times_the_prior_predicts_score_one_and_imply_the_shipped_costs(tmp_path):
    script = load_script("prior_fit")
    records = _records(tmp_path / "records.jsonl", time_of=ranking.estimated_seconds)
    assert script.main(["--records", str(records), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["problems"]["fit"] + result["problems"]["scored"] == 8
    shipped = result["order"]["prior shipped"]["all"]
    assert shipped["top1"] == pytest.approx(1.0) and shipped["top4"] == pytest.approx(1.0)
    for row in result["residual_us"].values():
        assert row["median"] == pytest.approx(0.0, abs=1e-6)
    implied = result["implied_summing"]["triton unordered"]      # the fit half's split programs
    assert implied["problems"] >= 1 and implied["implied_us"] == pytest.approx(implied["shipped_us"])


def test_a_split_slower_than_estimated_implies_a_dearer_sum(tmp_path):
    script = load_script("prior_fit")

    def time_of(program):
        return ranking.estimated_seconds(program) + (1e-6 if program.split_k > 1 else 0.0)

    groups = script.measured_programs(_records(tmp_path / "r.jsonl", time_of=time_of))
    implied = script.implied_summing(script.residuals(groups))["triton unordered"]
    assert implied["implied_us"] == pytest.approx(ranking.SPLIT_REDUCE_S[("triton", "unordered")] * 1e6 + 1.0)


def test_a_missing_file_is_one_line(tmp_path, capsys):
    script = load_script("prior_fit")
    assert script.main(["--records", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "--records" in err and "Traceback" not in err
