"""benchmarks/read_room.py on CPU: the room above torch.matmul against a plain read of the weight,
and the share of it gemmgen took, per M and per weight size."""
import json
import math

import pytest

from benchmark_scripts import load_script


def _row(name, m, n, k, ms, status="ok"):
    return {"name": name, "m": m, "n": n, "k": k, "device_ms": ms, "status": status}


def test_room_and_share_taken_per_m_and_weight_size(tmp_path, capsys):
    bench = {"rows": [_row("torch", 1, 4096, 4096, 0.016), _row("gemmgen", 1, 4096, 4096, 0.0125),
                      _row("torch", 1, 512, 4096, 0.008), _row("gemmgen", 1, 512, 4096, 0.006),
                      _row("torch", 256, 4096, 4096, 0.05), _row("gemmgen", 256, 4096, 4096, 0.04),  # M > 128
                      _row("torch", 8, 1024, 1024, 0.005), _row("gemmgen", 8, 1024, 1024, 0.004)]}  # no read
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.json").write_text(json.dumps(bench))
    ceiling = {"rows": [{"n": 4096, "k": 4096, "device_us": 10.0}, {"n": 512, "k": 4096, "device_us": 2.0}]}
    (tmp_path / "ceiling.json").write_text(json.dumps(ceiling))
    script = load_script("read_room")
    out = tmp_path / "room" / "table.txt"
    assert script.main([str(tmp_path / "bench"), "--ceiling", str(tmp_path / "ceiling.json"), "--out", str(out)]) == 0
    lines = {tuple(line.split()[:2]): line.split()[2:] for line in out.read_text().splitlines()[1:]}
    n, room, took, share, ratio = lines[("M", "1")]
    assert n == "2" and math.isclose(float(room), math.sqrt(1.6 * 4.0), abs_tol=1e-3)   # 16/10, 8/2
    assert math.isclose(float(took), math.sqrt(1.28 * 8 / 6), abs_tol=1e-3)
    assert math.isclose(float(share), math.log(float(took)) / math.log(float(room)), abs_tol=0.01)
    assert math.isclose(float(ratio), (10 / 12.5 + 2 / 6) / 2, abs_tol=1e-3)
    assert lines[("weight", "0-16")][1] == "1" and lines[("weight", "16-64")][1] == "1"   # 4.2 MB, 33.6 MB
    assert out.read_text() == capsys.readouterr().out


def test_inputs_without_a_usable_row_are_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps({"rows": [_row("torch", 1, 64, 64, 0.01)]}))
    (tmp_path / "ceiling.json").write_text(json.dumps({"rows": []}))
    script = load_script("read_room")
    with pytest.raises(SystemExit):
        script.main([str(tmp_path / "results.json"), "--ceiling", str(tmp_path / "ceiling.json")])
    assert "no bench row" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main([str(tmp_path / "missing"), "--ceiling", str(tmp_path / "ceiling.json")])
    assert "cannot read the inputs" in capsys.readouterr().err


def test_a_shape_two_benches_measured_counts_once_from_the_last(tmp_path, capsys):
    old = {"rows": [_row("torch", 4, 512, 4096, 0.008), _row("gemmgen", 4, 512, 4096, 0.008)]}
    new = {"rows": [_row("torch", 4, 512, 4096, 0.008), _row("gemmgen", 4, 512, 4096, 0.004)]}
    for name, bench in (("old", old), ("new", new)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(bench))
    (tmp_path / "ceiling.json").write_text(json.dumps({"rows": [{"n": 512, "k": 4096, "device_us": 2.0}]}))
    script = load_script("read_room")
    assert script.main([str(tmp_path / "old"), str(tmp_path / "new"), "--ceiling", str(tmp_path / "ceiling.json")]) == 0
    lines = {tuple(line.split()[:2]): line.split()[2:] for line in capsys.readouterr().out.splitlines()[1:]}
    n, room, took, _, _ = lines[("M", "4")]
    assert n == "1" and math.isclose(float(took), 2.0, abs_tol=1e-3)
