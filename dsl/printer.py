"""`Program` to canonical text: every statement, one per line, in one fixed order.

`parse(to_text(p)) == p` for every valid program; floats are printed with
Python's shortest round-tripping repr (1.5, 0.1, 1e-05), never padded.
"""
from __future__ import annotations

from gemmgen.dsl.ir import Epilogue, Problem, Program


def _dim(d) -> str:
    return "*" if d is None else str(int(d))


def _float(x: float) -> str:
    return repr(float(x))


def problem_line(p: Problem) -> str:
    dims = "x".join(_dim(d) for d in (p.m, p.n, p.k))
    return f"gemm {dims} a={p.a_major} b={p.b_major} c={p.c_major} in={p.in_dtype} acc={p.acc_dtype}"


def epilogue_line(e: Epilogue) -> str:
    items = ["epilogue"]
    if float(e.alpha) != 1.0:
        items.append(f"alpha={_float(e.alpha)}")
    if float(e.beta) != 0.0:
        items.append(f"beta={_float(e.beta)}")
    if e.bias:
        items.append(f"bias={e.bias}")
    if e.activation:
        items.append(e.activation)
    if e.residual:
        items.append("residual")
    if e.gate:
        items.append(f"gate={e.gate}")
    if e.halves:
        items.append(f"halves={e.halves}")
    items.append(f"out={e.out_dtype}")
    return " ".join(items)


def statements(program: Program) -> list[tuple[str, str]]:
    """(statement name, canonical line) pairs in canonical order (`swap_ab` only when set, so
    the text of every other program is what it always was)."""
    p = program
    instr = "auto" if p.instr is None else f"{p.instr.kind} {p.instr.m}x{p.instr.n}x{p.instr.k}"
    split_k = "1" if p.split_k == 1 else f"{p.split_k} {p.split_k_reduce}"
    return [
        ("gemm", problem_line(p.problem)),
        ("epilogue", epilogue_line(p.problem.epilogue)),
        ("backend", f"backend {p.backend}"),
        ("tile", f"tile {p.tile.m}x{p.tile.n}x{p.tile.k}"
                 + (f" epilogue={p.epilogue_tile[0]}x{p.epilogue_tile[1]}" if p.epilogue_tile else "")),
        ("warps", f"warps {p.warps[0]}x{p.warps[1]}"),
        ("instr", f"instr {instr}"),
        ("cluster", f"cluster {p.cluster[0]}x{p.cluster[1]}"),
        ("stages", f"stages {'auto' if p.stages is None else p.stages}"),
        ("mainloop", f"mainloop {p.mainloop}"),
        ("scheduler", f"scheduler {p.scheduler}" + ("" if p.grid_sms is None else f" {p.grid_sms}")),
        ("raster", f"raster {p.raster} swizzle={p.swizzle}"),
        ("smem_swizzle", f"smem_swizzle {'auto' if p.smem_swizzle is None else p.smem_swizzle}"),
        ("split_k", f"split_k {split_k}"),
    ] + ([("swap_ab", "swap_ab")] if p.swap_ab else [])


def to_text(program: Program) -> str:
    """The canonical text of `program` (ends with a newline)."""
    return "".join(line + "\n" for _, line in statements(program))


def to_text_with_comments(program: Program, comments) -> str:
    """Canonical text keeping `#` comments: comments above the first statement stay at
    the top, a comment on its own line stays above the statement that follows it, a
    comment after a statement stays at its line's end."""
    by_line = {line: name for name, (line, _) in (program.spans or {}).items()}
    first = min(by_line, default=0)
    header: list[str] = []
    leading: dict[str, list[str]] = {}
    trailing: dict[str, str] = {}
    footer: list[str] = []
    for line, _, text in sorted(comments):
        if line < first:
            header.append(text.rstrip())
            continue
        if line in by_line:
            trailing[by_line[line]] = text.rstrip()
            continue
        later = [l for l in by_line if l > line]
        if later:
            leading.setdefault(by_line[min(later)], []).append(text.rstrip())
        else:
            footer.append(text.rstrip())
    out = list(header)
    for name, line in statements(program):
        out.extend(leading.get(name, ()))
        out.append(f"{line}  {trailing[name]}" if name in trailing else line)
    out.extend(footer)
    return "".join(line + "\n" for line in out)
