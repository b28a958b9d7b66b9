// Tensor-core row side of the branch attention (bf16 storage only; included by attention.cu).
//
// A block of 4 warps owns 64 consecutive query rows of the flattened (position, head) order
// of one (batch, group), 16 per warp, and the block's warps share every key tile (see
// row_kernel below for the key sets of the selection and window branches). The rows come from
// padded bf16 copies of the rotated queries and of d_out [B, T, H, DP] (RowArgs::tcq, tcdo),
// the keys from a padded bf16 copy [B, T, G, DP] (RoPE already applied, zeros past D: see pad_kernel),
// staged 64 keys at a time in shared memory with cp.async (row_stages), in the tile layout
// of wgmma.cuh (128-byte swizzle at padded D = 64, 128). Products (bf16 in, fp32 accumulate)
// are warpgroup products, wgmma, where the build is for sm_90a (CMAKE_CUDA_ARCHITECTURES 90a,
// the default): the block's 4 warps are one warpgroup, each warp's 16 rows are the rows of
// the 64-row products that it holds, B read from the shared tiles by the tensor cores (once
// per warpgroup, not once per warp as ldmatrix fragments), A (Q, dO, P, dS) from registers in
// mma.sync's fragment layout; elsewhere mma.sync m16n8k16 with ldmatrix fragments of the
// same tiles. The products are the same sums either way:
//   forward   S = Q K^T, online softmax in fp32 (exp2 domain), O += P V (P rounded to bf16),
//             O / l and lse = m + log(l) written as the fp32 kernel does;
//   backward  one pass over the keys for dq: S = Q K^T, dP = dO V^T, p = exp(scale s - lse),
//             dS = p (dP - lsum) in fp32, rounded to bf16 (hi + lo at padded D = 32,
//             row_ds_parts), A += dS K; dq (+)= scale g A, with
//             lsum = do . o_c per row from the saved fp32 branch output, summed in the
//             prologue (RowArgs::o_dot, padded D <= 64) or given (RowArgs::dot_in: from
//             branch_dot_kernel at padded D = 128; dense attention's from its bf16 output).
//             Without either a first pass computes
//             lsum += p dP (fp32) over the same tiles and writes delta = g lsum and dgate;
//             the compression branch's first pass (padded D <= 64) computes its own lse (see
//             the launcher) and lsum with it online (sum p~ dP rescaled as the row sum l is,
//             over l); at padded D = 128 it makes one pass with do . o_c and corrects it at the
//             end (the row sums S0 = sum p~, S1 = sum p~ dP, the row's most probable key and
//             RowArgs::cmp_ref's mean of the visible keys: see there).
//             (One pass with A = sum p dP k and B = sum p k, dq ~ A - lsum B as the fp32
//             kernel does, cancels badly once P and dP are rounded to bf16: with one key,
//             dq = 0 exactly but A - lsum B keeps the rounding error of dP.)
// Every output element is written by one thread after a fixed sequence of products: the
// results are deterministic. With wgmma a block skips a key tile only when none of its rows
// sees it (the products are block-wide); mma.sync skips per warp.
// Included inside namespace nsatron::nsa::cuda::detail::{anonymous} of attention.cu.
#pragma once

namespace tc {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// hi = bf16(lo_in, hi_in) packed, lo = the rounding residuals packed.
__device__ __forceinline__ void split2(float x0, float x1, std::uint32_t& hi, std::uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const std::uint32_t*>(&h);
  lo = *reinterpret_cast<const std::uint32_t*>(&l);
}

__device__ __forceinline__ void mma(float* c, const std::uint32_t* a, std::uint32_t b0,
                                    std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm4(std::uint32_t* r, const bf16* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldsm4t(std::uint32_t* r, const bf16* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void cp16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
// cp16 and cp4 where a < b, zeros elsewhere (cp.async's ignore-src predicate: no source bytes
// are read). cp16's src-size register cost the key side's copy issue three instructions from
// the row's sign bit and a compare per chunk; this is one compare with an immediate.
__device__ __forceinline__ void cp16_lt(void* smem, const void* gmem, int a, int b) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("{\n .reg .pred ig;\n setp.ge.s32 ig, %2, %3;\n cp.async.cg.shared.global [%0], [%1], 16, ig;\n}\n" ::"r"(s),
               "l"(gmem), "r"(a), "r"(b));
}
__device__ __forceinline__ void cp4_lt(void* smem, const void* gmem, int a, int b) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("{\n .reg .pred ig;\n setp.ge.s32 ig, %2, %3;\n cp.async.ca.shared.global [%0], [%1], 4, ig;\n}\n" ::"r"(s),
               "l"(gmem), "r"(a), "r"(b));
}
// p, as a value the compiler cannot take apart: an address computed as p + i * stride stays one
// wide multiply-add, not the parts of p re-added to every i * stride.
template <class T>
__device__ __forceinline__ const T* opaque(const T* p) {
  asm("" : "+l"(p));
  return p;
}
// 4-byte form (zeros where !valid), for per-row statistics.
__device__ __forceinline__ void cp4(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_wait0() { asm volatile("cp.async.wait_group 0;\n" ::); }

// A fragments (16 rows x 16 dims at column k0) of a row-major [16][STR] shared array.
template <int STR>
__device__ __forceinline__ void frag_a(std::uint32_t* r, const bf16* base, int k0, int lane) {
  ldsm4(r, base + (lane & 15) * STR + k0 + (lane >> 4) * 8);
}
// B fragments of X^T for two n-tiles (keys n0..n0+15) at dims k0..k0+15, X = [key][dim]:
// r[0], r[1] for keys n0..n0+7, r[2], r[3] for n0+8..n0+15.
template <int STR>
__device__ __forceinline__ void frag_bt(std::uint32_t* r, const bf16* base, int n0, int k0,
                                        int lane) {
  ldsm4(r, base + (n0 + (lane >> 4) * 8 + (lane & 7)) * STR + k0 + ((lane >> 3) & 1) * 8);
}
// B fragments of X for keys k0..k0+15 and two n-tiles of dims n0..n0+15, X = [key][dim].
template <int STR>
__device__ __forceinline__ void frag_b(std::uint32_t* r, const bf16* base, int k0, int n0,
                                       int lane) {
  ldsm4t(r, base + (k0 + (lane & 15)) * STR + n0 + (lane >> 4) * 8);
}
// The same fragments from a shared tile of DP dims per row (wgmma.cuh layout: the row and key
// kernels' shared key, value and row tiles), for the mma.sync path.
template <int DP, int R>
__device__ __forceinline__ const bf16* tile_at(const bf16* tile, int r, int ch) {
  return reinterpret_cast<const bf16*>(reinterpret_cast<const char*>(tile) + wg::tile_offset<DP, R>(r, ch));
}
// A fragments of rows m0..m0+15 (dims k0..k0+15) of a tile.
template <int DP, int R>
__device__ __forceinline__ void tile_frag_a(std::uint32_t* r, const bf16* tile, int m0, int k0, int lane) {
  ldsm4(r, tile_at<DP, R>(tile, m0 + (lane & 15), k0 / 8 + (lane >> 4)));
}
template <int DP, int R>
__device__ __forceinline__ void tile_frag_bt(std::uint32_t* r, const bf16* tile, int n0, int k0,
                                             int lane) {
  ldsm4(r, tile_at<DP, R>(tile, n0 + (lane >> 4) * 8 + (lane & 7), k0 / 8 + ((lane >> 3) & 1)));
}
template <int DP, int R>
__device__ __forceinline__ void tile_frag_b(std::uint32_t* r, const bf16* tile, int k0, int n0,
                                            int lane) {
  ldsm4t(r, tile_at<DP, R>(tile, k0 + (lane & 15), n0 / 8 + (lane >> 4)));
}

// Padded bf16 copy: dst[row][0..DP) = (rope ? RoPE(src row, pos) : src row), zeros past D.
// Rows are (b, s, g) with s < NK, position b * NK + s's source rows at src + that * pitch
// (G * D: contiguous); the RoPE position of key s is s (tokens). With parts > 1,
// also the rounding residuals, part p at dst + p * rows * DP: part p = bf16(x - the parts
// before it), so 2 parts carry ~16 significant bits and 3 parts ~24 (fp32). One thread per 8
// elements of a row (one 16-byte store per part). Where the row is bf16 with no padding and its
// 8 elements, their partners half away and their table entries are 16-byte aligned (the q,
// d_out and key copies of the paper and 125M shapes), they come by 16-byte loads and the index
// arithmetic is 32-bit: the general loop's 2-byte loads and 64-bit divisions held these copies
// at ~1.8 TB/s (1.1 ms per copy of q at the paper's 64k; docs/performance.md, tenth session).
// The same values either way.
__device__ __forceinline__ void bf16x8_to_float(const uint4 w, float (&v)[8]) {  // by value: one 16-byte load
  const std::uint32_t* wp = &w.x;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(wp + e));
    v[2 * e] = f.x;
    v[2 * e + 1] = f.y;
  }
}
template <class S>
__global__ void pad_kernel(const S* __restrict__ src, bf16* __restrict__ dst,
                           int parts, const float2* __restrict__ rope,
                           std::int64_t rows, int NK, FastDiv G, int D, int DP, std::int64_t pitch) {
  const int half = D / 2, chunks = DP / 8;
  const std::int64_t total = rows * chunks;
  auto store_parts = [&](float (&v)[8], std::int64_t row, int d0) {
    for (int p = 0; p < parts; ++p) {
      uint4 w;
      std::uint32_t* wp = &w.x;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const __nv_bfloat162 part = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
        wp[e] = *reinterpret_cast<const std::uint32_t*>(&part);
        const float2 pf = __bfloat1622float2(part);
        v[2 * e] -= pf.x;
        v[2 * e + 1] -= pf.y;
      }
      *reinterpret_cast<uint4*>(dst + p * rows * DP + row * DP + d0) = w;
    }
  };
  if constexpr (std::is_same_v<S, bf16>) {
    const bool vec = D == DP && half % 8 == 0 && total < (std::int64_t(1) << 30) && pitch % 8 == 0 &&
                     (reinterpret_cast<std::uintptr_t>(src) & 15u) == 0 &&
                     (reinterpret_cast<std::uintptr_t>(rope) & 15u) == 0;
    // The contiguous rows' loop as it was before pitches (a branch per 8 elements before their
    // loads cost these copies 19%, docs/performance.md, thirteenth session), the pitched one apart.
    auto rows = [&](auto contiguous) {
      for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < int(total); idx += gridDim.x * blockDim.x) {
        const int row = idx / chunks, d0 = (idx - row * chunks) * 8;
        const int pos = decltype(contiguous)::value ? row / G.d : G.div(row);
        const S* x = src + (decltype(contiguous)::value ? std::int64_t(row) * D
                                                        : std::int64_t(pos) * pitch + (row - pos * G.d) * D);
        float v[8];
        bf16x8_to_float(*reinterpret_cast<const uint4*>(x + d0), v);
        if (rope) {
          const bool lo = d0 < half;
          const int i0 = lo ? d0 : d0 - half;
          float xp[8];
          bf16x8_to_float(*reinterpret_cast<const uint4*>(x + (lo ? d0 + half : d0 - half)), xp);
          const float4* c4 = reinterpret_cast<const float4*>(rope + std::int64_t(pos % NK) * half + i0);
#pragma unroll
          for (int e2 = 0; e2 < 4; ++e2) {
            const float4 c = c4[e2];
            v[2 * e2] = rope_pair(v[2 * e2], xp[2 * e2], make_float2(c.x, c.y), lo);
            v[2 * e2 + 1] = rope_pair(v[2 * e2 + 1], xp[2 * e2 + 1], make_float2(c.z, c.w), lo);
          }
        }
        store_parts(v, row, d0);
      }
    };
    if (vec) {
      if (pitch == std::int64_t(G.d) * D)
        rows(std::true_type{});
      else
        rows(std::false_type{});
      return;
    }
  }
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = idx / chunks;
    const int d0 = int(idx - row * chunks) * 8;
    const S* x = src + pitched(row, G, pitch, D);
    const float2* cs = rope ? rope + std::int64_t((row / G.d) % NK) * half : nullptr;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int dd = d0 + e;
      v[e] = dd < D ? (rope ? rope_elem(x, dd, half, cs) : ldf(x[dd])) : 0.f;
    }
    store_parts(v, row, d0);
  }
}

template <int BR>
__device__ __forceinline__ bool kmask(const Geo& g, int t, int s) {
  if constexpr (BR == kWin) return s <= t && s > t - g.w;
  if constexpr (BR == kCmp) return s * g.d + g.l - 1 <= t;
  return s <= t;
}

// ---- Tensor-core row side: a block of kRowsPerBlock query rows sharing every key tile -------
//
// A block of W = 4 warps owns 64 consecutive rows of the flattened (position, head) order of
// one (batch, group), i.e. the heads of up to 64 consecutive positions; each warp owns 16 of
// them. Key tiles of KT = 64 keys are staged once per block in shared memory (cp.async, double
// buffered with two barriers per tile; the forward at padded D = 128 triple buffered with one:
// row_stages) and serve every warp, so each key is read from L2 once per 64 rows instead of
// once per 16.
//   window:    the keys [t_first - w + 1, t_last] of the block's positions;
//   compression: the compressed keys [0, N_t_last) (backward only, bf16: the forward's fp32
//              kernel gives the lse the selection needs);
//   selection: the union over the block's positions of their selected blocks, as 64-aligned
//              key tiles (a bitmask over tiles, walked in ascending order); per tile and
//              position a 64-bit mask of the keys that position may see (its selected blocks,
//              s <= t), built when the tile is issued.
// A warp skips a tile none of its rows may see (the online softmax state is unchanged), so a
// small group (h < 16) no longer pads a 16-row tile with empty rows, and positions that chose
// different blocks cost only the shared loads of the tiles they do not use.
// Warps per block. Measured on an H100 (docs/performance.md, 2026-11-24) with 1, 2 and 4
// warps for the selection at h = 1..16 (T = 8192, D = 128) and at the 125M shape: 4 was the
// fastest at every group size (sharing the key tiles outweighs the barrier coupling of warps
// whose positions chose different blocks).
constexpr int kRowWarps = 4;

// Selection: threads per position that build its key mask of a tile (each over every
// kMaskParts-th of its selected blocks), so that every thread of the block takes part.
constexpr int kMaskParts = kRowWarps * 32 / (16 * kRowWarps);

template <int DP>
struct RowCfg {
  static constexpr int KT = 64;        // keys per shared tile
  static constexpr int STR = DP + 8;   // bf16 per shared row (16 B pad: no bank conflicts)
};

