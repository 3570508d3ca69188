"""benchmarks/worker_starts.py on CPU: what it times, its refusals, and its one-line stop
without a GPU (the GPU run is the benchmark)."""
import pytest

from benchmark_scripts import load_script


def test_it_times_workers_started_side_by_side_until_all_are_ready():
    assert load_script("worker_starts").time_starts(2, gpu=False) > 0


@pytest.mark.parametrize("counts, words", [("1,x", "whole numbers"), ("0,3", "at least 1"), (",", "at least 1")])
def test_counts_it_cannot_use_are_refused(counts, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        load_script("worker_starts").main(["--out", str(tmp_path), "--counts", counts])
    assert stop.value.code == 2 and words in capsys.readouterr().err


def test_without_a_gpu_it_stops_with_one_line(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_script("worker_starts").main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no GPU is visible" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
