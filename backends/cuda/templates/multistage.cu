// ---------------------------------------------------------------------------
// Multistage mainloop: cp.async global->shared copies into a STAGES-deep ring
// of XOR-swizzled tiles, ldmatrix to registers, mma.sync m16n8k16 with fp32
// accumulators, the epilogue chain in registers. Split-K either writes fp32
// partials that a second kernel reduces in slice order (deterministic), adds
// them atomically into a workspace whose last-arriving CTA applies the epilogue,
// or (SPLIT_CLUSTER) sums them in slice order across the tile's cluster of CTAs.
// Stream-K (STREAM_K) deals the (tile, k tile) iterations out evenly over one
// wave of CTAs; the CTA that began a tile adds the others' partials in K order.
// With WGMMA (`instr wgmma`) the same ring is laid out as wgmma reads it (wgmma.cuh)
// and warpgroups issue wgmma from it instead of ldmatrix + mma.sync.
// The ring's tiles and the copies that fill them: multistage_ring.cuh.
// GATED (`epilogue gate=ACT halves=stacked`): B is K x 2N, its gate half then its up half. A
// CTA's B tile is 2 x BN columns, the gate's BN columns of the output tile then the up's BN
// (B_TILE_N), so each warp holds the gate and the up accumulators of the same output elements
// (acc and acc_up, one layout); the epilogue stores gate(acc) * acc_up as a BN-wide output tile.
// ---------------------------------------------------------------------------
#define B_HALVES (GATED ? 2 : 1)
#define B_TILE_N (BN * B_HALVES)
#if GATED && (SPLIT_K > 1 || PERSISTENT || STREAM_K)
#error "a gated epilogue runs one CTA a tile over the whole of K (scheduler tile, split_k 1)"
#endif
#if WGMMA
// Warpgroups of 4 warps stacked along M, WGS_M of them along M times WARPS_N along N; each
// issues one m64nWARP_TILE_N wgmma per 64-row block. Warp w of a warpgroup holds rows 16w ..
// 16w + 15 of each block in mma.sync's accumulator layout: MMA_M_TILES blocks ACC_ROW_STEP
// rows apart, each of MMA_N_TILES n8 tiles.
#define WGS_M (WARPS_M / 4)
#define WARP_TILE_M (BM / WGS_M)      // a warpgroup's rows
#define WARP_TILE_N (BN / WARPS_N)
#define MMA_M_TILES (WARP_TILE_M / 64)
#define ACC_ROW_STEP 64
#define LOADS_AHEAD (STAGES - 2)      // a slot is refilled once the wgmma before last is done
#else
#define WARP_TILE_M (BM / WARPS_M)
#define WARP_TILE_N (BN / WARPS_N)
#define MMA_M_TILES (WARP_TILE_M / 16)
#define ACC_ROW_STEP 16
#define LOADS_AHEAD (STAGES - 1)
#endif
#define MMA_N_TILES (WARP_TILE_N / 8)

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// ldmatrix lane l addresses row l%8 of 8x8 matrix q = l/8.
// A fragment (16 x 16): matrices a0..a3 = (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
// (m 8-15, k 8-15): mn_half = q & 1, k_half = q >> 1.
// B fragments of two n8 blocks: b[0], b[1] for n 0-7 and b[2], b[3] for n 8-15, each pair
// being (k 0-7, k 8-15): mn_half = q >> 1, k_half = q & 1.
template <bool K_CONTIG>
__device__ __forceinline__ void ldmatrix_fragment(unsigned (&f)[4], unsigned addr) {
  if (K_CONTIG) ldmatrix_x4(f, addr);
  else ldmatrix_x4_trans(f, addr);
}

