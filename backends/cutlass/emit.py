"""Program -> CUTLASS 3.x SM90 source: the operation description, the emitted
kernel type, and a small C-ABI host wrapper around it. Pure text, no side effects.

The kernel type comes from `cutlass_library`'s own 3.x emitter
(`EmitGemmUniversal3xInstance`), fed a `GemmOperation`; we write only what it
cannot express: fused epilogues it has no enum for, and the extern "C" wrapper.

Build-time choices (what changes the machine code) live in `InstanceSpec`;
runtime choices (raster order, swizzle width, splits, decomposition, alpha,
beta, pointers, shapes) are wrapper arguments, so one build serves many programs.
One exception: the plain epilogue at alpha 1 gets a build without the scaling
(`InstanceSpec.unscaled`), which then takes no alpha.

Tile shape: on SM90 `cutlass_library` hands `TileDescription.tile_shape` to the
collective builders unchanged, and the SM90 builders read it as the tile of ONE
CTA; the cluster multiplies the grid, not the tile (a 128x128 tile with a 2x1
cluster covers 256x128 per cluster). Only the SM100 path of the same emitter
rewrites it (`get_collective_tile_shape`), where the description's tile is the
cluster's. DSL `tile` is per CTA, so it maps to the description one to one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional

from gemmgen.backends.cuda.source import epilogue_flags, template
from gemmgen.backends.cutlass.rules import (
    on_stream_k_scheduler,
    sliced_split_k,
    stream_k_split,
)
from gemmgen.dsl.ir import Program

# DSL activation -> the CUTLASS functor (GELU is the exact erf form, as in dsl/ir.py).
ACTIVATION_FUNCTORS = {
    "relu": "cutlass::epilogue::thread::ReLu",
    "gelu": "cutlass::epilogue::thread::GELU",
    "silu": "cutlass::epilogue::thread::SiLu",
}
ELEMENT_TYPES = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "f32": "float"}
RASTER_CODES = {"m": 1, "n": 2}  # RasterOrderOptions::AlongM / AlongN (0 is Heuristic)
# DecompositionMode values of the stream-K scheduler.
DECOMPOSITION_CODES = {"heuristic": 0, "data_parallel": 1, "split_k": 2, "stream_k": 3}
# ReductionMode of the stream-K scheduler for `split_k N unordered`: the splits add into the
# fp32 workspace as they arrive (Nondeterministic). Its deterministic turnstile (each split
# after the previous one) took 39.8 us at 256x128x8192 split 16 on the H200, slower than no
# split (21.8 us), so `split_k N workspace` is not that: it is K slices of a batched GEMM and
# a reduce kernel (`InstanceSpec.partials`).
REDUCTION_CODES = {"unordered": 1}
WRAPPER_ENTRY = "gg_run"
AUTO_EPILOGUE_TILE = "cutlass::epilogue::collective::EpilogueTileAuto"


@dataclass(frozen=True)
class InstanceSpec:
    """Everything that changes the compiled kernel; nothing that is a runtime argument."""

    tile: tuple[int, int, int]
    cluster: tuple[int, int]
    stages: int  # 0: the builder's automatic count, after the epilogue's carve-out
    mainloop: str  # ws_cooperative | ws_pingpong
    tile_scheduler: str  # persistent | stream_k | tile (one tile per CTA, ping-pong only)
    a_major: str
    b_major: str
    c_major: str
    in_dtype: str
    out_dtype: str
    source: Optional[str]  # None: no C operand; "c": beta * C; "residual": C is the residual
    bias: Optional[str]  # None | "m" (one per row) | "n" (one per column)
    activation: Optional[str]
    residual_after_activation: bool  # act(...) + residual: a custom visitor tree
    # `split_k N workspace`: the kernel writes fp32 partials of N K slices (a batched GEMM, no
    # epilogue) and a reduce kernel in the same library sums them and applies the epilogue.
    partials: bool = False
    # `tile ... epilogue=MxN`: the TMA-store epilogue's sub-tile; None: CUTLASS's automatic one.
    epilogue_tile: Optional[tuple[int, int]] = None
    # The plain epilogue at alpha 1 (no C, bias, activation or residual) stores the accumulator
    # converted, with no multiply per element; otherwise alpha scales it as a run-time argument.
    # cuBLAS's kernels spend no FMUL there; CUTLASS's spent one an element, 1.55x the warp
    # instructions of cuBLAS's at K of one k-tile, and alpha-free builds read 0.88x -> 0.92x there
    # and 1.003x -> 1.008x at 4096^3 on the H200.
    unscaled: bool = False

    @property
    def as_meta(self) -> dict:
        meta = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}
        for key in ("partials", "epilogue_tile", "unscaled"):   # only where set: earlier builds keep their digests
            if not meta[key]:
                del meta[key]
        return meta


@dataclass(frozen=True)
class RuntimeArgs:
    """The choices a program makes that the wrapper takes per call."""

    raster: int
    swizzle: int
    splits: int
    decomposition: int
    reduction: int = 0
    grid_sms: int = 0   # `scheduler persistent N`: the persistent grid on N SMs; 0: every SM


def instance_spec(program: Program) -> InstanceSpec:
    """The build-time half of a program (the build key is the digest of its source)."""
    p = program.problem
    e = p.epilogue
    if e.residual:
        source = "residual"
    elif e.beta != 0.0:
        source = "c"
    else:
        source = None
    # `unordered` split-K runs on the stream-K scheduler (DecompositionMode::SplitK), so a
    # "persistent" program with such splits needs the stream-K build; `workspace` splits are
    # K slices of a batched GEMM on the program's own scheduler.
    partials = sliced_split_k(program)
    uses_stream_k = on_stream_k_scheduler(program)
    plain = source is None and not e.bias and not e.activation
    unscaled = plain and e.alpha == 1.0 and not partials     # a K-slice build's GEMM writes fp32 partials
    return InstanceSpec(
        tile=(program.tile.m, program.tile.n, program.tile.k),
        cluster=tuple(program.cluster),
        stages=program.stages or 0,
        mainloop=program.mainloop,
        tile_scheduler="stream_k" if uses_stream_k else program.scheduler,
        a_major=p.a_major,
        b_major=p.b_major,
        c_major=p.c_major,
        in_dtype=p.in_dtype,
        out_dtype=e.out_dtype,
        source=source,
        bias=e.bias,
        activation=e.activation,
        residual_after_activation=bool(e.residual and e.activation),
        partials=partials,
        epilogue_tile=program.epilogue_tile,
        unscaled=unscaled,
    )


def runtime_args(program: Program) -> RuntimeArgs:
    """The runtime half of a program: raster, swizzle, splits, decomposition, reduction mode and
    the persistent grid's SMs."""
    splits_on_stream_k = stream_k_split(program)
    if splits_on_stream_k:
        decomposition = DECOMPOSITION_CODES["split_k"]
    elif program.scheduler == "stream_k":
        decomposition = DECOMPOSITION_CODES["stream_k"]
    else:
        decomposition = DECOMPOSITION_CODES["data_parallel"]
    return RuntimeArgs(
        raster=RASTER_CODES[program.raster],
        swizzle=program.swizzle,
        splits=program.split_k,
        decomposition=decomposition,
        reduction=REDUCTION_CODES["unordered"] if splits_on_stream_k else 0,
        grid_sms=program.grid_sms or 0,
    )


