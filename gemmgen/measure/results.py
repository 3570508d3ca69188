"""results.json: rows, the summary computed from them, merging shards, resuming runs.

    {"meta": {...environment, command, date, mode...},
     "rows": [{name, kind, m, n, k, layout, shape_layout, gflop, bucket, device_ms, host_ms,
               spread, tflops, floor_ms, fraction_of_floor, max_rel_err, bound, passed,
               status, message, ...}, ...],
     "summary": {"n_shapes", "names", "baselines", "passed": {name: n},
                 "geomean": {"A/B": speedup of A over B}, "geomean_n": {"A/B": shapes},
                 "geomean_host": {...}, "median_fraction_of_floor": {name: x},
                 "same_session": {candidate: {"reference", "geomean", "n"}},
                 "by_bucket": {bucket: {"n_shapes", "geomean", "geomean_n", "same_session",
                                        "median_fraction_of_floor"}}}}

A speedup A/B is the geometric mean over shapes where both A and B passed their check
and have a device time, of B.device_ms / A.device_ms: > 1 means A is faster. Pairs are
every name (candidate or baseline) against every baseline. Pure: runs on CPU.

An isolated candidate runs in the worker process, the baselines in the bench process; its
`same_session` figure compares it with a reference baseline timed in its own worker session,
which removes the processes' difference (see gemmgen.measure.worker.Job.reference).
"""
from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from pathlib import Path
from typing import Any, Iterable, Optional

from gemmgen.measure.errors import MeasureError
from gemmgen.measure.numerics import bucket_names, bucket_of, geomean, median

RESULTS = "results.json"


def shape_key(row: dict) -> tuple:
    return (row["m"], row["n"], row["k"], row.get("shape_layout", row.get("layout", "nn")))


def row_key(row: dict) -> tuple:
    return shape_key(row) + (row["name"],)


def _usable(row: dict) -> bool:
    return bool(row.get("passed")) and row.get("device_ms") is not None and row["device_ms"] > 0


def _ratios(rows: list[dict], a: str, b: str, field: str) -> list[float]:
    by_shape: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        by_shape.setdefault(shape_key(row), {})[row["name"]] = row
    out = []
    for named in by_shape.values():
        ra, rb = named.get(a), named.get(b)
        if ra and rb and _usable(ra) and _usable(rb) and ra.get(field) and rb.get(field):
            out.append(rb[field] / ra[field])
    return out


def _pairs(rows: list[dict], names: list[str], baselines: list[str]) -> dict[str, Any]:
    geo, count, host = {}, {}, {}
    for a in names:
        for b in baselines:
            if a == b:
                continue
            key = f"{a}/{b}"
            dev = _ratios(rows, a, b, "device_ms")
            geo[key] = geomean(dev)
            count[key] = len(dev)
            host[key] = geomean(_ratios(rows, a, b, "host_ms"))
    return {"geomean": geo, "geomean_n": count, "geomean_host": host}


def _same_session(rows: list[dict], names: list[str]) -> dict[str, dict]:
    """Per isolated candidate: geomean of reference / candidate device time, both timed in the
    candidate's worker session (the comparison free of the two processes' difference)."""
    out = {}
    for n in names:
        timed = [r for r in rows if r["name"] == n and _usable(r) and (r.get("notes") or {}).get("reference_device_ms")]
        if not timed:
            continue
        speedups = [r["notes"]["reference_device_ms"] / r["device_ms"] for r in timed]
        noises = [r["notes"].get("speedup_noise") for r in timed]
        # slower than the reference by more than the comparison's noise (rows that carry one)
        slower = [r for r, s, z in zip(timed, speedups, noises) if z is not None and s * (1 + z) < 1]
        out[n] = {"reference": timed[0]["notes"]["reference"], "geomean": geomean(speedups), "n": len(timed),
                  "min": min(speedups), "slower_beyond_noise": len(slower),
                  # of those, rows where the candidate served the reference itself: the same kernel twice
                  "slower_serving_the_reference": sum(1 for r in slower if _serves_reference(r)),
                  "with_noise": sum(1 for z in noises if z is not None)}
    return out


def _serves_reference(row: dict) -> bool:
    """A candidate row whose served kernel is the reference's own (gemmgen.compile's baseline)."""
    notes = row.get("notes") or {}
    return notes.get("how") == "baseline" and notes.get("backend") == notes.get("reference")


def _floor_medians(rows: list[dict], names: list[str]) -> dict[str, Optional[float]]:
    return {n: median(r["fraction_of_floor"] for r in rows if r["name"] == n and _usable(r)
                      and r.get("fraction_of_floor") is not None) for n in names}


