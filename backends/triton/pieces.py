"""Text pieces every Triton kernel of gemmgen shares: the parameter list, the rasterisation,
the fused epilogue, the operands' address arithmetic. Pure functions of the program."""
from __future__ import annotations

import textwrap
from typing import Optional

from gemmgen.dsl.ir import Program

TRITON_DTYPE = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32"}
SIGNATURE_DTYPE = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}
# A shape-generic kernel is compiled as triton's JIT would specialise it for the common case,
# M, N, K and row strides multiples of 16; its launcher checks and falls back to an unhinted build.
GENERIC_HINT = 16


def pow2_divisor(value: Optional[int], cap: int = 16) -> int:
    """Largest power of two dividing `value` (at most `cap`); 1 when unknown."""
    if not value:
        return 1
    d = 1
    while d < cap and value % (d * 2) == 0:
        d *= 2
    return d


class Args:
    """The kernel's parameter list, built once and shared by the text and the meta."""

    def __init__(self):
        self.params: list[tuple[str, str, str]] = []   # (name, signature type, role)
        self.hints: dict[str, int] = {}                # name -> tt.divisibility the compiler may assume
        self.assumed: list[str] = []                   # hints a shape-generic launcher must check per call

    def add(self, name: str, ty: str, role: str, divisible: int = 1, assumed: bool = False) -> None:
        self.params.append((name, ty, role))
        if divisible > 1:
            self.hints[name] = divisible
            if assumed:
                self.assumed.append(name)

    def text(self, indent: str = "    ") -> str:
        lines = []
        for name, ty, _ in self.params:
            lines.append(f"{indent}{name}: tl.constexpr," if ty == "constexpr" else f"{indent}{name},")
        return "\n".join(lines)




def tile_coords_fn(raster: str) -> str:
    """The rasterisation, as every gemmgen backend defines it (docs/backends.md).

    raster m: consecutive tiles walk down M inside bands of GROUP tile columns (n fastest
    inside a band), so swizzle=1 is plain column order; raster n is the mirror image.
    Triton's classic GROUP_M ordering is `raster n swizzle=GROUP_M`.
    """
    band_dim, walk_dim = ("n", "m") if raster == "m" else ("m", "n")
    return f'''@triton.jit
def tile_coords(tile, num_pid_m, num_pid_n, GROUP: tl.constexpr):
    """Raster {raster}: walk along {walk_dim.upper()} in bands of GROUP tile {'columns' if band_dim == 'n' else 'rows'}
    ({band_dim} fastest inside a band), so a wave of CTAs shares operand panels in L2."""
    per_band = GROUP * num_pid_{walk_dim}
    band = tile // per_band
    first_{band_dim} = band * GROUP
    band_width = tl.minimum(num_pid_{band_dim} - first_{band_dim}, GROUP)
    pid_{band_dim} = first_{band_dim} + (tile % per_band) % band_width
    pid_{walk_dim} = (tile % per_band) // band_width
    return pid_m, pid_n
'''


def out_offsets(program: Program, stride: str) -> str:
    """Element offsets of the (offs_m, offs_n) tile in an M x N matrix laid out as the output
    (`c=`): the contiguous dimension has stride 1, the other `stride` (out, c and residual)."""
    if program.problem.c_major == "row":
        return f"offs_m[:, None] * {stride} + offs_n[None, :]"
    return f"offs_m[:, None] + offs_n[None, :] * {stride}"


def activation_text(name: str, x: str) -> str:
    """`name` applied to `x` in fp32, as the reference computes it."""
    return {"relu": f"tl.maximum({x}, 0.0)",
            "gelu": f"0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476))",
            "silu": f"{x} * tl.sigmoid({x})"}[name]