#if GATED
// The output of a gated epilogue, before the epilogue chain: gate(A B_gate) * (A B_up), in fp32.
__device__ __forceinline__ void gate_accumulators(float (&acc)[MMA_M_TILES][MMA_N_TILES][4],
                                                  const float (&acc_up)[MMA_M_TILES][MMA_N_TILES][4]) {
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
    for (int j = 0; j < MMA_N_TILES; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = gate_activate(acc[i][j][v]) * acc_up[i][j][v];
}
#endif

#if WGMMA
// Pins every accumulator at this point of the instruction stream (no instruction): reads of
// them cannot move above a wgmma wait, nor writes below a wgmma that reads them.
__device__ __forceinline__ void wgmma_hold(float (&acc)[MMA_M_TILES][MMA_N_TILES][4]) {
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
    for (int j = 0; j < MMA_N_TILES; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) asm volatile("" : "+f"(acc[i][j][v]) :: "memory");
}

// The warpgroup's wgmma over one 16-deep k step of the stage: block i's accumulators are the
// warp's acc[i] (an m64nWARP_TILE_N accumulator block is the mma.sync layout, n8 tile after n8 tile).
__device__ __forceinline__ void wgmma_k_step(float (&acc)[MMA_M_TILES][MMA_N_TILES][4], unsigned sa, unsigned sb,
                                             int wg_row, int wg_col, int kk) {
  const unsigned long long db = wgmma_descriptor<B_K_CONTIG>(sb, wg_col, kk);
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
    wgmma_tile(reinterpret_cast<float (&)[MMA_N_TILES * 4]>(acc[i]),
               wgmma_descriptor<A_K_CONTIG>(sa, wg_row + i * 64, kk), db, 1);
}
#endif

#if MMA_N_TILES % 4 == 0
// Row half h of m-tile i over n-tiles 4g .. 4g+3: the four 8-column blocks one lane quad
// stores together (epilogue_store_quad, epilogue_store_block_staged).
__device__ __forceinline__ void quad_of(const float (&acc)[MMA_M_TILES][MMA_N_TILES][4], int i, int g, int h,
                                        float (&v)[4][2]) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    v[b][0] = acc[i][4 * g + b][2 * h];
    v[b][1] = acc[i][4 * g + b][2 * h + 1];
  }
}

// Every 8x32 block of this warp's accumulators, as `store(v, row, col)` with v from
// quad_of: one loop for both epilogue paths, which differ only in the store. m-tile i starts
// i * ACC_ROW_STEP rows below `row_base`.
template <class Store>
__device__ __forceinline__ void for_each_quad(const float (&acc)[MMA_M_TILES][MMA_N_TILES][4], int row_base,
                                              int col0, Store store) {
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
    for (int g = 0; g < MMA_N_TILES / 4; ++g)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[4][2];
        quad_of(acc, i, g, h, v);
        store(v, row_base + i * ACC_ROW_STEP + h * 8, col0 + 32 * g);
      }
}
#endif

