// ---------------------------------------------------------------------------
// Warp-specialized Hopper mainloops: one producer warpgroup
// issues TMA loads of the A and B tiles (K- or MN-contiguous, 128B-swizzled)
// into a STAGES-deep ring guarded by full/empty mbarriers; CONSUMERS warpgroups run wgmma m64nINSTR_Nk16 from the
// 128B-swizzled tiles and apply the epilogue from registers. Persistent: each
// CTA walks tiles blockIdx.x, +gridDim.x, ... in the program's raster order.
// With CLUSTER_M == 2 the two CTAs of a cluster take vertically adjacent tiles
// and each loads half of their shared B tile, multicast to both.
// GATED (`epilogue gate=ACT halves=stacked`): B holds the gate's N columns, then the up's.
// A stage holds the gate's BN rows of B, then the up's BN (from row N of B's tensor map), so
// each consumer keeps the gate and the up accumulators of the same output elements, one
// layout; the epilogue stores gate(acc) * acc_up. The gate's last tile past N reads up rows,
// which only feed columns that are never stored.
// JOINED_HALVES: the warpgroup's gate rows and up rows lie one after the other in a stage, and one
// wgmma of twice INSTR_N reads both, A once: its accumulator e < ACC_PER_BLOCK is a gate column,
// e + ACC_PER_BLOCK the up of the same column.
// SPLIT_K > 1 (`split_k S cluster`, one tile a CTA): the grid's z is the K slice and the S slices
// of a tile are one cluster. Each parks its fp32 partial tile in shared memory; then each sums a
// 1/S share of the tile's elements over the S slices, in slice order, through distributed shared
// memory, and stores them through the epilogue. STORE_T (c=col, swap_ab's C^T): the partial is
// parked column by column and element (i, j) is stored at row j, column i of the row-major
// output the epilogue flags describe, so the sum still walks along the stored rows.
// STREAM_K (`scheduler stream_k`, ws_cooperative): one wave of CTAs deals out the (tile, k tile)
// iterations evenly; the producer streams its CTA's share across tile boundaries, and the CTA
// that began a tile adds the partials of the CTAs that finished it (each as its first pass) in
// K order, through a global workspace slot and flag per CTA (common.cuh's stream-K helpers).
// STORE_T without SPLIT_K (c=col) stores each element of the computed tile at its transposed place.
// ---------------------------------------------------------------------------
#if STREAM_K && (PINGPONG || GATED || CLUSTER_M > 1 || SPLIT_K > 1)
#error "stream-K runs ws_cooperative, cluster 1x1, split_k 1, without a gate"
#endif
#define CONSUMER_THREADS (CONSUMERS * 128)
#define THREADS (CONSUMER_THREADS + 128)
#define WG_TILE_M (BM / WGS_M)                 // rows one consumer warpgroup owns
#define WG_TILE_N (BN / WGS_N)                 // columns one consumer warpgroup owns
#define M_BLOCKS (WG_TILE_M / 64)              // wgmma m64 blocks per warpgroup
#define N_BLOCKS (WG_TILE_N / INSTR_N)         // wgmma n blocks per warpgroup
#define ACC_PER_BLOCK (INSTR_N / 2)            // fp32 accumulators per thread per output block
#define B_HALVES (GATED ? 2 : 1)
#define A_STAGE_BYTES (BM * BK * 2)
#define B_HALF_BYTES (BN * BK * 2)                   // one half of a gated B stage
#define B_STAGE_BYTES (B_HALVES * B_HALF_BYTES)
#define B_LOAD_ROWS (BN / CLUSTER_M)           // rows of B this CTA loads (and multicasts)
#define READERS_PER_STAGE (PINGPONG ? 1 : CONSUMERS)   // consumer warpgroups reading each slot
#if STORE_T   // element (r, c) of a parked partial tile, and the extent the sum walks 4 at a time
#define PARTIAL_AT(r, c) ((c) * (BM + PARTIAL_PAD) + (r))
#define SUM_WALK BM
#else
#define PARTIAL_AT(r, c) ((r) * (BN + PARTIAL_PAD) + (c))
#define SUM_WALK BN
#endif