struct RowSmem {  // byte offsets of the dynamic shared memory of row_kernel
  std::size_t q, ql, o, k, v, kmask, selp, tbits, total;
};
// Parts of each key and value tile of the row kernel: the compression backward's fp32 keys and
// values up to padded D = 64 (cmp_kv_parts), the window branch's rotated keys at padded D = 32
// (win_score_parts); one otherwise. Every product with them is the sum of the parts' products.
template <int DP, int BR, bool BWD>
constexpr int row_kv_parts() {
  return BR == kCmp ? (BWD ? cmp_kv_parts(DP) : 1) : (BR == kWin ? win_score_parts(DP) : 1);
}
// Parts of the rotated queries in the row kernel's scores (win_score_parts).
template <int DP, int BR>
constexpr int row_q_parts() {
  return BR == kWin ? win_score_parts(DP) : 1;
}
// Shared stages of the key and value tiles. The forward at padded D = 128 takes three (one
// barrier per tile; the tile whose P V product runs under the next tile's softmax, the
// current tile, the next one in flight: row_kernel's kDefer): its query rows are read once,
// into registers, before the first tile, so they are staged where the third stage's tiles go
// (row_smem) and its two blocks per SM still fit. The backward and every kernel at smaller D
// take two (three would cost a block per SM at smaller D); the backward at D = 128 gives its
// key tiles a third (row_defers_dq).
template <int DP, bool BWD>
constexpr int row_stages() {
  return !BWD && DP == 128 ? 3 : 2;
}
// The backward at padded D = 128 defers its dq += dS K product to the next step (row_kernel's
// kDeferDq), so its key tiles take a third stage: the tile that product reads, the current
// one, the next in flight (its value tiles keep two). Its d_out rows are read once, into
// registers, before the first tile, and are staged where the third key stage's tiles go, so
// the footprint (and two blocks per SM) is the two-stage backward's.
template <int DP, bool BWD>
constexpr bool row_defers_dq() {
  return BWD && DP == 128;
}
// Whether the row kernel takes warpgroup products where the build has them (sm_90a): all four
// warps compute every tile the block loads (for the selection: every tile of the union of its
// positions' blocks), the operands read once per warpgroup. Otherwise each warp computes its
// 16 rows with mma.sync and skips the tiles none of its rows may see.
template <int DP, int BR, bool BWD>
constexpr bool row_warpgroup_products() {
  return true;
}
template <int DP, int BR, bool BWD>
__host__ __device__ inline RowSmem row_smem(int n, int ntw) {
  using C = RowCfg<DP>;
  constexpr int kMaxPos = 16 * kRowWarps, kStages = row_stages<DP, BWD>();
  RowSmem L;
  const std::size_t rows = std::size_t(16 * kRowWarps) * DP * 2;  // the block's rows: one tile
  const std::size_t stage = std::size_t(C::KT) * DP * 2;  // one tile, laid out as wgmma.cuh says
  constexpr int kKParts = row_kv_parts<DP, BR, BWD>();
  const std::size_t q_bytes = rows * (row_q_parts<DP, BR>() == 2 ? 2 : 1);
  if constexpr (kStages == 3) {  // [v stages][k stages], the rows from the last k stage on
    L.v = 0;
    L.k = L.v + kStages * stage * kKParts;
    L.q = L.k + (kStages - 1) * stage * kKParts;
    L.ql = L.q + rows;
    L.o = L.ql;  // unused (forward)
    L.kmask = std::max(L.k + kStages * stage * kKParts, L.q + q_bytes);
  } else if constexpr (row_defers_dq<DP, BWD>()) {  // [q][k stages 0, 1, 2 = d_out rows][v stages]
    static_assert(16 * kRowWarps <= C::KT, "the d_out rows fit one key stage");
    L.q = 0;
    L.ql = L.q + rows;
    L.k = L.q + q_bytes;
    L.o = L.k + 2 * stage * kKParts;
    L.v = L.k + 3 * stage * kKParts;
    L.kmask = L.v + kStages * stage * kKParts;
  } else {
    L.q = 0;
    L.ql = L.q + rows;  // the queries' residuals (row_q_parts == 2)
    L.o = L.q + q_bytes;
    L.k = L.o + (BWD ? rows : 0);
    L.v = L.k + kStages * stage * kKParts;
    L.kmask = L.v + kStages * stage * kKParts;
  }
  const bool slc = BR == kSlc;
  L.selp = L.kmask + (slc ? std::size_t(kStages) * kMaskParts * kMaxPos * 8 : 0);
  L.tbits = L.selp + (slc ? std::size_t(kMaxPos) * n * 4 : 0);
  L.total = L.tbits + (slc ? std::size_t(ntw) * 4 : 0);
  return L;
}

// Smallest set bit of bits[0, nw) after position cur (-1: from the start); -1 when none.
__device__ __forceinline__ int next_set_bit(const std::uint32_t* bits, int nw, int cur) {
  int w = (cur + 1) >> 5;
  if (w >= nw) return -1;
  std::uint32_t m = bits[w] & (~0u << ((cur + 1) & 31));
  while (m == 0) {
    if (++w >= nw) return -1;
    m = bits[w];
  }
  return w * 32 + __ffs(m) - 1;
}

// Keys [lo, hi) of a 64-key tile as bits (0 <= lo <= hi <= 64).
__device__ __forceinline__ unsigned long long key_bits(int lo, int hi) {
  if (hi <= lo) return 0ull;
  const unsigned long long upto = hi == 64 ? ~0ull : ((1ull << hi) - 1ull);
  return upto & ~((1ull << lo) - 1ull);
}

// The selection: the keys of the 64-key tile [s0, s0 + KT) that position t may see through
// every STEP-th of its selected blocks (row: its n selected blocks, ascending, -1 after the
// last), as key_bits; the caller ORs the STEP parts. mcur: this part's cursor into row, moved
// past the blocks that end before s0 (the tiles of a pass ascend, so it only moves forward).
template <int KT, int STEP>
__device__ __forceinline__ unsigned long long selected_tile_keys(const int* row, const Geo& g, int t, int s0,
                                                                 int& mcur) {
  unsigned long long m = 0ull;
  for (; mcur < g.n; mcur += STEP) {  // skip the blocks that end before s0
    const int j = row[mcur];
    if (j < 0 || j * g.ls + g.ls > s0) break;
  }
  for (int e = mcur; e < g.n; e += STEP) {  // the blocks that meet the tile
    const int j = row[e];
    if (j < 0 || j * g.ls >= s0 + KT) break;
    m |= key_bits(max(j * g.ls, s0) - s0, min(j * g.ls + g.ls, s0 + KT) - s0);
  }
  if (t - s0 < KT - 1) m &= key_bits(0, t - s0 + 1);
  return m;
}

// The same keys through a cursor that keeps the part's current selected block and the next one
// in registers (e: the current entry's index, as selected_tile_keys' mcur). Where l' is a
// multiple of KT (whole_tiles: every tile lies in one selected block) a tile's keys are then a
// compare of registers, and the shared load of the entry after the next is issued a tile before
// it is used; otherwise selected_tile_keys walks the entries. (The walk's chain of shared loads,
// products and compares was ~25% of the selection row backward's stall samples at h = 1, where
// 64 positions walk their lists at every step: docs/performance.md, nineteenth session.)
template <int KT, int STEP>
struct SelectedTileCursor {
  int e = 0, cur = -1, next = -1;
  // A pass begins: the part's first entry (row: the position's n selected blocks).
  __device__ __forceinline__ void start(const int* row, int n, int part) {
    e = part;
    cur = part < n ? row[part] : -1;
    next = part + STEP < n ? row[part + STEP] : -1;
  }
  __device__ __forceinline__ unsigned long long keys(const int* row, const Geo& g, int t, int s0, bool whole_tiles) {
    if (!whole_tiles) return selected_tile_keys<KT, STEP>(row, g, t, s0, e);
    while (cur >= 0 && cur * g.ls + g.ls <= s0) {  // past the blocks that end before s0
      e += STEP;
      cur = next;
      next = e + STEP < g.n ? row[e + STEP] : -1;
    }
    if (cur < 0 || cur * g.ls >= s0 + KT) return 0ull;  // (a tile is in a block or outside it)
    return t - s0 < KT - 1 ? key_bits(0, t - s0 + 1) : ~0ull;
  }
};

// 2^x on the special function unit, denormal results flushed to zero (they are below the fp32
// resolution of every sum they enter: each row's sum holds a term of at least 1) and
// 2^-inf = 0, which is how masked keys drop out.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The bits of a 64-key tile's visibility mask (bit k: key k) that a thread's accumulator
// columns hold: keys n * 8 + 2 gc + c (n < 8, c < 2) -> bit 2 n + c.
__device__ __forceinline__ std::uint32_t thread_key_bits(unsigned long long vis, int gc) {
  const unsigned long long x = vis >> (2 * gc);
  auto pack8 = [](std::uint32_t w) {  // bits 0, 1, 8, 9, 16, 17, 24, 25 -> bits 0..7
    w &= 0x03030303u;
    w = (w | (w >> 6)) & 0x000F000Fu;
    return (w | (w >> 12)) & 0xFFu;
  };
  return pack8(std::uint32_t(x)) | (pack8(std::uint32_t(x >> 32)) << 8);
}

// Sets to -inf the scores (an m16n8 accumulator layout, 8 tiles of 8 keys: a 64-key tile) of
// the keys a thread's two rows may not see; m[h2]: thread_key_bits of row h2's mask. Tiles
// that every row of the warp sees whole cost one vote, tiles that each row sees whole or not
// at all (a selected block, or not) one select per score; only a tile's edges test each bit.
// Q: the 64-key part s[8 Q .. 8 Q + 7] of a wider tile (row_ws.cuh's 128-key tiles; indexed in
// place, not through a cast reference, which put the scores in local memory).
template <int Q = 0, int NT>
__device__ __forceinline__ void mask_scores(float (&s)[NT][4], const std::uint32_t (&m)[2]) {
  static_assert(8 * (Q + 1) <= NT, "the part is in the tile");
  constexpr std::uint32_t kAll = 0xFFFFu;
  if (__all_sync(0xffffffffu, (m[0] & m[1]) == kAll)) return;
  const bool whole_rows = (m[0] == 0u || m[0] == kAll) && (m[1] == 0u || m[1] == kAll);
  if (__all_sync(0xffffffffu, whole_rows)) {
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[8 * Q + n][e] = m[e >> 1] ? s[8 * Q + n][e] : -INFINITY;
    return;
  }
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[8 * Q + n][e] = (m[e >> 1] >> (2 * n + (e & 1))) & 1u ? s[8 * Q + n][e] : -INFINITY;
}

// One key tile of the online softmax of a thread's two rows (an m16n8 accumulator layout:
// rows lane/4 and lane/4 + 8, NT tiles of 8 keys), in the exp2 domain: on entry s holds the
// scores, -inf where the row may not see the key (mask_scores); on exit s holds
// p = 2^(sl2 s - m2) (0 where masked), the running max m2 and sum ls (this thread's keys only)
// are updated, and acc, when given, is rescaled to the new max. With corr_out given, it
// receives the two rows' factors (2^(old m2 - new m2)) for a caller that rescales its
// accumulators later (the forward's deferred P V product; softmax_tile_dot's running sum).
// sl2 = scale log2(e) > 0, so the max of sl2 s is sl2 times the max of s; one factor per row
// (sl2[h2]) where the caller folds a row's own scale into it. The accumulators are rescaled
// only where some row of the warp has a new max (a factor of 1 leaves them as they are).
template <int NT, int DT>
__device__ __forceinline__ void online_softmax_tile(float (&s)[NT][4], const float (&sl2)[2], float (&m2)[2],
                                                    float (&ls)[2], float (*acc)[4], float* corr_out = nullptr) {
  float corr[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h2], s[n][2 * h2 + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m2[h2], mx * sl2[h2]);
    const bool none = mnew == -INFINITY;  // nothing seen yet
    corr[h2] = none ? 1.f : ex2(m2[h2] - mnew);
    const float nsub = none ? 0.f : -mnew;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ee = 2 * h2 + e;
        s[n][ee] = ex2(fmaf(s[n][ee], sl2[h2], nsub));
        sum += s[n][ee];
      }
    ls[h2] = ls[h2] * corr[h2] + sum;
    m2[h2] = mnew;
    if (corr_out) corr_out[h2] = corr[h2];  // the caller rescales its accumulators
  }
  if (acc && __any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] *= corr[e >> 1];
  }
}
template <int NT, int DT>
__device__ __forceinline__ void online_softmax_tile(float (&s)[NT][4], float sl2, float (&m2)[2], float (&ls)[2],
                                                    float (*acc)[4], float* corr_out = nullptr) {
  const float sl2r[2] = {sl2, sl2};
  online_softmax_tile<NT, DT>(s, sl2r, m2, ls, acc, corr_out);
}

// The running sum beside online_softmax_tile's: xs (this thread's keys of its two rows) becomes
// xs corr + sum_j p_j x_j, with p the tile's probabilities (online_softmax_tile's s on exit) and
// corr its factors, so that xs / ls is sum_j p_j x_j over the row's softmax (the compression
// backward's sum of p dP, taken once dP's product is done).
template <int NT>
__device__ __forceinline__ void softmax_tile_dot(const float (&p)[NT][4], const float (&x)[NT][4],
                                                 const float (&corr)[2], float (&xs)[2]) {
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    float xsum = 0.f;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) xsum += p[n][2 * h2 + e] * x[n][2 * h2 + e];
    xs[h2] = xs[h2] * corr[h2] + xsum;
  }
}

// The A fragments (16 rows x 16 keys, keys 16 k2..) of X [16][KT] fp32 in the accumulator
// layout, rounded to bf16.
template <int NT>
__device__ __forceinline__ void pack_a(std::uint32_t (&xa)[4], const float (*x)[4], int k2) {
  xa[0] = pack2(x[2 * k2][0], x[2 * k2][1]);
  xa[1] = pack2(x[2 * k2][2], x[2 * k2][3]);
  xa[2] = pack2(x[2 * k2 + 1][0], x[2 * k2 + 1][1]);
  xa[3] = pack2(x[2 * k2 + 1][2], x[2 * k2 + 1][3]);
}
// The same fragment as bf16 hi (xh, as pack_a) + lo (xl, the rounding residuals) parts.
template <int NT>
__device__ __forceinline__ void pack_a_parts(std::uint32_t (&xh)[4], std::uint32_t (&xl)[4], const float (*x)[4],
                                             int k2) {
  split2(x[2 * k2][0], x[2 * k2][1], xh[0], xl[0]);
  split2(x[2 * k2][2], x[2 * k2][3], xh[1], xl[1]);
  split2(x[2 * k2 + 1][0], x[2 * k2 + 1][1], xh[2], xl[2]);
  split2(x[2 * k2 + 1][2], x[2 * k2 + 1][3], xh[3], xl[3]);
}

// The forward's deferred P V (FlashAttention-3's overlap within a warpgroup), once the previous
// tile's product is done: acc *= corr (the tile's softmax factors; skipped where the warp's
// rows saw nothing, corr = 1), and the tile's probabilities s packed as the A fragments pa of
// the product issued at the next step.
template <int NT, int DT>
__device__ __forceinline__ void rescale_and_pack(float (&acc)[DT][4], const float (&corr)[2], bool rescale,
                                                 std::uint32_t (&pa)[NT / 2][4], const float (&s)[NT][4]) {
  if (rescale)
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] *= corr[e >> 1];
#pragma unroll
  for (int k2 = 0; k2 < NT / 2; ++k2) pack_a<NT>(pa[k2], s, k2);
}

// A thread's two row sums (rows lane/4 and lane/4 + 8) over the 4 threads that hold each row,
// in the fixed order of the xor tree.
__device__ __forceinline__ void quad_row_sums(float (&x)[2]) {
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    x[h2] += __shfl_xor_sync(0xffffffffu, x[h2], 1);
    x[h2] += __shfl_xor_sync(0xffffffffu, x[h2], 2);
  }
}

// The largest of a quad's values per row and its index (the smallest index among equals):
// each of a thread's two rows' (p, j) across the four threads that hold the row.
__device__ __forceinline__ void quad_row_argmax(float (&p)[2], int (&j)[2]) {
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
    for (int m = 1; m <= 2; m <<= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, p[h2], m);
      const int oj = __shfl_xor_sync(0xffffffffu, j[h2], m);
      if (op > p[h2] || (op == p[h2] && oj < j[h2])) {
        p[h2] = op;
        j[h2] = oj;
      }
    }
}

// S += Q K^T for a warp's 16 rows over a tile of KT keys and, with BWD, dP += dO V^T: A
// fragments qa (and oa) of the rows, DP / 16 of 16 dims each in mma.sync's layout, or on
// sm_90a the warpgroup's 64 rows in shared memory (wg::SharedRowsA); K and V as KPARTS parts
// of wgmma.cuh tiles KT x DP, KT * DP apart (the products of the smallest part first). On
// sm_90a with WG (the default; row_warpgroup_products) one warpgroup product per 16 dims and
// part (every warp of the block calls it together); SPLIT_S computes S as two N = 32 products
// (the row kernels' forward at padded D = 64: see kSplitS there). Elsewhere mma.sync with
// ldmatrix fragments of the tiles (so also scores_add_qlo, acc_add_packed, acc_add_product). DP_LATER (sm_90a, BWD): S and dP are two product groups and only S is
// waited for; dP is left running (the caller computes the probabilities from S meanwhile and
// then waits with wg::wait(dp)). `under` runs once the products are issued and before any wait
// (on sm_90a, under them: the row kernel's next-tile copies and masks). OVERWRITE: s and dp
// need not be zeroed; the first products overwrite them (on sm_90a, so that no ordinary
// instruction writes their registers while an earlier product still runs: wgmma.cuh's
// mma_ss_n64_overwrite).
struct Nothing {
  __device__ void operator()() const {}
};
// x where A, else y (of different types: a kernel's register fragments or its shared tile).
template <bool A, class X, class Y>
__device__ __forceinline__ auto& pick(X& x, Y& y) {
  if constexpr (A) return x;
  else return y;
}
#if NSATRON_WGMMA
// d += a B (N = 8 ND), or d = a B where OVERWRITE (N = 64 only) and this is the tile's first
// product (first): tile_scores' S and dP products.
template <bool OVERWRITE, int ND, class A>
__device__ __forceinline__ void mma_first_overwrites(float (&d)[ND][4], const A& a, std::uint64_t b, bool first) {
  if constexpr (OVERWRITE) {
    if (first) {
      wg::mma_overwrite<0>(d, a, b);
      return;
    }
  }
  wg::mma<8 * ND, 0>(d, a, b);
}
#endif
template <int DP, int KT, int KPARTS, bool BWD, bool SPLIT_S, bool WAIT = true, bool DP_LATER = false,
          bool OVERWRITE = false, bool WG = true, int NDP, class QA, class OA, class Under = Nothing>
