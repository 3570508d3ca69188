"""Dynamic M: one kernel for `x @ W.T` whose batch M is known only at call time.

`gemmgen.compile((None, N, K), ...)` returns a `DispatchKernel`. Its table covers every M from
1 up, in rows built from what was measured for (·, N, K) on the GPU:

* `point`: an M with a record (a winner, a library choice, or a tuning that found nothing):
  served exactly as `gemmgen.compile((M, N, K))` serves it;
* `range`: the Ms strictly between two neighbouring points where the same program won at both
  (the same text but for M): that program, re-bound to the call's M;
* `baseline`: every other M, torch.matmul (cuBLAS): between points whose winners differ or
  where one of them has none, and below the first point and above the last.

So a program serves only at Ms it was measured at, or between two Ms where it won at both.
A call reads M from `a.shape[0]` and takes the kernel for that M from a dictionary; the first
call at an M makes its kernel from the table (a bisection), later ones find it.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional

from gemmgen.backends.base import INT32_LIMIT
from gemmgen.dsl.ir import Problem, Program
from gemmgen.kernel import BACKEND_NAMES, Kernel, build_ahead

#: The last M the table reaches, the kernels' own limit (they index with 32-bit integers).
M_LIMIT = INT32_LIMIT - 1


@dataclass(frozen=True)
class Row:
    """Ms lo..hi (inclusive) and how they are served: 'point', 'range' or 'baseline'."""

    lo: int
    hi: int
    how: str
    program: Optional[Program] = None     # for 'range': the program that won at both ends
    ends: tuple[int, int] = (0, 0)        # for 'range': the Ms it won at

    def describe(self, point: Optional[Kernel] = None) -> str:
        span = (f"M = {self.lo}" if self.lo == self.hi else f"M >= {self.lo}" if self.hi == M_LIMIT
                else f"M = {self.lo}..{self.hi}")
        if self.how == "point":
            return f"{span}: {point.provenance.summary if point else 'measured here'}"
        if self.how == "range":
            backend = BACKEND_NAMES.get(self.program.backend, self.program.backend)
            return (f"{span}: the {backend} program that won at M = {self.ends[0]} and "
                    f"M = {self.ends[1]}, re-bound to the call's M")
        return f"{span}: torch.matmul (cuBLAS)"


def _unbound(kernel: Kernel) -> Optional[Program]:
    """The kernel's program with M forgotten (None unless a measured program serves it)."""
    if kernel.provenance.how != "exact" or kernel.ir is None:
        return None
    return replace(kernel.ir, problem=replace(kernel.ir.problem, m=None))


def table(points: Mapping[int, Kernel]) -> tuple[Row, ...]:
    """The rows for M = 1..M_LIMIT from the kernels served at the measured points."""
    ms = sorted(points)
    rows: list[Row] = []
    start = 1
    for i, m in enumerate(ms):
        if m > start:
            before = ms[i - 1] if i else None
            same = before is not None and _unbound(points[before]) is not None and \
                _unbound(points[before]) == _unbound(points[m])
            rows.append(Row(start, m - 1, "range", _unbound(points[m]), (before, m)) if same
                        else Row(start, m - 1, "baseline"))
        rows.append(Row(m, m, "point"))
        start = m + 1
    if start <= M_LIMIT:
        rows.append(Row(start, M_LIMIT, "baseline"))
    return tuple(rows)


class DispatchKernel:
    """A GEMM over a batch M given at call time: call it as a Kernel, `kernel(a, b, ...)`.

    `problem` has M = None; `rows` is the dispatch table; `kernel_for(m)` is the Kernel that
    serves M = m (`make(m, row)` builds it the first time)."""

    def __init__(self, problem: Problem, rows: tuple[Row, ...], make: Callable[[int, Row], Kernel],
                 points: Mapping[int, Kernel]):
        self.problem = problem
        self.rows = rows
        self._starts = [row.lo for row in rows]
        self._make = make
        self._points = dict(points)
        self._by_m: dict[int, Kernel] = dict(points)

    def _measured(self, row: Row) -> bool:
        """Whether the row's Ms run a measured program or library algorithm (not torch.matmul)."""
        return row.how == "range" or (row.how == "point" and self._points[row.lo].provenance.how != "baseline")

    @property
    def serves_measured(self) -> bool:
        """Whether some M is served by a measured program or library algorithm."""
        return any(self._measured(row) for row in self.rows)

    def row_for(self, m: int) -> Row:
        return self.rows[bisect.bisect_right(self._starts, m) - 1]

    def kernel_for(self, m: int) -> Kernel:
        kernel = self._by_m.get(m)
        if kernel is None:
            kernel = self._by_m[m] = self._make(m, self.row_for(m))
        return kernel

    def prebuild(self, ms, *, jobs: Optional[int] = None) -> dict:
        """Build the kernels of these Ms ahead of their first calls (in parallel, no GPU needed):
        a program re-bound to a new M is otherwise compiled on that M's first call."""
        return build_ahead((self.kernel_for(m) for m in ms), jobs=jobs)

    def __call__(self, a, b, bias=None, residual=None, c=None, out=None, alpha=None, beta=None):
        kernel = self._by_m.get(a.shape[0]) or self.kernel_for(a.shape[0])
        return kernel(a, b, bias=bias, residual=residual, c=c, out=out, alpha=alpha, beta=beta)

    def describe(self) -> str:
        served = sum(self._measured(row) for row in self.rows)
        lines = [f"dynamic-M kernel for {self.problem.key}: {len(self._points)} measured Ms; "
                 f"{served} of its {len(self.rows)} rows serve a measured program or algorithm, "
                 "the rest torch.matmul"]
        lines += ["  " + row.describe(self._points.get(row.lo)) for row in self.rows]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"DispatchKernel({self.problem.key}, {len(self.rows)} rows)"