struct __align__(64) TmaDescriptor { unsigned long long opaque[16]; };

struct ProblemArgs {
  int M, N, K;
#if STREAM_K
  float* __restrict__ workspace;     // a partial tile per CTA, in the consumers' accumulator layout
  unsigned* __restrict__ counters;   // a flag per CTA (its partial is written), left at zero
#endif
};

#if STREAM_K
#define ACC_FLOATS (M_BLOCKS * N_BLOCKS * ACC_PER_BLOCK)   // a consumer thread's accumulators
#define STREAM_K_BARRIER 3                                 // named barrier of the consumer threads
// CTA `cta`'s partial tile: float4 q of consumer thread t at slot[q * CONSUMER_THREADS + t], so a
// warp moves 512 contiguous bytes at a time.
__device__ __forceinline__ float4* partial_slot(float* workspace, int cta, int t) {
  return reinterpret_cast<float4*>(workspace) + (long long)cta * (ACC_FLOATS / 4) * CONSUMER_THREADS + t;
}
#endif

// ---- mbarriers --------------------------------------------------------------
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
// Spin until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
// Arrive on the barrier at the same offset in the shared memory of cluster CTA `cta`.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned cta) {
  asm volatile(
      "{\n .reg .b32 remote;\n"
      " mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
      :: "r"(bar), "r"(cta) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

// A consumer warp is done reading a ring slot: tell the producer of every CTA that
// writes into it (with multicast, both CTAs of the cluster write into each other).
__device__ __forceinline__ void release_stage(unsigned empty) {
#if CLUSTER_M > 1
#pragma unroll
  for (int c = 0; c < CLUSTER_M; ++c) mbar_arrive_cluster(empty, (unsigned)c);
#else
  mbar_arrive(empty);
#endif
}

// ---- TMA: one box at (inner, outer) element coordinates, completing on `bar` -----
__device__ __forceinline__ void tma_load(unsigned dst, const TmaDescriptor* map, unsigned bar, int inner, int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      :: "r"(dst), "l"(map), "r"(inner), "r"(outer), "r"(bar) : "memory");
}
// The same box written at the same offset into every CTA of `cta_mask`, completing on
// each destination CTA's barrier at offset `bar`.
__device__ __forceinline__ void tma_load_multicast(unsigned dst, const TmaDescriptor* map, unsigned bar,
                                                   int inner, int outer, unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;"
      :: "r"(dst), "l"(map), "r"(inner), "r"(outer), "r"(bar), "h"(cta_mask) : "memory");
}

// One operand tile's TMA boxes (its layout and wgmma descriptors: wgmma.cuh).
//  K-contiguous: one box of BK x TILE_MN. MN-contiguous: TILE_MN/64 boxes of 64 (MN) x BK (K).
template <int TILE_MN, bool K_CONTIG>
struct OperandTile {
  __device__ static __forceinline__ unsigned long long descriptor(unsigned stage, int mn_offset, int kk) {
    return wgmma_descriptor<K_CONTIG>(stage, mn_offset, kk);
  }
  // Load rows [mn0 + first_row, + rows) of the tile at k0 into the same rows of `stage`.
  __device__ static __forceinline__ void load(unsigned stage, const TmaDescriptor* map, unsigned bar,
                                              int mn0, int k0, int first_row, int rows, unsigned short mcast) {
    if (K_CONTIG) {
      unsigned dst = stage + first_row * (BK * 2);
      if (mcast) tma_load_multicast(dst, map, bar, k0, mn0 + first_row, mcast);
      else tma_load(dst, map, bar, k0, mn0 + first_row);
    } else {
      for (int blk = first_row / 64; blk < (first_row + rows) / 64; ++blk) {
        unsigned dst = stage + blk * WGMMA_BOX_BYTES;
        if (mcast) tma_load_multicast(dst, map, bar, mn0 + blk * 64, k0, mcast);
        else tma_load(dst, map, bar, mn0 + blk * 64, k0);
      }
    }
  }
};
using TileA = OperandTile<BM, A_K_CONTIG>;
using TileB = OperandTile<BN, B_K_CONTIG>;