__device__ __forceinline__ void tile_scores(float (&s)[KT / 8][4], float (&dp)[NDP][4], QA& qa, OA& oa,
                                            const bf16* Kt, const bf16* Vt, int lane, Under&& under = Under{}) {
  static_assert(!OVERWRITE || (KT == 64 && !SPLIT_S), "overwriting products: N = 64, S in one product");
#if NSATRON_WGMMA
  if constexpr (WG) {
    wg::pin(qa);
    if constexpr (BWD) {
      wg::pin(oa);
      if constexpr (!OVERWRITE) wg::pin(dp);
    }
    if constexpr (!OVERWRITE) wg::pin(s);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk)
#pragma unroll
      for (int p = KPARTS - 1; p >= 0; --p) {  // smallest part first
        if constexpr (SPLIT_S) {  // keys 0..31 and 32..63 as two N = 32 products
          const char* kt = reinterpret_cast<const char*>(Kt + p * KT * DP);
          wg::mma_rs_n32_at<0, 0>(s, qa[kk], wg::kmajor_desc<DP, KT>(kt, kk));
          wg::mma_rs_n32_at<0, 4>(s, qa[kk], wg::kmajor_desc<DP, KT>(kt + wg::row_group_offset<DP>(32), kk));
        } else {
          mma_first_overwrites<OVERWRITE>(s, qa[kk], wg::kmajor_desc<DP, KT>(Kt + p * KT * DP, kk),
                                          kk == 0 && p == KPARTS - 1);  // (unrolled: known)
        }
      }
    if constexpr (DP_LATER) wg::commit();  // S alone
    if constexpr (BWD) {
#pragma unroll
      for (int kk = 0; kk < DP / 16; ++kk)
#pragma unroll
        for (int p = KPARTS - 1; p >= 0; --p)
          mma_first_overwrites<OVERWRITE>(dp, oa[kk], wg::kmajor_desc<DP, KT>(Vt + p * KT * DP, kk),
                                          kk == 0 && p == KPARTS - 1);
    }
    wg::commit();
    under();
    if constexpr (DP_LATER) {
      wg::wait_all_but_newest(s);  // S; dP (the newest group) runs on
    } else if constexpr (WAIT) {  // else the caller waits (the forward's deferred P V)
      wg::wait(s);
      if constexpr (BWD) wg::pin(dp);
    }
  } else
#endif
  {
    if constexpr (OVERWRITE) {
#pragma unroll
      for (int n = 0; n < KT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = 0.f;
          if constexpr (BWD) dp[n][e] = 0.f;
        }
    }
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < KT / 16; ++np) {
#pragma unroll
        for (int p = KPARTS - 1; p >= 0; --p) {  // smallest part first
          std::uint32_t kb[4];
          tile_frag_bt<DP, KT>(kb, Kt + p * KT * DP, np * 16, kk * 16, lane);
          mma(s[2 * np], qa[kk], kb[0], kb[1]);
          mma(s[2 * np + 1], qa[kk], kb[2], kb[3]);
        }
        if constexpr (BWD) {
#pragma unroll
          for (int p = KPARTS - 1; p >= 0; --p) {
            std::uint32_t vb[4];
            tile_frag_bt<DP, KT>(vb, Vt + p * KT * DP, np * 16, kk * 16, lane);
            mma(dp[2 * np], oa[kk], vb[0], vb[1]);
            mma(dp[2 * np + 1], oa[kk], vb[2], vb[3]);
          }
        }
      }
    }
    under();
  }
}

// S += Q_lo K_hi for a warp's 16 rows over a tile of KT keys: the rotated queries' bf16
// rounding residuals (ql, fragments as tile_scores' qa) against the keys' first (hi) part at
// Kt, the third product of the scores' parts (win_score_parts). Its own product group (wgmma:
// waited for before it returns where WAIT).
template <int DP, int KT, int NQ, bool WAIT = true, bool WG = true>
__device__ __forceinline__ void scores_add_qlo(float (&s)[KT / 8][4], std::uint32_t (&ql)[NQ][4], const bf16* Kt,
                                               int lane) {
#if NSATRON_WGMMA
  if constexpr (WG) {
    wg::pin(ql);
    wg::pin(s);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) wg::mma<KT, 0>(s, ql[kk], wg::kmajor_desc<DP, KT>(Kt, kk));
    wg::commit();
    if constexpr (WAIT) wg::wait(s);
  } else
#endif
  {
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk)
#pragma unroll
      for (int np = 0; np < KT / 16; ++np) {
        std::uint32_t kb[4];
        tile_frag_bt<DP, KT>(kb, Kt, np * 16, kk * 16, lane);
        mma(s[2 * np], ql[kk], kb[0], kb[1]);
        mma(s[2 * np + 1], ql[kk], kb[2], kb[3]);
      }
  }
}

// acc += X Y for a warp's 16 rows: X [16][KT] fp32 in the accumulator layout, rounded to bf16
// here (XPARTS 1) or split into bf16 hi + lo (XPARTS 2: X_hi Y + X_lo Y, ~16 significant
// bits of X), Y [KT][DP] bf16 in shared memory as PARTS parts (smallest first): TILE false,
// rows of STR elements, parts KT * STR apart; TILE true, wgmma.cuh tiles (STR = DP), parts
// KT * DP apart, and on sm_90a the product is one warpgroup product (every warp of the block
// calls it together; wgmma.cuh).
// acc += X Y as acc_add_product with TILE and X in one part, X already packed as A fragments
// (pack_a): xa[k2] the keys 16 k2 .. 16 k2 + 15. WAIT false (sm_90a): the product is committed
// and left running; the caller waits (wg::wait(acc)) before it reads acc or rewrites xa.
template <int NT, int DT, int KT, int PARTS, bool WAIT = true, bool WG = true>
__device__ __forceinline__ void acc_add_packed(float (&acc)[DT][4], std::uint32_t (&xa)[NT / 2][4], const bf16* y,
                                               int lane) {
  constexpr int DP = DT * 8;
#if NSATRON_WGMMA
  if constexpr (WG) {
    wg::pin(acc);
    wg::pin(xa);
    wg::fence();
#pragma unroll
    for (int k2 = 0; k2 < NT / 2; ++k2)
#pragma unroll
      for (int p = PARTS - 1; p >= 0; --p) wg::mma<DP, 1>(acc, xa[k2], wg::mnmajor_desc<DP, KT>(y + p * KT * DP, k2));
    wg::commit();
    if constexpr (WAIT) wg::wait(acc);
  } else
#endif
  {
#pragma unroll
    for (int k2 = 0; k2 < NT / 2; ++k2)
#pragma unroll
      for (int jp = 0; jp < DT / 2; ++jp)
#pragma unroll
        for (int p = PARTS - 1; p >= 0; --p) {
          std::uint32_t xb[4];
          tile_frag_b<DP, KT>(xb, y + p * KT * DP, k2 * 16, jp * 16, lane);
          mma(acc[2 * jp], xa[k2], xb[0], xb[1]);
          mma(acc[2 * jp + 1], xa[k2], xb[2], xb[3]);
        }
  }
}

template <int NT, int DT, int STR, int KT, int PARTS, bool TILE = false, int XPARTS = 1, bool WG = true>
__device__ __forceinline__ void acc_add_product(float (&acc)[DT][4], const float (*x)[4], const bf16* y,
                                                int lane) {
  static_assert(XPARTS == 1 || XPARTS == 2, "X as one or two bf16 parts");
  if constexpr (TILE && XPARTS == 1) {
    std::uint32_t xa[NT / 2][4];
#pragma unroll
    for (int k2 = 0; k2 < NT / 2; ++k2) pack_a<NT>(xa[k2], x, k2);
    acc_add_packed<NT, DT, KT, PARTS, true, WG>(acc, xa, y, lane);
    return;
  }
#if NSATRON_WGMMA
  if constexpr (TILE && WG) {
    std::uint32_t xa[NT / 2][4], xl[XPARTS == 2 ? NT / 2 : 1][4];
#pragma unroll
    for (int k2 = 0; k2 < NT / 2; ++k2) {
      if constexpr (XPARTS == 2) pack_a_parts<NT>(xa[k2], xl[k2], x, k2);
      else pack_a<NT>(xa[k2], x, k2);
    }
    wg::pin(acc);
    wg::pin(xa);
    if constexpr (XPARTS == 2) wg::pin(xl);
    wg::fence();
#pragma unroll
    for (int k2 = 0; k2 < NT / 2; ++k2)
#pragma unroll
      for (int p = PARTS - 1; p >= 0; --p) {
        if constexpr (XPARTS == 2) wg::mma<DT * 8, 1>(acc, xl[k2], wg::mnmajor_desc<STR, KT>(y + p * KT * STR, k2));
        wg::mma<DT * 8, 1>(acc, xa[k2], wg::mnmajor_desc<STR, KT>(y + p * KT * STR, k2));
      }
    wg::commit();
    wg::wait(acc);
  } else
#endif
  {
    constexpr int PSTR = KT * STR;  // elements between parts (STR = DP for tiles)
#pragma unroll
    for (int k2 = 0; k2 < NT / 2; ++k2) {
      std::uint32_t xa[4], xl[4];
      if constexpr (XPARTS == 2) pack_a_parts<NT>(xa, xl, x, k2);
      else pack_a<NT>(xa, x, k2);
#pragma unroll
      for (int jp = 0; jp < DT / 2; ++jp)
#pragma unroll
        for (int p = PARTS - 1; p >= 0; --p) {
          std::uint32_t xb[4];
          if constexpr (TILE)
            tile_frag_b<STR, KT>(xb, y + p * PSTR, k2 * 16, jp * 16, lane);
          else
            frag_b<STR>(xb, y + p * PSTR, k2 * 16, jp * 16, lane);
          if constexpr (XPARTS == 2) {
            mma(acc[2 * jp], xl, xb[0], xb[1]);
            mma(acc[2 * jp + 1], xl, xb[2], xb[3]);
          }
          mma(acc[2 * jp], xa, xb[0], xb[1]);
          mma(acc[2 * jp + 1], xa, xb[2], xb[3]);
        }
    }
  }
}

// The forward's epilogue for one row: o = acc / l (bf16, the thread's columns) and, from its
// first thread (gc == 0), lse = ln 2 m2 + ln l (-inf for a row that saw nothing). l: the full
// row sum; m2: its max in the exp2 domain.
// O: bf16 (dense attention's output) or float (the NSA branch outputs, kept for the backward).
template <int DT, class O>
__device__ __forceinline__ void store_row_output(const float (*acc)[4], int h2, float l, float m2,
                                                 O* o_row, float* lse_row, int D, int gc) {
  const bool any = l > 0.f;
  const float inv = any ? 1.f / l : 0.f;
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const int dd = j * 8 + gc * 2;
    if (dd < D) {
      const float v0 = acc[j][2 * h2] * inv, v1 = acc[j][2 * h2 + 1] * inv;
      if constexpr (std::is_same_v<O, float>)
        *reinterpret_cast<float2*>(o_row + dd) = make_float2(v0, v1);
      else
        *reinterpret_cast<__nv_bfloat162*>(o_row + dd) = __floats2bfloat162_rn(v0, v1);
    }
  }
  if (gc == 0) *lse_row = any ? m2 * 0.6931471805599453f + logf(l) : -INFINITY;
}

// Heaviest first. Where the blocks of one (batch, group) carry very different work, the order
// in which the hardware starts them (grid x fastest, then y, then z) decides the tail: with the
// units (row blocks, key tiles) in x and the pairs in y or z, the last pairs' heaviest blocks
// start after most of the first pairs'. Those launches put the pairs in x instead, the units in
// the slower dimension (at most kMaxGridYZ of them; above, the usual grid): every pair's
// heaviest units start first. The same blocks, the same sums, the same bits; a list-scheduling
// model of the tails: bench/block_order_model.py (docs/performance.md, twentieth session).
constexpr std::int64_t kMaxGridYZ = 65535;  // CUDA's largest grid y and z

// Row blocks of R rows of one (batch, group) (int: the launchers check T h + R < 2^31).
__host__ __device__ inline int row_block_count(const Geo& g, int R) { return (g.T * g.h + R - 1) / R; }

// Whether a row launch of branch BR runs heaviest first, its grid (pairs, row blocks) with the
// last row blocks first: the window branch where the window covers the sequence (the own dense
// kernel, w = T, or T <= w), whose row blocks attend every key up to their last position, so
// that their work grows with the block (the model: at the paper's 8192, w = T, a tail of ~3%
// in the (row blocks, pairs) order, ~8% at the 125M layer's 32 pairs; ~0 heaviest first).
template <int BR>
__host__ __device__ inline bool row_heaviest_first(const Geo& g, int R) {
  return BR == kWin && g.w >= g.T && row_block_count(g, R) <= kMaxGridYZ;
}

// The grid of a row launch of branch BR: nblocks row blocks of R rows per (batch, group), in
// the layout row_block reads (row_heaviest_first).
template <int BR>
dim3 row_launch_grid(const Geo& g, int R, std::int64_t nblocks) {
  const unsigned pairs = unsigned(g.B * g.G), blocks = unsigned(nblocks);
  return row_heaviest_first<BR>(g, R) ? dim3(pairs, blocks) : dim3(blocks, pairs);
}

// A row block of R rows of one (batch, group): rows rho0 .. rho0 + R - 1, row rho = (position
// rho / h, head rho % h); its positions t_first .. t_last (npos of them). The grid is (row
// blocks, B G) with blockIdx.y = b G + gi, or heaviest first (row_heaviest_first) (B G, row
// blocks) with row block gridDim.y - 1 - blockIdx.y. (32-bit: the launchers check T h + R < 2^31.)
struct RowBlock {
  int b, gi, rho0, t_first, t_last, npos;
};
__device__ __forceinline__ RowBlock row_block(const Geo& g, int R, bool heaviest_first) {
  RowBlock r;
  const int x = heaviest_first ? int(gridDim.y - 1 - blockIdx.y) : int(blockIdx.x);
  const int pair = heaviest_first ? int(blockIdx.x) : int(blockIdx.y);
  r.b = pair / g.G;
  r.gi = pair % g.G;
  r.rho0 = x * R;
  r.t_first = g.hdiv.div(r.rho0);
  r.t_last = min(g.T - 1, g.hdiv.div(r.rho0 + R - 1));
  r.npos = r.t_last - r.t_first + 1;
  return r;
}
// The selection: the selected blocks of the row block's positions into selp [P][n] (P >= npos;
// -1 past the last position), by all the block's threads.
__device__ __forceinline__ void load_selected_blocks(int* selp, const Geo& g, const RowArgs& a, const RowBlock& rb,
                                                     int P) {
  for (int idx = threadIdx.x; idx < P * g.n; idx += blockDim.x) {
    const int p = idx / g.n, e = idx % g.n;
    selp[idx] = p < rb.npos ? a.sel[((std::int64_t(rb.b) * g.T + rb.t_first + p) * g.G + rb.gi) * g.n + e] : -1;
  }
}

// The union of the selected tiles of a row block's positions (selp: load_selected_blocks): bit
// tt of tbits for every KT-key tile that holds a key s <= t of a block position t chose. By all
// the block's threads, after tbits is zeroed and selp is in (a barrier between).
template <int KT>
__device__ __forceinline__ void mark_selected_tiles(const int* selp, const Geo& g, int t_first, int npos,
                                                    std::uint32_t* tbits) {
  for (int idx = threadIdx.x; idx < npos * g.n; idx += blockDim.x) {
    const int j = selp[idx];
    if (j < 0) continue;
    const int t = t_first + idx / g.n;
    const int last = min(j * g.ls + g.ls - 1, t);  // s <= t
    for (int tt = (j * g.ls) / KT; tt <= last / KT; ++tt) {
      atomicOr(&tbits[tt >> 5], 1u << (tt & 31));
    }
  }
}

