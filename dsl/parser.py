"""Text to `Program`: the lark grammar (gemm.lark) and a Transformer to the frozen IR.

All lexing is lark's (LALR, contextual lexer). Parse errors become `ProgramError`
with a line, a column and a message in the language's own words: which statement,
what was expected, what was found. Lark's exception classes never reach a user.
"""
from __future__ import annotations

import functools
import importlib.resources
import re
from typing import Any, Optional

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from gemmgen.dsl import ir
from gemmgen.dsl.diagnostics import ProgramError

REQUIRED = ("gemm", "backend", "tile", "warps", "mainloop")
STATEMENTS = ("gemm", "epilogue", "backend", "tile", "warps", "instr", "cluster", "stages",
              "mainloop", "scheduler", "raster", "smem_swizzle", "split_k", "swap_ab")

# How each statement is written; quoted in error messages so the fix is one look away.
USAGE = {
    "gemm": "gemm MxNxK a=row|col b=row|col c=row|col in=f16 acc=f32  (M, N, K may be *)",
    "epilogue": ("epilogue [alpha=F] [beta=F] [bias=m|n] [relu|gelu|silu] [residual] [out=f16|bf16|f32], "
                 "or gated: epilogue gate=relu|gelu|silu halves=stacked [out=...]"),
    "backend": "backend triton|cutlass|cuda",
    "tile": "tile MxNxK [epilogue=MxN], e.g. tile 128x256x64",
    "warps": "warps WMxWN, e.g. warps 2x4",
    "instr": "instr auto | instr wgmma 64xNx16 | instr mma 16x8x16",
    "cluster": "cluster CMxCN, e.g. cluster 2x1",
    "stages": "stages N | stages auto",
    "mainloop": "mainloop multistage|ws_cooperative|ws_pingpong|direct",
    "scheduler": "scheduler tile|persistent|stream_k (persistent: optionally the SMs it may use, e.g. 128)",
    "raster": "raster m|n swizzle=S, e.g. raster m swizzle=8",
    "smem_swizzle": "smem_swizzle auto|0|32|64|128",
    "split_k": "split_k 1 | split_k N workspace | split_k N unordered | split_k N atomic | split_k N cluster",
    "swap_ab": "swap_ab  (compute C^T = B^T A^T; the other statements describe that N x M x K problem)",
}

# Readable names for the grammar's pattern terminals (string literals print as themselves).
_TERMINAL_WORDS = {
    "INT": "a whole number",
    "NUMBER": "a number",
    "STAR": "'*'",
    "AUTO": "'auto'",
    "MAJOR": " or ".join(map(repr, ir.MAJORS)),
    "DTYPE": ", ".join(map(repr, ir.DTYPES)),
    "AXIS": "'m' or 'n'",
    "ACTIVATION": ", ".join(map(repr, ir.ACTIVATIONS)),
    "BACKEND": ", ".join(map(repr, ir.BACKENDS)),
    "INSTR_KIND": "'wgmma' or 'mma'",
    "MAINLOOP": ", ".join(map(repr, ir.MAINLOOPS)),
    "SCHEDULER": ", ".join(map(repr, ir.SCHEDULERS)),
    "SPLIT_K_REDUCE": ", ".join(map(repr, ir.SPLIT_K_REDUCES)),
    "HALVES": ", ".join(map(repr, ir.HALVES)),
    "_NL": "end of line",
    "$END": "end of file",
}


@functools.lru_cache(maxsize=1)
def grammar_text() -> str:
    """The grammar source, shipped as package data (the policy room reuses it)."""
    return importlib.resources.files("gemmgen.dsl").joinpath("gemm.lark").read_text()


def _new_lark(**options) -> Lark:
    return Lark(grammar_text(), parser="lalr", lexer="contextual", propagate_positions=True, **options)


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    return _new_lark()


def _pos(meta) -> tuple[int, int]:
    return (getattr(meta, "line", 0), getattr(meta, "column", 0))


