// ---------------------------------------------------------------------------
// Direct mainloop: for skinny products, where one operand (A, the weight under swap_ab) is
// read once and is most of the bytes. No shared memory: each warp loads its rows of A and
// columns of B from global memory straight into mma.sync m16n8k16 fragments, a ring of
// STAGES k tiles of loads in flight per thread, and K is split over SPLIT_K CTAs whose fp32
// partials are added in arrival order, the last CTA of a tile applying the epilogue; with
// SPLIT_CLUSTER the SPLIT_K CTAs of a tile are one cluster, and they sum their partials through
// distributed shared memory, in slice order, with no workspace and no atomics.
//
// Both operands are K-contiguous (A row-major, B column-major). K is walked in chunks of 32:
// lane (g, q) = (lane / 4, lane % 4) loads 16 bytes of its row at k0 + 8q, values
// k0 + 8q + 0..7. A sum over k does not depend on which k sits in which mma slot as long as
// A and B agree, so the first mma of the chunk takes values 0-3 of every lane (slots 2q, 2q+1
// and 2q+8, 2q+9) and the second takes values 4-7.
// A streams (no L1 allocation, read once); B is what every CTA along M reads again (L1).
// STORE_T: C is column-major (c=col, what swap_ab computes), so element (i, j) is stored at
// row j, column i of the row-major output the epilogue flags describe.
// ---------------------------------------------------------------------------
#define WARP_TILE_M (BM / WARPS_M)
#define WARP_TILE_N (BN / WARPS_N)
#define MMA_M_TILES (WARP_TILE_M / 16)
#define MMA_N_TILES (WARP_TILE_N / 8)
#define K_CHUNKS (BK / 32)
#define THREADS (WARPS_M * WARPS_N * 32)
#define ARRIVAL_SPLIT (SPLIT_K > 1 && !SPLIT_CLUSTER)
#define CLUSTER_SPLIT (SPLIT_K > 1 && SPLIT_CLUSTER)

struct Chunk { unsigned x, y, z, w; };

__device__ __forceinline__ Chunk load_streamed(const f16_bits* p, bool ok) {
  Chunk c = {0u, 0u, 0u, 0u};
  if (ok)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "l"(p));
  return c;
}

__device__ __forceinline__ Chunk load_reused(const f16_bits* p, bool ok) {
  Chunk c = {0u, 0u, 0u, 0u};
  if (ok)
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "l"(p));
  return c;
}

struct Stage {
  Chunk a[MMA_M_TILES][2][K_CHUNKS];   // rows g and g + 8 of each 16-row block
  Chunk b[MMA_N_TILES][K_CHUNKS];      // column g of each 8-column block
};

__device__ __forceinline__ void load_stage(Stage& s, const f16_bits* const (&a_row)[MMA_M_TILES][2],
                                           const f16_bits* const (&b_col)[MMA_N_TILES], int kt, int kt_end, int K,
                                           int q) {
#pragma unroll
  for (int c = 0; c < K_CHUNKS; ++c) {
    const int k = kt * BK + 32 * c + 8 * q;
    const bool ok = kt < kt_end && k < K;
#pragma unroll
    for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) s.a[i][h][c] = load_streamed(a_row[i][h] + k, ok);
#pragma unroll
    for (int j = 0; j < MMA_N_TILES; ++j) s.b[j][c] = load_reused(b_col[j] + k, ok);
  }
}

__device__ __forceinline__ void mma_stage(float (&acc)[MMA_M_TILES][MMA_N_TILES][4], const Stage& s) {
#pragma unroll
  for (int c = 0; c < K_CHUNKS; ++c)
#pragma unroll
    for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
      for (int j = 0; j < MMA_N_TILES; ++j) {
        const Chunk &lo = s.a[i][0][c], &hi = s.a[i][1][c], &b = s.b[j][c];
        const unsigned first[4] = {lo.x, hi.x, lo.y, hi.y}, second[4] = {lo.z, hi.z, lo.w, hi.w};
        mma_16816(acc[i][j], first, b.x, b.y);
        mma_16816(acc[i][j], second, b.z, b.w);
      }
}