// The row kernels' forward epilogue for one of a thread's rows (h2, global row index row, full
// sum l, max m2 in the exp2 domain): the branch output and its lse (store_row_output) and,
// where a.gated_out (the window branch, the last), the gated sum of the three branches as
// combine_kernel computes it.
template <int DT>
__device__ __forceinline__ void row_forward_store(const Geo& g, const RowArgs& a, const float (*acc)[4], int h2,
                                                  float l, float m2, std::int64_t row, int gc) {
  if (a.o_f32)
    store_row_output<DT>(acc, h2, l, m2, static_cast<float*>(a.o) + row * g.D, a.lse + row, g.D, gc);
  else
    store_row_output<DT>(acc, h2, l, m2, static_cast<bf16*>(a.o) + row * g.D, a.lse + row, g.D, gc);
  if (!a.gated_out) return;
  const bf16* gt = static_cast<const bf16*>(a.gate) + gate_offset(g, row);
  const float g0 = sigmoidf(ldf(gt[0])), g1 = sigmoidf(ldf(gt[1])), g2 = sigmoidf(ldf(gt[2]));
  const float inv = l > 0.f ? 1.f / l : 0.f;  // this branch's o, as stored above
  float2 oc[DT], osl[DT];
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const int dd = j * 8 + gc * 2;
    const bool in = dd < g.D;
    oc[j] = in ? *reinterpret_cast<const float2*>(a.o_cmp_in + row * g.D + dd) : make_float2(0.f, 0.f);
    osl[j] = in ? *reinterpret_cast<const float2*>(a.o_slc_in + row * g.D + dd) : make_float2(0.f, 0.f);
  }
  bf16* out = static_cast<bf16*>(a.gated_out) + row * g.D;
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const int dd = j * 8 + gc * 2;
    if (dd >= g.D) continue;
    const float w0 = acc[j][2 * h2] * inv, w1 = acc[j][2 * h2 + 1] * inv;
    *reinterpret_cast<std::uint32_t*>(out + dd) =
        pack2(g0 * oc[j].x + g1 * osl[j].x + g2 * w0, g0 * oc[j].y + g1 * osl[j].y + g2 * w1);
  }
}

// Blocks per SM the row kernel's registers must allow (__launch_bounds__): at DP <= 64, 4 for
// the forward (<= 128 registers; its shared memory fits 4) and 3 for the backward (<= 168);
// measured on an H100 (docs/performance.md, 2026-11-25): without a bound the forward took 133
// registers (3 blocks), and a bound of 1 let the backward take 200 (2 blocks, 1.16 -> 1.54 ms
// for the selection).
constexpr int row_min_blocks(int DP, bool BWD) { return DP <= 64 ? (BWD ? 3 : 4) : 1; }

// LATE (the two-stage kernels): one block barrier per step, the next tile issued after it
// (row_late_issue chooses; the same bits either way). Without LATE the next tile is issued
// before the step's wait and a closing barrier frees its stage: a longer prefetch, which pays
// where the keys come from DRAM, at the cost of a second barrier, which dominates where they
// stay in the L2 (docs/performance.md, change 49).
template <int DP, int BR, bool BWD, bool LATE>
__global__ void __launch_bounds__(kRowWarps * 32, row_min_blocks(DP, BWD)) row_kernel(Geo g, RowArgs a, int ntw) {
  using C = RowCfg<DP>;
  constexpr int kRowsPerBlock = 16 * kRowWarps, kMaxPos = kRowsPerBlock;
  constexpr int kKParts = row_kv_parts<DP, BR, BWD>();
  constexpr int kQParts = row_q_parts<DP, BR>();  // 2: S += Q_lo K_hi too (win_score_parts)
  constexpr int kStages = row_stages<DP, BWD>();
  constexpr int KT = C::KT, NT = KT / 8, DT = DP / 8, CH = DP / 8;
  auto stage_of = [](int k) { return kStages == 2 ? (k & 1) : int(unsigned(k) % unsigned(kStages)); };
  // The backward at D = 128 leaves step k's dq product running into step k + 1, where each
  // warp's wait for that step's scores retires it; tile k + 3, the next copy into its key
  // stage, is issued after a block barrier that follows every warp's wait (step k + 2's, or
  // with two barriers step k + 1's closing one). So its key tiles take three stages
  // (row_defers_dq); its value tiles (read by dP, waited for within the step) keep two.
  constexpr bool kDeferDq = row_defers_dq<DP, BWD>();
  // Warpgroup products (sm_90a builds) or mma.sync per warp (row_warpgroup_products).
  constexpr bool kWg = NSATRON_WGMMA && row_warpgroup_products<DP, BR, BWD>();
  auto kstage_of = [&](int k) { return kDeferDq ? int(unsigned(k) % 3u) : stage_of(k); };
  // The forward's three stages hold the tile whose P V product is still running (deferred to
  // the next step, under that step's softmax: FlashAttention-3's overlap within a warpgroup),
  // the current tile and the next one in flight.
  constexpr bool kDefer = kStages == 3;  // the forward at padded D = 128 (row_stages)
  // One barrier per step, the next tile issued after it: the three-stage forward always, the
  // two-stage kernels with LATE.
  constexpr bool kOneBarrier = kDefer || LATE;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(1024) float4 smem4[];  // 1024: swizzled wgmma tiles (wgmma.cuh)
  char* sm = reinterpret_cast<char*>(smem4);
  const RowSmem L = row_smem<DP, BR, BWD>(g.n, ntw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The block's rows as wgmma.cuh tiles of kRowsPerBlock x DP (warp w's at rows 16 w ..): the
  // rotated queries, their residuals (kQParts == 2), the backward's d_out rows.
  bf16* Qs = reinterpret_cast<bf16*>(sm + L.q);
  bf16* Qls = reinterpret_cast<bf16*>(sm + L.ql);
  bf16* Os = reinterpret_cast<bf16*>(sm + L.o);
  bf16* Ks = reinterpret_cast<bf16*>(sm + L.k);  // [kStages][parts] wgmma.cuh tiles of KT x DP
  bf16* Vs = reinterpret_cast<bf16*>(sm + L.v);  // [kStages][parts] wgmma.cuh tiles of KT x DP
  auto* kmask = reinterpret_cast<unsigned long long*>(sm + L.kmask);  // slc: [kStages][parts][kMaxPos]
  int* selp = reinterpret_cast<int*>(sm + L.selp);                    // slc: [kMaxPos][n]
  auto* tbits = reinterpret_cast<std::uint32_t*>(sm + L.tbits);       // slc: [ntw]
  const bf16* kp = static_cast<const bf16*>(a.tck);
  const bf16* vp = static_cast<const bf16*>(a.tcv);
  const RowBlock rb = row_block(g, kRowsPerBlock, row_heaviest_first<BR>(g, kRowsPerBlock));
  const int b = rb.b, gi = rb.gi, rho0 = rb.rho0, t_first = rb.t_first, t_last = rb.t_last, npos = rb.npos;
  auto row_of = [&](int i, int& t, int& head) -> bool {
    const int rho = rho0 + i;
    g.hdiv.divmod(rho, t, head);
    return t < g.T;
  };
  // Stage the warp's rotated queries (and d_out) from their padded bf16 copies (RowArgs::tcq,
  // tcdo) by cp.async, a group of their own committed before the first key tile's: its
  // latency overlaps the tile's (the forward waits for this group alone before it loads its
  // query fragments; the backward's first step waits for both).
  {
    const bf16* qsrc = static_cast<const bf16*>(a.tcq);
    const bf16* osrc = static_cast<const bf16*>(a.tcdo);
#pragma unroll
    for (int idx = lane; idx < 16 * CH; idx += 32) {
      const int i = idx / CH, ch = idx % CH;
      int t, hd;
      const bool ok = row_of(warp * 16 + i, t, hd);
      const std::int64_t off = ok ? ((std::int64_t(b) * g.T + t) * g.H + gi * g.h + hd) * DP + ch * 8 : 0;
      const int to = wg::tile_offset<DP, kRowsPerBlock>(warp * 16 + i, ch);
      cp16(reinterpret_cast<char*>(Qs) + to, qsrc + off, ok);
      if constexpr (kQParts == 2) cp16(reinterpret_cast<char*>(Qls) + to, static_cast<const bf16*>(a.tcql) + off, ok);
      if constexpr (BWD) cp16(reinterpret_cast<char*>(Os) + to, osrc + off, ok);
    }
    cp_commit();
  }
  // This thread's two rows: r = lane/4 and lane/4 + 8 of the warp.
  const int gr = lane >> 2, gc = lane & 3;
  int rt[2], rp[2];
  bool rv[2];
  std::int64_t rowg[2];
  // Compression: the compressed blocks each row sees (visible_blocks, a division by d: once per
  // row here, not at every key tile, where it was ~4% of the row backward's stall samples).
  [[maybe_unused]] int rvis[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    int t, hd;
    rv[h2] = row_of(warp * 16 + gr + 8 * h2, t, hd);
    rt[h2] = rv[h2] ? t : t_first;
    rp[h2] = rt[h2] - t_first;
    rowg[h2] = (std::int64_t(b) * g.T + rt[h2]) * g.H + gi * g.h + (rv[h2] ? hd : 0);
    if constexpr (BR == kCmp) rvis[h2] = rv[h2] ? visible_blocks(g, rt[h2]) : 0;
  }
  // Key tiles. Window: [beg + k*KT, ...) up to t_last. Selection: the set bits of tbits.
  int ntiles = 0, beg = 0;
  // One past the last key any row of the block sees (compression: compressed blocks).
  const int key_end = BR == kCmp ? visible_blocks(g, t_last) : t_last + 1;
  const int NK = BR == kCmp ? g.N : g.T;
  if constexpr (BR == kSlc) {
    for (int idx = tid; idx < ntw; idx += blockDim.x) tbits[idx] = 0u;
    load_selected_blocks(selp, g, a, rb, kMaxPos);
    __syncthreads();
    mark_selected_tiles<KT>(selp, g, t_first, npos, tbits);
    __syncthreads();
    for (int w2 = 0; w2 < ntw; ++w2) ntiles += __popc(tbits[w2]);
  } else {
    beg = BR == kWin ? max(0, t_first - g.w + 1) : 0;
    ntiles = (key_end - beg + KT - 1) / KT;
  }
  // Passes over the tiles: forward 1; backward: dq, after an lsum pass (do . o_c) unless the
  // caller gives do . o_c (a.dot_in, from the saved branch output, with the forward's lse) or
  // the saved output itself (a.o_dot: the prologue sums it).
  // Without it the compression branch's first pass computes its own tensor-core lse (see the
  // launcher) and, online, lsum with it.
  const int passes = BWD ? (a.dot_in || a.o_dot ? 1 : 2) : 1;
  // The compression backward's one pass (with dot_in) exists at padded D = 128 only: the
  // launcher's cmp_backward_one_pass (nsa_cuda.cu, D > 64); elsewhere its row sums cost nothing.
  constexpr bool kCmpOnePass = BWD && BR == kCmp && DP > 64;
  const int nsteps = passes * ntiles;
  constexpr int kKeyStep = kRowWarps * 32 / CH, kKeyIt = KT / kKeyStep;
  static_assert((kRowWarps * 32) % CH == 0 && KT % kKeyStep == 0 && kKeyStep % 8 == 0, "whole passes over the chunks");
  const int kk0 = tid / CH, kch = tid % CH;
  const int to0 = wg::tile_offset<DP, KT>(kk0, kch);
  // Steps are issued in order: issue_j is the next one's tile index within its pass (counters,
  // not k % ntiles: an integer division per step cost ~4% of the selection forward).
  int issue_j = 0;
  // Selection: the union's tiles in ascending order, a cursor over tbits in registers (the word
  // of the last issued tile and its bits not yet issued), which reads shared memory once per
  // 32 tiles instead of at every step (next_set_bit's chain of loads and bit scans).
  int tword = -1;
  std::uint32_t tleft = 0u;
  // Selection: this thread's cursor into its position's selected blocks (SelectedTileCursor:
  // entries part, part + kMaskParts, ...; they ascend, -1 after the last: write_selection_row),
  // past the blocks that end before the tiles still to come in this pass (which ascend too).
  SelectedTileCursor<KT, kMaskParts> mcur;
  const bool whole_tiles = g.ls % KT == 0;
  int s0_next = 0;
  // Step k into stage stage_of(k): its key and value tiles (one cp.async group per step, empty
  // past the last) and, for the selection, its positions' key masks, written by write_masks
  // (s0: the tile's first key; new_pass: the step begins a pass) with the copies (issue) or
  // after them (issue_copies(k, false), then issue_masks(k)).
  auto write_masks = [&](int k, int s0, bool new_pass) {
    if constexpr (BR == kSlc) {  // kMaskParts threads per position, each over every
      // kMaskParts-th selected block; the row's mask is the OR of the parts (thread p of each
      // half: with few positions, h = 16's 4, the first lanes of two warps; spread over every
      // warp instead the selection kernels were 4-8% slower: docs/performance.md, ninth session)
      const int p = tid % kMaxPos, part = tid / kMaxPos;
      unsigned long long m = 0ull;
      const int t = t_first + p;
      if (new_pass) mcur.start(selp + p * g.n, g.n, part);
      if (p < npos && t >= s0) m = mcur.keys(selp + p * g.n, g, t, s0, whole_tiles);
      kmask[(stage_of(k) * kMaskParts + part) * kMaxPos + p] = m;
    }
  };
  auto issue_copies = [&](int k, auto with_masks) {
    if (k < nsteps) {
      int s0;  // the tile's first key
      if constexpr (BR == kSlc) {
        if (issue_j == 0) {  // a pass begins: from the first word
          tword = -1;
          tleft = 0u;
        }
        while (tleft == 0u && tword + 1 < ntw) tleft = tbits[++tword];
        s0 = (tword * 32 + __ffs(tleft) - 1) * KT;  // (a step of the pass: a bit is left)
        tleft &= tleft - 1u;
      } else {
        s0 = beg + issue_j * KT;
      }
      const int cnt = min(KT, key_end - s0);
      bf16* kd = Ks + kstage_of(k) * kKParts * KT * DP;
      bf16* vd = Vs + stage_of(k) * kKParts * KT * DP;
      const std::int64_t part_stride = std::int64_t(g.B) * NK * g.G * DP;
      // This thread's chunks: chunk kch of keys kk0 + it * kKeyStep; the global and tile
      // offsets advance by constants (the tile layout repeats every 8 rows).
      const std::int64_t off0 = ((std::int64_t(b) * NK + s0 + kk0) * g.G + gi) * DP + kch * 8;
      const std::int64_t step = std::int64_t(kKeyStep) * g.G * DP;
      if (cnt == KT) {  // a whole tile (all but a row block's last): sources by a moving pointer,
        // no bounds (the general loop below took ~9 instructions per copy, a quarter of the
        // compression backward's instructions, docs/performance.md, tenth session)
        const bf16* ksrc = kp + off0;
        const bf16* vsrc = vp + off0;
#pragma unroll
        for (int it = 0; it < kKeyIt; ++it, ksrc += step, vsrc += step) {
          const int to = to0 + wg::row_group_offset<DP>(it * kKeyStep);
#pragma unroll
          for (int p = 0; p < kKParts; ++p) {
            cp16(reinterpret_cast<char*>(kd + p * KT * DP) + to, ksrc + p * part_stride, true);
            cp16(reinterpret_cast<char*>(vd + p * KT * DP) + to, vsrc + p * part_stride, true);
          }
        }
      } else {
#pragma unroll
        for (int it = 0; it < kKeyIt; ++it) {
          const bool ok = kk0 + it * kKeyStep < cnt;
          const int to = to0 + wg::row_group_offset<DP>(it * kKeyStep);
#pragma unroll
          for (int p = 0; p < kKParts; ++p) {
            const std::int64_t po = ok ? p * part_stride + off0 + it * step : 0;
            cp16(reinterpret_cast<char*>(kd + p * KT * DP) + to, kp + po, ok);
            cp16(reinterpret_cast<char*>(vd + p * KT * DP) + to, vp + po, ok);
          }
        }
      }
      if constexpr (decltype(with_masks)::value) write_masks(k, s0, issue_j == 0);
      s0_next = s0;
      if (++issue_j == ntiles) issue_j = 0;
    }
    cp_commit();
  };
  auto issue = [&](int k) { issue_copies(k, std::true_type{}); };
  // The masks of step k, right after issue_copies(k, false) and before any other issue: they
  // read the tile that call chose (s0_next) and whether it began a pass (issue_j moved 0 -> 1).
  auto issue_masks = [&](int k) {
    if (k < nsteps) write_masks(k, s0_next, issue_j == 1 || ntiles == 1);
  };

  const float sl2 = g.scale * kLog2e;
  float m2[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f};
  float acc[DT][4];
  float dot[2] = {0.f, 0.f};  // backward: do . o_c per row, after pass 1
  float us[2] = {0.f, 0.f};   // compression backward: the online sum of p dP (pass 0)
  // The compression backward's one pass: each row's most probable key (its p~ and index; the
  // first of equals) for the correction's reference (below)
  [[maybe_unused]] float ptop[2] = {0.f, 0.f};
  [[maybe_unused]] int jtop[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
#if NSATRON_WGMMA
  // kDeferDq: the zeros held in acc's registers (else the compiler writes them again on the
  // path that skips the loop, beside the path where a dq product still runs, and ptxas then
  // serialises every product: C7515)
  if constexpr (kWg && kDeferDq) wg::pin(acc);
#endif
  float lrow2[2] = {0.f, 0.f};  // backward: lse in the exp2 domain
  if constexpr (BWD) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      // (the compression branch's rows before its first block have lse -inf: 0 here, so that
      // their masked scores give p = 2^-inf = 0, as the statistics pass's l = 0 does)
      const float lse = rv[h2] ? a.lse_in[rowg[h2]] : 0.f;
      lrow2[h2] = lse > -INFINITY ? lse * kLog2e : 0.f;
      if (a.dot_in) dot[h2] = rv[h2] ? a.dot_in[rowg[h2]] : 0.f;
    }
  }
  std::uint32_t qf[BWD ? 1 : DP / 16][4], qlf[!BWD && kQParts == 2 ? DP / 16 : 1][4];
  // The deferred P V (kDefer): the previous seen tile's P as A fragments, its value tile.
  std::uint32_t pa[kDefer ? NT / 2 : 1][4] = {};
  const bf16* v_prev = nullptr;
  bool pv_pending = false;
  // kDeferDq: the d_out rows' fragments, kept (their tile is the third key stage's place), and
  // the running dq product's A fragments (dS as bf16), rewritten only after its wait.
  std::uint32_t of[kDeferDq ? DP / 16 : 1][4], dsa[kDeferDq ? NT / 2 : 1][4];
  issue(0);
  const int s0_first = s0_next;
  if constexpr (BWD) {
    if (a.o_dot) {  // do . o_c from the saved branch output, under the first tile's copies: the
      // quad's four threads take the row's columns as its accumulators do (pairs 8 apart), then
      // sum them in a fixed order (quad_row_sums)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        float sum = 0.f;
        if (rv[h2]) {
          const float* orow = a.o_dot + rowg[h2] * g.D;
          const bf16* drow = static_cast<const bf16*>(a.dout) + rowg[h2] * g.D;
#pragma unroll 4
          for (int j = 0; j < DT; ++j) {
            const int dd = j * 8 + gc * 2;
            if (dd < g.D) {
              const float2 o = *reinterpret_cast<const float2*>(orow + dd);
              const float2 d = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(drow + dd));
              sum = fmaf(d.x, o.x, fmaf(d.y, o.y, sum));
            }
          }
        }
        dot[h2] = sum;
      }
      quad_row_sums(dot);
    }
  }
  if constexpr (!BWD || kDeferDq) {  // fragments kept in registers: the forward's queries,
    cp_wait1();  // the deferred-dq backward's d_out rows (their group: the rows are in the
    __syncwarp();  // third stage's place, first overwritten by step 2's copies, after a barrier)
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      if constexpr (!BWD) {
        tile_frag_a<DP, kRowsPerBlock>(qf[kk], Qs, warp * 16, kk * 16, lane);
        if constexpr (kQParts == 2) tile_frag_a<DP, kRowsPerBlock>(qlf[kk], Qls, warp * 16, kk * 16, lane);
      } else {
        tile_frag_a<DP, kRowsPerBlock>(of[kk], Os, warp * 16, kk * 16, lane);
      }
    }
  }
  __syncthreads();  // the masks of step 0 (the loop reads a step's masks before its barrier)
  int s0_cur = s0_first;
  // kDefer: the softmax's rescale of acc, applied after P V; the compression backward's
  // statistics pass: of us
  float corr[2] = {1.f, 1.f};
  for (int k = 0, pass = 0, j_in_pass = 0; k < nsteps; ++k) {
    // Backward phases: 0 softmax statistics and lsum (compression only, the first pass), 1
    // lsum (the others, when no dot_in), 2 dq (the last pass).
    if (j_in_pass == ntiles) {
      j_in_pass = 0;
      ++pass;
    }
    ++j_in_pass;
    const int phase = !BWD ? 0 : (pass == passes - 1 ? 2 : (BR == kCmp ? 0 : 1));
    const bool pass2 = BWD && phase == 2;
    if (BWD && BR == kCmp && k == ntiles) {  // end of the statistics pass: lse per row
      quad_row_sums(ls);
      quad_row_sums(us);
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const float l = ls[h2];
        lrow2[h2] = l > 0.f ? m2[h2] + log2f(l) : 0.f;
        if (rv[h2] && gc == 0 && a.lse_tc) a.lse_tc[rowg[h2]] = l > 0.f ? lrow2[h2] / kLog2e : -INFINITY;
        dot[h2] = l > 0.f ? us[h2] / l : 0.f;  // lsum = sum_j p_j dP_j
        ls[h2] = 0.f;
      }
    }
    if (BWD && BR != kCmp && passes == 2 && k == ntiles) {  // end of the lsum pass: row sums
      quad_row_sums(ls);
      dot[0] = ls[0];
      dot[1] = ls[1];
    }
    const int s0 = s0_cur;
    if constexpr (!kOneBarrier) {  // into the stage step k - 1 read (its closing barrier passed)
      issue(k + 1);
      s0_cur = s0_next;
    }
    // With one barrier the next tile is issued after it. On sm_90a the selection's masks (and
    // in the forward its copies) are issued under this step's first products, where they
    // were ~30% of the stall samples between the barrier and the products
    // (docs/performance.md, eighth session: the backward's copies issued there were slower, as
    // was the D <= 64 backward: with spills at its 168 registers then, and in the ninth
    // session, without them, still slower); elsewhere at once (a warp that
    // sees no key there skips the products, and with them what runs under them).
    constexpr bool kMasksUnder = kOneBarrier && kWg && BR == kSlc && (DP > 64 || !BWD);
    constexpr bool kCopiesUnder = kMasksUnder && !BWD;
    auto issue_next = [&] {  // what goes under the products (nothing without kMasksUnder)
      if constexpr (kCopiesUnder) {
        issue(k + 1);
        s0_cur = s0_next;
      } else if constexpr (kMasksUnder) {
        issue_masks(k + 1);
      }
    };
    if constexpr (kOneBarrier) {  // the step's one barrier, before its masks are read: tile k
      cp_wait0();  // is in (the only group in flight) and every warp finished step k - 1 (and,
#if NSATRON_WGMMA  // kDefer, waited there for its deferred product of tile k - 2's values), so
      if constexpr (kWg) wg::fence_proxy_async();  // tile k + 1 goes into the stage of tile k - 1
#endif  // (two stages) or k - 2 (three; kDeferDq: its keys, its values into k - 1's)
      __syncthreads();
      if constexpr (!kMasksUnder) {
        issue(k + 1);
        s0_cur = s0_next;
      } else if constexpr (!kCopiesUnder) {  // the masks below
        issue_copies(k + 1, std::false_type{});
        s0_cur = s0_next;
      }
    }
    // Which keys of the tile each of this thread's rows may see (the selection's masks of
    // stage stage_of(k) were written by issue(k), before this step's barrier (kOneBarrier) or
    // the previous step's).
    unsigned long long vis[2];
    if constexpr (BR == kSlc) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        vis[h2] = 0ull;