@v_args(meta=True)
class _ToIR(Transformer):
    """Each statement becomes (name, (line, col), value); `start` assembles the Program."""

    def __init__(self, filename: Optional[str]):
        super().__init__()
        self.filename = filename

    def _error(self, message: str, at: tuple[int, int], statement: str = "") -> ProgramError:
        return ProgramError(message, at[0], at[1], self.filename, statement)

    def _unique(self, items, statement: str) -> dict:
        """Options given in any order, each at most once."""
        seen: dict[str, Any] = {}
        for key, at, value in items:
            if key in seen:
                label = {"activation": "an activation", "residual": "`residual`"}.get(key, f"`{key}=`")
                raise self._error(f"`{statement}` gives {label} twice ({seen[key]} and {value}); "
                                  f"keep one", at, statement)
            seen[key] = value
        return seen

    # -- gemm --------------------------------------------------------------
    def dim(self, meta, children):
        tok = children[0]
        return None if tok.type == "STAR" else int(tok)

    def _option(name):  # noqa: N805 - a class-body helper that builds the `key=value` methods below
        def method(self, meta, children):
            return (name, _pos(meta), str(children[-1]))
        return method

    a_major = _option("a")
    b_major = _option("b")
    c_major = _option("c")
    in_dtype = _option("in")
    acc_dtype = _option("acc")

    def gemm(self, meta, children):
        m, n, k, *options = children
        opts = self._unique(options, "gemm")
        problem = ir.Problem(m, n, k, a_major=opts.get("a", "row"), b_major=opts.get("b", "row"),
                             c_major=opts.get("c", "row"), in_dtype=opts.get("in", "f16"),
                             acc_dtype=opts.get("acc", "f32"))
        return ("gemm", _pos(meta), problem)

    # -- epilogue ----------------------------------------------------------
    def alpha(self, meta, children):
        return ("alpha", _pos(meta), float(children[0]))

    def beta(self, meta, children):
        return ("beta", _pos(meta), float(children[0]))

    def bias(self, meta, children):
        return ("bias", _pos(meta), str(children[0]))

    def activation(self, meta, children):
        return ("activation", _pos(meta), str(children[0]))

    def residual(self, meta, children):
        return ("residual", _pos(meta), True)

    out_dtype = _option("out")
    gate = _option("gate")
    halves = _option("halves")
    del _option

    def epilogue(self, meta, children):
        items = self._unique(children, "epilogue")
        fields = {"bias": items.get("bias"), "activation": items.get("activation"),
                  "residual": items.get("residual", False), "out_dtype": items.get("out", "f16"),
                  "gate": items.get("gate"), "halves": items.get("halves")}
        if "alpha" in items:
            fields["alpha"] = items["alpha"]
        if "beta" in items:
            fields["beta"] = items["beta"]
        return ("epilogue", _pos(meta), ir.Epilogue(**fields))

    # -- schedule statements ----------------------------------------------
    def backend(self, meta, children):
        return ("backend", _pos(meta), str(children[0]))

    def tile(self, meta, children):
        sizes = [int(c) for c in children]
        return ("tile", _pos(meta), (ir.Tile(*sizes[:3]), tuple(sizes[3:]) or None))

    def warps(self, meta, children):
        return ("warps", _pos(meta), (int(children[0]), int(children[1])))

    def cluster(self, meta, children):
        return ("cluster", _pos(meta), (int(children[0]), int(children[1])))

    def instr(self, meta, children):
        if children[0].type == "AUTO":
            return ("instr", _pos(meta), None)
        kind, m, n, k = children
        return ("instr", _pos(meta), ir.Instr(str(kind), int(m), int(n), int(k)))

    def stages(self, meta, children):
        tok = children[0]
        return ("stages", _pos(meta), None if tok.type == "AUTO" else int(tok))

    def mainloop(self, meta, children):
        return ("mainloop", _pos(meta), str(children[0]))

    def scheduler(self, meta, children):
        sms = int(children[1]) if len(children) > 1 else None
        return ("scheduler", _pos(meta), (str(children[0]), sms))

    def raster(self, meta, children):
        swizzle = int(children[1]) if len(children) > 1 else 1
        return ("raster", _pos(meta), (str(children[0]), swizzle))

    def smem_swizzle(self, meta, children):
        tok = children[0]
        return ("smem_swizzle", _pos(meta), None if tok.type == "AUTO" else int(tok))

    def split_k(self, meta, children):
        n = int(children[0])
        at = _pos(meta)
        reduce = str(children[1]) if len(children) > 1 else None
        if n != 1 and reduce is None:
            raise self._error(f"split_k {n} needs a reduction: write `split_k {n} workspace` "
                              f"(fp32 partials, then a reduce), `split_k {n} unordered` or `split_k {n} atomic`",
                              at, "split_k")
        if n == 1 and reduce is not None:
            raise self._error(f"split_k {n} splits nothing, so it takes no reduction: write `split_k 1`",
                              at, "split_k")
        return ("split_k", at, (n, reduce or "workspace"))

    def swap_ab(self, meta, children):
        return ("swap_ab", _pos(meta), True)

    # -- the program -------------------------------------------------------
    def start(self, meta, statements):
        found: dict[str, tuple[tuple[int, int], Any]] = {}
        for name, at, value in statements:
            if name in found:
                first = found[name][0]
                raise self._error(f"second `{name}` statement (the first is on line {first[0]}); "
                                  f"each statement appears at most once: delete one", at, name)
            found[name] = (at, value)
        missing = [name for name in REQUIRED if name not in found]
        if missing:
            at = found["gemm"][0] if "gemm" in found else (1, 1)
            example = "; ".join(f"`{USAGE[name]}`" for name in missing)
            raise self._error(f"the program has no `{'`, `'.join(missing)}` statement"
                              f"{'s' if len(missing) > 1 else ''}: add {example}", at, missing[0])
        value = {name: v for name, (_, v) in found.items()}
        problem = value["gemm"]
        if "epilogue" in value:
            problem = ir.Problem(problem.m, problem.n, problem.k, problem.a_major, problem.b_major,
                                 problem.c_major, problem.in_dtype, problem.acc_dtype, value["epilogue"])
        raster, swizzle = value.get("raster", ("m", 1))
        split_k, reduce = value.get("split_k", (1, "workspace"))
        scheduler, grid_sms = value.get("scheduler", ("tile", None))
        tile, epilogue_tile = value["tile"]
        return ir.Program(
            problem=problem, backend=value["backend"], tile=tile, warps=value["warps"],
            mainloop=value["mainloop"], instr=value.get("instr"), cluster=value.get("cluster", (1, 1)),
            stages=value.get("stages"), scheduler=scheduler, grid_sms=grid_sms, raster=raster,
            swizzle=swizzle, smem_swizzle=value.get("smem_swizzle"), split_k=split_k,
            split_k_reduce=reduce, epilogue_tile=epilogue_tile, swap_ab=value.get("swap_ab", False),
            spans={name: at for name, (at, _) in found.items()},
        )