# ---------------------------------------------------------------- the kernel type


class _FusionDeclaration:
    """A fused epilogue the emitter has no enum for; it calls `emit_declaration()`."""

    def __init__(self, text: str):
        self.text = text

    def emit_declaration(self) -> str:
        return self.text


def _gemm_operation(spec: InstanceSpec, fusion):
    # Deferred: cutlass_library (optional, heavy to import).
    from cutlass_library import library as L
    from cutlass_library.gemm_operation import GemmOperation

    dt = {"f16": L.DataType.f16, "bf16": L.DataType.bf16, "f32": L.DataType.f32}
    layout = {"row": L.LayoutType.RowMajor, "col": L.LayoutType.ColumnMajor}
    math = L.MathInstruction(
        [64, spec.tile[1], 16], dt[spec.in_dtype], dt[spec.in_dtype], L.DataType.f32,
        L.OpcodeClass.TensorOp, L.MathOperation.multiply_add,
    )
    # Warp count is informational for 3.x kernels: the schedule fixes the threads.
    tile = L.TileDescription(list(spec.tile), spec.stages, [4, 1, 1], math, 90, 90,
                             [spec.cluster[0], spec.cluster[1], 1])
    align = 128 // L.DataTypeSize[dt[spec.in_dtype]]  # 16-byte TMA alignment
    out_align = 128 // L.DataTypeSize[dt[spec.out_dtype]]
    a = L.TensorDescription(dt[spec.in_dtype], layout[spec.a_major], align)
    b = L.TensorDescription(dt[spec.in_dtype], layout[spec.b_major], align)
    c_element = L.DataType.void if spec.source is None else dt[spec.out_dtype]
    c = L.TensorDescription(c_element, layout[spec.c_major], out_align)
    d = L.TensorDescription(dt[spec.out_dtype], layout[spec.c_major], out_align)
    cooperative = spec.mainloop == "ws_cooperative"
    if cooperative:
        kernel_schedule = L.KernelScheduleType.TmaWarpSpecializedCooperative
    elif spec.tile_scheduler == "tile":
        # One producer and one consumer warpgroup, one output tile per CTA (not persistent).
        kernel_schedule = L.KernelScheduleType.TmaWarpSpecialized
    else:
        kernel_schedule = L.KernelScheduleType.TmaWarpSpecializedPingpong
    return GemmOperation(
        L.GemmKind.Universal3x, 90, tile, a, b, c, L.DataType.f32,
        epilogue_functor=fusion, D=d,
        kernel_schedule=kernel_schedule,
        epilogue_schedule=(L.EpilogueScheduleType.TmaWarpSpecializedCooperative if cooperative
                           else L.EpilogueScheduleType.TmaWarpSpecialized),
        tile_scheduler={"stream_k": L.TileSchedulerType.StreamK, "persistent": L.TileSchedulerType.Persistent,
                        "tile": L.TileSchedulerType.Default}[spec.tile_scheduler],
    )