#pragma unroll
        for (int part = 0; part < kMaskParts; ++part)
          vis[h2] |= rv[h2] ? kmask[(stage_of(k) * kMaskParts + part) * kMaxPos + rp[h2]] : 0ull;
      }
    } else if constexpr (BR == kWin) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
        vis[h2] = rv[h2] ? key_bits(max(0, rt[h2] - g.w + 1 - s0), min(KT, rt[h2] + 1 - s0)) : 0ull;
    } else {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
        vis[h2] = rv[h2] ? key_bits(0, min(KT, rvis[h2] - s0)) : 0ull;
    }
    const bool warp_sees = __any_sync(0xffffffffu, (vis[0] | vis[1]) != 0ull);
    bool sees;
#if NSATRON_WGMMA
    if constexpr (kWg) {
      // The products are warpgroup-wide: the block skips a tile only when no row sees it (with
      // kOneBarrier it never does: every tile of the block's list is seen by some row of the
      // block (the union of its positions' tiles, their windows, or the compressed blocks its
      // last position sees), and one -inf row costs nothing).
      sees = true;
      if constexpr (!kOneBarrier) {
        cp_wait1();
        wg::fence_proxy_async();  // the cp.async tiles are read by the tensor cores' async proxy
        sees = __syncthreads_or(warp_sees);
        if constexpr (kDeferDq)
          if (!sees) wg::wait(acc);  // no S to retire the running dq product with: before the
                                     // closing barrier, as step k + 2's copies need its tile
      }
    } else
#endif
    {
      if constexpr (!kOneBarrier) {
        cp_wait1();
        __syncthreads();
      }
      sees = warp_sees;  // a warp skips a tile none of its rows may see
      if constexpr (kDefer)
        if (!sees && pv_pending) {  // the deferred product before its stage is refilled
          acc_add_packed<NT, DT, KT, kKParts, true, false>(acc, pa, v_prev, lane);
          pv_pending = false;
#pragma unroll
          for (int k2 = 0; k2 < NT / 2; ++k2)
#pragma unroll
            for (int e = 0; e < 4; ++e) pa[k2][e] = 0u;  // the next seen tile's product adds +0
        }
    }
    if (sees) {  // else: nothing to see here
      const bf16* Kt = Ks + kstage_of(k) * kKParts * KT * DP;
      const bf16* Vt = Vs + stage_of(k) * kKParts * KT * DP;
      float s[NT][4], dp[BWD ? NT : 1][4];
      if constexpr (!kDeferDq) {  // (kDeferDq: the first products overwrite them)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[n][e] = 0.f;
            if constexpr (BWD) dp[n][e] = 0.f;
          }
      }
      // (Every backward pass takes dP, tile_scores with BWD: the compression's statistics pass
      // for its online sum of p dP, the lsum pass for its sum, the dq pass for dS.)
      // The forward at padded D = 64 computes S as two N = 32 products on sm_90a: as one N = 64
      // product (the same instruction shape as its O += P V) its outputs were wrong on every
      // seed (selection and window, out errors 0.1-0.2), while S alone or P V alone on wgmma,
      // the other D, the backward and the unit tests of both shapes were right; the cause was
      // not found (docs/performance.md, 2026-11-26). The split form passes every parity case.
      constexpr bool kSplitS = DP == 64 && !BWD;
      // S = Q K^T (and dP = dO V^T). The forward's query fragments are kept in registers; the
      // backward's rows are A from shared memory on sm_90a (no registers, no loads: as
      // fragments loaded per tile they took 64 registers and 16 ldmatrix per warp and tile;
      // docs/performance.md, ninth session), fragments per tile elsewhere.
      if constexpr (BWD) {
        // The rows' A operands qa and oa_tile: shared tiles (warpgroup products) or fragments.
        auto scores = [&](auto& qa, auto& oa_tile) {
          auto& oa = pick<kDeferDq>(of, oa_tile);  // the d_out rows: kept fragments, or the tile
          // dP left running while the probabilities are computed from S (waited for below; with
          // kDeferDq the wait for S also retires the previous step's dq product, issued before)
          tile_scores<DP, KT, kKParts, true, kSplitS, true, true, kDeferDq, kWg>(s, dp, qa, oa, Kt, Vt, lane,
                                                                                 issue_next);
        };
#if NSATRON_WGMMA
        if constexpr (kWg) {
          const wg::SharedRowsA<DP> qa{Qs}, oa_tile{Os};
          scores(qa, oa_tile);
        } else
#endif
        {
          std::uint32_t qa[DP / 16][4], oa_tile[kDeferDq ? 1 : DP / 16][4];
#pragma unroll
          for (int kk = 0; kk < DP / 16; ++kk) {
            tile_frag_a<DP, kRowsPerBlock>(qa[kk], Qs, warp * 16, kk * 16, lane);
            if constexpr (!kDeferDq) tile_frag_a<DP, kRowsPerBlock>(oa_tile[kk], Os, warp * 16, kk * 16, lane);
          }
          scores(qa, oa_tile);
        }
        if constexpr (kQParts == 2) {
          std::uint32_t ql[DP / 16][4];
#pragma unroll
          for (int kk = 0; kk < DP / 16; ++kk) tile_frag_a<DP, kRowsPerBlock>(ql[kk], Qls, warp * 16, kk * 16, lane);
          scores_add_qlo<DP, KT, DP / 16, true, kWg>(s, ql, Kt, lane);
        }
      } else {
        tile_scores<DP, KT, kKParts, false, kSplitS, !kDefer, false, false, kWg>(
            s, dp, qf, qf, Kt, Vt, lane, [&] {
              if constexpr (!kDefer) issue_next();  // (kDefer: under both products, below)
            });
        if constexpr (kQParts == 2) scores_add_qlo<DP, KT, DP / 16, !kDefer, kWg>(s, qlf, Kt, lane);
        if constexpr (kDefer) {  // the previous tile's P V, issued after these scores and left
          // running (the first tile's: P = 0, a product that adds +0; the same instructions on
          // every path, which ptxas needs to keep the products asynchronous)
          if (!pv_pending) v_prev = Vt;
          acc_add_packed<NT, DT, KT, kKParts, false, kWg>(acc, pa, v_prev, lane);
          issue_next();  // under both products
#if NSATRON_WGMMA
          if constexpr (kWg) wg::wait_all_but_newest(s);  // the scores alone
#endif
        }
      }
      // A warp none of whose rows sees the tile (the selection: a tile in the block's union
      // only for other positions' blocks; on sm_90a the products are the warpgroup's, so it
      // takes part in them) skips the masks and the softmax: its probabilities (and dS) are 0
      // and its statistics unchanged, the bits the softmax would give them (online_softmax_tile
      // on a row of -inf: corr = 2^0 = 1 or, before any key, 1; p = 2^-inf = 0). Not in the
      // two-stage forward (padded D <= 64): at D = 64 the branch cost it 64 bytes of spills
      // under its 128-register bound.
      constexpr bool kWarpSkip = BR == kSlc && (BWD || kDefer);
      const bool rows_see = !kWarpSkip || warp_sees;
      if (!rows_see) {
#if NSATRON_WGMMA
        if constexpr (kWg && BWD) wg::wait(dp);  // in flight (DP_LATER) until here
#endif
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[n][e] = 0.f;
            if constexpr (BWD) dp[n][e] = 0.f;
          }
        corr[0] = corr[1] = 1.f;
      } else {
        // Masks (-inf where a row may not see a key) and probabilities (fp32).
        const std::uint32_t mbits[2] = {thread_key_bits(vis[0], gc), thread_key_bits(vis[1], gc)};
        mask_scores(s, mbits);
        if (!BWD || phase == 0) {  // online softmax (forward; backward statistics pass)
          if constexpr (BWD) {
            online_softmax_tile<NT, DT>(s, sl2, m2, ls, nullptr, corr);
#if NSATRON_WGMMA
            if constexpr (kWg) wg::wait(dp);
#endif
            softmax_tile_dot<NT>(s, dp, corr, us);  // us: the online sum of p dP
          } else if constexpr (kDefer) {
            online_softmax_tile<NT, DT>(s, sl2, m2, ls, nullptr, corr);
          } else {
            online_softmax_tile<NT, DT>(s, sl2, m2, ls, acc);
          }
        } else {  // p from the statistics, then (dP done) dS or the lsum pass's sum of p dP
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = ex2(fmaf(s[n][e], sl2, -lrow2[e >> 1]));
#if NSATRON_WGMMA
          if constexpr (kWg) wg::wait(dp);
#endif
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h2 = e >> 1;
              if (pass2) {
                if constexpr (kCmpOnePass) {  // the one-pass correction's row sums (below)
                  ls[h2] += s[n][e];
                  us[h2] += s[n][e] * dp[n][e];
                  if (s[n][e] > ptop[h2]) {  // (keys ascend along n, e: the first of equals kept)
                    ptop[h2] = s[n][e];
                    jtop[h2] = s0 + n * 8 + 2 * gc + (e & 1);
                  }
                }
                dp[n][e] = s[n][e] * (dp[n][e] - dot[h2]);  // dS / scale
              } else {
                ls[h2] += s[n][e] * dp[n][e];
              }
            }
        }
      }
      if constexpr (BWD) {
        if (pass2) {  // acc += dS K (dS in row_ds_parts(DP) parts)
          if constexpr (kDeferDq) {  // left running: waited for with the next step's S
#pragma unroll
            for (int k2 = 0; k2 < NT / 2; ++k2) pack_a<NT>(dsa[k2], dp, k2);
            acc_add_packed<NT, DT, KT, kKParts, false, kWg>(acc, dsa, Kt, lane);
          } else {
            acc_add_product<NT, DT, DP, KT, kKParts, true, row_ds_parts(DP), kWg>(acc, dp, Kt, lane);
          }
        }
      } else if constexpr (kDefer) {  // acc += P V at the next step (or after the loop)
#if NSATRON_WGMMA
        if constexpr (kWg) wg::wait(acc);  // the previous tile's product
#endif
        rescale_and_pack<NT, DT>(acc, corr, rows_see, pa, s);
        v_prev = Vt;
        pv_pending = true;
      } else {
        acc_add_product<NT, DT, DP, KT, kKParts, true, 1, kWg>(acc, s, Vt, lane);  // acc += P V
      }
    }
    if constexpr (!kOneBarrier) __syncthreads();  // issue(k + 2) refills stage k & 1 (kDeferDq:
                                                  // its values; its keys go into (k + 2) % 3)
  }
  if constexpr (kDefer)
    if (pv_pending) acc_add_packed<NT, DT, KT, kKParts, true, kWg>(acc, pa, v_prev, lane);
