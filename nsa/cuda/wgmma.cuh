// Hopper warpgroup matrix products (wgmma, sm_90a) for the NSA tensor-core kernels.
//
// A warpgroup (4 consecutive warps, 128 threads) computes D[64][N] (+)= A[64][16] B[16][N]:
//   A from registers: warp w holds rows 16w..16w+15 in the layout of mma.sync.m16n8k16's A
//     fragment (a[0]: row lane/4, cols 2(lane%4)+{0,1}; a[1]: row +8; a[2]: cols +8;
//     a[3]: row +8, cols +8), so fragments built for mma.sync (ldmatrix, packed accumulators)
//     serve as they are;
//   B from shared memory through a matrix descriptor;
//   D fp32 in registers, warp w rows 16w.., d[i][0..3] the m16n8 accumulator of columns
//     8i..8i+7 (d[i][0], d[i][1]: row lane/4, cols 8i + 2(lane%4) + {0,1}; d[i][2], d[i][3]:
//     row lane/4 + 8), the layout of mma.sync's C fragments side by side.
//
// Shared tiles: R rows of DP bf16 (keys, or query rows), element (r, c) at byte
// tile_offset<DP, R>(r, c / 8) + 2 (c % 8): each 16-byte chunk of a row (one cp.async) has its
// own place (ldmatrix reads the same tiles with per-lane addresses). One tile serves as B both
// ways (the PTX ISA's canonical layouts, no swizzle at DP = 32, the 128-byte swizzle above):
//   K-major (B = X^T: rows are B's N, dims its K; S = Q K^T, dP = dO V^T): kmajor_desc(tile,
//     kk) for dims kk * 16 ..;
//   MN-major (B = X: rows are B's K, dims its N; O += P V, dQ += dS K, dV += P^T dO):
//     mnmajor_desc(tile, kr) for rows kr * 16 .., with the instruction's B-transpose bit set.
// A K-major tile also serves as A from shared memory (the key side's keys and values, the row
// backward's query and d_out rows: SharedRowsA).
// Order: shared memory written by cp.async or ordinary stores needs fence_proxy_async() in the
// writing threads before the barrier that precedes the products; pin() on the batch's
// accumulators and A fragments, then fence() (their registers were written by ordinary
// instructions), the products, commit() after them, and wait(acc) before the accumulators are
// read (it also keeps the compiler from reading them earlier). Tested against a CPU product
// for both majors, N = 32, 64, 128, both tile layouts and A from registers or shared memory by
// tests/nsa_cuda/test_wgmma.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

// 1 in device code compiled for sm_90a (wgmma exists), else 0 (the kernels use mma.sync).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NSATRON_WGMMA 1
#else
#define NSATRON_WGMMA 0
#endif