def _tile_shape_type(spec: InstanceSpec) -> str:
    m, n, k = spec.tile
    return f"cute::Shape<cute::_{m}, cute::_{n}, cute::_{k}>"


def _bias_leaf(spec: InstanceSpec, out: str) -> str:
    """Visitor leaf that reads the bias vector (per row: column broadcast, and vice versa)."""
    if spec.bias == "n":
        return (f"cutlass::epilogue::fusion::Sm90RowBroadcast<0, {_tile_shape_type(spec)}, {out}, float, "
                f"cute::Stride<cute::_0, cute::_1, int64_t>, 8>")
    return (f"cutlass::epilogue::fusion::Sm90ColBroadcast<0, {_tile_shape_type(spec)}, {out}, float, "
            f"cute::Stride<cute::_1, cute::_0, int64_t>, 1>")


def _fusion(spec: InstanceSpec):
    """The epilogue: a CUTLASS fusion operation where one exists, else a visitor tree.

    Returns (functor for the emitter, C++ statements that fill `args.epilogue.thread`).
    CUTLASS's LinComb* operations compute act(beta * C + alpha * acc + bias), which
    is our epilogue with C = c, or with C = residual and beta = 1 when there is no
    activation. act(alpha * acc + bias) + residual has no fusion operation, so it
    is a tree: plus(act(alpha * acc [+ bias]), C) with C = residual.
    """
    # Deferred: cutlass_library (optional, heavy to import).
    from cutlass_library import library as L

    out = ELEMENT_TYPES[spec.out_dtype]
    elem_c = "void" if spec.source is None else out
    act = ACTIVATION_FUNCTORS.get(spec.activation or "")
    fusion_ns = "cutlass::epilogue::fusion"
    rnd = "cutlass::FloatRoundStyle::round_to_nearest"
    if spec.residual_after_activation:
        ew = f"{fusion_ns}::Sm90EVT"
        if spec.bias:
            scaled = (f"{ew}<{fusion_ns}::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, {rnd}>, "
                      f"{fusion_ns}::Sm90ScalarBroadcast<float>, {fusion_ns}::Sm90AccFetch, {_bias_leaf(spec, out)}>")
            scaled_args = "{{{alpha}}, {}, {static_cast<BiasElement const*>(bias), BiasElement(0), {}}, {}}"
        else:
            scaled = (f"{ew}<{fusion_ns}::Sm90Compute<cutlass::multiplies, float, float, {rnd}>, "
                      f"{fusion_ns}::Sm90ScalarBroadcast<float>, {fusion_ns}::Sm90AccFetch>")
            scaled_args = "{{{alpha}}, {}, {}}"
        tree = (f"{ew}<{fusion_ns}::Sm90Compute<cutlass::plus, {out}, float, {rnd}>, "
                f"{ew}<{fusion_ns}::Sm90Compute<{act}, float, float, {rnd}>, {scaled}>, "
                f"{fusion_ns}::Sm90SrcFetch<{out}>>")
        thread = f"args.epilogue.thread = {{{{{scaled_args}, {{}}}}, {{}}, {{}}}};"
        return _FusionDeclaration(tree), thread

    if spec.unscaled:     # D = acc: one compute node converting the accumulator; alpha is 1, beta 0
        return _FusionDeclaration(f"{fusion_ns}::Sm90EVT<{fusion_ns}::Sm90Compute<cutlass::epilogue::thread::Identity, "
                                  f"{out}, float, {rnd}>, {fusion_ns}::Sm90AccFetch>"), "(void)alpha; (void)beta;"
    thread = ["args.epilogue.thread.alpha = alpha;", "args.epilogue.thread.beta = beta;"]
    if spec.bias:
        name = {"m": "LinCombPerRowBias", "n": "LinCombPerColBias"}[spec.bias]
        align = 8 if spec.bias == "n" else 1
        thread.append("args.epilogue.thread.bias_ptr = static_cast<BiasElement const*>(bias);")
        if act:
            return _FusionDeclaration(
                f"{fusion_ns}::{name}EltAct<{act}, {out}, float, {out}, {elem_c}, float, {align}>"), "\n  ".join(thread)
        return _FusionDeclaration(f"{fusion_ns}::{name}<{out}, float, {out}, {elem_c}, float, {align}>"), "\n  ".join(thread)
    if act:
        return _FusionDeclaration(f"{fusion_ns}::LinCombEltAct<{act}, {out}, float, {elem_c}, float>"), "\n  ".join(thread)
    # Plain alpha * acc + beta * C: the emitter's own enum.
    return L.EpilogueFunctor3x.LinearCombination, "\n  ".join(thread)


