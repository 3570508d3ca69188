// ---------------------------------------------------------------------------
// The multistage family's ring: its shared tiles (XOR-swizzled for ldmatrix, or in the
// boxes wgmma reads) and each thread's cp.async copies into them, zero-filled past the
// problem's edges. The kernel that reads the ring: multistage.cu.
// ---------------------------------------------------------------------------
#define THREADS (WARPS_M * WARPS_N * 32)

// A shared tile of ROWS rows x COLS fp16; its 16-byte chunks are XOR-swizzled
// so that the 8 row addresses of one ldmatrix phase hit 8 distinct bank groups.
template <int ROWS, int COLS>
struct SwizzledTile {
  static constexpr int CHUNKS = COLS / 8;                       // 16-byte chunks per row
  static constexpr int ROWS_PER_LINE = CHUNKS >= 8 ? 1 : 8 / CHUNKS;  // rows per 128-byte line
  static constexpr int PHASES = CHUNKS >= 8 ? 8 : CHUNKS;
  static constexpr int ELEMS = ROWS * COLS;
  static constexpr int BYTES = ELEMS * 2;
  static constexpr int ROW_BYTES = COLS * 2;                    // row r + 8 is row r moved by 8 of these
  // A row's XOR phase repeats every 8 rows, so it depends on row % 8 alone.
  static_assert(ROWS_PER_LINE * PHASES == 8, "the swizzle repeats every 8 rows");
  __device__ static __forceinline__ int phase(int row) { return (row / ROWS_PER_LINE) & (PHASES - 1); }
  // Byte offset of (row, col); col is a multiple of 8 for chunk accesses.
  __device__ static __forceinline__ unsigned offset_bytes(int row, int col) {
    return (unsigned)(row * COLS + (((col >> 3) ^ phase(row)) << 3) + (col & 7)) * 2u;
  }
};

#if WGMMA
// An MN-contiguous tile of ROWS (K) x COLS (MN) fp16 as wgmma reads it: COLS / 64 boxes of
// ROWS rows of 128 bytes, chunk c of row r stored at chunk c ^ (r % 8) (wgmma.cuh). A
// K-contiguous tile with COLS = BK = 64 is a SwizzledTile already.
template <int ROWS, int COLS>
struct BoxTile {
  static constexpr int CHUNKS = COLS / 8;
  static constexpr int ELEMS = ROWS * COLS;
  static constexpr int BYTES = ELEMS * 2;
  static constexpr int ROW_BYTES = 128;
  static_assert(COLS % 64 == 0, "whole 64-wide boxes");
  __device__ static __forceinline__ unsigned offset_bytes(int row, int col) {
    return (unsigned)((col >> 6) * ROWS * 128 + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) + (col & 7) * 2);
  }
};
#endif

template <int TILE_MN, bool K_CONTIG>
struct TileOf { using Tile = SwizzledTile<K_CONTIG ? TILE_MN : BK, K_CONTIG ? BK : TILE_MN>; };
#if WGMMA
template <int TILE_MN>
struct TileOf<TILE_MN, false> { using Tile = BoxTile<BK, TILE_MN>; };
#endif

// One operand (A or B) seen as MN x K. K_CONTIG: stored with K contiguous
// (element (mn, k) at mn*ld + k), kept in shared memory as [MN][K] rows;
// otherwise MN contiguous (at k*ld + mn), kept as [K][MN] rows.
// HALVES = 2 (a gated epilogue's B, `halves=stacked`): the tile's TILE_MN rows (or columns) are
// two halves of HALF = TILE_MN / 2, the gate's columns mn0 .. mn0 + HALF - 1 of the joined B,
// then the up projection's, MN columns further on (tile column c >= HALF is global column
// MN + mn0 + c - HALF); each half is bounded by MN on its own.
//
// Addresses are worked out once per thread, before the K loop: computed afresh for every copy
// and every ldmatrix they took ~300 of the K loop's ~390 instructions per k-tile, against
// 64 HMMA.
template <int TILE_MN, bool K_CONTIG, int HALVES = 1>
struct Operand {
  using Tile = typename TileOf<TILE_MN, K_CONTIG>::Tile;
  static constexpr int HALF = TILE_MN / HALVES;                 // rows (or columns) of one half
  static_assert(HALVES == 1 || (HALVES == 2 && HALF % 8 == 0), "two halves of whole 16-byte chunks");
  static constexpr int CHUNKS = Tile::ELEMS / 8;
  static constexpr int ROW_CHUNKS = Tile::CHUNKS;
  static constexpr int PER_THREAD = (CHUNKS + THREADS - 1) / THREADS;
  // A thread's chunks sit ROW_STEP rows apart in one column of the tile.
  static constexpr int ROW_STEP = THREADS / ROW_CHUNKS;
  static_assert(THREADS % ROW_CHUNKS == 0, "every thread copies one column of chunks");

  // The global-to-shared copies of one thread: pointer and bounds of its first chunk, at
  // the k tile it loads next.
  struct Copier {
    const f16_bits* src;     // chunk 0 at the next k tile to load
    long long row_stride;    // elements between chunk j and chunk j + 1
    long long tile_step;     // elements between one k tile and the next
    long long up_step;       // HALVES = 2, K_CONTIG: what chunk j adds on crossing into the up half
    unsigned dst;            // byte offset of chunk 0 within a stage
    int row0, col;           // chunk 0 in the tile
    unsigned mn_inside;      // bit j: chunk j lies inside M (or N; with two halves, inside its half)
    int k_next;              // K index of the next k tile's first column (or row)