// Row half h of 8-column blocks 4g .. 4g+3 of one wgmma accumulator block: what one lane
// quad stores together (epilogue_store_quad, epilogue_store_block_staged).
__device__ __forceinline__ void quad_of(const float (&block)[ACC_PER_BLOCK], int g, int h, float (&v)[4][2]) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    v[b][0] = block[4 * (4 * g + b) + 2 * h];
    v[b][1] = block[4 * (4 * g + b) + 2 * h + 1];
  }
}

// Every 8x32 block of one wgmma accumulator block, as `store(v, row, col)` with v from
// quad_of: one loop for both epilogue paths, which differ only in the store.
template <class Store>
__device__ __forceinline__ void for_each_quad(const float (&block)[ACC_PER_BLOCK], int row, int col0, Store store) {
#pragma unroll
  for (int g = 0; g < INSTR_N / 32; ++g)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v[4][2];
      quad_of(block, g, h, v);
      store(v, row + 8 * h, col0 + 32 * g);
    }
}

// ---- named barriers (id 0 is __syncthreads) ----------------------------------------
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// ---- register budget of the two roles (setmaxnreg needs __launch_bounds__; CONSUMER_REGS
//      leaves room for CTAS_PER_SM CTAs an SM)
__device__ __forceinline__ void producer_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(PRODUCER_REGS));
}
__device__ __forceinline__ void consumer_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(CONSUMER_REGS));
}

// Tile `t` of this CTA's walk -> (tile_m, tile_n). Clusters walk tiles in vertical pairs.
__device__ __forceinline__ bool tile_coords(int t, int tiles_m, int tiles_n, unsigned rank, int& tm, int& tn) {
  const int pairs_m = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;
  if (t >= pairs_m * tiles_n) return false;
  int pm;
  raster_tile(t, pairs_m, tiles_n, pm, tn);
  tm = pm * CLUSTER_M + (int)rank;
  return true;
}

extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM)
gemm_hopper_ws(const __grid_constant__ TmaDescriptor tmap_a, const __grid_constant__ TmaDescriptor tmap_b,
               const ProblemArgs args, const EpilogueArgs epi) {
  extern __shared__ unsigned char smem_raw[];
  // 128B-swizzled TMA boxes and wgmma descriptors both assume 1024-byte aligned tiles.
  const unsigned smem_base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const unsigned smem_a = smem_base;
  const unsigned smem_b = smem_a + STAGES * A_STAGE_BYTES;
  const unsigned full_bar = smem_b + STAGES * B_STAGE_BYTES;   // STAGES x 8 bytes
  const unsigned empty_bar = full_bar + STAGES * 8;             // STAGES x 8 bytes
  // 512 bytes per consumer warp for the epilogue of interior tiles (not the ring: the
  // producer is already filling it with the next tile's operands).
  const unsigned staging = (empty_bar + STAGES * 8 + 15u) & ~15u;

  const int M = args.M, N = args.N, K = args.K;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  // This CTA's K slice: k tiles [kt_begin, kt_begin + k_tiles) (all of K without split-K).
  const int k_tiles_all = (K + BK - 1) / BK;
  const int kt_begin = (int)((long long)k_tiles_all * blockIdx.z / SPLIT_K);
  const int k_tiles = (int)((long long)k_tiles_all * (blockIdx.z + 1) / SPLIT_K) - kt_begin;
#if SPLIT_K > 1
  float* const partial = reinterpret_cast<float*>(smem_raw + (staging + CONSUMERS * 4 * 512 - smem_u32(smem_raw)));
#endif
#if STREAM_K
  // This CTA's iterations [it_begin, it_end) of tiles x k tiles (split_k is 1: k_tiles is all of K).
  const int total = tiles_m * tiles_n * k_tiles;
  const int it_begin = stream_k_begin(blockIdx.x, total), it_end = stream_k_begin(blockIdx.x + 1, total);
#endif
  const unsigned rank = CLUSTER_M > 1 ? cluster_rank() : 0u;
  const int walk_start = CLUSTER_M > 1 ? (int)(blockIdx.x / CLUSTER_M) : (int)blockIdx.x;
  const int walk_step = CLUSTER_M > 1 ? (int)(gridDim.x / CLUSTER_M) : (int)gridDim.x;
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);                                  // the producer's expect_tx
      mbar_init(empty_bar + 8 * s, READERS_PER_STAGE * 4 * CLUSTER_M);  // each reading warp, cluster-wide
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (CLUSTER_M > 1) cluster_sync();   // peers' barriers exist before anyone multicasts into them

  if (warpgroup == 0) {
    // ------------------------------- producer -----------------------------------
    producer_registers();
    if (threadIdx.x == 0) {
      asm volatile("prefetch.tensormap [%0];" :: "l"(&tmap_a) : "memory");
      asm volatile("prefetch.tensormap [%0];" :: "l"(&tmap_b) : "memory");
      int stage = 0; unsigned phase = 0;
      int tm, tn;
#if STREAM_K
      for (int it = it_begin; it < it_end; ++it) {
        const int t = it / k_tiles;
        tile_coords(t, tiles_m, tiles_n, rank, tm, tn);
        {
          const int kt = it - t * k_tiles;
#else
      for (int t = walk_start; tile_coords(t, tiles_m, tiles_n, rank, tm, tn); t += walk_step) {
        for (int kt = 0; kt < k_tiles; ++kt) {
#endif
          mbar_wait(empty_bar + 8 * stage, phase ^ 1);       // slot free in every CTA of the cluster
          mbar_expect_tx(full_bar + 8 * stage, A_STAGE_BYTES + B_STAGE_BYTES);
          const int k0 = (kt_begin + kt) * BK;
          TileA::load(smem_a + stage * A_STAGE_BYTES, &tmap_a, full_bar + 8 * stage, tm * BM, k0, 0, BM, 0);
          const unsigned short mcast = CLUSTER_M > 1 ? (unsigned short)((1u << CLUSTER_M) - 1) : (unsigned short)0;
          TileB::load(smem_b + stage * B_STAGE_BYTES, &tmap_b, full_bar + 8 * stage, tn * BN, k0,
                      (int)rank * B_LOAD_ROWS, B_LOAD_ROWS, mcast);
#if GATED
          TileB::load(smem_b + stage * B_STAGE_BYTES + B_HALF_BYTES, &tmap_b, full_bar + 8 * stage, N + tn * BN,
                      k0, (int)rank * B_LOAD_ROWS, B_LOAD_ROWS, mcast);
#endif
          if (++stage == STAGES) { stage = 0; phase ^= 1; }
        }
      }
    }
  } else {
    // ------------------------------- consumers ----------------------------------
    consumer_registers();
    const int consumer = warpgroup - 1;
    const int wg_m = PINGPONG ? 0 : consumer % WGS_M, wg_n = PINGPONG ? 0 : consumer / WGS_M;
    const int warp_in_group = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const bool pair_aligned = (epi.ld_out % 2) == 0;
    const bool row_aligned16 = (epi.ld_out % 8) == 0 && (reinterpret_cast<unsigned long long>(epi.out) & 15) == 0;
    float acc[M_BLOCKS][N_BLOCKS][ACC_PER_BLOCK];
#if GATED && JOINED_HALVES
    float acc_both[M_BLOCKS][2 * ACC_PER_BLOCK];   // N_BLOCKS is 1: the warpgroup's gate, then its up
#elif GATED
    float acc_up[M_BLOCKS][N_BLOCKS][ACC_PER_BLOCK];
#endif
    // Position in the producer's sequence of ring slots: slot = pos % STAGES, and the
    // slot's full barrier completes its (pos / STAGES)-th phase for this use.
    int pos = PINGPONG ? consumer * k_tiles : 0;
    int tm, tn, walked = 0;
#if STREAM_K
    // Each pass computes k tiles [seg_from, seg_to) of tile t.
    for (int it = it_begin; it < it_end;) {
      const int t = it / k_tiles, seg_from = it - t * k_tiles, seg_to = imin(k_tiles, seg_from + (it_end - it));
      it += seg_to - seg_from;
      tile_coords(t, tiles_m, tiles_n, rank, tm, tn);
#else
    for (int t = walk_start; tile_coords(t, tiles_m, tiles_n, rank, tm, tn); t += walk_step, ++walked) {
      const int seg_from = 0, seg_to = k_tiles;
#endif
      if (PINGPONG && (walked & 1) != consumer) continue;
#if PINGPONG
      // The two mainloops take turns in walk order. A consumer that ran ahead into the
      // other's next tile would wait on full barriers two phases behind, whose parity
      // reads as complete: it would read unfilled slots and over-release them. Barrier
      // 1 + (w & 1) says "tile w's mainloop may start"; 128 threads arrive, 128 sync.
      if (walked > 0) named_barrier_sync(1 + (walked & 1), 2 * 128);
#endif
      int prev_stage = -1;
      for (int kt = seg_from; kt < seg_to; ++kt, ++pos) {
        const int stage = pos % STAGES;
        mbar_wait(full_bar + 8 * stage, (unsigned)(pos / STAGES) & 1u);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
          for (int i = 0; i < M_BLOCKS; ++i) {
            unsigned long long da = TileA::descriptor(smem_a + stage * A_STAGE_BYTES, wg_m * WG_TILE_M + i * 64, kk);
#if GATED && JOINED_HALVES
            wgmma_tile(acc_both[i], da, TileB::descriptor(smem_b + stage * B_STAGE_BYTES, 0, kk),
                       (kt > seg_from || kk > 0) ? 1 : 0);
#else
#pragma unroll
            for (int j = 0; j < N_BLOCKS; ++j) {
              unsigned long long db = TileB::descriptor(smem_b + stage * B_STAGE_BYTES,
                                                        wg_n * WG_TILE_N + j * INSTR_N, kk);
              wgmma_tile(acc[i][j], da, db, (kt > seg_from || kk > 0) ? 1 : 0);
#if GATED
              unsigned long long db_up = TileB::descriptor(smem_b + stage * B_STAGE_BYTES,
                                                           BN + wg_n * WG_TILE_N + j * INSTR_N, kk);
              wgmma_tile(acc_up[i][j], da, db_up, (kt > seg_from || kk > 0) ? 1 : 0);
#endif
            }
#endif
          }
        }
        wgmma_commit();
        // Keep one k tile of wgmma in flight; the one before it has read its slot.
        wgmma_wait<1>();
        if (prev_stage >= 0 && lane == 0) release_stage(empty_bar + 8 * prev_stage);
        prev_stage = stage;
      }
      wgmma_wait<0>();
      if (prev_stage >= 0 && lane == 0) release_stage(empty_bar + 8 * prev_stage);
#if PINGPONG
      {
        int next_m, next_n;   // signal only a tile that exists, so no arrival is left unmatched
        if (tile_coords(t + walk_step, tiles_m, tiles_n, rank, next_m, next_n))
          named_barrier_arrive(1 + ((walked + 1) & 1), 2 * 128);
      }
      pos += k_tiles;   // the other warpgroup's tile
#endif

#if GATED && JOINED_HALVES
#pragma unroll
      for (int i = 0; i < M_BLOCKS; ++i)
#pragma unroll
        for (int e = 0; e < ACC_PER_BLOCK; ++e)
          acc[i][0][e] = gate_activate(acc_both[i][e]) * acc_both[i][e + ACC_PER_BLOCK];
#elif GATED
#pragma unroll
      for (int i = 0; i < M_BLOCKS; ++i)
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
          for (int e = 0; e < ACC_PER_BLOCK; ++e) acc[i][j][e] = gate_activate(acc[i][j][e]) * acc_up[i][j][e];
#endif
#if STREAM_K
      const int ct = (int)threadIdx.x - 128;   // consumer thread
      if (seg_from > 0) {
        // The rest of a tile that an earlier CTA began (always this CTA's first pass): hand it
        // the partial, then raise this CTA's flag.
        float4* part = partial_slot(args.workspace, blockIdx.x, ct);
#pragma unroll
        for (int i = 0; i < M_BLOCKS; ++i)
#pragma unroll
          for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int e = 0; e < ACC_PER_BLOCK; e += 4)
              __stcg(part + ((i * N_BLOCKS + j) * ACC_PER_BLOCK + e) / 4 * CONSUMER_THREADS,
                     make_float4(acc[i][j][e], acc[i][j][e + 1], acc[i][j][e + 2], acc[i][j][e + 3]));
        __threadfence();
        named_barrier_sync(STREAM_K_BARRIER, CONSUMER_THREADS);
        if (ct == 0) raise_flag(args.counters + blockIdx.x);
        continue;
      }
      if (seg_to < k_tiles) {
        // This CTA began the tile and the next CTAs hold its rest (each as its first pass, done
        // early): add their partials in K order, so the sum is the same every run. They are
        // resident already (the grid is one wave), so the wait ends.
        const int tile_end = (t + 1) * k_tiles;
        for (int c = blockIdx.x + 1; c < gridDim.x && stream_k_begin(c, total) < tile_end; ++c) {
          if (ct == 0) {
            wait_flag(args.counters + c);
            args.counters[c] = 0u;   // consumed: ready for the next launch
          }
          named_barrier_sync(STREAM_K_BARRIER, CONSUMER_THREADS);
          const float4* part = partial_slot(args.workspace, c, ct);
#pragma unroll
          for (int i = 0; i < M_BLOCKS; ++i)
#pragma unroll
            for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
              for (int e = 0; e < ACC_PER_BLOCK; e += 4) {
                const float4 v = __ldcg(part + ((i * N_BLOCKS + j) * ACC_PER_BLOCK + e) / 4 * CONSUMER_THREADS);
                acc[i][j][e] += v.x; acc[i][j][e + 1] += v.y; acc[i][j][e + 2] += v.z; acc[i][j][e + 3] += v.w;
              }
        }
      }
#endif
      // Epilogue from registers. wgmma accumulator e of block (i, j): row 16*warp + lane/4
      // (+8 when e%4 >= 2), column 8*(e/4) + 2*(lane%4) + e%2. Four 8-column blocks at a
      // time go out as one 16-byte store per lane (epilogue_store_quad).
      const int row0 = tm * BM + wg_m * WG_TILE_M + warp_in_group * 16 + lane / 4;
      const int col_base = tn * BN + wg_n * WG_TILE_N;
#if SPLIT_K > 1
      // Park this slice's partial tile (tile-local rows and columns) for the cluster's sum below.
#pragma unroll
      for (int i = 0; i < M_BLOCKS; ++i)
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
          for (int e = 0; e < ACC_PER_BLOCK; e += 2) {
            const int r = row0 - tm * BM + i * 64 + ((e % 4) >= 2 ? 8 : 0);
            const int c = col_base - tn * BN + j * INSTR_N + (e / 4) * 8 + 2 * (lane % 4);
#if STORE_T
            partial[PARTIAL_AT(r, c)] = acc[i][j][e];
            partial[PARTIAL_AT(r, c + 1)] = acc[i][j][e + 1];
#else
            *reinterpret_cast<float2*>(partial + PARTIAL_AT(r, c)) = make_float2(acc[i][j][e], acc[i][j][e + 1]);
#endif
          }
      continue;
#endif
#if STORE_T
      // C^T (swap_ab): element (row, col) of the computed tile goes to row col, column row.
#pragma unroll
      for (int i = 0; i < M_BLOCKS; ++i)
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
          for (int e = 0; e < ACC_PER_BLOCK; ++e) {
            const int row = row0 + i * 64 + ((e % 4) >= 2 ? 8 : 0);
            const int col = col_base + j * INSTR_N + (e / 4) * 8 + 2 * (lane % 4) + e % 2;
            if (row < M && col < N) epilogue_store_element<STORE_T>(epi, acc[i][j][e], row, col);
          }
      continue;
#endif
#if (INSTR_N / 8) % 4 == 0 && !OUT_DTYPE_F32
      // A tile wholly inside M x N stores without bounds checks through the warp's staging
      // buffer (epilogue_store_block_staged): at 4096^3 the kernel then executes 28.8 M
      // instructions where the checked, shuffled stores made it 34.4 M (ncu).
      if ((tm + 1) * BM <= M && (tn + 1) * BN <= N && row_aligned16) {
        const unsigned buffer = staging + (unsigned)(consumer * 4 + warp_in_group) * 512u;
#pragma unroll
        for (int i = 0; i < M_BLOCKS; ++i)
#pragma unroll
          for (int j = 0; j < N_BLOCKS; ++j)
            for_each_quad(acc[i][j], row0 + i * 64, col_base + j * INSTR_N, [&](float (&v)[4][2], int row, int col) {
              epilogue_store_block_staged(epi, v, row, col, buffer);
            });
        continue;
      }
#endif
#pragma unroll
      for (int i = 0; i < M_BLOCKS; ++i)
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j) {
#if (INSTR_N / 8) % 4 == 0
          for_each_quad(acc[i][j], row0 + i * 64, col_base + j * INSTR_N, [&](float (&v)[4][2], int row, int col) {
            epilogue_store_quad(epi, v, row, col, M, N, row_aligned16);
          });
#else
#pragma unroll
          for (int e = 0; e < ACC_PER_BLOCK; e += 2)
            epilogue_store_pair(epi, acc[i][j][e], acc[i][j][e + 1], row0 + i * 64 + ((e % 4) >= 2 ? 8 : 0),
                                col_base + j * INSTR_N + (e / 4) * 8 + 2 * (lane % 4), M, N, pair_aligned);
#endif
        }
    }
  }
  __syncwarp();