def kernel_type_source(spec: InstanceSpec) -> tuple[str, str, str]:
    """(includes, type definitions, kernel type name) from cutlass_library's 3.x emitter."""
    # Deferred: cutlass_library (optional, heavy to import).
    from cutlass_library.gemm_operation import EmitGemmUniversal3xInstance

    functor, _ = _fusion(spec)
    operation = _gemm_operation(spec, functor)
    emitter = EmitGemmUniversal3xInstance()
    # The emitter reads a non-enum functor from itself (emitter.epilogue_functor).
    emitter.epilogue_functor = functor
    includes = "\n".join(f'#include "{h}"' for h in emitter.includes)
    text = emitter.emit(operation)
    if spec.epilogue_tile:
        # The SM90 path of the emitter always asks for the automatic sub-tile; set the program's.
        m, n = spec.epilogue_tile
        assert text.count(AUTO_EPILOGUE_TILE) == 1, "the emitter's epilogue no longer has one automatic tile"
        text = text.replace(AUTO_EPILOGUE_TILE, f"cute::Shape<cute::_{m}, cute::_{n}>")
    return includes, text, operation.procedural_name()


_WRAPPER = r"""
// ---- C-ABI host wrapper (gemmgen) ---------------------------------------------
namespace {

using Kernel = ${kernel};
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using Arguments = typename Gemm::Arguments;
using ElementA = typename Kernel::ElementA;
using ElementB = typename Kernel::ElementB;
using ElementC = typename Kernel::CollectiveEpilogue::ElementC;
using ElementD = typename Kernel::CollectiveEpilogue::ElementD;
using BiasElement = ${bias_element};

int g_sm_count = 0;
int g_max_active_clusters = 0;
int g_device = -1;
bool g_skip_workspace_init = false;  // diagnosis only: reproduces the stale-barrier stream-K hang

// Packed-or-not strides: the one dynamic leading stride of each operand is `ld`.
template <class Stride>
Stride leading_stride(int64_t ld, int64_t batch) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  cute::get<2>(s) = batch;
  return s;
}

Arguments make_arguments(void const* a, void const* b, void const* c, void* d, void const* bias,
                         int m, int n, int k, int64_t lda, int64_t ldb, int64_t ldc, int64_t ldd,
                         float alpha, float beta, int raster, int swizzle, int splits, int decomposition,
                         int reduction, int grid_sms) {
  (void)bias; (void)splits; (void)decomposition; (void)reduction;
  Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {${problem_shape}};
  args.mainloop.ptr_A = static_cast<ElementA const*>(a);
  args.mainloop.dA = leading_stride<typename Kernel::StrideA>(lda, ${a_batch});
  args.mainloop.ptr_B = static_cast<ElementB const*>(b);
  args.mainloop.dB = leading_stride<typename Kernel::StrideB>(ldb, ${b_batch});
  args.epilogue.ptr_C = ${c_pointer};
  args.epilogue.dC = leading_stride<typename Kernel::CollectiveEpilogue::StrideC>(ldc, int64_t(m) * n);
  args.epilogue.ptr_D = static_cast<ElementD*>(d);
  args.epilogue.dD = leading_stride<typename Kernel::CollectiveEpilogue::StrideD>(ldd, int64_t(m) * n);
  ${thread_args}
  args.hw_info.device_id = g_device;
  args.hw_info.sm_count = g_sm_count;
  args.hw_info.max_active_clusters = g_max_active_clusters;
  // `scheduler persistent N`: the persistent grid on N SMs (whole clusters), not on all of them.
  if (grid_sms > 0 && grid_sms < g_sm_count) {
    args.hw_info.sm_count = grid_sms;
    int clusters = grid_sms / ${cluster_size};
    if (g_max_active_clusters > clusters) args.hw_info.max_active_clusters = clusters;
  }
  args.scheduler.raster_order =
      static_cast<cutlass::gemm::kernel::detail::RasterOrderOptions>(raster);
  args.scheduler.max_swizzle_size = swizzle;
  ${scheduler_args}
  return args;
}

}  // namespace

// Once per process and device: SM count, the kernel's dynamic shared memory limit,
// and how many clusters can be co-resident (the persistent grid is sized to it, so
// no CTA of a stream-K grid waits on a peer that cannot be scheduled).
extern "C" int gg_initialize(int device) {
  // This library carries its own (static) CUDA runtime: point it at torch's device.
  if (cudaSetDevice(device) != cudaSuccess) return 1;
  g_device = device;
  if (cudaDeviceGetAttribute(&g_sm_count, cudaDevAttrMultiProcessorCount, g_device) != cudaSuccess) return 2;
  int smem = int(Kernel::SharedStorageSize);
  if (cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    cudaGetLastError();
    return 3;
  }
  g_max_active_clusters = cutlass::KernelHardwareInfo::query_device_max_active_clusters<Kernel>();
  if (g_max_active_clusters <= 0) {
    cudaGetLastError();
    return 4;
  }
  return 0;
}

extern "C" int gg_max_active_clusters() { return g_max_active_clusters; }

// Diagnosis only: skip the per-launch barrier reset, which reproduces the stale-barrier hang.
extern "C" void gg_debug_skip_workspace_init(int skip) { g_skip_workspace_init = skip != 0; }

extern "C" int gg_shared_memory_bytes() { return int(Kernel::SharedStorageSize); }
extern "C" int gg_threads() { return int(Kernel::MaxThreadsPerBlock); }
extern "C" int gg_stages() { return int(Kernel::DispatchPolicy::Stages); }

${entries}"""


