"""How much room a small-batch product has above torch.matmul, and how much of it gemmgen took,
against a plain read of the same weight (CPU: no timing here, only committed device times).

A product at M <= 128 must read its weight once; `read_ceiling.py` timed the fastest plain read
of each weight of the layer set on the H200, under the same L2 flush as the benches. Per M and
per weight size, over the rows of `gemmgen bench` runs whose weight it timed, this gives the
geomean of torch.matmul's time over the read's (the room: what a kernel as fast as a plain read
would be over torch.matmul), of torch.matmul's over gemmgen's (what was taken, timed in the
bench process), the share of the room taken (in log terms) and the median of the read's time
over gemmgen's. A shape several benches measured counts once, from the last one named (name
the newest last).

    python3 benchmarks/read_room.py benchmarks/results/gemmgen_llm_decode_offline \\
        benchmarks/results/gemmgen_llm_m4_16_offline benchmarks/results/gemmgen_llm_m32_256_offline \\
        benchmarks/results/gemmgen_llm_small_weights_offline \\
        --ceiling benchmarks/results/read_ceiling/read_ceiling.json --out benchmarks/results/read_room/table.txt
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from gemmgen.errors import GemmgenError
from gemmgen.measure.numerics import geomean, median
from gemmgen.measure.results import load

#: Weight sizes (MB, 1e6 bytes) that split the rows: a plain read reaches 0.32 of the bandwidth
#: floor at 3.7 MB and 0.96 at 1-2 GB (read_ceiling/), so the room shrinks with size.
SIZE_EDGES_MB = (16, 64, 256)


def size_bucket(weight_bytes: int) -> str:
    mb = weight_bytes / 1e6
    lower = 0
    for edge in SIZE_EDGES_MB:
        if mb < edge:
            return f"{lower}-{edge} MB"
        lower = edge
    return f">= {lower} MB"


def pairs(bench: dict, read_us: dict) -> dict[tuple[int, int, int], tuple[int, int, float, float, float]]:
    """(M, N, K) -> (M, weight bytes, torch.matmul us, gemmgen us, read us) for each row of a
    bench at M <= 128 whose weight (N, K) was read, both checked and timed."""
    torch = {(r["m"], r["n"], r["k"]): r for r in bench["rows"] if r["name"] == "torch" and r["status"] == "ok"}
    out = {}
    for r in bench["rows"]:
        key = (r["m"], r["n"], r["k"])
        if r["name"] != "gemmgen" or r["status"] != "ok" or r["m"] > 128 or key not in torch:
            continue
        read = read_us.get((r["n"], r["k"]))
        if read:
            out[key] = (r["m"], 2 * r["n"] * r["k"], 1e3 * torch[key]["device_ms"], 1e3 * r["device_ms"], read)
    return out


def table(rows: list[tuple[int, int, float, float, float]]) -> str:
    groups = defaultdict(list)
    for row in rows:
        groups[("M", row[0])].append(row)
        groups[("weight", size_bucket(row[1]))].append(row)
        groups[("all", "M <= 128")].append(row)
    order = sorted((g for g in groups if g[0] == "M"), key=lambda g: g[1])
    order += [("weight", size_bucket(0))] + [("weight", size_bucket(int(e * 1e6))) for e in SIZE_EDGES_MB]
    order += [("all", "M <= 128")]
    lines = [f"{'rows of':>8} {'':>12} {'n':>4} {'read x torch':>13} {'gemmgen x torch':>16} "
             f"{'room taken':>11} {'read / gemmgen':>15}"]
    for group in order:
        sel = groups.get(group)
        if not sel:
            continue
        room = geomean([t / r for _, _, t, _, r in sel])
        took = geomean([t / g for _, _, t, g, _ in sel])
        share = math.log(took) / math.log(room) if room > 1 else float("nan")
        ratio = median(r / g for _, _, _, g, r in sel)
        lines.append(f"{group[0]:>8} {str(group[1]):>12} {len(sel):4d} {room:13.3f} {took:16.3f} "
                     f"{share:11.2f} {ratio:15.3f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("benches", nargs="+", help="gemmgen bench folders or results.json files")
    ap.add_argument("--ceiling", required=True, help="read_ceiling.py's JSON")
    ap.add_argument("--out", default=None, help="write the table here too")
    args = ap.parse_args(argv)
    if args.out and Path(args.out).is_dir():
        ap.error(f"--out {args.out} is a folder; give the table's file name, e.g. {Path(args.out) / 'table.txt'}")

    try:
        ceiling = json.loads(Path(args.ceiling).read_text())
        read_us = {(r["n"], r["k"]): r["device_us"] for r in ceiling["rows"]}
        by_shape = {}
        for bench in args.benches:           # a later bench's row replaces an earlier one's
            by_shape.update(pairs(load(bench), read_us))
        rows = list(by_shape.values())
    except (OSError, ValueError, KeyError, GemmgenError) as exc:
        ap.error(f"cannot read the inputs: {exc}")
    if not rows:
        ap.error("no bench row at M <= 128 has a weight the read ceiling timed")
    text = table(rows)
    print(text, end="")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