#if SPLIT_K > 1
  cluster_sync();   // every slice's partial tile is parked
  int tm, tn;
  if (warpgroup > 0 && tile_coords(walk_start, tiles_m, tiles_n, 0u, tm, tn)) {
    // This CTA's share of the tile: 4 consecutive elements of a stored row per step, summed over
    // the slices in order.
    for (int e = 4 * ((int)blockIdx.z * CONSUMER_THREADS + (int)threadIdx.x - 128); e < BM * BN;
         e += 4 * SPLIT_K * CONSUMER_THREADS) {
#if STORE_T
      const int r = e % SUM_WALK, c = e / SUM_WALK;
#else
      const int r = e / SUM_WALK, c = e % SUM_WALK;
#endif
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int s = 0; s < SPLIT_K; ++s) {
        const float4 v = ld_cluster_f32x4(partial + PARTIAL_AT(r, c), (unsigned)s);
        sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
      }
      const float v[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {   // element (row, col) of the computed product
        const int row = tm * BM + r + (STORE_T ? q : 0), col = tn * BN + c + (STORE_T ? 0 : q);
        if (row < M && col < N) epilogue_store_element<STORE_T>(epi, v[q], row, col);
      }
    }
  }
  cluster_sync();   // no CTA leaves while a peer may still read its partial tile
#endif
  if (CLUSTER_M > 1) cluster_sync();   // no CTA leaves while its peer may still signal it
}