_DIRECT_ENTRIES = r"""// Bytes of device workspace for these arguments (0 for data-parallel persistent runs).
extern "C" long long gg_workspace_size(int m, int n, int k, int raster, int swizzle, int splits,
                                       int decomposition, int reduction, int grid_sms) {
  Arguments args = make_arguments(nullptr, nullptr, nullptr, nullptr, nullptr, m, n, k, 0, 0, 0, 0,
                                  1.f, 0.f, raster, swizzle, splits, decomposition, reduction, grid_sms);
  return (long long)Gemm::get_workspace_size(args);
}

// One GEMM on `stream`, no synchronisation. Returns 0, or a cutlass::Status code + 100
// (can_implement refused), + 200 (workspace), + 300 (launch).
extern "C" int gg_run(void const* a, void const* b, void const* c, void* d, void const* bias,
                      int m, int n, int k, long long lda, long long ldb, long long ldc, long long ldd,
                      float alpha, float beta, int raster, int swizzle, int splits, int decomposition,
                      int reduction, int grid_sms, void* workspace, void* stream) {
  Arguments args = make_arguments(a, b, c, d, bias, m, n, k, lda, ldb, ldc, ldd, alpha, beta,
                                  raster, swizzle, splits, decomposition, reduction, grid_sms);
  cutlass::Status status = Kernel::can_implement(args) ? cutlass::Status::kSuccess
                                                       : cutlass::Status::kErrorInvalidProblem;
  if (status != cutlass::Status::kSuccess) return 100 + int(status);
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  // Stream-K/split-K barriers count up and are never reset by the kernel: zero them
  // before every launch (an async memset on `stream`), or the next run deadlocks.
  if (!g_skip_workspace_init) {
    status = Kernel::initialize_workspace(args, workspace, cuda_stream, nullptr);
    if (status != cutlass::Status::kSuccess) return 200 + int(status);
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
  status = Gemm::run(params, cuda_stream);
  if (status != cutlass::Status::kSuccess) return 300 + int(status);
  return 0;
}
"""