def parse(text: str, filename: Optional[str] = None) -> ir.Program:
    """The program written in `text`; raises `ProgramError` (with line and column) if malformed."""
    return _parse(_lark(), text, filename)


def parse_with_comments(text: str, filename: Optional[str] = None) -> tuple[ir.Program, list[tuple[int, int, str]]]:
    """The program and its `#` comments as (line, column, text), for `gemmgen fmt`."""
    comments: list[tuple[int, int, str]] = []
    lark = _new_lark(lexer_callbacks={"COMMENT": lambda tok: comments.append((tok.line, tok.column, str(tok)))})
    return _parse(lark, text, filename), comments


@functools.lru_cache(maxsize=1)
def _epilogue_lark() -> Lark:
    return _new_lark(start="epilogue")


def parse_epilogue(items: str) -> ir.Epilogue:
    """An epilogue statement's items alone ('bias=n gelu out=f16', any order) -> Epilogue; raises
    `ProgramError` like `parse` (column 1 is the statement's word `epilogue`)."""
    if not isinstance(items, str):
        raise TypeError(f"parse_epilogue takes the items' text (str), not {type(items).__name__}")
    statement = f"epilogue {items}"
    try:
        tree = _epilogue_lark().parse(statement)
    except UnexpectedInput as exc:
        raise _parse_error(exc, statement, None) from None
    try:
        return _ToIR(None).transform(tree)[2]
    except VisitError as exc:
        if isinstance(exc.orig_exc, ProgramError):
            raise exc.orig_exc from None
        raise