    // The half that tile row (or column) r lies in, and r within it.
    __device__ static __forceinline__ int half_of(int r) { return HALVES == 1 ? 0 : r / HALF; }
    __device__ static __forceinline__ int in_half(int r) { return HALVES == 1 ? r : r % HALF; }
    // The half of chunk j past chunk 0's, known at compile time: a thread's chunks lie ROW_STEP
    // rows apart from row0 < ROW_STEP, so with HALF a multiple of ROW_STEP chunk j is in half
    // j * ROW_STEP / HALF whatever row0 is; with a smaller HALF the tile is at most ROW_STEP
    // rows, one chunk a thread.
    __host__ __device__ static constexpr int crossed(int j) { return HALVES == 1 || HALF % ROW_STEP ? 0 : j * ROW_STEP / HALF; }

    __device__ __forceinline__ Copier(const f16_bits* g, long long ld, int mn0, int MN, int k0, int tid) {
      row0 = tid / ROW_CHUNKS;
      col = (tid % ROW_CHUNKS) * 8;
      k_next = k0;
      dst = Tile::offset_bytes(row0, col);
      mn_inside = 0u;
#pragma unroll
      for (int j = 0; j < PER_THREAD; ++j) {
        const int mn = K_CONTIG ? mn0 + in_half(row0 + j * ROW_STEP) : mn0 + in_half(col);
        if (mn < MN) mn_inside |= 1u << j;
      }
      // chunk 0's row (K_CONTIG) or column in the joined operand: its half's first, plus its place in it
      const int mn_first = mn0 + (K_CONTIG ? in_half(row0) + half_of(row0) * MN : in_half(col) + half_of(col) * MN);
      src = g + (K_CONTIG ? (long long)mn_first * ld + k0 + col : (long long)(k0 + row0) * ld + mn_first);
      row_stride = (long long)ROW_STEP * ld;   // rows are M (or N) when K_CONTIG, else K
      tile_step = K_CONTIG ? (long long)BK : (long long)BK * ld;
      up_step = (long long)(MN - HALF) * ld;   // row HALF + r of the tile is row MN + r of the half
    }

    // Issue the cp.async copies of the next k tile into the stage at byte address `stage`;
    // chunks past MN or k_end are zero-filled: src-size 0 reads nothing from the (then
    // out-of-bounds) address, and zeros add nothing to the product.
    __device__ __forceinline__ void load(unsigned stage, int k_end) {
      const f16_bits* p = src;
      const int k_left = k_end - k_next;                       // columns (or rows) of K left
#pragma unroll
      for (int j = 0; j < PER_THREAD; ++j) {
        if (CHUNKS % THREADS != 0 && row0 + j * ROW_STEP >= CHUNKS / ROW_CHUNKS) break;
        const bool k_inside = K_CONTIG ? col < k_left : row0 + j * ROW_STEP < k_left;
        const bool valid = ((mn_inside >> j) & 1u) && k_inside;
        // The swizzle repeats every 8 rows: for ROW_STEP a multiple of 8, chunk j is chunk 0
        // moved down j * ROW_STEP rows.
        const unsigned d = ROW_STEP % 8 == 0 ? dst + (unsigned)(j * ROW_STEP * Tile::ROW_BYTES)
                                             : Tile::offset_bytes(row0 + j * ROW_STEP, col);
        const f16_bits* from = K_CONTIG && crossed(j) ? p + crossed(j) * up_step : p;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(stage + d), "l"(from), "r"(valid ? 16 : 0) : "memory");
        p += row_stride;
      }
      src += tile_step;
      k_next += BK;
    }
  };

  // Where one lane's ldmatrix rows sit in a stage, worked out once. Fragment f (the f-th
  // 16-row block of the warp's M or N) at k step kk is at
  //   K-contiguous:  row_bytes + f * 16 * BK * 2    + (((kk >> 3) ^ x) << 4)
  //   MN-contiguous: row_bytes + kk * TILE_MN * 2   + (((w8 + 2 f) ^ x) << 4)
  // since every term of the row other than the lane's r = lane % 8 is a multiple of 8.
  // `mn_half` / `k_half`: which 8 rows of M (or N) and which 8 of K this lane's matrix
  // of the ldmatrix.x4 covers (A and B order their four matrices differently).
  struct Fragments {
    unsigned row_bytes;
    int x, w8;

    __device__ __forceinline__ Fragments(int mn_warp_base, int lane, int mn_half, int k_half) {
      const int r = lane & 7;
      if (K_CONTIG) {
        row_bytes = (unsigned)((mn_warp_base + r + 8 * mn_half) * BK * 2);
        x = k_half ^ Tile::phase(r);
        w8 = 0;
      } else {
        row_bytes = (unsigned)((r + 8 * k_half) * TILE_MN * 2);
        x = mn_half ^ Tile::phase(r);
        w8 = mn_warp_base / 8;
      }
    }
    __device__ __forceinline__ unsigned at(unsigned stage, int f, int kk) const {
      return K_CONTIG ? stage + row_bytes + (unsigned)(f * 16 * BK * 2) + (unsigned)(((kk >> 3) ^ x) << 4)
                      : stage + row_bytes + (unsigned)(kk * TILE_MN * 2) + (unsigned)(((w8 + 2 * f) ^ x) << 4);
    }
  };
};
