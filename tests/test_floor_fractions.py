"""benchmarks/floor_fractions.py on CPU: per M, the floor fractions of the best program and the
speedup of what serves (a winner by the database's rule, else torch.matmul at 1.0)."""
import math

from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db import Database
from gemmgen.tuning_db.exchange import export
from benchmark_scripts import load_script
from tuning_fakes import library_choice, trial


def test_served_speedup_counts_a_winner_and_torch_where_nothing_won(tmp_path, capsys):
    won, lost = (Problem(1, n, 4096, a_major="row", b_major="col") for n in (4096, 8192))
    db = Database(tmp_path / "runs.sqlite")
    db.record(trial(won, device_ms=0.5, baseline_ms=1.2))      # torch.matmul 1.26 ms beside it
    db.record(trial(lost, device_ms=1.5, baseline_ms=1.2))
    db.record_library(library_choice(won, device_ms=0.9, torch_ms=1.0))   # serves, but slower than the program
    export(db, tmp_path / "trials.jsonl")
    script = load_script("floor_fractions")
    assert script.main([str(tmp_path / "trials.jsonl"), "--out", str(tmp_path / "floor.txt")]) == 0
    head, row = (tmp_path / "floor.txt").read_text().splitlines()
    cells = dict(zip(head.replace(" x ", "_x_").split(), row.split()))
    assert cells["M"] == "1" and cells["problems"] == "2" and cells["won"] == "1"
    assert math.isclose(float(cells["served_x_torch"]), math.sqrt(1.26 / 0.5), abs_tol=1e-3)
    best = math.sqrt(1.26 / 0.5 * 1.26 / 1.5)         # the loser counts at its own speed here
    assert math.isclose(float(cells["program_x_torch"]), best, abs_tol=1e-3)


def test_a_library_choice_serves_where_no_program_won(tmp_path):
    """A problem whose programs all lost and whose cuBLASLt choice beat torch.matmul counts as
    won, at the choice's speedup."""
    problem = Problem(64, 4096, 4096, a_major="row", b_major="col")
    db = Database(tmp_path / "runs.sqlite")
    db.record(trial(problem, device_ms=1.5, baseline_ms=1.2))
    db.record_library(library_choice(problem, device_ms=0.8, torch_ms=1.0))
    export(db, tmp_path / "trials.jsonl")
    script = load_script("floor_fractions")
    assert script.main([str(tmp_path / "trials.jsonl"), "--out", str(tmp_path / "floor.txt")]) == 0
    head, row = (tmp_path / "floor.txt").read_text().splitlines()
    cells = dict(zip(head.replace(" x ", "_x_").split(), row.split()))
    assert cells["won"] == "1" and math.isclose(float(cells["served_x_torch"]), 1.25, abs_tol=1e-3)