def _parse(lark: Lark, text: str, filename: Optional[str]) -> ir.Program:
    if not isinstance(text, str):
        raise TypeError(f"parse takes a program's text (str), not {type(text).__name__}: "
                        "read the file first, e.g. parse(Path(f).read_text())")
    if not text.endswith("\n"):
        text += "\n"
    try:
        tree = lark.parse(text)
    except UnexpectedInput as exc:
        raise _parse_error(exc, text, filename) from None
    try:
        return _ToIR(filename).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, ProgramError):
            raise exc.orig_exc from None
        raise


# -- turning lark's exceptions into the language's words ---------------------

_WORD = re.compile(r"[A-Za-z0-9_.+\-*]+")


def _describe_expected(names) -> str:
    words = []
    for name in sorted(set(names)):
        if name in _TERMINAL_WORDS:
            words.append(_TERMINAL_WORDS[name])
            continue
        try:
            pattern = _lark().get_terminal(name).pattern
        except KeyError:
            continue
        words.append(repr(pattern.value) if pattern.type == "str" else name.lower())
    words = sorted(set(words), key=lambda w: (w in ("end of line", "end of file"), w))
    if not words:
        return "nothing more"
    if len(words) == 1:
        return ("one of " if ", " in words[0] else "") + words[0]
    return "one of " + ", ".join(words)


def _statement_of_line(text: str, line: int) -> Optional[str]:
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return None
    match = _WORD.match(lines[line - 1].lstrip())
    return match.group(0) if match and match.group(0) in STATEMENTS else None


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _expected_at(text: str, offset: int) -> Optional[set]:
    """Terminals the parser accepts at `offset` (the start of a bad word), via lark's interactive parser."""
    try:
        interactive = _lark().parse_interactive(text[:offset])
        interactive.exhaust_lexer()
        return set(interactive.accepts()) - {"$END"}
    except UnexpectedInput:
        return None


def _parse_error(exc: UnexpectedInput, text: str, filename: Optional[str]) -> ProgramError:
    line, column = exc.line, exc.column
    expected: set = set()
    found: str
    offset = exc.pos_in_stream if exc.pos_in_stream is not None else len(text)
    if isinstance(exc, (UnexpectedToken, UnexpectedEOF)):
        expected = set(exc.expected or ())
    else:
        expected = set(getattr(exc, "allowed", None) or ())
    # The lexer may have matched a keyword that is the prefix of a longer word
    # (`tiles` -> `tile` + `s`): report the whole word, at its start.
    start = offset
    if offset < len(text) and _is_word(text[offset]):
        while start > 0 and (text[start - 1].isalpha() or text[start - 1] == "_"):
            start -= 1
    if start != offset:
        column -= offset - start
        again = _expected_at(text, start)
        if again is not None:
            expected = again
    token = getattr(exc, "token", None)
    if start == offset and isinstance(token, Token) and token.type in ("$END", "_NL"):
        found = "the end of the file" if token.type == "$END" else "the end of the line"
    elif isinstance(exc, UnexpectedEOF) or offset >= len(text):
        found = "the end of the file"
    else:
        word = _WORD.match(text, start)
        found = repr(word.group(0)) if word else repr(text[offset])
    statement = _statement_of_line(text, line)
    lines = text.splitlines()
    before = lines[line - 1][: max(column - 1, 0)] if 1 <= line <= len(lines) else ""
    starts_line = not before.strip()
    if starts_line and statement is None:
        message = (f"unknown statement {found}: a line starts with one of "
                   f"{', '.join(STATEMENTS)}")
    elif statement is not None:
        message = (f"in `{statement}`: expected {_describe_expected(expected)}, found {found}; "
                   f"write `{USAGE[statement]}`")
    else:
        message = f"expected {_describe_expected(expected)}, found {found}"
    return ProgramError(message, line, column, filename, statement or "")
