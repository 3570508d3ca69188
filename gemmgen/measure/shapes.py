"""Shape lists for the bench: CSV parsing with layouts, and shard splitting.

A shapes file is CSV with columns M,N,K and an optional fourth, layout: two letters,
A's then B's storage, `n` = row-major (not transposed) and `t` = column-major
(transposed): `nn` is A (M x K) and B (K x N) both row-major (the CUDA-L2 sets, and
the default); `nt` stores B as N x K (B = W.T, the `x @ W.T` case); `tn` stores A as
K x M. A third letter, if present, gives C's storage the same way. A header row
(M,N,K[,layout], any case) is optional; blank lines and lines starting with # are skipped.

Sets of real layers (benchmarks/shapes/llm_layers.csv) add two named columns, model and
layer, which need the header (M,N,K,layout,model,layer). They label a row; they are not
part of the problem, so `Shape.key`, equality and hashing ignore them. A comment line
`# held_out: a, b, c` names the model families kept out of all tuning and training.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from gemmgen.dsl.ir import Problem
from gemmgen.files import read_text
from gemmgen.measure.errors import ShapesError

LETTERS = {"n": "row", "t": "col"}
COLUMNS = ("m", "n", "k", "layout", "model", "layer")   # header names (any case), M,N,K first
NAME = re.compile(r"[A-Za-z0-9_.\-]+")                  # model and layer labels: no commas or spaces
HELD_OUT = re.compile(r"#\s*held_out\s*:(.*)")         # exact key, so prose about held-out rows never matches


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int
    layout: str = "nn"
    # Labels, not problem: compare=False keeps equality and hash on (m, n, k, layout), like key,
    # so k and v of one family (same N, K) collapse in a set and old results keep matching.
    model: Optional[str] = field(default=None, compare=False)
    layer: Optional[str] = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return f"{self.m}x{self.n}x{self.k}:{self.layout}"

    @property
    def gflop(self) -> float:
        return 2.0 * self.m * self.n * self.k / 1e9

    def problem(self) -> Problem:
        a, b, c = majors(self.layout)
        return Problem(self.m, self.n, self.k, a_major=a, b_major=b, c_major=c)


def majors(layout: str) -> tuple[str, str, str]:
    """('row'|'col') for A, B, C from a layout like nn, nt, tn, tt or nnt."""
    text = layout.strip().lower()
    if len(text) not in (2, 3) or any(ch not in LETTERS for ch in text):
        raise ShapesError(f"layout {layout!r}: use two letters (A then B, optionally a third for C), "
                          "n = row-major, t = column-major: nn, nt, tn or tt")
    full = text + ("n" if len(text) == 2 else "")
    return LETTERS[full[0]], LETTERS[full[1]], LETTERS[full[2]]


def _positive(text: str, what: str, where: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ShapesError(f"{where}: {what} = {text.strip()!r} is not an integer") from None
    if value <= 0:
        raise ShapesError(f"{where}: {what} = {value} must be positive")
    return value


def _header(cells: list[str], where: str) -> Optional[list[str]]:
    """The column names if this first row is a header, None if it is already data."""
    names = [c.lower() for c in cells]
    if names[:3] != ["m", "n", "k"]:
        return None
    allowed = ",".join(("M", "N", "K") + COLUMNS[3:])
    for name in names[3:]:
        if name not in COLUMNS[3:]:
            raise ShapesError(f"{where}: header column {name!r} is not known; allowed columns: {allowed} "
                              "(M,N,K first, then any of layout, model, layer)")
    if len(set(names)) != len(names):
        raise ShapesError(f"{where}: header {','.join(cells)} names a column twice")
    return names


def _label(text: str, what: str, where: str) -> Optional[str]:
    if not text:
        return None
    if not NAME.fullmatch(text):
        raise ShapesError(f"{where}: {what} = {text!r}: use letters, digits, '_', '.' or '-' (no spaces or commas)")
    return text


def parse_shapes(lines: list[str], source: str = "<shapes>") -> list[Shape]:
    shapes: list[Shape] = []
    columns = None
    for lineno, row in enumerate(csv.reader(lines), start=1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        where = f"{source}:{lineno}"
        if columns is None:
            columns = _header(cells, where)
            if columns is not None:
                continue
            columns = ["m", "n", "k"]   # no header: positional M,N,K[,layout]
        # Without model/layer a fourth field is the layout, as before; with them, one field per column.
        if columns[3:] in ([], ["layout"]):
            if len(cells) not in (3, 4):
                raise ShapesError(f"{where}: expected M,N,K[,layout], got {len(cells)} field(s): {','.join(cells)}")
            value = dict(zip(COLUMNS, cells))
        elif len(cells) != len(columns):
            raise ShapesError(f"{where}: expected {len(columns)} fields ({','.join(columns)}), "
                              f"got {len(cells)}: {','.join(cells)}")
        else:
            value = dict(zip(columns, cells))
        m, n, k = (_positive(value[c], c.upper(), where) for c in "mnk")
        layout = value.get("layout", "").lower() or "nn"
        try:
            majors(layout)
        except ShapesError as exc:
            raise ShapesError(f"{where}: {exc}") from None
        shapes.append(Shape(m, n, k, layout, _label(value.get("model", ""), "model", where),
                            _label(value.get("layer", ""), "layer", where)))
    if not shapes:
        raise ShapesError(f"{source}: no shapes found")
    return shapes


def read_lines(path: str | Path) -> list[str]:
    """A shapes file's lines; one that cannot be read is a ShapesError naming it."""
    return read_text(path, "a shapes CSV (M,N,K[,layout,...] rows)", ShapesError).splitlines()