namespace nsatron::nsa::cuda::wg {

// Byte offset of 16-byte chunk ch of row r in a shared tile of R rows x DP bf16 (the tile's
// base 1024-byte aligned). DP = 32: no swizzle, 8x8 core matrices of 128 contiguous bytes,
// (r / 8) DP 16 + ch 128 + (r % 8) 16. DP = 64, 128: the 128-byte swizzle, per 64-dim half of
// the rows (half h = ch / 8 at h R 128): rows of 128 bytes, 8-row groups of 1024 bytes, the
// 16-byte chunk c = ch % 8 of row r at chunk c XOR (r % 8) of its row (so that the 8 rows of a
// core matrix, and the chunks a product reads together, fall in different banks).
template <int DP, int R>
__host__ __device__ __forceinline__ int tile_offset(int r, int ch) {
  if constexpr (DP == 32) return (r >> 3) * (DP * 16) + ch * 128 + (r & 7) * 16;
  else return (ch >> 3) * (R * 128) + (r >> 3) * 1024 + (r & 7) * 128 + (((ch & 7) ^ (r & 7)) << 4);
}
// Byte offset of row r0 (a multiple of 8) within each half: a tile of the rows from r0 on.
template <int DP>
__host__ __device__ __forceinline__ int row_group_offset(int r0) {
  return DP == 32 ? (r0 >> 3) * (DP * 16) : (r0 >> 3) * 1024;
}

#if NSATRON_WGMMA
// A tile's start address as the descriptor holds it: its shared-window address (below 2^18:
// a block's shared memory on sm_90 is at most 227 KB) in 16-byte units.
__device__ __forceinline__ std::uint32_t desc_addr(const void* smem) {
  return (static_cast<std::uint32_t>(__cvta_generic_to_shared(smem)) & 0x3FFFFu) >> 4;
}
// The descriptor of the matrix at byte off of the tile whose desc_addr is a16. LBO, SBO: the
// leading and stride byte offsets; SW: 0 no swizzle, 1 the 128-byte swizzle (bits 62-63). The
// fields other than the address are constants and the address (a16 + off / 16 < 2^14, bits
// 0-13) a sum, so the descriptors of one tile's k steps cost an add each once the compiler has
// the tile's a16. (Built from the pointer each time, masks and shifts included, their lines
// held ~8% of the row backward's stall samples at D = 128; built this way the kernel was only
// ~1% faster: docs/performance.md, 2026-11-27.)
template <std::uint32_t LBO, std::uint32_t SBO, std::uint32_t SW>
__device__ __forceinline__ std::uint64_t desc_at(std::uint32_t a16, std::uint32_t off) {
  constexpr std::uint32_t hi = ((SBO >> 4) & 0x3FFFu) | (SW << 30);
  constexpr std::uint32_t lo = ((LBO >> 4) & 0x3FFFu) << 16;
  return (std::uint64_t(hi) << 32) | (a16 + (off >> 4) + lo);
}
// K-major B (rows are its N, dims its K), dims kk * 16 ..: no swizzle, LBO 128 B between the
// two 8-dim core matrices, SBO DP 16 B between 8-row groups; swizzled, the k step's 32 bytes
// within the 128-byte rows of its half (the hardware applies the XOR), SBO 1024 B.
template <int DP, int R>
__device__ __forceinline__ std::uint64_t kmajor_desc(const void* tile, int kk) {
  const std::uint32_t a16 = desc_addr(tile);
  if constexpr (DP == 32) return desc_at<128u, DP * 16u, 0>(a16, kk * 256);
  else return desc_at<16u, 1024u, 1>(a16, (kk >> 2) * (R * 128) + (kk & 3) * 32);
}
// MN-major B (rows are its K, dims its N), rows kr * 16 ..: no swizzle, LBO DP 16 B between the
// two 8-row halves, SBO 128 B between 8-dim groups; swizzled, LBO R 128 B between the 64-dim
// halves, SBO 1024 B between 8-row groups.
template <int DP, int R>
__device__ __forceinline__ std::uint64_t mnmajor_desc(const void* tile, int kr) {
  const std::uint32_t a16 = desc_addr(tile);
  if constexpr (DP == 32) return desc_at<DP * 16u, 128u, 0>(a16, kr * 2 * DP * 16);
  else return desc_at<R * 128u, 1024u, 1>(a16, kr * 2048);
}

// A from shared memory for the warpgroup's 64 rows: a K-major tile of 64 rows x DP (the row
// kernel's query and d_out rows); a[kk] is the descriptor of dims kk * 16 .., so that a product
// written as mma(d, a[kk], b) takes registers or this alike. Nothing to pin (pin below).
template <int DP>
struct SharedRowsA {
  const void* tile;
  __device__ __forceinline__ std::uint64_t operator[](int kk) const { return kmajor_desc<DP, 64>(tile, kk); }
};

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Waits until at most N of the warpgroup's committed product groups are pending (the newest
// N, left running), then pins d: later reads depend on this point (the compiler sees the
// product asm as done at issue).
template <int N, int NT>
__device__ __forceinline__ void wait_pending(float (&d)[NT][4]) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
// Waits for every committed product of the warpgroup, then pins d.
template <int NT>
__device__ __forceinline__ void wait(float (&d)[NT][4]) {
  wait_pending<0>(d);
}
// Waits for every committed product group but the newest one (a product issued after d's,
// left running), then pins d.
template <int NT>
__device__ __forceinline__ void wait_all_but_newest(float (&d)[NT][4]) {
  wait_pending<1>(d);
}
// Pins registers at this point of the program: the instructions that write them (the zeroing
// of accumulators, a rescale, the packing of A fragments) complete before it. Call on every
// accumulator and A fragment of a batch before its fence(): the compiler may otherwise move
// such register writes past the fence (it orders only memory and other asm), and a product
// would then read registers written after its wgmma.fence.
template <int NT>
__device__ __forceinline__ void pin(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
__device__ __forceinline__ void pin(std::uint32_t (&a)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[e])::"memory");
}
template <int NA>
__device__ __forceinline__ void pin(std::uint32_t (&a)[NA][4]) {
#pragma unroll
  for (int i = 0; i < NA; ++i) pin(a[i]);
}
template <int DP>
__device__ __forceinline__ void pin(const SharedRowsA<DP>&) {}  // shared memory: no registers