#if NSATRON_WGMMA
  if constexpr (kWg && kDeferDq) wg::wait(acc);  // the last dq product
#endif
  cp_wait0();

  if constexpr (!BWD) quad_row_sums(ls);
  // The compression backward in one pass (dot_in: do . o_c of the forward's output, and its lse).
  // Its probabilities p~ come from bf16 scores, so they need not sum to one (S0 = sum p~) and
  // S1 = sum p~ dP need not be S0 do . o_c: the pass accumulated A = sum_j p~_j (dP_j - dot) k_j,
  // while the two-pass result (p = p~ / S0, lsum = S1 / S0) is sum_j p_j (dP_j - lsum) k_j
  // = A / S0 - (lsum - dot) kbar, kbar = sum_j p_j k_j. Without the second term the residue
  // (lsum - dot) kbar carried the keys' common mean into dq (bf16 grad_q past the 1e-2 bound:
  // docs/performance.md, sixteenth session); kbar needs a D-wide accumulator, so c stands in for
  // it: the row's most probable key k_top with its probability w = p~_top / S0, and the mean of
  // the row's visible compressed keys (a.cmp_ref) for the rest, c = w k_top + (1 - w) mean.
  // What is left is (lsum - dot)(kbar - c), the keys' spread about that instead of their mean
  // (with the mean alone, c = mean, peaked attention's grad_q errors were ~1.3x the two passes':
  // docs/performance.md, seventeenth session). The key side gets the two-pass row terms: lse +
  // ln S0 (a.lse_tc) and lsum.
  [[maybe_unused]] float inv_s0[2] = {0.f, 0.f}, lsum_shift[2] = {0.f, 0.f};
  const bool cmp_one_pass = kCmpOnePass && passes == 1;
  if (cmp_one_pass) {
    quad_row_sums(ls);  // S0
    quad_row_sums(us);  // S1
    quad_row_argmax(ptop, jtop);
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const float s0 = ls[h2];
      inv_s0[h2] = s0 > 0.f ? 1.f / s0 : 0.f;
      ptop[h2] *= inv_s0[h2];  // w
      const float lsum = us[h2] * inv_s0[h2];
      lsum_shift[h2] = lsum - dot[h2];
      dot[h2] = lsum;  // the two-pass's lsum: delta and the gate gradient below
      if (rv[h2] && gc == 0 && a.lse_tc) a.lse_tc[rowg[h2]] = s0 > 0.f ? a.lse_in[rowg[h2]] + logf(s0) : -INFINITY;
    }
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    if (!rv[h2]) continue;
    const std::int64_t row = rowg[h2];
    if constexpr (!BWD) {
      row_forward_store<DT>(g, a, acc, h2, ls[h2], m2[h2], row, gc);
    } else {
      const float gs = a.gate ? sigmoidf(ldf(static_cast<const bf16*>(a.gate)[gate_offset(g, row) + BR])) : 1.f;
      const float dt = dot[h2];
      if (gc == 0 && (!a.dot_in || cmp_one_pass)) {
        a.gsig[row] = gs;
        a.delta[row] = gs * dt;
        if (a.dgate) static_cast<bf16*>(a.dgate)[gate_offset(g, row) + BR] = __float2bfloat16_rn(dt * gs * (1.f - gs));
      }
      if (a.dq) {
        float* dq = a.dq + row * g.D;
        const float f = g.scale * gs;
        // the one-pass correction's reference: the mean of the row's visible compressed keys
        // and its most probable one (none visible: A = 0 and no shift)
        [[maybe_unused]] const float* cref = nullptr;
        [[maybe_unused]] const float* ctop = nullptr;
        if constexpr (BR == kCmp)
          if (cmp_one_pass && rvis[h2] > 0) {
            cref = a.cmp_ref + ((std::int64_t(b) * g.N + (rvis[h2] - 1)) * g.G + gi) * g.D;
            ctop = static_cast<const float*>(a.k) + ((std::int64_t(b) * g.N + jtop[h2]) * g.G + gi) * g.D;
          }
        float2 y[DT];  // the earlier branches' sum (every load before the first store) + this one
#pragma unroll
        for (int j = 0; j < DT; ++j) {
          const int dd = j * 8 + gc * 2;
          y[j] = a.accumulate && dd < g.D ? *reinterpret_cast<const float2*>(dq + dd)
                                          : make_float2(0.f, 0.f);
          if (cmp_one_pass) {
            float2 c = make_float2(0.f, 0.f);
            if (cref && dd < g.D) {
              const float2 mean = *reinterpret_cast<const float2*>(cref + dd);
              const float2 top = *reinterpret_cast<const float2*>(ctop + dd);
              const float w = ptop[h2];
              c = make_float2(fmaf(w, top.x - mean.x, mean.x), fmaf(w, top.y - mean.y, mean.y));
            }
            y[j].x += f * (acc[j][2 * h2] * inv_s0[h2] - lsum_shift[h2] * c.x);
            y[j].y += f * (acc[j][2 * h2 + 1] * inv_s0[h2] - lsum_shift[h2] * c.y);
          } else {
            y[j].x += f * acc[j][2 * h2];
            y[j].y += f * acc[j][2 * h2 + 1];
          }
        }
        if (a.dq_final) {  // the last branch: rotate back (rope_back_elem) and store as bf16;
          // column dd's partner dd +- D/2 is this thread's column j +- DT/2 (D = DP:
          // dq_final_fused)
          constexpr int hj = DT / 2;
          const float2* cs = a.rope + std::int64_t(rt[h2]) * g.half;
          bf16* out = static_cast<bf16*>(a.dq_final) + q_offset(g, row);
#pragma unroll
          for (int j = 0; j < DT; ++j) {  // every column is < D = DP
            const int dd = j * 8 + gc * 2;
            const bool lo = j < hj;  // dd < D/2
            const float2 yp = y[lo ? j + hj : j - hj];
            const int i = lo ? dd : dd - g.half;  // the pair's index in the RoPE table
            *reinterpret_cast<std::uint32_t*>(out + dd) =
                pack2(rope_back_pair(y[j].x, yp.x, cs[i], lo), rope_back_pair(y[j].y, yp.y, cs[i + 1], lo));
          }
        } else {
#pragma unroll
          for (int j = 0; j < DT; ++j) {
            const int dd = j * 8 + gc * 2;
            if (dd < g.D) *reinterpret_cast<float2*>(dq + dd) = y[j];
          }
        }
      }
    }
  }
}

// 32-bit words of a row block's set of 64-key tiles over the keys (the selection's tbits).
inline int row_tile_words(const Geo& g) { return int(((g.T + RowCfg<128>::KT - 1) / RowCfg<128>::KT + 31) / 32); }

// Blocks of the two-stage row kernel one SM holds (its registers and shared memory).
template <int DP, int BR, bool BWD>
int row_blocks_per_sm(const Geo& g) {
  const std::size_t smem = row_smem<DP, BR, BWD>(g.n, row_tile_words(g)).total;
  CUDA_CHECK(cudaFuncSetAttribute(row_kernel<DP, BR, BWD, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(smem)));
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, row_kernel<DP, BR, BWD, true>, kRowWarps * 32, smem));
  return n > 0 ? n : 1;
}

// Whether a launch of the two-stage row kernels takes the LATE schedule (row_kernel): where the
// keys and values its resident blocks stream (K and V of each (batch, group) they work on, all
// parts) take at most row_late_issue_bytes() (selection_loop.h: by default no limit, one
// barrier everywhere, measured faster at every T on an H200; -1: half the device's L2), so
// that they stay in the L2 and the second barrier, not the prefetch distance, is the cost. The grid runs one (batch, group)'s blocks_per_pair row blocks after another (blockIdx.x
// fastest), so the SMs' resident blocks work on at most 1 + ceil(resident / blocks_per_pair)
// pairs at once: at h = 1, T = 8192, one head's 4 MB of a launch's 200 MB; heaviest first
// (row_heaviest_first) the pairs alternate, and min(pairs, resident blocks) are live. Measured on an H100
// (50 MB of L2; docs/performance.md, change 49): one barrier -1.5% at the paper's T = 8192 (17 MB
// of keys and values), +2% at 65536 (134 MB; 34 MB per pair); on an H200 since (2026-11-29) one
// barrier -2 to -7% at 32768 and 65536 too. Both schedules give the same bits.
template <int DP, int BR, bool BWD>
bool row_late_issue(const Geo& g, std::int64_t blocks_per_pair) {
  if (row_late_issue_bytes() == kRowLateAlways) return true;  // (no occupancy query per launch)
  const std::int64_t nk = BR == kCmp ? g.N : g.T;
  const std::int64_t pair_bytes = nk * DP * 2 * 2 * row_kv_parts<DP, BR, BWD>();
  const std::int64_t limit = row_late_issue_bytes() >= 0 ? row_late_issue_bytes() : cuda_l2_cache_bytes() / 2;
  if (pair_bytes > limit) return false;
  const std::int64_t resident = std::int64_t(sm_count()) * row_blocks_per_sm<DP, BR, BWD>(g);
  const std::int64_t pairs = std::int64_t(g.B) * g.G;
  const std::int64_t live =
      row_heaviest_first<BR>(g, kRowWarps * 16) ? std::min(pairs, resident) : std::min<std::int64_t>(pairs, 1 + (resident + blocks_per_pair - 1) / blocks_per_pair);
  return pair_bytes * live <= limit;
}