extern "C" __global__ void __launch_bounds__(WARPS_M * WARPS_N * 32)
gemm_direct(const GemmArgs args, const EpilogueArgs epi) {
  const int M = args.M, N = args.N, K = args.K;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int tiles_m = (M + BM - 1) / BM;
  const int tm = blockIdx.x % tiles_m, tn = blockIdx.x / tiles_m;   // neighbours share B's columns
  const int row0 = tm * BM + (warp % WARPS_M) * WARP_TILE_M;
  const int col0 = tn * BN + (warp / WARPS_M) * WARP_TILE_N;
  const int k_tiles = (K + BK - 1) / BK;
  const int kt_begin = (int)((long long)k_tiles * blockIdx.z / SPLIT_K);
  const int kt_end = (int)((long long)k_tiles * (blockIdx.z + 1) / SPLIT_K);

  // Rows and columns past the edge read the last one (always in bounds) and are never stored.
  const f16_bits* a_row[MMA_M_TILES][2];
  const f16_bits* b_col[MMA_N_TILES];
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      a_row[i][h] = args.a + (long long)imin(row0 + 16 * i + 8 * h + g, M - 1) * args.ld_a;
#pragma unroll
  for (int j = 0; j < MMA_N_TILES; ++j) b_col[j] = args.b + (long long)imin(col0 + 8 * j + g, N - 1) * args.ld_b;

  float acc[MMA_M_TILES][MMA_N_TILES][4];
  zero_acc(acc);

  Stage ring[STAGES];
#pragma unroll
  for (int s = 0; s < STAGES; ++s) load_stage(ring[s], a_row, b_col, kt_begin + s, kt_end, K, q);
  for (int kt = kt_begin; kt < kt_end; kt += STAGES) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      if (kt + s < kt_end) mma_stage(acc, ring[s]);   // a tile past the slice loaded zeros anyway
      load_stage(ring[s], a_row, b_col, kt + s + STAGES, kt_end, K, q);
    }
  }

  // Accumulator (i, j, v): row g (+8 for v >= 2) of block i, column 2q (+1 for odd v) of block j.
#if SPLIT_K > 1
  // This CTA computed K slice blockIdx.z of its tile. With CLUSTER_SPLIT that is its rank in the
  // tile's cluster: it parks its partial tile in its shared memory, and after the cluster's
  // barrier each CTA sums a 1/SPLIT_K share of the tile's elements over every slice, in slice
  // order, and stores them through the epilogue. Otherwise it adds its partials into the
  // workspace, and the tile's last CTA to arrive finishes them below.
#if CLUSTER_SPLIT
  __shared__ float partial[BM * BN];
#endif
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
    for (int j = 0; j < MMA_N_TILES; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int r = row0 + 16 * i + g + 8 * (v >> 1), c = col0 + 8 * j + 2 * q + (v & 1);
#if CLUSTER_SPLIT
        partial[(r - tm * BM) * BN + c - tn * BN] = acc[i][j][v];
#else
        if (r < M && c < N) atomicAdd(args.workspace + (long long)r * N + c, acc[i][j][v]);
#endif
      }
#if CLUSTER_SPLIT
  cluster_sync();
  for (int e = (int)cluster_rank() * THREADS + threadIdx.x; e < BM * BN; e += SPLIT_K * THREADS) {
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < SPLIT_K; ++s) sum += ld_cluster_f32(partial + e, (unsigned)s);
    const int r = tm * BM + e / BN, c = tn * BN + e % BN;
    if (r < M && c < N) epilogue_store_element<STORE_T>(epi, sum, r, c);
  }
  cluster_sync();   // no CTA leaves while a peer may still read its shared memory
  return;
#else
  if (!last_to_arrive(args.counters + blockIdx.x, SPLIT_K)) return;
#endif
#endif
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
    for (int j = 0; j < MMA_N_TILES; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int r = row0 + 16 * i + g + 8 * (v >> 1), c = col0 + 8 * j + 2 * q + (v & 1);
        if (r >= M || c >= N) continue;
#if ARRIVAL_SPLIT
        epilogue_store_element<STORE_T>(epi, take_sum(args.workspace + (long long)r * N + c), r, c);
#else
        epilogue_store_element<STORE_T>(epi, acc[i][j][v], r, c);
#endif
      }
#if ARRIVAL_SPLIT
  if (threadIdx.x == 0) args.counters[blockIdx.x] = 0u;
#endif
}