def summarize(rows: list[dict]) -> dict[str, Any]:
    names: list[str] = []
    baselines: list[str] = []
    for row in rows:
        if row["name"] not in names:
            names.append(row["name"])
        if row.get("kind") == "baseline" and row["name"] not in baselines:
            baselines.append(row["name"])
    summary: dict[str, Any] = {
        "n_shapes": len({shape_key(r) for r in rows}),
        "names": names,
        "baselines": baselines,
        "passed": {n: sum(1 for r in rows if r["name"] == n and r.get("passed")) for n in names},
        "measured": {n: sum(1 for r in rows if r["name"] == n and _usable(r)) for n in names},
    }
    summary.update(_pairs(rows, names, baselines))
    summary["same_session"] = _same_session(rows, names)
    summary["median_fraction_of_floor"] = _floor_medians(rows, names)
    by_bucket = {}
    for bucket in bucket_names():
        inside = [r for r in rows if bucket_of(2.0 * r["m"] * r["n"] * r["k"] / 1e9) == bucket]
        if not inside:
            continue
        entry = {"n_shapes": len({shape_key(r) for r in inside})}
        pairs = _pairs(inside, names, baselines)
        entry["geomean"], entry["geomean_n"] = pairs["geomean"], pairs["geomean_n"]
        entry["same_session"] = _same_session(inside, names)
        entry["median_fraction_of_floor"] = _floor_medians(inside, names)
        by_bucket[bucket] = entry
    summary["by_bucket"] = by_bucket
    return summary


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def save(out_dir: str | Path, meta: dict, rows: list[dict]) -> dict:
    """Write DIR/results.json atomically (a stopped run leaves the last complete file)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "rows": rows, "summary": summarize(rows)}
    tmp = out / (RESULTS + ".tmp")
    # Compact: committed results travel with the repository to the GPU machine (64 MiB in all).
    tmp.write_text(json.dumps(_clean(doc), separators=(",", ":")) + "\n")
    os.replace(tmp, out / RESULTS)
    return doc


def load(path: str | Path) -> dict:
    """A results document from DIR or DIR/results.json, or its gzipped copy (results.json.gz:
    older committed runs are archived so, the repository travels to the GPU machine)."""
    p = Path(path)
    if p.is_dir():
        p = p / RESULTS
    packed = p.with_name(p.name + ".gz")
    try:
        if not p.exists() and packed.exists():
            p = packed
            doc = json.loads(gzip.decompress(p.read_bytes()))
        else:
            doc = json.loads(p.read_text())
    except (EOFError, zlib.error, gzip.BadGzipFile):
        raise MeasureError(f"{p} is a damaged or truncated gzip file") from None
    except OSError as exc:
        raise MeasureError(f"cannot read {p}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise MeasureError(f"{p} is not UTF-8 text: give a gemmgen bench results.json") from None
    except json.JSONDecodeError as exc:
        raise MeasureError(f"{p} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or "rows" not in doc or not isinstance(doc["rows"], list):
        raise MeasureError(f"{p} is not a gemmgen results file (no 'rows' list)")
    bad = next((i for i, row in enumerate(doc["rows"]) if not isinstance(row, dict) or "name" not in row), None)
    if bad is not None:
        raise MeasureError(f"{p}: row {bad} is not a result row (an object with a 'name'); was the file edited?")
    return doc


def refresh(path: str | Path) -> dict:
    """The document with its summary recomputed, written back to DIR/results.json; an archived
    run (results.json.gz only) is left as committed."""
    doc = load(path)
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if (folder / RESULTS).exists():
        return save(folder, doc.get("meta", {}), doc["rows"])
    return {**doc, "summary": summarize(doc["rows"])}


def done_shapes(rows: Iterable[dict], wanted_names: Iterable[str]) -> set[tuple]:
    """Shapes that already have a row for every wanted name: --resume skips them."""
    wanted = set(wanted_names)
    have: dict[tuple, set[str]] = {}
    for row in rows:
        have.setdefault(shape_key(row), set()).add(row["name"])
    return {key for key, got in have.items() if wanted <= got}


def merge(docs: list[dict]) -> tuple[dict, list[dict]]:
    """Rows of several runs (shards), later ones winning on the same shape and name."""
    if not docs:
        raise MeasureError("nothing to merge")
    rows: dict[tuple, dict] = {}
    for doc in docs:
        for row in doc["rows"]:
            rows[row_key(row)] = row
    modes = {doc.get("meta", {}).get("mode") for doc in docs} - {None}
    if len(modes) > 1:
        raise MeasureError(f"refusing to merge runs of different modes ({', '.join(sorted(modes))})")
    meta = dict(docs[0].get("meta", {}))
    meta["merged_from"] = [
        {k: doc.get("meta", {}).get(k) for k in ("out", "shard", "date", "command", "stopped")} for doc in docs
    ]
    ordered = sorted(rows.values(), key=lambda r: (r["m"] * r["n"] * r["k"], shape_key(r), r["name"]))
    return meta, ordered


def bucket_label(row: dict) -> str:
    return bucket_of(2.0 * row["m"] * row["n"] * row["k"] / 1e9)
