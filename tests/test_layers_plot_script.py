"""benchmarks/layers_plot.py on CPU: several benches (one a batch size) read into one table and
plot, the benches it must not mix refused with one line, and `--part` choosing whose families
a shared shape counts for."""
import json

import pytest

from benchmark_scripts import load_script

SHAPES = """# held_out: heldfam
M,N,K,layout,model,layer
1,64,64,nt,tunedfam,q
2,64,64,nt,tunedfam,q
1,64,64,nt,heldfam,q
2,64,64,nt,heldfam,q
"""


def _bench(folder, m, gpu="NVIDIA H100 80GB HBM3", mode="server", torch_ms=0.012):
    folder.mkdir(parents=True)
    rows = [{"name": name, "m": m, "n": 64, "k": 64, "status": "ok", "device_ms": ms, "fraction_of_floor": 0.5}
            for name, ms in (("torch", torch_ms), ("lt_autotune", 0.011), ("gemmgen", 0.010))]
    meta = {"mode": mode, "part": "all", "date": f"2026-12-0{m}T00:00:00Z",
            "environment": {"gpu": {"name": gpu}}}
    (folder / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    return str(folder)


@pytest.fixture
def shapes(tmp_path):
    path = tmp_path / "layers.csv"
    path.write_text(SHAPES)
    return str(path)


def test_benches_of_several_batch_sizes_make_one_table(tmp_path, shapes):
    script = load_script("layers_plot")
    folders = [_bench(tmp_path / "m1", 1), _bench(tmp_path / "m2", 2, torch_ms=0.015)]
    assert script.main(folders + ["--out", str(tmp_path / "both"), "--shapes", shapes]) == 0
    table = (tmp_path / "both" / "by_m.txt").read_text().splitlines()
    lines_of = {int(line.split()[0]): line.split() for line in table[1:]}
    assert sorted(lines_of) == [1, 2]
    assert float(lines_of[1][2]) == pytest.approx(1.2) and float(lines_of[2][2]) == pytest.approx(1.5)
    assert (tmp_path / "both" / "by_m.png").stat().st_size > 0


@pytest.mark.parametrize("second, words", [
    ({"gpu": "NVIDIA H200"}, "differ in GPU"),
    ({"mode": "offline"}, "differ in mode"),
    ({"m": 1}, "both measured 1x64x64"),
])
def test_benches_it_must_not_mix_are_refused(tmp_path, shapes, capsys, second, words):
    first = _bench(tmp_path / "a", 1)
    other = _bench(tmp_path / "b", second.pop("m", 2), **second)
    assert load_script("layers_plot").main([first, other, "--out", str(tmp_path / "o"), "--shapes", shapes]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_several_benches_need_a_folder_for_their_plot(tmp_path, shapes, capsys):
    folders = [_bench(tmp_path / "m1", 1), _bench(tmp_path / "m2", 2)]
    with pytest.raises(SystemExit) as stop:
        load_script("layers_plot").main(folders + ["--shapes", shapes])
    assert stop.value.code == 2 and "--out" in capsys.readouterr().err


def test_part_tuning_leaves_held_out_families_that_share_a_shape_out(tmp_path, shapes, monkeypatch):
    script = load_script("layers_plot")
    drawn = []
    import matplotlib.axes

    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: (drawn.append(k.get("label")), real_plot(self, *a, **k))[1])
    folder = _bench(tmp_path / "m1", 1)
    assert script.main([folder, "--shapes", shapes]) == 0
    assert sorted(filter(None, drawn)) == ["heldfam", "tunedfam"]      # the bench's own part: all
    drawn.clear()
    assert script.main([folder, "--shapes", shapes, "--part", "tuning"]) == 0
    assert list(filter(None, drawn)) == ["tunedfam"]
