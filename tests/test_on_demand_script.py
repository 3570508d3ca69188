"""benchmarks/on_demand.py on CPU: its problems are layers of the set, what it is told to search
is checked before anything runs, and without a GPU it stops with one line (the GPU run is the
benchmark)."""
from pathlib import Path

import pytest

from benchmark_scripts import load_script


def test_its_problems_are_layers_of_the_set():
    script = load_script("on_demand")
    assert len(script.layer_shapes(script.PROBLEMS)) == len(script.PROBLEMS)


@pytest.mark.parametrize("flags, words", [
    (["--fast-backends", "triton,cudaa"], "cudaa not understood"),
    (["--fast-backends", "triton,cublaslt"], "program backends only"),
    (["--exhaustive-backends", "cutlas"], "cutlas not understood"),
])
def test_a_backend_list_it_cannot_use_is_refused_first(flags, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        load_script("on_demand").main(["--out", str(tmp_path)] + flags)
    assert stop.value.code == 2 and words in capsys.readouterr().err


def test_without_a_gpu_it_stops_with_one_line(tmp_path, capsys, monkeypatch):
    from gemmgen.tune import on_demand

    script = load_script("on_demand")
    monkeypatch.setattr(script, "gpu_present", lambda: False)
    assert script.main(["--out", str(tmp_path), "--fast-backends", "triton,cuda"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "Traceback" not in err
    assert on_demand.FAST_BACKENDS == ("triton",)        # the experiment's setting never began


def test_its_working_database_goes_when_the_process_ends(tmp_path, monkeypatch):
    script = load_script("on_demand")
    monkeypatch.setattr(script, "gpu_present", lambda: True)
    monkeypatch.setattr(script, "layer_shapes", lambda problems: [])      # no GPU work here
    at_exit = []
    monkeypatch.setattr(script.atexit, "register", lambda fn, *args: at_exit.append((fn, args)))
    assert script.main(["--out", str(tmp_path)]) == 0
    [(remove, (work, _))] = at_exit
    assert Path(work).is_dir() and (tmp_path / "on_demand.json").is_file()
    remove(work, True)
    assert not Path(work).exists()