// d (+)= a B for N = 32, 64, 128 (scale_d 0: d = a B). TNSP: 0 K-major B, 1 MN-major B.
// (Operand lists written out by a generator: one asm per instruction shape.) N = 32 acts on
// d[OFF..OFF+3], the columns 8 OFF .. 8 OFF + 31 of a possibly wider accumulator (OFF = 0 and
// NT = 4: the whole of it; kSplitS in the row kernel uses the offset).
template <int TNSP, int OFF, int NT>
__device__ __forceinline__ void mma_rs_n32_at(float (&d)[NT][4], const std::uint32_t (&a)[4],
                                              std::uint64_t b, int scale_d = 1) {
  static_assert(OFF + 4 <= NT, "columns in range");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
      : "+f"(d[OFF + 0][0]), "+f"(d[OFF + 0][1]), "+f"(d[OFF + 0][2]), "+f"(d[OFF + 0][3]),
        "+f"(d[OFF + 1][0]), "+f"(d[OFF + 1][1]), "+f"(d[OFF + 1][2]), "+f"(d[OFF + 1][3]),
        "+f"(d[OFF + 2][0]), "+f"(d[OFF + 2][1]), "+f"(d[OFF + 2][2]), "+f"(d[OFF + 2][3]),
        "+f"(d[OFF + 3][0]), "+f"(d[OFF + 3][1]), "+f"(d[OFF + 3][2]), "+f"(d[OFF + 3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TNSP));
}

// The 32 accumulator operands of an m64n64 product (d[8][4]), each with constraint DC ("+f" or
// "=f"), for the asm macros below.
#define NSATRON_WG_D32(DC)                                                                          \
  DC(d[0][0]), DC(d[0][1]), DC(d[0][2]), DC(d[0][3]), DC(d[1][0]), DC(d[1][1]), DC(d[1][2]),         \
      DC(d[1][3]), DC(d[2][0]), DC(d[2][1]), DC(d[2][2]), DC(d[2][3]), DC(d[3][0]), DC(d[3][1]),     \
      DC(d[3][2]), DC(d[3][3]), DC(d[4][0]), DC(d[4][1]), DC(d[4][2]), DC(d[4][3]), DC(d[5][0]),     \
      DC(d[5][1]), DC(d[5][2]), DC(d[5][3]), DC(d[6][0]), DC(d[6][1]), DC(d[6][2]), DC(d[6][3]),     \
      DC(d[7][0]), DC(d[7][1]), DC(d[7][2]), DC(d[7][3])

