"""benchmarks/replicate_noise.py: recorded library speedups against a later bench session."""
import json
from dataclasses import replace

import pytest

from gemmgen.dsl.ir import Problem
from gemmgen.tuning_db.records import library_to_json
from benchmark_scripts import load_script
from tuning_fakes import library_choice


def _bench(path, mode, date, rows):
    path.mkdir()
    doc = {"meta": {"mode": mode, "date": date}, "rows": [
        {"name": "gemmgen", "m": m, "n": n, "k": k, "layout": "nn", "device_ms": 1.0,
         "notes": {"how": how, "reference_device_ms": measured}} for (m, n, k), how, measured in rows]}
    (path / "results.json").write_text(json.dumps(doc))
    return str(path)


def test_each_bench_row_meets_the_choice_recorded_before_it(tmp_path, capsys):
    p, q = Problem(256, 256, 4096), Problem(512, 512, 1024)
    choices = [
        library_choice(p, device_ms=0.9, torch_ms=1.0, created="2026-11-29T10:00:00.000000+00:00"),   # 1.111x
        library_choice(p, device_ms=0.5, torch_ms=1.0, created="2026-11-29T12:00:00.000000+00:00"),   # after: ignored
        replace(library_choice(q, device_ms=1.0, torch_ms=1.05, created="2026-11-29T10:00:00.000000+00:00"),
                server_ms=1.0, torch_server_ms=1.02),
    ]
    records = tmp_path / "shipped.jsonl"
    records.write_text("".join(library_to_json(c) + "\n" for c in choices))
    rows = [((256, 256, 4096), "library", 1.1), ((512, 512, 1024), "library", 1.05), ((64, 64, 64), "exact", 2.0)]
    offline = _bench(tmp_path / "off", "offline", "2026-11-29T11:00:00+00:00", rows)
    server = _bench(tmp_path / "srv", "server", "2026-11-29T11:00:00+00:00", rows)
    script = load_script("replicate_noise")
    script.main([str(records), offline, server, "--out", str(tmp_path / "out")])
    doc = json.loads((tmp_path / "out" / "replicate_noise.json").read_text())
    off, srv = doc["runs"]
    assert off["n"] == 2 and [r["recorded"] for r in off["rows"]] == pytest.approx([1 / 0.9, 1.05])
    assert srv["rows"][1]["recorded_mode"] == "server" and srv["rows"][1]["recorded"] == pytest.approx(1.02)
    assert srv["rows"][0]["recorded_mode"] == "offline"          # no server pair recorded: the offline one
    assert doc["summary"]["pooled_sd_offline"] == pytest.approx(off["sd"])
    assert (tmp_path / "out" / "replicate_noise.png").is_file()
    assert "REPLICATE_NOISE 1.9 %" in capsys.readouterr().out
