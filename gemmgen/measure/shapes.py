"""Shape lists for the bench: CSV parsing with layouts, and shard splitting.

A shapes file is CSV with columns M,N,K and an optional fourth, layout: two letters,
A's then B's storage, `n` = row-major (not transposed) and `t` = column-major
(transposed): `nn` is A (M x K) and B (K x N) both row-major (the CUDA-L2 sets, and
the default); `nt` stores B as N x K (B = W.T, the `x @ W.T` case); `tn` stores A as
K x M. A third letter, if present, gives C's storage the same way. A header row
(M,N,K[,layout], any case) is optional; blank lines and lines starting with # are skipped.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gemmgen.dsl.ir import Problem
from gemmgen.measure.errors import ShapesError

LETTERS = {"n": "row", "t": "col"}


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int
    layout: str = "nn"

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


def parse_shapes(lines: list[str], source: str = "<shapes>") -> list[Shape]:
    shapes: list[Shape] = []
    columns = None
    for lineno, row in enumerate(csv.reader(lines), start=1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        where = f"{source}:{lineno}"
        if columns is None:
            columns = [c.lower() for c in cells]
            if columns[:3] == ["m", "n", "k"]:
                if len(columns) > 4 or (len(columns) == 4 and columns[3] != "layout"):
                    raise ShapesError(f"{where}: header must read M,N,K or M,N,K,layout, not {','.join(cells)}")
                continue
            columns = ["m", "n", "k", "layout"]   # no header: positional
        if len(cells) not in (3, 4):
            raise ShapesError(f"{where}: expected M,N,K[,layout], got {len(cells)} field(s): {','.join(cells)}")
        m, n, k = (_positive(cells[i], "MNK"[i], where) for i in range(3))
        layout = cells[3].lower() if len(cells) == 4 and cells[3] else "nn"
        try:
            majors(layout)
        except ShapesError as exc:
            raise ShapesError(f"{where}: {exc}") from None
        shapes.append(Shape(m, n, k, layout))
    if not shapes:
        raise ShapesError(f"{source}: no shapes found")
    return shapes


def read_shapes(path: str | Path) -> list[Shape]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ShapesError(f"cannot read shapes file {p}: {exc.strerror}") from None
    return parse_shapes(text.splitlines(), str(p))


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


def shard(shapes: list[Shape], spec: str | None) -> list[Shape]:
    """Strided split: shapes are sorted by size in the shipped sets, so each shard gets all sizes."""
    if not spec:
        return list(shapes)
    i, n = parse_shard(spec)
    return shapes[i::n]