// The 64 accumulator operands of an m64n128 product (d[16][4]), as the asm names them and as
// its operand list gives them.
#define NSATRON_WG_D64_ASM                                                                          \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                            \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define NSATRON_WG_D64(DC)                                                                          \
  DC(d[0][0]), DC(d[0][1]), DC(d[0][2]), DC(d[0][3]), DC(d[1][0]), DC(d[1][1]), DC(d[1][2]),         \
      DC(d[1][3]), DC(d[2][0]), DC(d[2][1]), DC(d[2][2]), DC(d[2][3]), DC(d[3][0]), DC(d[3][1]),     \
      DC(d[3][2]), DC(d[3][3]), DC(d[4][0]), DC(d[4][1]), DC(d[4][2]), DC(d[4][3]), DC(d[5][0]),     \
      DC(d[5][1]), DC(d[5][2]), DC(d[5][3]), DC(d[6][0]), DC(d[6][1]), DC(d[6][2]), DC(d[6][3]),     \
      DC(d[7][0]), DC(d[7][1]), DC(d[7][2]), DC(d[7][3]), DC(d[8][0]), DC(d[8][1]), DC(d[8][2]),     \
      DC(d[8][3]), DC(d[9][0]), DC(d[9][1]), DC(d[9][2]), DC(d[9][3]), DC(d[10][0]), DC(d[10][1]),   \
      DC(d[10][2]), DC(d[10][3]), DC(d[11][0]), DC(d[11][1]), DC(d[11][2]), DC(d[11][3]),            \
      DC(d[12][0]), DC(d[12][1]), DC(d[12][2]), DC(d[12][3]), DC(d[13][0]), DC(d[13][1]),            \
      DC(d[13][2]), DC(d[13][3]), DC(d[14][0]), DC(d[14][1]), DC(d[14][2]), DC(d[14][3]),            \
      DC(d[15][0]), DC(d[15][1]), DC(d[15][2]), DC(d[15][3])

// The m64n64k16 bf16 product with A from registers; DC "+f" accumulates into d (scale_d), "=f"
// writes it (scale_d 0: mma_rs_n64_overwrite).
#define NSATRON_WG_RS_N64(DC)                                                                        \
  asm volatile(                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "                                        \
      "{"                                                                                            \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                        \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"               \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                              \
      : NSATRON_WG_D32(DC)                                                                          \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TNSP))

template <int TNSP>
__device__ __forceinline__ void mma_rs_n64(float (&d)[8][4], const std::uint32_t (&a)[4],
                                              std::uint64_t b, int scale_d) {
  NSATRON_WG_RS_N64("+f");
}

template <int TNSP>
__device__ __forceinline__ void mma_rs_n128(float (&d)[16][4], const std::uint32_t (&a)[4],
                                              std::uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      NSATRON_WG_D64_ASM
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : NSATRON_WG_D64("+f")
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(TNSP));
}

// d (+)= A B with A [64][16] K-major in shared memory too (a: its descriptor); N = 32 and 64
// (the key side's row groups: key_group_rows).
template <int TNSP>
__device__ __forceinline__ void mma_ss_n32(float (&d)[4][4], std::uint64_t a, std::uint64_t b,
                                              int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, %19;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a), "l"(b), "r"(scale_d), "n"(TNSP));
}