def epilogue_fn(program: Program) -> tuple[str, list[str]]:
    """One jit function applying out = cast(act(alpha*acc + beta*c + bias) + residual)."""
    e = program.problem.epilogue
    params = ["acc", "offs_m", "offs_n", "M", "N"]
    body = ["    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)"] if (e.beta != 0.0 or e.residual) else []
    if e.alpha != 1.0:
        params.append("alpha")
        body.append("    acc = acc * alpha")
    if e.beta != 0.0:
        params += ["c_ptr", "stride_cm", "beta"]
        body.append(f"    c = tl.load(c_ptr + {out_offsets(program, 'stride_cm')}, mask=mask, other=0.0)")
        body.append("    acc = acc + beta * c.to(tl.float32)")
    if e.bias == "n":
        params.append("bias_ptr")
        body.append("    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)")
        body.append("    acc = acc + bias.to(tl.float32)[None, :]")
    elif e.bias == "m":
        params.append("bias_ptr")
        body.append("    bias = tl.load(bias_ptr + offs_m, mask=offs_m < M, other=0.0)")
        body.append("    acc = acc + bias.to(tl.float32)[:, None]")
    if e.activation:
        body.append(f"    acc = {activation_text(e.activation, 'acc')}"
                    + ("  # exact (erf) GELU" if e.activation == "gelu" else ""))
    if e.gate:
        params.insert(1, "acc_up")
        body.append(f"    acc = {activation_text(e.gate, 'acc')} * acc_up  # gate(A B_gate) * (A B_up)")
    if e.residual:
        params += ["res_ptr", "stride_rm"]
        body.append(f"    res = tl.load(res_ptr + {out_offsets(program, 'stride_rm')}, mask=mask, other=0.0)")
        body.append("    acc = acc + res.to(tl.float32)")
    out_ty = TRITON_DTYPE[e.out_dtype]
    body.append(f"    return acc.to({out_ty})")
    return ("@triton.jit\n"
            f"def epilogue({', '.join(params)}):\n"
            f'    """{e.signature}: fp32 math on the accumulator tile, one rounding to {e.out_dtype}; '
            'the caller stores it."""\n'
            + "\n".join(body) + "\n"), params


def epilogue_args(args: Args, program: Program, bound: bool) -> None:
    """Kernel parameters the epilogue reads, after the operands: pointers first, then strides, scalars."""
    e = program.problem.epilogue
    out = SIGNATURE_DTYPE[e.out_dtype]
    if e.beta != 0.0:
        args.add("c_ptr", f"*{out}", "c", 16)
    if e.bias:
        args.add("bias_ptr", f"*{out}", "bias", 16)
    if e.residual:
        args.add("res_ptr", f"*{out}", "residual", 16)


def epilogue_scalars(args: Args, program: Program, bound: bool, out_stride: bool = True) -> None:
    p, e = program.problem, program.problem.epilogue
    # the output's line stride: N elements a row (c=row) or M a column (c=col)
    n_div = pow2_divisor(p.n if p.c_major == "row" else p.m) if bound else GENERIC_HINT
    if out_stride:
        args.add("stride_om", "i32", "stride_out", n_div, assumed=not bound)
    if e.beta != 0.0:
        args.add("stride_cm", "i32", "stride_c", n_div, assumed=not bound)
    if e.residual:
        args.add("stride_rm", "i32", "stride_residual", n_div, assumed=not bound)
    if e.alpha != 1.0:
        args.add("alpha", "fp32", "alpha")
    if e.beta != 0.0:
        args.add("beta", "fp32", "beta")


def epilogue_call(params: list[str], acc: str = "acc", offs_n: str = "offs_n") -> str:
    names = {"acc": acc, "offs_n": offs_n}
    return f"epilogue({', '.join(names.get(x, x) for x in params)})"


def pointer_store(program: Program, params: list[str], indent: str, acc: str = "acc") -> str:
    """Masked store of the epilogue's tile (of accumulator `acc`) through out's line stride."""
    return (f"{indent}mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)\n"
            f"{indent}tl.store(out_ptr + {out_offsets(program, 'stride_om')}, "
            f"{epilogue_call(params, acc=acc)}, mask=mask)")