template <int DP, int BR, bool BWD, bool LATE>
void row_launch_schedule(const Geo& g, const RowArgs& a, cudaStream_t s, std::int64_t nblocks) {
  const int ntw = row_tile_words(g);
  const std::size_t smem = row_smem<DP, BR, BWD>(g.n, ntw).total;
  CUDA_CHECK(cudaFuncSetAttribute(row_kernel<DP, BR, BWD, LATE>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  row_kernel<DP, BR, BWD, LATE><<<row_launch_grid<BR>(g, kRowWarps * 16, nblocks), kRowWarps * 32, smem, s>>>(g, a, ntw);
  check_launch("tc::row_kernel");
}

template <int DP, int BR, bool BWD>
void row_launch(const Geo& g, const RowArgs& a, cudaStream_t s) {
  constexpr int kRows = 16 * kRowWarps;
  const std::int64_t nblocks = (std::int64_t(g.T) * g.h + kRows - 1) / kRows;
  if (nblocks == 0) return;
  if (std::int64_t(g.T) * g.h + kRows >= (std::int64_t(1) << 31))
    throw std::runtime_error("tc::row_kernel: T * heads per group = " + std::to_string(std::int64_t(g.T) * g.h) +
                             " rows of one (batch, group); at most 2^31 - 65 are supported");
  if constexpr (row_stages<DP, BWD>() == 2) {
    if (row_late_issue<DP, BR, BWD>(g, nblocks)) {
      row_launch_schedule<DP, BR, BWD, true>(g, a, s, nblocks);
      return;
    }
  }
  row_launch_schedule<DP, BR, BWD, false>(g, a, s, nblocks);  // (three stages: one barrier already)
}

// ---- Tensor-core key side (dK, dV) of the selection and window branches (bf16 only) --------
//
// A block owns KB = 64 consecutive keys of one (batch, group) (selection: of one selected
// block j, in sub-tiles of 64 when l' > 64), one warp per 16 keys (keys are the M dimension
// of every mma). The rows that see those keys, (position, head) in ascending position then
// head order, are staged in shared memory RB = 64 at a time (cp.async, key_stages: 3 or 2, from
// padded bf16 copies: rotated q and d_out, [B, T, H, DP]); window: positions
// [s0, min(T, s1 - 1 + w)); selection: the positions that chose j (inverse index, built once
// per backward by launch_inverse_index: ascending). All tiles (keys, values, rows) are in the
// layout of wgmma.cuh. On sm_90a the block's 4 warps are one warpgroup and compute
// key_group_rows (64; 32 at D = 32) rows at a time as warpgroup products (K and V as A operands
// read from their shared tiles, Q and dO as B; the block skips a row group only when no row
// of it sees any of its keys); with
// mma.sync, per 16-row sub-batch a warp computes the same:
//   S^T = K Q^T, dP^T = V dO^T (fp32 accumulate), p = exp(scale s - lse) (fp32),
//   dV += (g p)^T dO (g p rounded to bf16),
//   dK += dS^T Q with dS = p (g dP - delta): up to DP = 64 split into bf16 hi + lo parts,
//         dS_hi Q + dS_lo Q, and at DP = 32 Q too (key_q_parts): + dS_hi Q_lo (with both
//         roundings grad_k reached 1.04e-2 of the bf16 bound 1e-2 at D=6); at DP = 128, dS
//         rounded to bf16 once (key_ds_parts, internal.cuh, says what it costs in accuracy),
// skipping sub-batches whose positions cannot see its keys. A selection list of more than
// key_rows_per_split(g) rows (internal.cuh) is split over blocks (grid y) of that many rows each,
// whose fp32 partial sums are added
// in split order by the unit's last block (see the epilogue): balance, block 0 is chosen by
// every position. Every dK, dV element is owned by
// one thread and summed over the rows in a fixed order (deterministic). At the end dK is
// scaled, rotated back and both are stored as bf16.
constexpr int kKeyWarps = 4;
constexpr int kKB = 16 * kKeyWarps;  // keys per block
// 16-row sub-batches a warp of the key side computes together (registers: 2 at DP <= 64).
template <int DP>
constexpr int kKeyPairs = DP <= 64 ? 2 : 1;
constexpr int kKeyRows = 64;  // rows per staged batch (RB), every D

// Parts of each key and value: those of the row backward's tiles (row_kv_parts), which the
// key side reads from the same padded copies.
template <int DP, int BR>
constexpr int key_parts() {
  return row_kv_parts<DP, BR, true>();
}

// Rows of a staged batch computed together (one warpgroup product's N on sm_90a). 64 at D = 64
// and 128 (one group per batch: 32 took 11-17% longer per key kernel, docs/performance.md
// 2026-11-27 third session; 158-238 registers, none spilled); 32 at D = 32.
template <int DP>
constexpr int key_group_rows() { return DP >= 64 ? 64 : 32; }

// Shared stages of the staged row batches: batch i + S - 1 is issued while batch i is
// computed, into the stage batch i - 1 left, so one barrier per batch suffices. S = 3 at
// D <= 64 (68.6 kB per block at D = 64: 3 blocks per SM), S = 2 at D = 128 (64-row batches:
// 100.4 kB, 2 blocks per SM, as the registers allow; three stages would leave one).
template <int DP>
constexpr int key_stages() { return DP > 64 ? 2 : 3; }
// The compression's key side at padded D = 64 takes its keys and values in two parts each
// (cmp_kv_parts): with three stages 85.0 kB, 2 blocks per SM (ncu: 7.5 warps per SM, a
// latency-bound kernel), with two 67.6 kB, 3 blocks. Two stages where h <= kCmpKeyTwoStagesMaxH
// (ncu, one H200 at the base clock, per launch: 125M h = 6 0.200 -> 0.187 ms, a tensor-parallel
// rank's share of it 0.134 -> 0.111, T = 8192 h = 1 0.471 -> 0.415), three above (h = 16, the
// same T: 0.432 -> 0.535 with two, where a block walks ~10x as many row batches and the third
// stage hides their loads); docs/performance.md, twenty-sixth session. The same arithmetic
// either way. (key_launch chooses.)
constexpr int kCmpKeyTwoStagesMaxH = 6;

template <int DP, int BR, int S>
constexpr std::size_t key_smem_bytes() {  // all bf16 tiles are tiles laid out as wgmma.cuh says
  constexpr int kRB = kKeyRows;
  constexpr std::size_t tiles =
      std::size_t(S * (1 + key_q_parts(DP)) * kRB * DP + 2 * key_parts<DP, BR>() * kKB * DP) * 2 +
      std::size_t(S * 4 * kRB) * 4;
  constexpr std::size_t epilogue = std::size_t(2 * kKB * (DP + 4)) * 4;  // fp32 dK, dV
  return tiles > epilogue ? tiles : epilogue;
}

// Whether the key side of branch BR runs heaviest first (see kMaxGridYZ), its grid (B G, 1,
// key tiles): the window, whose tile t sees the rows of positions [64 t, min(T, 64 t + 63 + w)):
// at w = 512 about the same count for every t, but at w ~ T (the own dense kernel) a count
// falling linearly with t, and in the (tiles, 1, pairs) order the last pairs' heaviest tiles
// started only after most of the first pairs' blocks (the model at the paper's 8192, 4 pairs of
// 128 tiles on 264 resident blocks: the last block ended at 1.51x the mean work per slot,
// tile-major 1.02x; about the gap between this kernel's ~350 TFLOP/s at w = T and the row
// backward's ~570). Only where w >= T: at w = 512 the tiles' work is even, and neighbouring
// tiles of a pair share ~575 positions of rows, which the (tiles, 1, pairs) order keeps close
// together in time (L2 reuse).
template <int BR>
__host__ __device__ inline bool key_tile_major(const Geo& g) {
  return BR == kWin && g.w >= g.T && (g.T + kKB - 1) / kKB <= kMaxGridYZ;
}

template <int DP, int BR, int S>  // S: the row batches' shared stages (key_stages, kCmpKeyTwoStagesMaxH)
__global__ void __launch_bounds__(kKeyWarps * 32, DP <= 64 ? 3 : 1) key_kernel(Geo g, KeyArgs a, int nsub) {
  static_assert(S == 2 || S == 3, "two or three stages");
  constexpr int DT = DP / 8, KS = DP / 16, CH = DP / 8, kRB = kKeyRows;
  constexpr int P = key_parts<DP, BR>();
  // mma.sync: K, V fragments in registers for the whole block where they fit (sm_90a: the
  // warpgroup products read them from the shared tiles as A operands).
  constexpr bool kHoist = DP <= 64 && P == 1 && !NSATRON_WGMMA;
  // sm_90a, compression: the next batch's copies issued under the batch's first products (at
  // 64k -4.5% on this kernel; the selection's D = 64 kernel was 7% slower with it, the window's
  // unchanged: docs/performance.md, eleventh session).
  constexpr bool kIssueUnder = NSATRON_WGMMA && BR == kCmp;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(1024) float4 smem4[];  // 1024: swizzled wgmma tiles (wgmma.cuh)
  // Tiles of DP bf16 per row laid out as wgmma.cuh says.
  bf16* Qb = reinterpret_cast<bf16*>(smem4);  // [S] tiles of RB rows
  bf16* Ob = Qb + S * kRB * DP;               // [S] tiles of RB rows
  constexpr int kQP = key_q_parts(DP);       // rotated q as hi (+ lo) parts
  // The window branch's scores take the q residuals too (win_score_parts): S^T += K_hi Q_lo.
  constexpr bool kSQ = BR == kWin && win_score_parts(DP) == 2;
  static_assert(!kSQ || kQP == 2, "the scores' q residuals are the staged ones of dK");
  bf16* Lb = Ob + S * kRB * DP;               // [S] tiles: q residuals (kQP == 2)
  bf16* Ks = Lb + (kQP - 1) * S * kRB * DP;   // [P] tiles of KB keys
  bf16* Vs = Ks + P * kKB * DP;               // [P] tiles of KB keys
  float* rs = reinterpret_cast<float*>(Vs + P * kKB * DP);  // [S][3][RB] lse, g, delta
  int* rtp = reinterpret_cast<int*>(rs + S * 3 * kRB);    // [S][RB] position, -1: none
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool tile_major = key_tile_major<BR>(g);  // grid (pairs, 1, tiles) where heaviest first
  const int tile = tile_major ? int(blockIdx.z) : int(blockIdx.x);
  const int pair = tile_major ? int(blockIdx.x) : int(blockIdx.z);
  const int b = pair / g.G, gi = pair % g.G;
  int s0, s1, npos, p0 = 0, nsplit = 1, off = 0, rsplit = 0;
  std::int64_t unit = 0;
  const std::int32_t* list = nullptr;
  if constexpr (BR == kWin) {
    s0 = tile * kKB;
    s1 = min(g.T, s0 + kKB);
    p0 = s0;
    npos = min(g.T, s1 - 1 + g.w) - s0;
  } else if constexpr (BR == kCmp) {  // compressed blocks s0..s1-1; positions p0..T-1
    s0 = blockIdx.x * kKB;
    s1 = min(g.N, s0 + kKB);
    p0 = min(g.T, s0 * g.d + g.l - 1);
    npos = g.T - p0;
    rsplit = cmp_key_rows_per_split(g);
    nsplit = max(1, (npos * g.h + rsplit - 1) / rsplit);
    unit = (std::int64_t(b) * g.G + gi) * gridDim.x + blockIdx.x;
  } else {
    const int j = blockIdx.x / nsub;
    s0 = j * g.ls + (blockIdx.x % nsub) * kKB;
    s1 = min(min(g.T, j * g.ls + g.ls), s0 + kKB);
    unit = (std::int64_t(b) * g.G + gi) * g.NB + j;
    off = a.inv_off[unit];
    npos = a.inv_off[unit + 1] - off;
    list = a.inv_pos + off;
    rsplit = key_rows_per_split(g);
    nsplit = max(1, (npos * g.h + rsplit - 1) / rsplit);
  }
  if (s0 >= s1 || int(blockIdx.y) >= nsplit) return;  // block-uniform
  // This block's rows: [rbeg, rend) of the list's (position, head) rows.
  const int rbeg = int(blockIdx.y) * rsplit;
  const int nrows = BR != kWin ? min(npos * g.h, rbeg + rsplit) : npos * g.h;  // rend
  const int nbatch = (nrows - rbeg + kRB - 1) / kRB;
  const bf16* kp = static_cast<const bf16*>(a.tck);
  const bf16* vp = static_cast<const bf16*>(a.tcv);
  const bf16* qp = static_cast<const bf16*>(a.tcq);
  const bf16* op = static_cast<const bf16*>(a.tcdo);
  const bf16* lp = static_cast<const bf16*>(a.tcql);

  // Keys and values of the block.
  for (int idx = tid; idx < kKB * CH; idx += kKeyWarps * 32) {
    const int kk = idx / CH, ch = idx % CH;
    const bool ok = s0 + kk < s1;
    const std::int64_t NK = BR == kCmp ? g.N : g.T;
    const std::int64_t ko = ok ? ((std::int64_t(b) * NK + s0 + kk) * g.G + gi) * DP + ch * 8 : 0;
    const int to = wg::tile_offset<DP, kKB>(kk, ch);
#pragma unroll
    for (int p = 0; p < P; ++p) {  // part p at p * B*NK*G*DP (launch_tc_pad)
      const std::int64_t po = ok ? p * std::int64_t(g.B) * NK * g.G * DP + ko : 0;
      cp16(reinterpret_cast<char*>(Ks + p * kKB * DP) + to, kp + po, ok);
      cp16(reinterpret_cast<char*>(Vs + p * kKB * DP) + to, vp + po, ok);
    }
  }
  int next_t = 0;  // selection: see issue
  // The copy issue's per-thread constants. Every 16-byte chunk of a batch's rows: thread tid
  // takes chunk cch = lane % CH of row r0 + it * kRowStep in pass it (r0 = warp * kRpw + sub,
  // sub = lane / CH): its tile offset is r0's plus whole 8-row groups (kRowStep is a multiple
  // of 8), and its global row is one of this (batch, group)'s, (b T + t) H + gi h + hd: the
  // block's first, blk_row, plus the local row t H + hd (below 2^31: key_launch checks T H).
  constexpr int kIt = kRB * CH / (kKeyWarps * 32), kRpw = 32 / CH, kRowStep = kKeyWarps * kRpw;
  static_assert(kRB * CH % (kKeyWarps * 32) == 0 && 32 % CH == 0 && kIt <= CH && kRowStep % 8 == 0,
                "whole passes over the chunks, rows owned by lanes of their chunks, 8-row groups per pass");
  const int cch = lane % CH, sub = lane / CH;
  const int to0 = wg::tile_offset<DP, kRB>(warp * kRpw + sub, cch);
  const std::int64_t blk_row = (std::int64_t(b) * g.T) * g.H + gi * g.h;
  const bf16* qrow = opaque(qp + blk_row * DP + cch * 8);  // chunk cch of local row 0
  const bf16* orow = opaque(op + blk_row * DP + cch * 8);
  const bf16* lrow = kQP == 2 ? opaque(lp + blk_row * DP + cch * 8) : nullptr;
  // The rows' statistics: at DP = 128 from bases at local row 0 (one wide multiply-add per row
  // each); at DP <= 64 from the arrays' starts (three more bases made the sm_90 build's mma.sync
  // kernels spill).
  constexpr bool kStatBases = DP > 64;
  const float* lse_b = kStatBases ? opaque(a.lse + blk_row) : a.lse;
  const float* gs_b = kStatBases ? opaque(a.gsig + blk_row) : a.gsig;
  const float* dl_b = kStatBases ? opaque(a.delta + blk_row) : a.delta;
  auto issue = [&](int i) {
    if (i < nbatch) {
      const int st = i % S;
      char* qd = reinterpret_cast<char*>(Qb + st * kRB * DP) + to0;
      char* od = reinterpret_cast<char*>(Ob + st * kRB * DP) + to0;
      char* ld = reinterpret_cast<char*>(Lb + st * kRB * DP) + to0;
      float* rd = rs + st * 3 * kRB;
      int* td = rtp + st * kRB;
      // Each of the warp's rows is resolved once, by its owner lane, lane it of the CH lanes of
      // its chunks (position from the selection's list, local row), and passed to them by one
      // 32-bit shuffle within those CH lanes (every lane computing every row's address cost
      // ~20% of the selection's key side; the position and a 64-bit row, three shuffles a pass,
      // the lane numbers and the 64-bit address arithmetic, were ~2/3 of the issue's
      // instructions). Pass it's row is a row of the block where it * kRowStep < lim; the
      // others (the last batch's end) are zero-filled, from local row 0's address. The owner
      // lane also stages, after the chunks, the row's position (-1: none) and, asynchronously,
      // its lse, sigmoid(gate) and delta.
      // (Selection: the list entry of the lane's row in batch i + 1 is loaded here, a batch
      // ahead of its use; loaded at its use, its wait was ~4% of the key side's stall samples.)
      const int lim = nrows - (rbeg + i * kRB + warp * kRpw + sub);
      const bool owner = cch < kIt;  // (lanes with cch >= kIt own none)
      const int own_r = warp * kRpw + sub + cch * kRowStep;
      int own_t = -1, own_v = 0;
      if (owner) {  // the row this lane resolves
        const int rho = rbeg + i * kRB + own_r;
        if (rho < nrows) {
          int pi, hd;
          g.hdiv.divmod(rho, pi, hd);
          own_t = BR == kSlc ? (i == 0 ? list[pi] : next_t) : p0 + pi;
          own_v = own_t * g.H + hd;
        }
        if constexpr (BR == kSlc)
          if (rho + kRB < nrows) next_t = list[g.hdiv.div(rho + kRB)];
      }
#pragma unroll
      for (int it = 0; it < kIt; ++it) {
        const std::int64_t go = std::int64_t(__shfl_sync(0xffffffffu, own_v, it, CH)) * DP;
        const int to = wg::row_group_offset<DP>(it * kRowStep);
        cp16_lt(qd + to, qrow + go, it * kRowStep, lim);
        cp16_lt(od + to, orow + go, it * kRowStep, lim);
        if constexpr (kQP == 2) cp16_lt(ld + to, lrow + go, it * kRowStep, lim);
      }
      // The row's position and statistics, by its owner lane after the chunks (inside the
      // chunk loop, by the lane of the row's first chunk, each pass had a divergent branch
      // between the shuffles).
      if (owner) {
        td[own_r] = own_t;
        const std::int64_t ro = kStatBases ? own_v : blk_row + own_v;
        cp4_lt(rd + own_r, lse_b + ro, cch * kRowStep, lim);  // lse (natural log; times log2 e where it is read)
        cp4_lt(rd + kRB + own_r, gs_b + ro, cch * kRowStep, lim);
        cp4_lt(rd + 2 * kRB + own_r, dl_b + ro, cch * kRowStep, lim);
      }
    }
    cp_commit();
  };

  const int gr = lane >> 2, gc = lane & 3;
  const int ws0 = s0 + warp * 16;
  const int wlast = min(s1, ws0 + 16) - 1;  // last valid key of the warp (< ws0: none)
  const bool wact = ws0 < s1;
  float dK[DT][4], dV[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dK[j][e] = dV[j][e] = 0.f;
  std::uint32_t kf[kHoist ? P * KS : 1][4], vf[kHoist ? P * KS : 1][4];
  const float sl2 = g.scale * kLog2e;
  // The nr rows from r0 of a staged batch against the keys klo..khi: 1 some row sees one of
  // them, 0 none does, -1 no rows (invalid rows are only at the end). Rows are in ascending
  // position order, so the first and last rows decide.
  auto rows_state = [&](const int* td, int r0, int nr, int klo, int khi) -> int {
    const int tA = td[r0];
    if (tA < 0) return -1;
    const int tB = td[r0 + nr - 1] >= 0 ? td[r0 + nr - 1] : g.T;
    if (tB < (BR == kCmp ? klo * g.d + g.l - 1 : klo)) return 0;
    if (BR == kWin && tA - g.w >= khi) return 0;  // every key left the window
    return 1;
  };

  issue(0);  // the key tile joins batch 0's group
  if constexpr (S == 3) issue(1);
  for (int i = 0; i < nbatch; ++i) {
    if constexpr (S == 3) cp_wait1();  // batch i's group (batch i + 1's may still be in flight)
    else cp_wait0();
#if NSATRON_WGMMA
    wg::fence_proxy_async();  // the cp.async tiles are read by the tensor cores' async proxy
#endif
    __syncthreads();  // batch i is visible, and every warp is done with batch i - 1 (whose
                      // stage batch i + S - 1 takes; its products were waited for in its groups)
    bool next_issued = false;  // issue(i + S - 1), once per batch
    auto issue_next = [&] {
      if (!next_issued) issue(i + S - 1);
      next_issued = true;
    };
    if constexpr (!kIssueUnder) issue_next();
    if (i == 0 && kHoist) {
#pragma unroll
      for (int p = 0; p < (kHoist ? P : 0); ++p)
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          tile_frag_a<DP, kKB>(kf[p * KS + kk], Ks + p * kKB * DP, warp * 16, kk * 16, lane);
          tile_frag_a<DP, kKB>(vf[p * KS + kk], Vs + p * kKB * DP, warp * 16, kk * 16, lane);
        }
    }
    const int st = i % S;
    const bf16* Qc = Qb + st * kRB * DP;
    const bf16* Oc = Ob + st * kRB * DP;
    const bf16* Lc = Lb + st * kRB * DP;
    const float* rd = rs + st * 3 * kRB;
    const int* td = rtp + st * kRB;
    // NR rows from rb (whole 16-row sub-batches): S^T = K Q^T and dP^T = V dO^T for the
    // warp's 16 keys x NR rows (accumulator layout: key gr (+8), row n*8 + 2gc (+1)), p and
    // dS, then dV += (g p)^T dO and dK += dS^T Q. Each dK, dV element sums the rows in order.
    auto rows_group = [&](int rb, auto nr) {
      constexpr int NR = decltype(nr)::value, NN = NR / 8, NM = NR / 16;
      float st[NN][4], dpt[NN][4];
#pragma unroll
      for (int n = 0; n < NN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
#if NSATRON_WGMMA
      const char* Qr = reinterpret_cast<const char*>(Qc) + wg::row_group_offset<DP>(rb);
      const char* Or = reinterpret_cast<const char*>(Oc) + wg::row_group_offset<DP>(rb);
      const char* Lr = reinterpret_cast<const char*>(Lc) + wg::row_group_offset<DP>(rb);
      wg::pin(st);
      wg::pin(dpt);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        if constexpr (kSQ)  // S^T += K_hi Q_lo (win_score_parts)
          wg::mma<NR, 0>(st, wg::kmajor_desc<DP, kKB>(Ks, kk), wg::kmajor_desc<DP, kRB>(Lr, kk));
#pragma unroll
        for (int p = P - 1; p >= 0; --p) {  // smallest part first
          wg::mma<NR, 0>(st, wg::kmajor_desc<DP, kKB>(Ks + p * kKB * DP, kk), wg::kmajor_desc<DP, kRB>(Qr, kk));
          wg::mma<NR, 0>(dpt, wg::kmajor_desc<DP, kKB>(Vs + p * kKB * DP, kk), wg::kmajor_desc<DP, kRB>(Or, kk));
        }
      }
      wg::commit();
      if constexpr (kIssueUnder) issue_next();  // the next batch's copies under the products
      wg::wait(st);
      wg::pin(dpt);
#else
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
        for (int p = P - 1; p >= 0; --p) {  // smallest part first
          std::uint32_t ka[4], va[4];
          if constexpr (kHoist) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              ka[e] = kf[p * KS + kk][e];
              va[e] = vf[p * KS + kk][e];
            }
          } else {
            tile_frag_a<DP, kKB>(ka, Ks + p * kKB * DP, warp * 16, kk * 16, lane);
            tile_frag_a<DP, kKB>(va, Vs + p * kKB * DP, warp * 16, kk * 16, lane);
          }
#pragma unroll
          for (int m = 0; m < NM; ++m) {
            std::uint32_t qb[4], ob[4];
            tile_frag_bt<DP, kRB>(qb, Qc, rb + 16 * m, kk * 16, lane);
            tile_frag_bt<DP, kRB>(ob, Oc, rb + 16 * m, kk * 16, lane);
            if constexpr (kSQ) {
              if (p == 0) {  // S^T += K_hi Q_lo (win_score_parts)
                std::uint32_t lb[4];
                tile_frag_bt<DP, kRB>(lb, Lc, rb + 16 * m, kk * 16, lane);
                mma(st[2 * m], ka, lb[0], lb[1]);
                mma(st[2 * m + 1], ka, lb[2], lb[3]);
              }
            }
            mma(st[2 * m], ka, qb[0], qb[1]);
            mma(st[2 * m + 1], ka, qb[2], qb[3]);
            mma(dpt[2 * m], va, ob[0], ob[1]);
            mma(dpt[2 * m + 1], va, ob[2], ob[3]);
          }
        }
      }
#endif
      // p and dS / scale per (key, row). Where every row of a 16-row sub-batch sees every
      // key of the warp (rows in ascending position order), no mask.
      constexpr int kDSP = key_ds_parts(DP);
      std::uint32_t pa[NM][4], ea[NM][4];
      [[maybe_unused]] std::uint32_t el[kDSP == 2 ? NM : 1][4];  // dS_lo (kDSP == 2)
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const int r0 = rb + 16 * m;
        const int tA = td[r0], tZ = td[r0 + 15];
        const bool whole = tZ >= 0 && wlast == ws0 + 15 &&
                           tA >= (BR == kCmp ? wlast * g.d + g.l - 1 : wlast) &&
                           (BR != kWin || tZ - g.w < ws0);
        // (whole is warp-uniform: the unmasked form has no per-element tests.)
        auto probs = [&](auto masked) {
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int r = r0 + n * 8 + gc * 2 + c;
              const int t = td[r];
              const float L = rd[r] * kLog2e, Gs = rd[kRB + r], Dl = rd[2 * kRB + r];
#pragma unroll
              for (int hk = 0; hk < 2; ++hk) {
                const int e = 2 * hk + c;
                const int s = ws0 + gr + 8 * hk;
                bool ok = true;
                if constexpr (decltype(masked)::value)
                  ok = wact && t >= 0 && s <= wlast && kmask<BR>(g, t, s);
                const float p = ok ? ex2(fmaf(st[2 * m + n][e], sl2, -L)) : 0.f;
                st[2 * m + n][e] = p * Gs;
                dpt[2 * m + n][e] = p * (Gs * dpt[2 * m + n][e] - Dl);
              }
            }
        };
        if (whole)
          probs(std::false_type{});
        else
          probs(std::true_type{});
        pack_a<NN>(pa[m], st, m);
        if constexpr (kDSP == 2) pack_a_parts<NN>(ea[m], el[m], dpt, m);  // dS as hi + lo
        else pack_a<NN>(ea[m], dpt, m);                                     // dS rounded to bf16
      }