#: Which rows of a shapes file to read: all, or one side of its `# held_out:` split.
PARTS = ("all", "tuning", "held-out")


def read_shapes(path: str | Path, part: str = "all") -> list[Shape]:
    """The distinct problems of a shapes file, in file order (a layer set repeats a problem
    where two layers share a shape, such as k and v), from the `part` asked for."""
    if part not in PARTS:
        raise ShapesError(f"part {part!r}: use one of {', '.join(PARTS)}")
    lines = read_lines(path)
    shapes = parse_shapes(lines, str(Path(path)))
    if part != "all":
        tuning, held = split_held_out(shapes, held_out_models(lines, str(Path(path))))
        shapes = tuning if part == "tuning" else held
    return list(dict.fromkeys(shapes))      # Shape equality ignores the model and layer labels


def held_out_models(path_or_lines: str | Path | Iterable[str], source: Optional[str] = None) -> frozenset[str]:
    """The families named on the `# held_out:` line of a file (a path) or of its lines; empty when none.

    Every name must label some row of the same file: a misspelt name would otherwise leak
    that family into tuning silently."""
    if isinstance(path_or_lines, (str, Path)):
        source = source or str(path_or_lines)
        lines = read_lines(path_or_lines)
    else:
        lines, source = list(path_or_lines), source or "<shapes>"
    found = [(i, match) for i, line in enumerate(lines, start=1) if (match := HELD_OUT.match(line.strip()))]
    if not found:
        return frozenset()
    if len(found) > 1:
        raise ShapesError(f"{source}:{found[1][0]}: a second held_out line (the first is line {found[0][0]}); "
                          "keep one, the split must be fixed")
    lineno, match = found[0]
    names = [t for t in re.split(r"[,\s]+", match.group(1).strip()) if t]
    for name in names:
        _label(name, "held_out name", f"{source}:{lineno}")
    held = frozenset(names)
    _check_present(held, parse_shapes(lines, source), f"{source}:{lineno}")
    return held


def _check_present(held: frozenset[str], shapes: list[Shape], where: str) -> None:
    models = {s.model for s in shapes if s.model}
    missing = sorted(held - models)
    if missing:
        known = ", ".join(sorted(models)) or "none (no model column)"
        raise ShapesError(f"{where}: held_out names {', '.join(missing)}, but no row has that model; "
                          f"models present: {known}")


def split_held_out(shapes: list[Shape], held_out: Iterable[str]) -> tuple[list[Shape], list[Shape]]:
    """(tuning part, held-out part), each in file order; rows without a model are tuning rows."""
    held = frozenset(held_out)
    _check_present(held, shapes, "split_held_out")
    return [s for s in shapes if s.model not in held], [s for s in shapes if s.model in held]


def parse_shard(spec: str) -> tuple[int, int]:
    """'i/n' with 0 <= i < n: this run takes every n-th shape starting at the i-th."""
    try:
        i_text, n_text = spec.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        raise ShapesError(f"--shard {spec!r}: write i/n, e.g. 0/4 for the first of four shards") from None
    if n <= 0 or not 0 <= i < n:
        raise ShapesError(f"--shard {spec!r}: need 0 <= i < n (shards are numbered from 0)")
    return i, n


def in_m_band(items: list, min_m: Optional[int] = None, max_m: Optional[int] = None,
              source: str = "the shapes") -> list:
    """The shapes (or problems: anything with an `m`) whose M lies in [min_m, max_m], either
    bound open when None: one batch size, or a band of them, of a layer set."""
    for flag, bound in (("--min-m", min_m), ("--max-m", max_m)):
        if bound is not None and bound < 1:
            raise ShapesError(f"{flag} {bound}: M is at least 1")
    if min_m is not None and max_m is not None and min_m > max_m:
        raise ShapesError(f"--min-m {min_m} is above --max-m {max_m}: give a band with min <= max")
    kept = [x for x in items if (min_m is None or x.m >= min_m) and (max_m is None or x.m <= max_m)]
    if items and not kept:
        ms = sorted({x.m for x in items})
        raise ShapesError(f"{source}: no shape has M in [{min_m or 1}, {max_m or 'any'}]; "
                          f"its Ms are {', '.join(map(str, ms[:20]))}{' ...' if len(ms) > 20 else ''}")
    return kept


def shard(shapes: list[Shape], spec: str | None) -> list[Shape]:
    """Strided split: shapes are sorted by size in the shipped sets, so each shard gets all sizes."""
    if not spec:
        return list(shapes)
    i, n = parse_shard(spec)
    return shapes[i::n]
