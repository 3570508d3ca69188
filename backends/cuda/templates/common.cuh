// ---------------------------------------------------------------------------
// Shared device helpers of the gemmgen raw CUDA backend. Self-contained: no
// CUDA headers, so NVRTC and nvcc compile it the same way. The per-program
// constants (tile, epilogue, majors) are defined above this text.
// ---------------------------------------------------------------------------
typedef unsigned short f16_bits;   // one fp16 value, as raw bits

// ---- shared-memory addresses and async copies -------------------------------
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// ---- conversions between fp32 and the output/auxiliary dtype -----------------
__device__ __forceinline__ float f16_to_f32(f16_bits h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ float bf16_to_f32(f16_bits h) {
  float f; asm("mov.b32 %0, %1;" : "=f"(f) : "r"(((unsigned)h) << 16)); return f;
}
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ f16_bits f32_to_f16(float f) {
  f16_bits h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ f16_bits f32_to_bf16(float f) {
  f16_bits h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
// Two fp32 values packed as one 32-bit pair, x0 at the lower address.
__device__ __forceinline__ unsigned pack_f16x2(float x0, float x1) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0)); return r;
}
__device__ __forceinline__ unsigned pack_bf16x2(float x0, float x1) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0)); return r;
}

#if OUT_DTYPE_F32
typedef float out_t;
__device__ __forceinline__ float out_to_f32(out_t v) { return v; }
__device__ __forceinline__ out_t f32_to_out(float v) { return v; }
#elif OUT_DTYPE_BF16
typedef f16_bits out_t;
__device__ __forceinline__ float out_to_f32(out_t v) { return bf16_to_f32(v); }
__device__ __forceinline__ out_t f32_to_out(float v) { return f32_to_bf16(v); }
#else
typedef f16_bits out_t;
__device__ __forceinline__ float out_to_f32(out_t v) { return f16_to_f32(v); }
__device__ __forceinline__ out_t f32_to_out(float v) { return f32_to_f16(v); }
#endif

// ---- the epilogue chain: out = cast(act(alpha*acc + beta*C + bias) + residual)
struct EpilogueArgs {
  out_t* __restrict__ out;  long long ld_out;
  const out_t* __restrict__ c; long long ld_c;
  const out_t* __restrict__ bias;
  const out_t* __restrict__ residual; long long ld_residual;
  float alpha, beta;
};

// The activations, written once: the epilogue's `activation=` and a gated epilogue's `gate=`.
__device__ __forceinline__ float relu_f32(float x) { return x > 0.f ? x : 0.f; }
__device__ __forceinline__ float gelu_f32(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float silu_f32(float x) { return x / (1.f + __expf(-x)); }

__device__ __forceinline__ float activate(float x) {
#if ACT_RELU
  return relu_f32(x);
#elif ACT_GELU
  return gelu_f32(x);
#elif ACT_SILU
  return silu_f32(x);
#else
  return x;
#endif
}

// A gated epilogue's gate (`gate=relu|gelu|silu`), applied to the gate half's fp32 accumulator.
__device__ __forceinline__ float gate_activate(float x) {
#if GATE_RELU
  return relu_f32(x);
#elif GATE_GELU
  return gelu_f32(x);
#elif GATE_SILU
  return silu_f32(x);
#else
  return x;
#endif
}

// The value written at (row, col) for accumulator value `acc` (no bounds check).
__device__ __forceinline__ float epilogue_value(const EpilogueArgs& e, float acc, int row, int col) {
  float v = e.alpha * acc;
#if HAS_BETA
  v += e.beta * out_to_f32(e.c[(long long)row * e.ld_c + col]);
#endif
#if BIAS_N
  v += out_to_f32(e.bias[col]);
#elif BIAS_M
  v += out_to_f32(e.bias[row]);
#endif
  v = activate(v);
#if HAS_RESIDUAL
  v += out_to_f32(e.residual[(long long)row * e.ld_residual + col]);
#endif
  return v;
}

// Split-K's second kernel (`split_k N workspace`, in the multistage family and in the CUTLASS
// backend's K slices): each element's fp32 partials, slice z at parts[z * M * N + idx], summed
// in slice order, then the epilogue.
__device__ __forceinline__ void reduce_slices(const float* __restrict__ parts, int M, int N, int slices,
                                              const EpilogueArgs& epi) {
  const long long total = (long long)M * N;
  for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int z = 0; z < slices; ++z) s += parts[z * total + idx];
    const int row = (int)(idx / N), col = (int)(idx - (long long)row * N);
    epi.out[(long long)row * epi.ld_out + col] = f32_to_out(epilogue_value(epi, s, row, col));
  }
}

