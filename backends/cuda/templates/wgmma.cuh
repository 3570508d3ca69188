// ---------------------------------------------------------------------------
// wgmma from 128B-swizzled shared memory: what both families that issue it share
// (hopper_ws.cu fills its ring by TMA, multistage.cu by cp.async; the layout is one).
//
// An operand tile is TILE_MN x BK (BK = 64 fp16, one 128-byte swizzle atom along K):
//  K-contiguous: row mn is 128 bytes at mn * 128, its 16-byte chunk c stored at chunk
//    c ^ (mn % 8); 8-row core groups 1024 B apart (SBO); LBO unused. Step kk * 16 along
//    K = +32 B inside the atom.
//  MN-contiguous: TILE_MN / 64 boxes of 64 (MN) x BK (K), each 64 * BK * 2 bytes; inside a
//    box k row r is 128 bytes at r * 128, chunk c at c ^ (r % 8); 8-row groups along K are
//    1024 B apart (SBO), 64-wide MN blocks one box apart (LBO). Step kk * 16 along K = +16
//    rows.
// ---------------------------------------------------------------------------

// Shared-memory matrix descriptor (128-byte swizzle): start address >> 4 in bits
// 0-13, leading byte offset >> 4 in bits 16-29, stride byte offset >> 4 in bits 32-45,
// base offset 0 (every swizzle atom is 1024-byte aligned), layout 1 = 128B swizzle
// in bits 62-63.
__device__ __forceinline__ unsigned long long smem_descriptor(unsigned addr, unsigned lbo, unsigned sbo) {
  unsigned long long desc = (unsigned long long)((addr & 0x3FFFF) >> 4);
  desc |= (unsigned long long)((lbo & 0x3FFFF) >> 4) << 16;
  desc |= (unsigned long long)((sbo & 0x3FFFF) >> 4) << 32;
  desc |= 1ull << 62;
  return desc;
}

#define WGMMA_BOX_BYTES (64u * BK * 2u)

// The descriptor of rows [mn_offset, + the instruction's M or N) at k step kk of a stage.
template <bool K_CONTIG>
__device__ __forceinline__ unsigned long long wgmma_descriptor(unsigned stage, int mn_offset, int kk) {
  if (K_CONTIG) return smem_descriptor(stage + mn_offset * (BK * 2) + kk * 32, 16, 1024);
  return smem_descriptor(stage + (mn_offset / 64) * WGMMA_BOX_BYTES + kk * 16 * 128, WGMMA_BOX_BYTES, 1024);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }

WGMMA_FUNCTION
