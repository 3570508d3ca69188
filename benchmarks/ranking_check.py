"""How well the raw CUDA ranking model orders programs the GPU has already timed.

CPU only. The search measures only the top of `backends/cuda_space.py`'s order, so a model that
ranks a fast program low never learns it missed it. The probes time programs the model did not
choose; this script reads them back and asks, per shape, how the model's estimates
(`estimate_seconds`) order the measured times: the Spearman rank correlation, and the rank the
model gives the fastest program (0 = it would be measured first). `--against` scores another
version of the model beside it, e.g. the committed one:

    git show HEAD:backends/cuda_space.py > /tmp/cuda_space_head.py
    python benchmarks/ranking_check.py --against /tmp/cuda_space_head.py \\
        benchmarks/results/split_probe benchmarks/results/short_k_probe \\
        benchmarks/results/cuda_search/s24/cuda_search.json.gz

A probe directory holds `programs/` and `pairs*/results.json` (anchor_turns.py --protocol
pairs); a cuda_search.py JSON holds each measured program's text and time.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import statistics
import sys
from pathlib import Path


def _ranks(values: list[float]) -> list[float]:
    """Ranks 0.. with ties averaged."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    rx, ry = _ranks(x), _ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def measured(source: Path) -> dict[str, list[tuple[object, float]]]:
    """Shape -> [(program, seconds or time relative to torch.matmul)] from a probe directory
    or a cuda_search.py JSON; within one shape only the order matters."""
    from gemmgen import dsl

    out: dict[str, list] = {}
    if source.is_dir():
        for path in sorted(source.glob("pairs*/results.json")):
            for shape in json.loads(path.read_text())["shapes"]:
                for name, v in shape["variants"].items():
                    program_file = source / "programs" / f"{name}.gemm"
                    if v.get("vs_torch_median_ratio") and program_file.exists():
                        program = dsl.parse(program_file.read_text())
                        out.setdefault(shape["shape"], []).append((program, 1.0 / v["vs_torch_median_ratio"][1]))
        return out
    doc = json.loads(gzip.open(source, "rt").read() if source.suffix == ".gz" else source.read_text())
    for row in doc["rows"]:
        if row.get("status") == "ok" and row.get("device_ms"):
            out.setdefault(f"{row['m']}x{row['n']}x{row['k']}:{row['layout']}", []).append(
                (dsl.parse(row["program"]), row["device_ms"]))
    return out


def score(model, data: dict[str, list]) -> tuple[int, float, float]:
    """(shapes, mean Spearman, mean rank of the fastest) over shapes with 4 programs or more."""
    rhos, best_ranks = [], []
    for rows in data.values():
        if len(rows) < 4:
            continue
        times = [t for _, t in rows]
        estimates = [model.estimate_seconds(p, p.problem) for p, _ in rows]
        rhos.append(spearman(estimates, times))
        fastest = min(range(len(times)), key=times.__getitem__)
        best_ranks.append(sorted(estimates).index(estimates[fastest]))
    return len(rhos), statistics.fmean(rhos), statistics.fmean(best_ranks)


def _load_model(path: str):
    spec = importlib.util.spec_from_file_location("cuda_space_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sources", nargs="+", help="probe directories or cuda_search.py JSON files")
    p.add_argument("--against", help="another cuda_space.py to score beside the installed one")
    args = p.parse_args(argv)
    from gemmgen.backends import cuda_space

    models = [("model", cuda_space)] + ([("against", _load_model(args.against))] if args.against else [])
    for source in map(Path, args.sources):
        if not source.exists():
            print(f"{source}: no such probe directory or search JSON", file=sys.stderr)
            return 2
        data = measured(source)
        for label, model in models:
            n, rho, best = score(model, data)
            print(f"{str(source):60s} {label:8s} {n:3d} shapes  Spearman {rho:.3f}  fastest ranked {best:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