// Zero a warp's mma.sync accumulators: [M tiles][N tiles] fragments of four fp32 values.
template <int TILES_M, int TILES_N>
__device__ __forceinline__ void zero_acc(float (&acc)[TILES_M][TILES_N][4]) {
#pragma unroll
  for (int i = 0; i < TILES_M; ++i)
#pragma unroll
    for (int j = 0; j < TILES_N; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;
}

// ---- thread-block clusters (the TMA family's multicast, the direct family's cluster split-K) ----
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
// Every thread of every CTA of the cluster: writes to shared memory before it are seen after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The address of the same shared-memory offset as `p` in the shared memory of cluster CTA `cta`.
__device__ __forceinline__ unsigned cluster_address(const float* p, unsigned cta) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(cta));
  return remote;
}
// The float there.
__device__ __forceinline__ float ld_cluster_f32(const float* p, unsigned cta) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_address(p, cta)) : "memory");
  return v;
}
// Four consecutive floats there (`p` 16-byte aligned).
__device__ __forceinline__ float4 ld_cluster_f32x4(const float* p, unsigned cta) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cluster_address(p, cta)) : "memory");
  return v;
}

// Arrival-order split-K (`split_k N unordered`), one launch: each CTA adds its fp32 partials
// into the workspace, then learns here whether it is its tile's last to arrive. Only that one
// reads the sums (take_sum) and applies the epilogue; it leaves workspace and counter at zero.
__device__ __forceinline__ bool last_to_arrive(unsigned* counter, int slices) {
  __shared__ unsigned is_last;
  __threadfence();   // this CTA's adds are visible before its arrival is
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1u) == (unsigned)(slices - 1);
  __syncthreads();
  if (is_last) __threadfence();
  return is_last;
}

// A finished sum, read past L1 (other SMs wrote it), and the element zeroed for the next call.
__device__ __forceinline__ float take_sum(float* w) {
  float s;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(s) : "l"(w));
  *w = 0.f;
  return s;
}

// ---- stream-K (the multistage and TMA families): one wave of CTAs shares the (tile, k tile)
// iterations; a tile's later CTAs hand their partials to the CTA that began it.
// First iteration of CTA `cta`'s share of `total` (under 2^31; the launchers check): every CTA
// gets total / gridDim.x, give or take one.
__device__ __forceinline__ int stream_k_begin(int cta, int total) {
  return (int)((long long)cta * total / gridDim.x);
}
// Raise `flag` once the partial it guards is written (by every thread, each fenced before the
// CTA's barrier that precedes this call).
__device__ __forceinline__ void raise_flag(unsigned* flag) {
  asm volatile("st.global.release.gpu.u32 [%0], %1;" :: "l"(flag), "r"(1u) : "memory");
}
// Wait until `flag` is raised (one thread, which then lowers it for the next launch; a CTA barrier
// after it makes the partial readable to the others, read past L1 with __ldcg).
__device__ __forceinline__ void wait_flag(const unsigned* flag) {
  unsigned ready;
  do {
    asm volatile("ld.global.acquire.gpu.u32 %0, [%1];" : "=r"(ready) : "l"(flag) : "memory");
  } while (!ready);
}

// ---- the epilogue's stores --------------------------------------------------
// The epilogue of element (i, j) of the computed product (inside M x N), stored at row i,
// column j, or, TRANSPOSED (c=col: swap_ab's C^T), at row j, column i of the row-major output
// the epilogue flags describe.
template <int TRANSPOSED>
__device__ __forceinline__ void epilogue_store_element(const EpilogueArgs& epi, float v, int i, int j) {
  const int row = TRANSPOSED ? j : i, col = TRANSPOSED ? i : j;
  epi.out[(long long)row * epi.ld_out + col] = f32_to_out(epilogue_value(epi, v, row, col));
}