#if SPLIT_K == 1
// One tile's epilogue when the CTA holds the whole K sum. The warp's accumulators start at row
// warp_row, column warp_col of the tile. `buffer`: 512 bytes of shared memory for this warp,
// free for staged stores.
__device__ __forceinline__ void store_tile(const EpilogueArgs& epi, const float (&acc)[MMA_M_TILES][MMA_N_TILES][4],
                                           int m0, int n0, int M, int N, int warp_row, int warp_col, int lane,
                                           unsigned buffer) {
  // Accumulator (i, j, v): row groupID (+8 for v >= 2), columns 2*(lane%4) + {0, 1}.
  const int row_base = m0 + warp_row + (lane >> 2);
#if MMA_N_TILES % 4 == 0
  const bool row_aligned16 = (epi.ld_out % 8) == 0 && (reinterpret_cast<unsigned long long>(epi.out) & 15) == 0;
#if !OUT_DTYPE_F32
  // A tile wholly inside M x N (with 16-byte aligned rows) stores without bounds checks,
  // staging each 8x32 block through the warp's buffer: epilogue_store_block_staged.
  if (m0 + BM <= M && n0 + BN <= N && row_aligned16) {
    for_each_quad(acc, row_base, n0 + warp_col, [&](float (&v)[4][2], int row, int col) {
      epilogue_store_block_staged(epi, v, row, col, buffer);
    });
    return;
  }
#endif
  // Four 8-column blocks at a time: one 16-byte store per lane (epilogue_store_quad).
  for_each_quad(acc, row_base, n0 + warp_col, [&](float (&v)[4][2], int row, int col) {
    epilogue_store_quad(epi, v, row, col, M, N, row_aligned16);
  });
#else
  const int col_base = n0 + warp_col + (lane & 3) * 2;
  const bool pair_aligned = (epi.ld_out % 2) == 0;
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
    for (int j = 0; j < MMA_N_TILES; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        epilogue_store_pair(epi, acc[i][j][2 * h], acc[i][j][2 * h + 1],
                            row_base + i * ACC_ROW_STEP + h * 8, col_base + j * 8, M, N, pair_aligned);
#endif
}
#endif

#if SPLIT_K > 1
// Every accumulator pair (i, j, h) of this warp inside M x N as visit(v0, v1, row, col): row
// groupID (+8 for h = 1), columns col and col + 1 (the second past N when col is N - 1).
template <class Visit>
__device__ __forceinline__ void for_each_pair(const float (&acc)[MMA_M_TILES][MMA_N_TILES][4], int row_base,
                                              int col_base, int M, int N, Visit visit) {
#pragma unroll
  for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
    for (int j = 0; j < MMA_N_TILES; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_base + i * ACC_ROW_STEP + h * 8, col = col_base + j * 8;
        if (row < M && col < N) visit(acc[i][j][2 * h], acc[i][j][2 * h + 1], row, col);
      }
}
#endif

#if STREAM_K
// A partial tile in the accumulators' own layout, a slot per CTA: float4 (i, j) of thread t at
// slot[(i * MMA_N_TILES + j) * THREADS + t], so each warp moves 512 contiguous bytes at a time.
__device__ __forceinline__ float4* partial_slot(float* workspace, int cta, int tid) {
  return reinterpret_cast<float4*>(workspace) + (long long)cta * MMA_M_TILES * MMA_N_TILES * THREADS + tid;
}
#endif

// One CTA a tile (`scheduler tile`, gridDim.x = tiles), or, with PERSISTENT, a CTA walks tiles
// blockIdx.x, + gridDim.x, ... and its copies run STAGES - 1 k tiles ahead across tile
// boundaries: the next tile's first loads are in flight during this tile's epilogue. With
// STREAM_K a CTA walks its share of the iterations, across tiles the same way.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_multistage(const GemmArgs args, const EpilogueArgs epi) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  using OpA = Operand<BM, A_K_CONTIG>;
  using OpB = Operand<B_TILE_N, B_K_CONTIG, B_HALVES>;   // gated: the gate's BN columns, then the up's
  constexpr unsigned A_STAGE = OpA::Tile::BYTES, B_STAGE = OpB::Tile::BYTES;
#if WGMMA
  const unsigned smem_a = (smem_u32(smem_raw) + 1023u) & ~1023u;   // wgmma's swizzle atoms are 1024-byte aligned
#else
  const unsigned smem_a = smem_u32(smem_raw);
#endif
  const unsigned smem_b = smem_a + STAGES * A_STAGE;

  const int M = args.M, N = args.N, K = args.K;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN, tiles = tiles_m * tiles_n;

  // This CTA's K range: whole BK tiles split evenly over the SPLIT_K slices.
  const int k_tiles_all = (K + BK - 1) / BK;
  const int k_tiles_per_slice = (k_tiles_all + SPLIT_K - 1) / SPLIT_K;
  const int kt_begin = imin(k_tiles_all, blockIdx.z * k_tiles_per_slice);
  const int kt_end = imin(k_tiles_all, kt_begin + k_tiles_per_slice);
  const int k_tiles = kt_end - kt_begin;
  const int k_end = imin(K, kt_end * BK);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#if WGMMA
  // Warpgroup (wg_m, wg_n); the warp's accumulators start at (warp_row, warp_col) of the tile.
  const int wg_m = (warp / 4) % WGS_M, wg_n = (warp / 4) / WGS_M;
  const int warp_row = wg_m * WARP_TILE_M + (warp % 4) * 16, warp_col = wg_n * WARP_TILE_N;
#else
  const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
  const int warp_row = warp_m * WARP_TILE_M, warp_col = warp_n * WARP_TILE_N;
#endif

#if STREAM_K
  // This CTA's iterations [it_begin, it_end) of tiles x k_tiles (split_k is 1: k_tiles is all of K).
  const int total = tiles * k_tiles;
  const int it_begin = stream_k_begin(blockIdx.x, total), it_end = stream_k_begin(blockIdx.x + 1, total);
  int load_it = it_begin, load_tile = it_begin / k_tiles, load_kt = it_begin % k_tiles, load_g = 0;
#else
  // The loads' cursor: tile `load_tile`, its k tile `load_kt`; `load_g` counts k tiles loaded.
  int load_tile = blockIdx.x, load_kt = 0, load_g = 0;
#endif
  int tile_m, tile_n;
  raster_tile(load_tile, tiles_m, tiles_n, tile_m, tile_n);
  typename OpA::Copier copy_a(args.a, args.ld_a, tile_m * BM, M, (kt_begin + load_kt) * BK, tid);
  typename OpB::Copier copy_b(args.b, args.ld_b, tile_n * BN, N, (kt_begin + load_kt) * BK, tid);
#if !WGMMA
  const int q = lane >> 3;
  const typename OpA::Fragments frag_a(warp_row, lane, q & 1, q >> 1);
  const typename OpB::Fragments frag_b(warp_col, lane, q >> 1, q & 1);
#endif

  auto load_next = [&]() {  // the cursor's k tile into its ring slot, then the cursor moves on
#if STREAM_K
    const bool more = load_it < it_end;
#else
    const bool more = load_tile < tiles && k_tiles > 0;
#endif
    if (more) {
      const int slot = load_g % STAGES;
      copy_a.load(smem_a + slot * A_STAGE, k_end);
      copy_b.load(smem_b + slot * B_STAGE, k_end);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    ++load_g;
#if STREAM_K
    if (more && ++load_it < it_end && ++load_kt >= k_tiles) {   // on into the next tile
      load_kt = 0;
      ++load_tile;
      raster_tile(load_tile, tiles_m, tiles_n, tile_m, tile_n);
      copy_a = typename OpA::Copier(args.a, args.ld_a, tile_m * BM, M, 0, tid);
      copy_b = typename OpB::Copier(args.b, args.ld_b, tile_n * BN, N, 0, tid);
    }
#elif PERSISTENT
    if (++load_kt >= k_tiles) {
      load_kt = 0;
      load_tile += gridDim.x;
      if (load_tile < tiles) {
        raster_tile(load_tile, tiles_m, tiles_n, tile_m, tile_n);
        copy_a = typename OpA::Copier(args.a, args.ld_a, tile_m * BM, M, kt_begin * BK, tid);
        copy_b = typename OpB::Copier(args.b, args.ld_b, tile_n * BN, N, kt_begin * BK, tid);
      }
    }
#else
    if (load_g >= k_tiles) load_tile = tiles;      // one tile a CTA: nothing after it
#endif
  };

#pragma unroll
  for (int s = 0; s < LOADS_AHEAD; ++s) load_next();

  int g = 0;  // k tiles computed
  // Each pass computes k tiles [seg_from, seg_to) of one tile.
#if STREAM_K
  for (int it = it_begin; it < it_end;) {
    const int tile = it / k_tiles, seg_from = it % k_tiles;
    const int seg_to = imin(k_tiles, seg_from + (it_end - it));
    it += seg_to - seg_from;
#elif PERSISTENT
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int seg_from = 0, seg_to = k_tiles;
#else
  {
    const int tile = blockIdx.x, seg_from = 0, seg_to = k_tiles;
#endif
    int tm, tn;
    raster_tile(tile, tiles_m, tiles_n, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;

    float acc[MMA_M_TILES][MMA_N_TILES][4];
    zero_acc(acc);
#if GATED
    float acc_up[MMA_M_TILES][MMA_N_TILES][4];   // the up half's, element for element beside acc
    zero_acc(acc_up);
#endif

    for (int kt = seg_from; kt < seg_to; ++kt, ++g) {
      // k tile g has landed once at most LOADS_AHEAD - 1 younger groups are in flight.
      asm volatile("cp.async.wait_group %0;\n" :: "n"(LOADS_AHEAD - 1) : "memory");
#if WGMMA
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the copies, seen by wgmma
#endif
      __syncthreads();  // also: every warp is done reading the slot refilled next
      load_next();

      const unsigned sa = smem_a + (g % STAGES) * A_STAGE;
      const unsigned sb = smem_b + (g % STAGES) * B_STAGE;
#if WGMMA
      wgmma_hold(acc);
#if GATED
      wgmma_hold(acc_up);
#endif
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        wgmma_k_step(acc, sa, sb, wg_m * WARP_TILE_M, warp_col, kk);
#if GATED
        wgmma_k_step(acc_up, sa, sb, wg_m * WARP_TILE_M, BN + warp_col, kk);   // the up half's columns
#endif
      }
      wgmma_commit();
      wgmma_wait<1>();   // this k tile's wgmma may run on; the one before it has read its slot
#else
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        unsigned af[MMA_M_TILES][4];
        unsigned bf[MMA_N_TILES / 2][4];
#pragma unroll
        for (int i = 0; i < MMA_M_TILES; ++i)
          ldmatrix_fragment<A_K_CONTIG>(af[i], frag_a.at(sa, i, kk));
#pragma unroll
        for (int j = 0; j < MMA_N_TILES / 2; ++j)
          ldmatrix_fragment<B_K_CONTIG>(bf[j], frag_b.at(sb, j, kk));
#pragma unroll
        for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
          for (int j = 0; j < MMA_N_TILES; ++j)
            mma_16816(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
#if GATED
        // The up half: the same warp columns, BN further on in the B tile.
#pragma unroll
        for (int j = 0; j < MMA_N_TILES / 2; ++j)
          ldmatrix_fragment<B_K_CONTIG>(bf[j], frag_b.at(sb, BN / 16 + j, kk));
#pragma unroll
        for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
          for (int j = 0; j < MMA_N_TILES; ++j)
            mma_16816(acc_up[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
#endif
      }
#endif
    }
#if WGMMA
    wgmma_wait<0>();
    wgmma_hold(acc);
#if GATED
    wgmma_hold(acc_up);
#endif
#endif
#if GATED
    gate_accumulators(acc, acc_up);
#endif

#if STREAM_K
    if (seg_from > 0) {
      // The rest of a tile that an earlier CTA began (always this CTA's first pass): hand it the
      // partial, then flag it.
      float4* part = partial_slot(args.workspace, blockIdx.x, tid);
#pragma unroll
      for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
        for (int j = 0; j < MMA_N_TILES; ++j)
          __stcg(part + (i * MMA_N_TILES + j) * THREADS,
                 make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));
      __threadfence();
      __syncthreads();
      if (tid == 0) raise_flag(args.counters + blockIdx.x);
      continue;
    }
    if (seg_to < k_tiles) {
      // This CTA began the tile and the next CTAs hold its rest (each as its first pass, done
      // early): add their partials in K order, so the sum is the same every run. They are
      // resident already (the grid is one wave), so the wait ends.
      const int tile_end = (tile + 1) * k_tiles;
      for (int c = blockIdx.x + 1; c < gridDim.x && stream_k_begin(c, total) < tile_end; ++c) {
        if (tid == 0) {
          wait_flag(args.counters + c);
          args.counters[c] = 0u;   // consumed: ready for the next launch
        }
        __syncthreads();
        const float4* part = partial_slot(args.workspace, c, tid);
#pragma unroll
        for (int i = 0; i < MMA_M_TILES; ++i)
#pragma unroll
          for (int j = 0; j < MMA_N_TILES; ++j) {
            const float4 v = __ldcg(part + (i * MMA_N_TILES + j) * THREADS);
            acc[i][j][0] += v.x; acc[i][j][1] += v.y; acc[i][j][2] += v.z; acc[i][j][3] += v.w;
          }
      }
    }
#endif
#if SPLIT_K == 1 && (PERSISTENT || STREAM_K)
    // The ring already holds the next tile's first loads: the stores stage through 512 bytes
    // a warp past it, and no warp waits for the others.
    store_tile(epi, acc, m0, n0, M, N, warp_row, warp_col, lane, smem_b + STAGES * B_STAGE + (unsigned)warp * 512u);
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#elif SPLIT_K == 1
    // No copy is in flight after the last k tile: once every warp is done reading the ring,
    // the stores stage through its first 512 bytes a warp.
    __syncthreads();
    store_tile(epi, acc, m0, n0, M, N, warp_row, warp_col, lane, smem_a + (unsigned)warp * 512u);
  }
#else
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    // Accumulator (i, j, v): row groupID (+8 for v >= 2), columns 2*(lane%4) + {0, 1}.
    const int row_base = m0 + warp_row + (lane >> 2);
    const int col_base = n0 + warp_col + (lane & 3) * 2;
#if SPLIT_CLUSTER
    // Cluster split-K: the SPLIT_K slices of this tile are one cluster. Each parks its fp32
    // partial tile in its own ring (no copy is in flight, and after the barrier no warp reads
    // it); after the cluster's barrier each sums a 1/SPLIT_K share of the tile over every slice,
    // in slice order, and stores it through the epilogue: one launch, no workspace.
    __syncthreads();
    float* partial = reinterpret_cast<float*>(smem_raw + (smem_a - smem_u32(smem_raw)));
    for_each_pair(acc, row_base - m0, col_base - n0, BM, BN, [partial](float v0, float v1, int r, int c) {
      *reinterpret_cast<float2*>(partial + r * BN + c) = make_float2(v0, v1);
    });
    cluster_sync();
    for (int e = 4 * ((int)cluster_rank() * THREADS + tid); e < BM * BN; e += 4 * SPLIT_K * THREADS) {
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int s = 0; s < SPLIT_K; ++s) {
        const float4 v = ld_cluster_f32x4(partial + e, (unsigned)s);
        sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
      }
      const int row = m0 + e / BN, col = n0 + e % BN;   // BN is a multiple of 16: one row
      const float v[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (row < M && col + c < N) epilogue_store_element<0>(epi, v[c], row, col + c);
    }
    cluster_sync();   // no CTA leaves while a peer may still read its shared memory
#elif !SPLIT_ATOMIC
    // Workspace split-K: this slice's fp32 partial tile; splitk_reduce finishes.
    float* part = args.workspace + (long long)blockIdx.z * M * N;
    for_each_pair(acc, row_base, col_base, M, N, [part, N](float v0, float v1, int row, int col) {
      part[(long long)row * N + col] = v0;
      if (col + 1 < N) part[(long long)row * N + col + 1] = v1;
    });
#else
    // Atomic split-K: add into the workspace; the last CTA of this tile to arrive
    // reads the sums, applies the epilogue and leaves workspace and counter at zero.
    for_each_pair(acc, row_base, col_base, M, N, [&](float v0, float v1, int row, int col) {
      atomicAdd(args.workspace + (long long)row * N + col, v0);
      if (col + 1 < N) atomicAdd(args.workspace + (long long)row * N + col + 1, v1);
    });
    const int tile_id = tm * tiles_n + tn;
    if (!last_to_arrive(args.counters + tile_id, SPLIT_K)) return;
    for_each_pair(acc, row_base, col_base, M, N, [&](float, float, int row, int col) {
      float* w = args.workspace + (long long)row * N + col;
      const float s0 = take_sum(w), s1 = col + 1 < N ? take_sum(w + 1) : 0.f;
      epilogue_store_pair(epi, s0, s1, row, col, M, N, false);
    });
    if (tid == 0) args.counters[tile_id] = 0u;
#endif  // SPLIT_CLUSTER, SPLIT_ATOMIC
  }
#endif  // SPLIT_K == 1
}

#if SPLIT_K > 1 && !SPLIT_ATOMIC && !SPLIT_CLUSTER
// Sum the SPLIT_K partials of each element in slice order, then the epilogue.
extern "C" __global__ void __launch_bounds__(256)
splitk_reduce(const float* __restrict__ workspace, int M, int N, const EpilogueArgs epi) {
  reduce_slices(workspace, M, N, SPLIT_K, epi);
}
#endif