template <int N, int TNSP>
__device__ __forceinline__ void mma(float (&d)[N / 8][4], const std::uint32_t (&a)[4],
                                    std::uint64_t b, int scale_d = 1) {
  if constexpr (N == 32) mma_rs_n32_at<TNSP, 0>(d, a, b, scale_d);
  else if constexpr (N == 64) mma_rs_n64<TNSP>(d, a, b, scale_d);
  else mma_rs_n128<TNSP>(d, a, b, scale_d);
}
// m64n64k16 with A and B from shared tiles; ETYPE "bf16" or "f16" (the instruction's operand
// type, both operands); DC the accumulator's constraint: "+f" (d read and written) or "=f" (d
// written only: scale_d 0). One asm statement per type, written out once here.
#define NSATRON_WG_SS_N64(ETYPE, DC)                                                                 \
  asm volatile(                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." ETYPE "." ETYPE " "                               \
      "{"                                                                                            \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                        \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"               \
      "}, %32, %33, p, 1, 1, 0, %35;\n}\n"                                                            \
      : NSATRON_WG_D32(DC)                                                                          \
      : "l"(a), "l"(b), "r"(scale_d), "n"(TNSP))

// F16: fp16 operands (the compression forward's scaled hi + lo parts), else bf16.
template <int TNSP, bool F16 = false>
__device__ __forceinline__ void mma_ss_n64(float (&d)[8][4], std::uint64_t a, std::uint64_t b,
                                              int scale_d) {
  if constexpr (F16) NSATRON_WG_SS_N64("f16", "+f");
  else NSATRON_WG_SS_N64("bf16", "+f");
}
// d = A B (scale_d 0), operands from shared memory (F16: fp16, else bf16), d an output only:
// no instruction need zero it, and the compiler copies nothing into its registers for the
// product (copies that it may place after the batch's fence; and ordinary instructions that
// write a product's accumulators while another product runs make ptxas serialise every
// product, C7515). A tile's first product in cmp_select_kernel's pipelined pass 1
// (select_tc.cuh) and in the row backward's deferred-dq schedule (attention_tc.cuh).
template <int TNSP, bool F16 = false>
__device__ __forceinline__ void mma_ss_n64_overwrite(float (&d)[8][4], std::uint64_t a, std::uint64_t b) {
  const int scale_d = 0;
  if constexpr (F16) NSATRON_WG_SS_N64("f16", "=f");
  else NSATRON_WG_SS_N64("bf16", "=f");
}
template <int TNSP>
__device__ __forceinline__ void mma_f16_overwrite(float (&d)[8][4], std::uint64_t a, std::uint64_t b) {
  mma_ss_n64_overwrite<TNSP, true>(d, a, b);
}
#undef NSATRON_WG_SS_N64

// d = a B (scale_d 0) with A from registers, N = 64: as mma_ss_n64_overwrite.
template <int TNSP>
__device__ __forceinline__ void mma_rs_n64_overwrite(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  const int scale_d = 0;
  NSATRON_WG_RS_N64("=f");
}
#undef NSATRON_WG_RS_N64
#undef NSATRON_WG_D32
// d = a B, N = 64, overwriting d: a from registers or a shared tile's descriptor.
template <int TNSP>
__device__ __forceinline__ void mma_overwrite(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b) {
  mma_rs_n64_overwrite<TNSP>(d, a, b);
}
template <int TNSP>
__device__ __forceinline__ void mma_overwrite(float (&d)[8][4], std::uint64_t a, std::uint64_t b) {
  mma_ss_n64_overwrite<TNSP>(d, a, b);
}

// m64n128k16 with A and B from shared tiles (the warp-specialised forward's scores over 128-key
// tiles, its query rows read from shared memory to keep their registers free).
template <int TNSP>
__device__ __forceinline__ void mma_ss_n128(float (&d)[16][4], std::uint64_t a, std::uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      NSATRON_WG_D64_ASM
      "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : NSATRON_WG_D64("+f")
      : "l"(a), "l"(b), "r"(scale_d), "n"(TNSP));
}

#undef NSATRON_WG_D64
#undef NSATRON_WG_D64_ASM

template <int N, int TNSP>
__device__ __forceinline__ void mma(float (&d)[N / 8][4], std::uint64_t a, std::uint64_t b,
                                    int scale_d = 1) {
  static_assert(N == 32 || N == 64 || N == 128, "shared-A products: N = 32, 64 or 128");
  if constexpr (N == 32) mma_ss_n32<TNSP>(d, a, b, scale_d);
  else if constexpr (N == 64) mma_ss_n64<TNSP>(d, a, b, scale_d);
  else mma_ss_n128<TNSP>(d, a, b, scale_d);
}

// fp16 operands, A and B in shared memory (the fused compression + selection's scores).
template <int TNSP>
__device__ __forceinline__ void mma_f16(float (&d)[8][4], std::uint64_t a, std::uint64_t b,
                                        int scale_d = 1) {
  mma_ss_n64<TNSP, true>(d, a, b, scale_d);
}
#endif  // NSATRON_WGMMA

}  // namespace nsatron::nsa::cuda::wg