// Store the epilogue of two horizontally adjacent accumulators (row, col), (row, col+1),
// bounds-checked against M x N; one 4- or 8-byte store when both are in and aligned.
__device__ __forceinline__ void epilogue_store_pair(const EpilogueArgs& e, float acc0, float acc1,
                                                    int row, int col, int M, int N, bool pair_aligned) {
  if (row >= M || col >= N) return;
  float v0 = epilogue_value(e, acc0, row, col);
  out_t* dst = e.out + (long long)row * e.ld_out + col;
  if (col + 1 < N) {
    float v1 = epilogue_value(e, acc1, row, col + 1);
    if (pair_aligned) {
#if OUT_DTYPE_F32
      asm volatile("st.global.v2.f32 [%0], {%1, %2};" :: "l"(dst), "f"(v0), "f"(v1) : "memory");
#elif OUT_DTYPE_BF16
      *reinterpret_cast<unsigned*>(dst) = pack_bf16x2(v0, v1);
#else
      *reinterpret_cast<unsigned*>(dst) = pack_f16x2(v0, v1);
#endif
      return;
    }
    dst[1] = f32_to_out(v1);
  }
  dst[0] = f32_to_out(v0);
}

// Store 4 consecutive 8-column blocks of one output row that the 4 lanes of a quad
// hold as tensor-core accumulators (lane q: columns 8b + 2q, 8b + 2q + 1 of block b).
// The epilogue is applied per element, the fp16/bf16 pairs are transposed across the
// quad with shuffles so that lane q owns all 8 columns of block q, and each lane
// writes them as one 16-byte store (element stores at the right edge of N, or when
// the row start is not 16-byte aligned). `col0` is the first column of block 0.
__device__ __forceinline__ void epilogue_store_quad(const EpilogueArgs& e, const float (&acc)[4][2],
                                                    int row, int col0, int M, int N, bool row_aligned16) {
#if OUT_DTYPE_F32
  const int q0 = (threadIdx.x & 3) * 2;
#pragma unroll
  for (int b = 0; b < 4; ++b)
    epilogue_store_pair(e, acc[b][0], acc[b][1], row, col0 + 8 * b + q0, M, N, row_aligned16);
#else
  const unsigned lane = threadIdx.x & 31, q = lane & 3;
  unsigned pair[4];  // pair[b]: this lane's two columns of block b, packed
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const int col = col0 + 8 * b + 2 * (int)q;
    float v0 = 0.f, v1 = 0.f;
    if (row < M && col < N) v0 = epilogue_value(e, acc[b][0], row, col);
    if (row < M && col + 1 < N) v1 = epilogue_value(e, acc[b][1], row, col + 1);
#if OUT_DTYPE_BF16
    pair[b] = pack_bf16x2(v0, v1);
#else
    pair[b] = pack_f16x2(v0, v1);
#endif
  }
  // 4x4 transpose inside the quad: in round s lane q reads lane (q+s)%4's pair of block q.
  unsigned mine[4];  // mine[l]: columns 2l, 2l+1 of block q
#pragma unroll
  for (int l = 0; l < 4; ++l) mine[l] = pair[l];        // placeholder, overwritten below
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const unsigned send_block = (q - s) & 3;             // the reader (q_src - s) wants its block
    unsigned send = pair[0];
#pragma unroll
    for (int b = 1; b < 4; ++b) send = (send_block == (unsigned)b) ? pair[b] : send;
    const unsigned src = (q + s) & 3;
    const unsigned got = __shfl_sync(0xffffffffu, send, (lane & ~3u) | src);