#if NSATRON_WGMMA
      wg::pin(pa);
      wg::pin(ea);
      if constexpr (kDSP == 2) wg::pin(el);
      wg::pin(dV);
      wg::pin(dK);
      wg::fence();
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        wg::mma<DP, 1>(dV, pa[m], wg::mnmajor_desc<DP, kRB>(Or, m));
        wg::mma<DP, 1>(dK, ea[m], wg::mnmajor_desc<DP, kRB>(Qr, m));
        if constexpr (kDSP == 2) wg::mma<DP, 1>(dK, el[m], wg::mnmajor_desc<DP, kRB>(Qr, m));
        if constexpr (kQP == 2) wg::mma<DP, 1>(dK, ea[m], wg::mnmajor_desc<DP, kRB>(Lr, m));
      }
      wg::commit();
      wg::wait(dK);
      wg::pin(dV);
#else
#pragma unroll
      for (int jp = 0; jp < DT / 2; ++jp)
#pragma unroll
        for (int m = 0; m < NM; ++m) {
          std::uint32_t xo[4], xq[4];
          tile_frag_b<DP, kRB>(xo, Oc, rb + 16 * m, jp * 16, lane);
          tile_frag_b<DP, kRB>(xq, Qc, rb + 16 * m, jp * 16, lane);
          mma(dV[2 * jp], pa[m], xo[0], xo[1]);
          mma(dV[2 * jp + 1], pa[m], xo[2], xo[3]);
          mma(dK[2 * jp], ea[m], xq[0], xq[1]);
          mma(dK[2 * jp + 1], ea[m], xq[2], xq[3]);
          if constexpr (kDSP == 2) {
            mma(dK[2 * jp], el[m], xq[0], xq[1]);
            mma(dK[2 * jp + 1], el[m], xq[2], xq[3]);
          }
          if constexpr (kQP == 2) {
            std::uint32_t xl[4];
            tile_frag_b<DP, kRB>(xl, Lc, rb + 16 * m, jp * 16, lane);
            mma(dK[2 * jp], ea[m], xl[0], xl[1]);
            mma(dK[2 * jp + 1], ea[m], xl[2], xl[3]);
          }
        }
#endif
    };
#if NSATRON_WGMMA
    // Warpgroup products: every warp takes every group of rows that some row of the block's
    // keys sees (the masks zero the rest).
    constexpr int kGR = key_group_rows<DP>();
    for (int r0 = 0; r0 < kRB; r0 += kGR) {
      const int st0 = rows_state(td, r0, kGR, s0, s1 - 1);  // the block's keys
      if (st0 == 1) rows_group(r0, std::integral_constant<int, kGR>{});
      if (st0 == -1) break;
    }
    issue_next();  // (where no group of rows was computed)
#else
    if (wact) {
      // A 16-row sub-batch at r0 against the warp's keys.
      auto state = [&](int r0) { return rows_state(td, r0, 16, ws0, wlast); };
      constexpr int kPair = kKeyPairs<DP>;
      for (int r0 = 0; r0 < kRB; r0 += 16 * kPair) {
        const int a0 = state(r0), a1 = kPair == 2 ? state(r0 + 16) : 0;
        if (a0 == 1 && a1 == 1) {
          rows_group(r0, std::integral_constant<int, 32>{});
        } else {
          if (a0 == 1) rows_group(r0, std::integral_constant<int, 16>{});
          if (a1 == 1) rows_group(r0 + 16, std::integral_constant<int, 16>{});
        }
        if (a0 == -1 || a1 == -1) break;
      }
    }
#endif
  }
  cp_wait0();
  __syncthreads();

  // dK (scaled) and dV to shared fp32 [KB][DP + 4], then rotate dK back and store.
  constexpr int FS = DP + 4;
  float* Tk = reinterpret_cast<float*>(smem4);
  float* Tv = Tk + kKB * FS;
  if (nsplit == 1) {
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int kk = warp * 16 + gr + 8 * (e >> 1), dd = j * 8 + gc * 2 + (e & 1);
        Tk[kk * FS + dd] = dK[j][e] * g.scale;
        Tv[kk * FS + dd] = dV[j][e];
      }
  } else {
    // Selection, split list: partial sums to slot (off*h/rsplit + unit + split) [2][KB][DP] (the
    // slots of a unit are distinct from every other unit's); the last block of the unit to
    // finish adds the partials in split order (the result does not depend on which one).
    // Compression: slot unit * kCmpKeyMaxSplits + split.
    const int sub = int(blockIdx.x) % nsub;
    const std::int64_t slot0 =
        BR == kCmp ? unit * kCmpKeyMaxSplits : std::int64_t(off) * g.h / rsplit + unit;
    auto part = [&](int sp) {
      return a.slc_part + ((slot0 + sp) * nsub + sub) * std::int64_t(2 * kKB * DP);
    };
    float* P = part(int(blockIdx.y));
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int kk = warp * 16 + gr + 8 * (e >> 1), dd = j * 8 + gc * 2 + (e & 1);
        P[kk * DP + dd] = dK[j][e] * g.scale;
        P[kKB * DP + kk * DP + dd] = dV[j][e];
      }
    __threadfence();
    __syncthreads();
    __shared__ int last;
    int* ticket = a.slc_ticket + (BR == kCmp ? unit : unit * nsub + sub);
    if (tid == 0) last = atomicAdd(ticket, 1) == nsplit - 1;
    __syncthreads();
    if (!last) return;  // block-uniform
    __threadfence();
    for (int idx = tid; idx < kKB * DP; idx += blockDim.x) {
      float sk = 0.f, sv = 0.f;
#pragma unroll 4  // the loads of four splits issued together, the adds in split order
      for (int sp = 0; sp < nsplit; ++sp) {
        const float* Q2 = part(sp);
        sk += __ldcg(Q2 + idx);
        sv += __ldcg(Q2 + kKB * DP + idx);
      }
      Tk[(idx / DP) * FS + idx % DP] = sk;
      Tv[(idx / DP) * FS + idx % DP] = sv;
    }
    if (tid == 0) *ticket = 0;  // ready for the next backward
  }
  __syncthreads();
  // dK rotated back (rope_back_pair) and both stored: one RoPE pair (i, i + D/2) per thread
  // and step, both elements from the pair's (cos, sin), the table loads of kEpi steps issued
  // before their uses (one element per step, each load waited for alone, was ~8% of the window
  // key side's stall samples at D = 128).
  constexpr int HP = DP / 2, kEpi = 4;  // pairs per key (those from g.half on are padding)
  const int cnt = s1 - s0;
  for (int base = tid; base < cnt * HP; base += kEpi * kKeyWarps * 32) {
    float2 r[kEpi];
#pragma unroll
    for (int u = 0; u < kEpi; ++u) {
      const int idx = base + u * kKeyWarps * 32, kk = idx / HP, i = idx % HP;
      const int s = s0 + kk;
      const int pos = BR == kCmp ? s * g.d + g.l - 1 : s;  // RoPE position of the key
      r[u] = idx < cnt * HP && i < g.half ? a.rope[std::int64_t(pos) * g.half + i] : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kEpi; ++u) {
      const int idx = base + u * kKeyWarps * 32, kk = idx / HP, i = idx % HP;
      if (idx >= cnt * HP || i >= g.half) continue;
      const float* y = Tk + kk * FS;
      const float* v = Tv + kk * FS;
      const float dk0 = rope_back_pair(y[i], y[i + g.half], r[u], true);
      const float dk1 = rope_back_pair(y[i + g.half], y[i], r[u], false);
      // [B, NK, G, D]: fp32 for the compression (its backward takes them on), else bf16
      using Out = std::conditional_t<BR == kCmp, float, bf16>;
      const std::int64_t NK = BR == kCmp ? g.N : g.T;
      const int s = s0 + kk;
      // (the token branches' rows Geo::kvp apart)
      const std::int64_t o = (std::int64_t(b) * NK + s) * (BR == kCmp ? std::int64_t(g.G) * g.D : g.kvp) +
                             std::int64_t(gi) * g.D + i;
      Out* dk = static_cast<Out*>(a.dk) + o;
      Out* dv = static_cast<Out*>(a.dv) + o;
      dk[0] = stf<Out>(dk0);
      dk[g.half] = stf<Out>(dk1);
      dv[0] = stf<Out>(v[i]);
      dv[g.half] = stf<Out>(v[i + g.half]);
    }
  }
}

template <int DP, int BR>
void key_launch(const Geo& g, const KeyArgs& a, cudaStream_t s) {
  int tiles, nsub = 1;
  if constexpr (BR == kWin) {
    tiles = (g.T + kKB - 1) / kKB;
  } else if constexpr (BR == kCmp) {
    tiles = cmp_key_blocks(g);
  } else {
    nsub = (g.ls + kKB - 1) / kKB;
    tiles = g.NB * nsub;
  }
  if (tiles == 0) return;
  if (std::int64_t(g.T) * g.H >= (std::int64_t(1) << 31))  // the copy issue's local rows t H + hd
    throw std::runtime_error("tc::key_kernel: T * heads = " + std::to_string(std::int64_t(g.T) * g.H) +
                             " rows of one sequence; at most 2^31 - 1 are supported");
  const int ysplits = BR == kSlc ? key_max_splits(g) : (BR == kCmp ? cmp_key_max_splits(g) : 1);
  const dim3 grid = key_tile_major<BR>(g) ? dim3(unsigned(g.B * g.G), unsigned(ysplits), unsigned(tiles))
                                         : dim3(unsigned(tiles), unsigned(ysplits), unsigned(g.B * g.G));
  auto launch = [&](auto stages) {
    constexpr int S = decltype(stages)::value;
    constexpr std::size_t smem = key_smem_bytes<DP, BR, S>();
    static_assert(smem >= std::size_t(2 * kKB * (DP + 4)) * 4, "epilogue fits");
    CUDA_CHECK(cudaFuncSetAttribute(key_kernel<DP, BR, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    key_kernel<DP, BR, S><<<grid, kKeyWarps * 32, smem, s>>>(g, a, nsub);
  };
  if constexpr (DP == 64 && BR == kCmp) {
    if (g.h <= kCmpKeyTwoStagesMaxH) launch(std::integral_constant<int, 2>{});
    else launch(std::integral_constant<int, key_stages<DP>()>{});
  } else {
    launch(std::integral_constant<int, key_stages<DP>()>{});
  }
  check_launch("tc::key_kernel");
}

// ---- Inverse selection index -----------------------------------------------------------------
// unit = (b, g, j). mark: for every entry j of sel[b, t, g, :] with j * l' <= t, set bit t of
// mask[unit] (atomicOr; the count grows only where the bit was clear, so duplicates count
// once); integer results, independent of the order. scan: off = exclusive prefix sum of the
// counts (one block, ascending). fill: one warp per unit writes the set bits' positions in
// ascending order from off[unit].
__global__ void inv_mark_kernel(Geo g, const std::int32_t* __restrict__ sel,
                                std::uint32_t* __restrict__ mask, int* __restrict__ cnt, int W) {
  const std::int64_t total = std::int64_t(g.B) * g.T * g.G * g.n;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int j = sel[idx];
    if (j < 0 || j >= g.NB) continue;
    const std::int64_t bt = idx / (std::int64_t(g.G) * g.n);
    const int gi = int((idx / g.n) % g.G);
    const int t = int(bt % g.T), b = int(bt / g.T);
    if (j * g.ls > t) continue;
    const std::int64_t unit = (std::int64_t(b) * g.G + gi) * g.NB + j;
    const std::uint32_t bit = 1u << (t & 31);
    if (!(atomicOr(mask + unit * W + (t >> 5), bit) & bit)) atomicAdd(cnt + unit, 1);
  }
}

__global__ void __launch_bounds__(1024) inv_scan_kernel(const int* __restrict__ cnt,
                                                        int* __restrict__ off, int U) {
  __shared__ int wsum[32];
  __shared__ int carry_s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) carry_s = 0;
  __syncthreads();
  for (int base = 0; base < U; base += 1024) {
    const int v = base + tid < U ? cnt[base + tid] : 0;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int w = wsum[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += y;
      }
      wsum[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    const int carry = carry_s;
    const int incl = x + (warp > 0 ? wsum[warp - 1] : 0);
    if (base + tid < U) off[base + tid] = carry + incl - v;
    __syncthreads();
    if (tid == 1023) carry_s = carry + incl;
    __syncthreads();
  }
  if (tid == 0) off[U] = carry_s;
}

__global__ void inv_fill_kernel(Geo g, const std::uint32_t* __restrict__ mask,
                                const int* __restrict__ off, int* __restrict__ pos, int W,
                                std::int64_t U) {
  const int lane = threadIdx.x & 31;
  const std::int64_t unit = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (unit >= U) return;  // warp-uniform
  const int j = int(unit % g.NB);
  int base = off[unit];
  for (int w0 = (j * g.ls) >> 5; w0 < W; w0 += 32) {
    const int w = w0 + lane;
    std::uint32_t m = w < W ? mask[unit * W + w] : 0u;
    const int c = __popc(m);
    int x = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    int p = base + x - c;
    while (m) {
      const int bit = __ffs(m) - 1;
      pos[p++] = w * 32 + bit;
      m &= m - 1;
    }
    base += __shfl_sync(0xffffffffu, x, 31);
  }
}

}  // namespace tc