# Direct entries' make_arguments values; the partials entries override them.
_DIRECT = {"problem_shape": "m, n, k, 1", "a_batch": "int64_t(m) * k", "b_batch": "int64_t(n) * k"}

# `split_k N workspace`: the GEMM runs as N batches, batch z over K slice z (a batch of A or B
# starts k/N elements further along K: k/N apart when K is the contiguous mode, k/N rows of
# `ld` apart otherwise), writing fp32 partials after CUTLASS's own workspace; the reduce kernel
# sums them in slice order (deterministic) and applies the epilogue (templates/common.cuh).
_K_STEP = ("(cute::is_static<cute::remove_cvref_t<decltype(cute::get<1>(typename Kernel::Stride{s}{{}}))>>::value"
           " ? int64_t(k / splits) : int64_t(k / splits) * ld{o})")
_SLICED = {"problem_shape": "m, n, k / splits, splits", "a_batch": _K_STEP.format(s="A", o="a"),
           "b_batch": _K_STEP.format(s="B", o="b")}

_SLICED_ENTRIES = r"""// ---- split_k N workspace: K slices into fp32 partials, then a reduce kernel ---------
namespace gg_reduce {
${reduce_defines}
${common}
__global__ void splitk_reduce(const float* __restrict__ parts, int M, int N, int slices, const EpilogueArgs epi) {
  reduce_slices(parts, M, N, slices, epi);
}
}  // namespace gg_reduce

namespace {
// CUTLASS's own workspace, rounded up so that the partials after it start 256-byte aligned.
long long own_workspace_bytes(int m, int n, int k, int raster, int swizzle, int splits, int grid_sms) {
  Arguments args = make_arguments(nullptr, nullptr, nullptr, nullptr, nullptr, m, n, k, 0, 0, 0, n,
                                  1.f, 0.f, raster, swizzle, splits, 0, 0, grid_sms);
  long long bytes = (long long)Gemm::get_workspace_size(args);
  return (bytes + 255) / 256 * 256;
}
}  // namespace

extern "C" long long gg_workspace_size(int m, int n, int k, int raster, int swizzle, int splits,
                                       int decomposition, int reduction, int grid_sms) {
  (void)decomposition; (void)reduction;
  return own_workspace_bytes(m, n, k, raster, swizzle, splits, grid_sms) + (long long)m * n * splits * 4;
}

// As the direct gg_run; 400: K does not cut into `splits` slices of a multiple of 8,
// 500: the reduce kernel did not launch.
extern "C" int gg_run(void const* a, void const* b, void const* c, void* d, void const* bias,
                      int m, int n, int k, long long lda, long long ldb, long long ldc, long long ldd,
                      float alpha, float beta, int raster, int swizzle, int splits, int decomposition,
                      int reduction, int grid_sms, void* workspace, void* stream) {
  (void)decomposition; (void)reduction;
  if (splits < 2 || k % splits || (k / splits) % 8) return 400;
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  float* parts = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                          own_workspace_bytes(m, n, k, raster, swizzle, splits, grid_sms));
  Arguments args = make_arguments(a, b, nullptr, parts, nullptr, m, n, k, lda, ldb, 0, n, 1.f, 0.f,
                                  raster, swizzle, splits, 0, 0, grid_sms);
  cutlass::Status status = Kernel::can_implement(args) ? cutlass::Status::kSuccess
                                                       : cutlass::Status::kErrorInvalidProblem;
  if (status != cutlass::Status::kSuccess) return 100 + int(status);
  status = Kernel::initialize_workspace(args, workspace, cuda_stream, nullptr);
  if (status != cutlass::Status::kSuccess) return 200 + int(status);
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
  status = Gemm::run(params, cuda_stream);
  if (status != cutlass::Status::kSuccess) return 300 + int(status);
  gg_reduce::EpilogueArgs epi;
  epi.out = static_cast<gg_reduce::out_t*>(d);
  epi.ld_out = ldd;
  epi.c = ${reduce_c};
  epi.ld_c = ldc;
  epi.bias = static_cast<const gg_reduce::out_t*>(bias);
  epi.residual = ${reduce_residual};
  epi.ld_residual = ldc;
  epi.alpha = alpha;
  epi.beta = beta;
  const long long blocks = ((long long)m * n + 255) / 256;
  const int grid = int(blocks < 8LL * g_sm_count ? blocks : 8LL * g_sm_count);
  gg_reduce::splitk_reduce<<<grid, 256, 0, cuda_stream>>>(parts, m, n, splits, epi);
  if (cudaGetLastError() != cudaSuccess) return 500;
  return 0;
}
"""