#pragma unroll
    for (int l = 0; l < 4; ++l) mine[l] = (src == (unsigned)l) ? got : mine[l];
  }
  if (row >= M) return;
  const int col = col0 + 8 * (int)q;
  out_t* dst = e.out + (long long)row * e.ld_out + col;
  if (row_aligned16 && col + 7 < N) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                 :: "l"(dst), "r"(mine[0]), "r"(mine[1]), "r"(mine[2]), "r"(mine[3]) : "memory");
    return;
  }
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    if (col + 2 * l < N) dst[2 * l] = (out_t)(mine[l] & 0xffffu);
    if (col + 2 * l + 1 < N) dst[2 * l + 1] = (out_t)(mine[l] >> 16);
  }
#endif
}

#if !OUT_DTYPE_F32
// The same 8x32 block, for a tile wholly inside M x N with 16-byte aligned rows: no bounds
// checks, and the transpose goes through the warp's own 512 bytes of shared memory at
// `buffer` instead of shuffles (at 64^3 the checked path above was ~580 of the multistage
// kernel's ~1,000 instructions; docs/design/cuda_kernels.md). Lane (r, q) = (lane / 4, lane % 4)
// holds row `row` (= the block's first row + r); the block's 16-byte chunks are
// XOR-swizzled by (r / 2) % 4, so neither the 4-byte writes nor the 16-byte reads conflict.
__device__ __forceinline__ void epilogue_store_block_staged(const EpilogueArgs& e, const float (&acc)[4][2],
                                                            int row, int col0, unsigned buffer) {
  const int lane = threadIdx.x & 31, r = lane >> 2, q = lane & 3, swz = (r >> 1) & 3;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const int col = col0 + 8 * b + 2 * q;
    const float v0 = epilogue_value(e, acc[b][0], row, col);
    const float v1 = epilogue_value(e, acc[b][1], row, col + 1);
#if OUT_DTYPE_BF16
    const unsigned packed = pack_bf16x2(v0, v1);
#else
    const unsigned packed = pack_f16x2(v0, v1);
#endif
    asm volatile("st.shared.u32 [%0], %1;" :: "r"(buffer + r * 64 + ((b ^ swz) << 4) + 4 * q), "r"(packed) : "memory");
  }
  __syncwarp();
  unsigned w0, w1, w2, w3;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3) : "r"(buffer + r * 64 + ((q ^ swz) << 4)) : "memory");
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
               :: "l"(e.out + (long long)row * e.ld_out + col0 + 8 * q), "r"(w0), "r"(w1), "r"(w2), "r"(w3)
               : "memory");
  __syncwarp();   // the next block reuses the buffer
}
#endif

// ---- the tensor-core instruction and the arguments of the mma.sync families -----
// D (16 x 8, fp32) += A (16 x 16, row) * B (16 x 8, col): fp16, or bf16 when IN_DTYPE_BF16.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if IN_DTYPE_BF16
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct GemmArgs {
  const f16_bits* __restrict__ a; long long ld_a;
  const f16_bits* __restrict__ b; long long ld_b;
  int M, N, K;
  float* __restrict__ workspace;      // split-K: fp32 partials (SPLIT_K x M x N, or M x N when atomic)
  unsigned* __restrict__ counters;    // split-K atomic: arrivals per output tile, left at zero
                                      // stream-K: a flag per CTA (its partial is written), left at zero
};

// ---- CTA rasterization: linear tile id -> (tile_m, tile_n) -------------------
// RASTER_M: consecutive ids walk down M inside bands of SWIZZLE tile columns
// (n fastest inside the band, so SWIZZLE=1 is plain column order); RASTER_N is
// the mirror image. Banding keeps the A and B panels of neighbouring CTAs in L2.
__device__ __forceinline__ void raster_tile(int id, int tiles_m, int tiles_n, int& tm, int& tn) {
#if RASTER_M
  int band_size = SWIZZLE * tiles_m;
  int band = id / band_size, r = id - band * band_size;
  int width = imin(SWIZZLE, tiles_n - band * SWIZZLE);
  tm = r / width; tn = band * SWIZZLE + (r - (r / width) * width);
#else
  int band_size = SWIZZLE * tiles_n;
  int band = id / band_size, r = id - band * band_size;
  int width = imin(SWIZZLE, tiles_m - band * SWIZZLE);
  tn = r / width; tm = band * SWIZZLE + (r - (r / width) * width);
#endif
}
