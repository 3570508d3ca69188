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


def test_a_failure_part_way_keeps_what_was_measured(tmp_path, monkeypatch, capsys):
    """Rows are saved after every problem, and a gemmgen error ends the run with one line."""
    import json
    from types import SimpleNamespace

    import gemmgen
    from gemmgen.errors import GemmgenError
    from gemmgen.tune import on_demand

    script = load_script("on_demand")
    monkeypatch.setattr(script, "gpu_present", lambda: True)
    compiled = []

    def fake_compile(shape, **kwargs):
        compiled.append(shape)
        if shape[0] == 4:       # the second problem (granite3_8b.gate.4)
            raise GemmgenError("the worker stopped: stand-in failure")
        return SimpleNamespace(fn=None, problem=SimpleNamespace(key="k", m=shape[0], n=shape[1], k=shape[2]),
                               provenance=SimpleNamespace(summary="a program"))

    monkeypatch.setattr(gemmgen, "compile", fake_compile)
    monkeypatch.setattr(on_demand, "tune_now", lambda *a, **k: None)
    monkeypatch.setattr(script, "side_by_side", lambda kernels, problem: (
        {"on_demand": 1.0, "exhaustive": 1.0, "torch": 1.1}, {}))
    argv = ["--out", str(tmp_path), "--problems", "phi3_medium.qkv.1,granite3_8b.gate.4"]
    monkeypatch.setattr(script.sys, "argv", ["on_demand.py"] + argv)

    assert load_script("gpu_main").run_main(script.main, argv) == 2
    assert "stand-in failure" in capsys.readouterr().err
    saved = json.loads((tmp_path / "on_demand.json").read_text())
    assert [r["layer"] for r in saved["rows"]] == ["phi3_medium.qkv"]
    assert saved["summary"]["on_demand_x_torch"] == 1.1