_GRID_ENTRY = r"""
// For the GPU tests: how many SMs the persistent scheduler may use for one call.
extern "C" int gg_grid_sms(int m, int n, int k, int swizzle, int splits, int grid_sms) {
  Arguments args = make_arguments(nullptr, nullptr, nullptr, nullptr, nullptr, m, n, k, 0, 0, 0, 0,
                                  1.f, 0.f, 0, swizzle, splits, 0, 0, grid_sms);
  return args.hw_info.sm_count;
}
"""


def _reduce_defines(spec: InstanceSpec) -> str:
    """The constants common.cuh's epilogue reads, from the instance's epilogue."""

    values = {**epilogue_flags(beta=spec.source == "c", residual=spec.source == "residual", bias=spec.bias,
                               activation=spec.activation, out_dtype=spec.out_dtype),
              "RASTER_M": 1, "SWIZZLE": 1}   # read only by common.cuh's tile order, unused here
    return "\n".join(f"#define {name} {v}" for name, v in values.items())


def _substitute(template: str, values: dict) -> str:
    for key, value in values.items():
        template = template.replace("${" + key + "}", value)
    return template


def emit_source(spec: InstanceSpec) -> str:
    """The whole translation unit for one instance: kernel type + C-ABI wrapper (+ the split-K
    reduce kernel for `partials`, whose GEMM writes fp32 with no epilogue of its own)."""
    gemm = replace(spec, out_dtype="f32", source=None, bias=None, activation=None,
                   residual_after_activation=False, partials=False) if spec.partials else spec
    includes, definitions, name = kernel_type_source(gemm)
    _, thread_args = _fusion(gemm)
    if spec.tile_scheduler == "stream_k":
        scheduler_args = (
            "args.scheduler.splits = splits;\n"
            "  args.scheduler.decomposition_mode =\n"
            "      static_cast<cutlass::gemm::kernel::detail::DecompositionMode>(decomposition);\n"
            "  args.scheduler.reduction_mode =\n"
            "      static_cast<cutlass::gemm::kernel::detail::ReductionMode>(reduction);"
        )
    else:
        scheduler_args = ""
    header = "\n".join([
        "// Generated by gemmgen (backends/cutlass_emit.py) from cutlass_library's SM90 3.x emitter.",
        "#include <cuda_runtime.h>",
        includes,
        '#include "cutlass/gemm/device/gemm_universal_adapter.h"',
        '#include "cutlass/epilogue/thread/activation.h"',
        '#include "cutlass/epilogue/fusion/operations.hpp"',
        '#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"',
    ])
    values = {
        "kernel": name,
        "bias_element": ELEMENT_TYPES[gemm.out_dtype],
        "c_pointer": "nullptr" if gemm.source is None else "static_cast<ElementC const*>(c)",
        "thread_args": thread_args,
        "scheduler_args": scheduler_args,
        "cluster_size": str(spec.cluster[0] * spec.cluster[1]),
        **(_SLICED if spec.partials else _DIRECT),
        "entries": (_SLICED_ENTRIES if spec.partials else _DIRECT_ENTRIES)
        + (_GRID_ENTRY if spec.tile_scheduler == "persistent" else ""),
    }
    if spec.partials:

        source = "static_cast<const gg_reduce::out_t*>(c)"
        values.update(reduce_defines=_reduce_defines(spec), common=template("common.cuh"),
                      reduce_c=source if spec.source == "c" else "nullptr",
                      reduce_residual=source if spec.source == "residual" else "nullptr")
    wrapper = _substitute(_WRAPPER, values)
    return f"{header}\n{definitions}\n{wrapper}"