def pointer_mainloop(program: Program, indent: str) -> str:
    """The pointer kernels' K loop over k-tiles k_begin..k_end into `acc` (cp.async-pipelined
    by Triton): operand pointers from `rows_a`, `cols_b` and `offs_k`, K masked unless EVEN_K."""
    ops = operand_text(program)
    gated = bool(program.problem.epilogue.gate)
    # gated: the up half of B, N columns to the right of the gate half (halves=stacked)
    up = {
        "ptrs": f"\nu_ptrs = b_ptrs + {ops['up_offset']}",
        "zero": "\nacc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "load": "\n        u = tl.load(u_ptrs)",
        "load_masked": "\n        u = tl.load(u_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)",
        "dot": "\n    acc_up = tl.dot(a, u, acc_up, out_dtype=tl.float32)",
        "step": f"\n    u_ptrs += {ops['b_step']}",
    }
    if not gated:
        up = dict.fromkeys(up, "")
    text = f"""a_ptrs = {ops["a_ptrs"]}
b_ptrs = {ops["b_ptrs"]}{up["ptrs"]}
acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32){up["zero"]}
for kt in range(k_begin, k_end):
    if EVEN_K:  # K is a multiple of BLOCK_K: no K mask
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs){up["load"]}
    else:
        k_left = K - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0){up["load_masked"]}
    acc = tl.dot(a, b, acc, out_dtype=tl.float32){up["dot"]}
    a_ptrs += {ops["a_step"]}
    b_ptrs += {ops["b_step"]}{up["step"]}"""
    return textwrap.indent(text, indent)


def pointer_args(program: Program, bound: bool, *, workspace: bool, epilogue: bool) -> Args:
    """The pointer kernels' parameters: A, B and out, the fp32 workspace if one is used, the
    epilogue's tensors, M, N, K, the operands' strides, then the epilogue's strides and scalars
    (`epilogue`: False where a later kernel applies it)."""
    p = program.problem
    ind = SIGNATURE_DTYPE[p.in_dtype]
    args = Args()
    args.add("a_ptr", f"*{ind}", "a", 16)
    args.add("b_ptr", f"*{ind}", "b", 16)
    args.add("out_ptr", f"*{SIGNATURE_DTYPE[p.epilogue.out_dtype]}", "out", 16)
    if workspace:
        args.add("ws_ptr", "*fp32", "workspace", 16)
    if epilogue:
        epilogue_args(args, program, bound)
    shape_args(args, program, bound)
    sa, sb = operand_stride_divisor(program, bound)
    args.add("stride_a", "i32", "stride_a", sa, assumed=not bound)
    args.add("stride_b", "i32", "stride_b", sb, assumed=not bound)
    if epilogue:
        epilogue_scalars(args, program, bound)
    return args


def shape_args(args: Args, program: Program, bound: bool) -> None:
    p = program.problem
    for dim, value in (("M", p.m), ("N", p.n), ("K", p.k)):
        args.add(dim, "i32", dim, pow2_divisor(value) if bound else GENERIC_HINT, assumed=not bound)




def operand_text(program: Program) -> dict[str, str]:
    """Address arithmetic per major-ness: the contiguous dimension has stride 1 in the text itself."""
    p = program.problem
    if p.a_major == "row":   # A is (M, K), K contiguous
        a_ptrs = "a_ptr + rows_a[:, None] * stride_a + offs_k[None, :]"
        a_step = "BLOCK_K"
    else:                    # A is a transposed view: K x M storage, M contiguous
        a_ptrs = "a_ptr + rows_a[:, None] + offs_k[None, :] * stride_a"
        a_step = "BLOCK_K * stride_a"
    if p.b_major == "row":   # B is (K, N), N contiguous
        b_ptrs = "b_ptr + offs_k[:, None] * stride_b + cols_b[None, :]"
        b_step = "BLOCK_K * stride_b"
        up_offset = "N"      # a gated B's up half: N columns on
    else:                    # B = W.T with W (N, K), K contiguous: the x @ W.T case
        b_ptrs = "b_ptr + offs_k[:, None] + cols_b[None, :] * stride_b"
        b_step = "BLOCK_K"
        up_offset = "N * stride_b"
    return {"a_ptrs": a_ptrs, "a_step": a_step, "b_ptrs": b_ptrs, "b_step": b_step, "up_offset": up_offset}


def operand_stride_divisor(program: Program, bound: bool) -> tuple[int, int]:
    """Divisibility of the operands' row strides: exact when bound, 8 (16 bytes) assumed when generic."""
    p = program.problem
    if not bound:
        return GENERIC_HINT, GENERIC_HINT
    a = p.k if p.a_major == "row" else p.m
    b = p.b_cols if p.b_major == "row" else p.k
    return pow2_divisor(a), pow2_divisor(b)
