// NSA compression on CUDA as matrix products (cuBLASLt through nsatron::cuda::gemm; tensor
// cores for bf16, plain fp32 for fp32).
//
// Math. For one KV head g, block i covers tokens [i*d, i*d + l). Split it into its l/d chunks
// of d tokens: chunk c covers tokens [c*d, c*d + d), and block i is chunks i .. i + l/d - 1.
// With Z the matrix of flattened chunks (row c = the d*D values of chunk c, token major) and
// W_m = rows [m*d*D, (m+1)*d*D) of the map W (so W = [W_0; W_1; ...]),
//   Y_i = flatten(X_i + P) W = sum_m Z_{i+m} W_m + flatten(P) W,
// i.e. l/d products of the chunk matrix shifted by m rows, plus a bias row per head; the keys
// are then rotated at position i*d + l - 1. The backward of Y = sum_m shift_m(Z) W_m + bias:
//   dW_m += shift_m(Z)^T dY + flatten(P)_m^T colsum(dY)   (colsum over every block of every
//           sequence),
//   dZ = sum_m shift_{-m}(dY) W_m^T  (a chunk gets the gradient of every block it belongs to:
//           the overlap of blocks when d < l), scattered back to the tokens: one product
//           A Wt^T with K = (l/d) parts D, A's row c = [shift_{-m}(dY part k) row c] and Wt's
//           row f = [W_m row f] side by side over (m, k) (four products accumulating into the
//           fp32 dZ had read and written it three more times: ~1 ms per backward at 48 heads),
//   dP += colsum(dY) W^T         (the bias row's gradient, reshaped to [l, D]).
//
// Layout of the scratch (per head g, rows of R = N + l/d - 1 chunks per sequence, sequences
// one after another; leading dimensions rounded up so that every shifted operand stays
// 256-byte aligned for cuBLASLt; parts: bf16 takes dY as two parts, the bf16 value and its
// rounding residual, so the products see ~16 significant bits of the fp32 gradient; fp32 one):
// forward, in this order:
//   Z   [G][B*R + l/d - 1][ldz]  T     the chunks; the l/d - 1 rows after the last are zero
//   Y   [G][B*R][ldy]            fp32  sum_m shift_m(Z) W_m (rows i >= N of a sequence unused)
//   bias [G][D]                  fp32  flatten(P) W
// backward, in this order:
//   Z   as in the forward (gathered again)
//   A   [G][B*R][lda]            T     row b*R + c: (m, k) -> part k of dY[b, c - m] (0 where
//                                      c - m is not a block of sequence b), m major, D each;
//                                      its (0, k) columns are dY's parts for the dW products
//   Wt  [G][d*D][lda]            T     row f: (m, k) -> W_m row f (each part's copy)
//   dZ  [G][B*R][ldv]            fp32
//   colsum [G][D]                fp32  colsum(dY)
//   zdY [G][l*D][parts*D]        fp32  shift_m(Z)^T dY, the parts side by side
//   slices [S <= 64][G][D]       fp32  colsum's row slices' sums (colsum_slices_kernel)
//
// Determinism: cuBLASLt products with a fixed algorithm per shape; the sums over m (forward)
// accumulate in a fixed order (beta = 1 in sequence), the parts of zdY are added by
// add_dw_kernel in order; every output element of the small kernels is computed by one
// thread (pack_dy, add_dw: a few consecutive ones each), colsum's by a fixed split of the
// rows summed in a fixed order.
#include <cstdint>
#include <type_traits>

#include "core/ops/cuda/common.cuh"  // 16-byte loads and stores (load, store, Packed), aligned16
#include "core/ops/matmul.h"
#include "nsa/cuda/internal.cuh"

namespace nsatron::nsa::cuda::detail {

namespace {

namespace vec = nsatron::cuda_detail;  // the op families' vector loads and stores

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
std::size_t align256(std::size_t x) { return (x + 255) & ~std::size_t(255); }

// colsum's warps per block and most row slices (colsum_slices_kernel below).
constexpr int kColsumWarps = 8;
constexpr int kColsumMaxSlices = 64;

// Shapes of the scratch for one call.
struct CmpLayout {
  int M;               // l / d: chunks per block
  std::int64_t R;      // chunks per sequence that blocks touch (0 when N = 0)
  std::int64_t BR;     // B * R
  std::int64_t ldz, ldy, lda, ldv;
  std::int64_t z_rows;
  int parts;           // 2 (hi, lo) for bf16, 1 for fp32
  std::int64_t K;      // l/d * parts * D: the dZ product's inner dimension (A's and Wt's columns)
  std::size_t z_bytes, y_bytes, a_bytes, wt_bytes, dz_bytes, bias_bytes, dw_bytes, slices_bytes;

  CmpLayout(const Geo& g, int elem) {
    M = g.l / g.d;
    R = g.N > 0 ? g.N + M - 1 : 0;
    BR = std::int64_t(g.B) * R;
    const std::int64_t per256 = 256 / elem;  // elements of T in 256 bytes
    ldz = round_up(std::int64_t(g.d) * g.D, per256);
    parts = elem == 2 ? 2 : 1;
    K = std::int64_t(M) * parts * g.D;
    lda = round_up(K, per256);
    ldy = round_up(g.D, 64);
    ldv = round_up(std::int64_t(g.d) * g.D, 64);
    z_rows = BR + M - 1;
    z_bytes = align256(std::size_t(g.G * z_rows * ldz) * elem);
    y_bytes = align256(std::size_t(g.G * BR * ldy) * 4);
    a_bytes = align256(std::size_t(g.G * BR * lda) * elem);
    wt_bytes = align256(std::size_t(g.G * std::int64_t(g.d) * g.D * lda) * elem);
    dz_bytes = align256(std::size_t(g.G * BR * ldv) * 4);
    bias_bytes = align256(std::size_t(g.G * g.D) * 4);
    slices_bytes = align256(std::size_t(kColsumMaxSlices) * g.G * g.D * 4);  // colsum's partial sums
    dw_bytes = align256(std::size_t(g.G) * g.l * g.D * parts * g.D * 4);
  }
};

template <class T>
constexpr DType dtype_of() {
  return sizeof(T) == 2 ? DType::BF16 : DType::F32;
}

// dst[f] = src[(f / D) * stride + f % D] (converted to O) for f < n, the block's threads
// striding over f; the quotient and remainder are advanced by constants, not divided per
// element (64-bit index arithmetic per element had cost more than the copy).
template <class O, class I>
__device__ __forceinline__ void copy_strided_rows(O* __restrict__ dst, const I* __restrict__ src, int n,
                                                  int D, std::int64_t stride) {
  const int step_q = int(blockDim.x) / D, step_e = int(blockDim.x) % D;
  int q = int(threadIdx.x) / D, e = int(threadIdx.x) % D;
  for (int f = threadIdx.x; f < n; f += blockDim.x) {
    if constexpr (std::is_same_v<O, I>)
      dst[f] = src[q * stride + e];  // (also whole 16-byte chunks: uint4)
    else
      dst[f] = stf<O>(ldf(src[q * stride + e]));
    q += step_q;
    e += step_e;
    if (e >= D) {
      e -= D;
      ++q;
    }
  }
}

// Z[g][b*R + c][r*D + e] = x[b, c*d + r, g, e]; rows past B*R zero. One block per row of Z
// (blockIdx.x = g * z_rows + row), its threads over the row's d*D elements (token r at stride
// Geo::kvp), in 16-byte chunks where D, the stride and x allow (Z's rows are 256-byte
// aligned): element by element the copies ran at ~230 GB/s (0.43 ms per step at 48 heads).
template <class T>
__global__ void gather_chunks_kernel(Geo g, std::int64_t R, std::int64_t ldz, std::int64_t z_rows,
                                     const T* __restrict__ x, T* __restrict__ z) {
  const std::int64_t zr = blockIdx.x;
  const int gi = int(zr / z_rows);
  const std::int64_t row = zr - gi * z_rows;
  T* dst = z + zr * ldz;
  const int dD = g.d * g.D;
  if (row >= std::int64_t(g.B) * R) {
    for (int f = threadIdx.x; f < dD; f += blockDim.x) dst[f] = stf<T>(0.f);
    return;
  }
  const std::int64_t b = row / R, c = row - b * R;
  const T* src = x + (b * g.T + c * g.d) * g.kvp + std::int64_t(gi) * g.D;
  constexpr int kPer16 = vec::kVec<T>;
  if (g.D % kPer16 == 0 && g.kvp % kPer16 == 0 && (reinterpret_cast<std::uintptr_t>(x) & 15u) == 0)
    copy_strided_rows(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), dD / kPer16,
                      g.D / kPer16, g.kvp / kPer16);
  else
    copy_strided_rows(dst, src, dD, g.D, g.kvp);
}

// y[b, i, g, :] = Y[g][b*R + i] + bias[g], rotated at position i*d + l - 1 when rope is set.
__global__ void finish_forward_kernel(Geo g, std::int64_t R, std::int64_t ldy,
                                      const float* __restrict__ yacc, const float* __restrict__ bias,
                                      const float2* __restrict__ rope, float* __restrict__ y) {
  const std::int64_t total = std::int64_t(g.B) * g.N * g.G * g.D;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int e = int(idx % g.D), gi = int((idx / g.D) % g.G);
    const std::int64_t bi = idx / (std::int64_t(g.D) * g.G);
    const std::int64_t b = bi / g.N, i = bi % g.N;
    const float* row = yacc + (std::int64_t(gi) * g.B * R + b * R + i) * ldy;
    const float* bs = bias + std::int64_t(gi) * g.D;
    if (rope) {
      const bool lo = e < g.half;
      const int k = lo ? e : e - g.half, ep = lo ? e + g.half : e - g.half;
      const float v = row[e] + bs[e], vp = row[ep] + bs[ep];
      const float2 cs = rope[(i * g.d + g.l - 1) * g.half + k];
      y[idx] = lo ? v * cs.x - vp * cs.y : v * cs.x + vp * cs.y;
    } else {
      y[idx] = row[e] + bs[e];
    }
  }
}

// A[g][b*R + c][(m*parts + k)*D + e] = part k of dy[b, c - m, g, e] where 0 <= c - m < N, else
// 0 (part 0 the value as T, part 1 for bf16 its rounding residual). One thread per (g, row, m)
// and U consecutive e (4 where D and dy allow 16-byte loads; one by one the copy ran at ~0.4
// TB/s), writing both parts.
template <class T, int U>
__global__ void pack_dy_kernel(Geo g, int M, int parts, std::int64_t R, std::int64_t BR, std::int64_t lda,
                               const float* __restrict__ dy, T* __restrict__ a) {
  const int DU = g.D / U;
  const std::int64_t total = std::int64_t(g.G) * BR * M * DU;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int e = int(idx % DU) * U, m = int((idx / DU) % M);
    const std::int64_t gr = idx / (std::int64_t(DU) * M);  // gi * BR + row
    const std::int64_t row = gr % BR, b = row / R, i = row - b * R - m;
    const int gi = int(gr / BR);
    float v[U];
    if (i >= 0 && i < g.N) {
      vec::load<float, U>(dy + ((b * g.N + i) * g.G + gi) * g.D + e, v);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = 0.f;
    }
    T* o = a + gr * lda + std::int64_t(m) * parts * g.D + e;
    vec::Packed<T, U> h, lo;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      h.e[u] = stf<T>(v[u]);
      lo.e[u] = stf<T>(v[u] - ldf(h.e[u]));
    }
    vec::store_packed<T, U>(o, h);
    if (parts == 2) vec::store_packed<T, U>(o + g.D, lo);
  }
}

// Wt[g][f][(m*parts + k)*D + e] = W[g][m*d*D + f][e] for f < d*D: every W_m's row f, once per
// part. One thread per (g, f, m) and U consecutive e (16 bytes where D and w allow: element by
// element it ran at ~0.7 TB/s, 0.21 ms a call at 48 heads).
template <class T, int U>
__global__ void stack_w_kernel(Geo g, int M, int parts, std::int64_t lda, const T* __restrict__ w,
                               T* __restrict__ wt) {
  const int DU = g.D / U;
  const std::int64_t dD = std::int64_t(g.d) * g.D, lD = std::int64_t(g.l) * g.D;
  const std::int64_t total = std::int64_t(g.G) * dD * M * DU;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int e = int(idx % DU) * U, m = int((idx / DU) % M);
    const std::int64_t gf = idx / (std::int64_t(DU) * M);  // gi * dD + f
    const std::int64_t gi = gf / dD, f = gf - gi * dD;
    const auto v = vec::load_packed<T, U>(w + (gi * lD + m * dD + f) * g.D + e);
    T* o = wt + gf * lda + std::int64_t(m) * parts * g.D + e;
    for (int k = 0; k < parts; ++k) vec::store_packed<T, U>(o + k * g.D, v);
  }
}

// dx[b, s, g, e] = dZ[g][b*R + s/d][(s%d)*D + e] for tokens inside the R chunks, else 0. One
// block per token (blockIdx.x = b * T + s), its threads over the token's G*D elements (group
// gi at stride B*R*ldv).
template <class T>
__global__ void scatter_dx_kernel(Geo g, std::int64_t R, std::int64_t ldv,
                                  const float* __restrict__ dz, T* __restrict__ dx) {
  const std::int64_t bs = blockIdx.x;
  const std::int64_t b = bs / g.T;
  const int s = int(bs - b * g.T), c = s / g.d;
  T* dst = dx + bs * g.kvp;  // the token's G * D elements (rows Geo::kvp apart)
  const int GD = g.G * g.D;
  if (c >= R) {
    for (int f = threadIdx.x; f < GD; f += blockDim.x) dst[f] = stf<T>(0.f);
    return;
  }
  copy_strided_rows(dst, dz + (b * R + c) * ldv + (s - c * g.d) * g.D, GD, g.D,
                    std::int64_t(g.B) * R * ldv);
}

// colsum[g][e] = sum over every block i < N of every sequence b of dy[b, i, g, e] (fp32), in a
// fixed order, in two launches. colsum_slices_kernel: the B*N rows split into S consecutive
// slices (colsum_slices: a function of the shape), block (g, 32-column piece, slice) with lane
// e - e0 over the piece's columns (one 128-byte row segment per warp and row) and warp w over
// the slice's rows w, w + 8, ..., the 8 warps' sums added in warp order into part[slice][g][e];
// colsum_add_slices_kernel: the slices added in slice order. (One block per (g, piece) over
// every row had 4 blocks at the 125M layer and 16 at 64k, each warp walking hundreds of rows
// in turn; a product of ones per head and bf16 part before that was 2 G launches of ~4 us per
// call, ~0.8 ms per backward at 48 heads.)
inline int colsum_slices(const Geo& g) {
  const std::int64_t rows = std::int64_t(g.B) * g.N;
  return int(std::clamp<std::int64_t>((rows + 255) / 256, 1, kColsumMaxSlices));  // <= 32 rows a warp
}
__global__ void colsum_slices_kernel(Geo g, const float* __restrict__ dy, float* __restrict__ part) {
  __shared__ float warp_sum[kColsumWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gi = blockIdx.x, e = blockIdx.y * 32 + lane, slice = blockIdx.z, S = gridDim.z;
  const std::int64_t rows = std::int64_t(g.B) * g.N, stride = std::int64_t(g.G) * g.D;
  const std::int64_t r0 = rows * slice / S, r1 = rows * (slice + 1) / S;
  float s = 0.f;
  if (e < g.D) {
    const float* col = dy + std::int64_t(gi) * g.D + e;
    for (std::int64_t r = r0 + warp; r < r1; r += kColsumWarps) s += col[r * stride];
  }
  warp_sum[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && e < g.D) {
    float t = warp_sum[0][lane];
#pragma unroll
    for (int w = 1; w < kColsumWarps; ++w) t += warp_sum[w][lane];
    part[(std::int64_t(slice) * g.G + gi) * g.D + e] = t;
  }
}
__global__ void colsum_add_slices_kernel(Geo g, int S, const float* __restrict__ part, float* __restrict__ colsum) {
  const int GD = g.G * g.D;
  for (int f = blockIdx.x * blockDim.x + threadIdx.x; f < GD; f += gridDim.x * blockDim.x) {
    float t = part[f];
    for (int k = 1; k < S; ++k) t += part[std::int64_t(k) * GD + f];
    colsum[f] = t;
  }
}

// dp[g, row] += W[g][row, :] . colsum[g, :], one warp per row of the flattened [l*D] axis.
template <class T>
__global__ void compress_dp_kernel(Geo g, const T* __restrict__ w, const float* __restrict__ sum,
                                   float* __restrict__ dp) {
  const std::int64_t row = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= std::int64_t(g.G) * g.l * g.D) return;
  const int gi = int(row / (std::int64_t(g.l) * g.D));
  float s = 0.f;
  for (int e = lane; e < g.D; e += 32) s += ldf(w[row * g.D + e]) * sum[gi * g.D + e];
  s = warp_sum(s);
  if (lane == 0) dp[row] += s;
}

// dw[g][f][e] += (sum_k zdy[g][f][k*D + e] + p[g][f] colsum[g][e]): the chunk products of the
// parts plus the bias row's share flatten(P)^T colsum(dY), added to the accumulated gradient
// in one step (so dw_in + dW is rounded once, whatever dw held before). U consecutive e per
// thread (4 where D and dw allow 16-byte accesses).
template <class T, int U>
__global__ void add_dw_kernel(Geo g, int parts, const float* __restrict__ zdy, const T* __restrict__ p,
                              const float* __restrict__ sum, float* __restrict__ dw) {
  const std::int64_t total = std::int64_t(g.G) * g.l * g.D * g.D / U;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t i0 = idx * U, gf = i0 / g.D;  // gf: g * l*D + f
    const int gi = int(gf / (std::int64_t(g.l) * g.D));
    const int e = int(i0 % g.D);
    const float* z = zdy + gf * parts * g.D + e;
    float c[U], t[U], cs[U], d[U];
    vec::load<float, U>(z, c);
    for (int k = 1; k < parts; ++k) {
      vec::load<float, U>(z + k * g.D, t);
#pragma unroll
      for (int u = 0; u < U; ++u) c[u] += t[u];
    }
    vec::load<float, U>(sum + gi * g.D + e, cs);
    vec::load<float, U>(dw + i0, d);
    const float pf = ldf(p[gf]);
#pragma unroll
    for (int u = 0; u < U; ++u) d[u] += c[u] + pf * cs[u];
    vec::store<float, U>(dw + i0, d);
  }
}

// Row-major C[M,N] (+)= op(A) op(B) on the NSA stream for every KV head at once: head g's
// operands at A + g stride_a, B + g stride_b, C + g stride_c (one launch: a head's product
// alone fills a fraction of the GPU at T = 8192).
template <class T>
void product_per_head(const Geo& g, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const T* A,
                      std::int64_t lda, std::int64_t stride_a, const T* B, std::int64_t ldb, std::int64_t stride_b,
                      bool accumulate, float* C, std::int64_t ldc, std::int64_t stride_c, cudaStream_t s) {
  nsatron::cuda::gemm_strided_batched(dtype_of<T>(), DType::F32, ta, tb, M, N, K, 1.0, A, lda, stride_a, B, ldb,
                                      stride_b, accumulate ? 1.0 : 0.0, C, ldc, stride_c, g.G, s);
}

template <class T>
T* gather(const Geo& g, const CmpLayout& L, const T* x, char* scratch, cudaStream_t s) {
  T* z = reinterpret_cast<T*>(scratch);
  const std::int64_t zrows = std::int64_t(g.G) * L.z_rows;
  if (zrows > 0)
    gather_chunks_kernel<T><<<unsigned(zrows), 128, 0, s>>>(g, L.R, L.ldz, L.z_rows, x, z);
  check_launch("gather_chunks_kernel");
  return z;
}

}  // namespace

std::size_t compress_scratch_bytes(const Geo& g, int elem_bytes) {
  const CmpLayout L(g, elem_bytes);
  const std::size_t fwd = L.z_bytes + L.y_bytes + L.bias_bytes;
  const std::size_t bwd =
      L.z_bytes + L.a_bytes + L.wt_bytes + L.dz_bytes + L.bias_bytes + L.dw_bytes + L.slices_bytes;
  return fwd > bwd ? fwd : bwd;
}

template <class T>
void launch_compress_forward(const Geo& g, const T* x, const T* w, const T* p, const float2* rope,
                             float* y, void* scratch, cudaStream_t s) {
  if (g.N == 0) return;
  const CmpLayout L(g, sizeof(T));
  char* base = static_cast<char*>(scratch);
  const T* z = gather<T>(g, L, x, base, s);
  auto* yacc = reinterpret_cast<float*>(base + L.z_bytes);
  auto* bias = reinterpret_cast<float*>(base + L.z_bytes + L.y_bytes);
  const std::int64_t dD = std::int64_t(g.d) * g.D, lD = std::int64_t(g.l) * g.D;
  // bias_g = flatten(P_g) W_g, then Y_g = sum_m shift_m(Z_g) W_g,m, every head at once.
  product_per_head<T>(g, false, false, 1, g.D, lD, p, lD, lD, w, g.D, lD * g.D, false, bias, g.D, g.D, s);
  for (int m = 0; m < L.M; ++m)
    product_per_head<T>(g, false, false, L.BR, g.D, dD, z + m * L.ldz, L.ldz, L.z_rows * L.ldz, w + m * dD * g.D, g.D,
                        lD * g.D, m > 0, yacc, L.ldy, L.BR * L.ldy, s);
  finish_forward_kernel<<<grid1(std::int64_t(g.B) * g.N * g.G * g.D, 256), 256, 0, s>>>(
      g, L.R, L.ldy, yacc, bias, rope, y);
  check_launch("finish_forward_kernel");
}

template <class T>
void launch_compress_backward(const Geo& g, const T* x, const T* w, const T* p, const float* dy,
                              T* dx, float* dw, float* dp, void* scratch, cudaStream_t s) {
  const CmpLayout L(g, sizeof(T));
  char* base = static_cast<char*>(scratch);
  if (g.N == 0) {  // no block: the tokens get no gradient (assigned), the maps none
    if (dx && g.B * g.T > 0)
      CUDA_CHECK(cudaMemset2DAsync(dx, std::size_t(g.kvp) * sizeof(T), 0, std::size_t(g.G) * g.D * sizeof(T),
                                   std::size_t(g.B) * g.T, s));
    return;
  }
  const std::int64_t dD = std::int64_t(g.d) * g.D, lD = std::int64_t(g.l) * g.D, PD = L.parts * g.D;
  // The backward's scratch after Z (gather writes it at base), in the order of the table above
  // (compress_scratch_bytes counts the same regions).
  std::size_t off = L.z_bytes;
  auto next_region = [&](std::size_t bytes) {
    char* r = base + off;
    off += bytes;
    return r;
  };
  T* a = reinterpret_cast<T*>(next_region(L.a_bytes));
  T* wt = reinterpret_cast<T*>(next_region(L.wt_bytes));
  auto* dz = reinterpret_cast<float*>(next_region(L.dz_bytes));
  auto* colsum = reinterpret_cast<float*>(next_region(L.bias_bytes));
  auto* zdy = reinterpret_cast<float*>(next_region(L.dw_bytes));
  auto* slices = reinterpret_cast<float*>(next_region(L.slices_bytes));
  if (dw || dx) {  // A: the operand of both products (dp needs only colsum)
    const std::int64_t npack = std::int64_t(g.G) * L.BR * L.M * g.D;
    if (g.D % 4 == 0 && vec::aligned16(dy))
      pack_dy_kernel<T, 4><<<grid1(npack / 4, 256), 256, 0, s>>>(g, L.M, L.parts, L.R, L.BR, L.lda, dy, a);
    else
      pack_dy_kernel<T, 1><<<grid1(npack, 256), 256, 0, s>>>(g, L.M, L.parts, L.R, L.BR, L.lda, dy, a);
    check_launch("pack_dy_kernel");
  }
  if (dw || dp) {  // colsum_g = 1^T dY_g, from the fp32 gradient
    const int S = colsum_slices(g);
    colsum_slices_kernel<<<dim3(unsigned(g.G), unsigned((g.D + 31) / 32), unsigned(S)), kColsumWarps * 32, 0, s>>>(
        g, dy, slices);
    check_launch("colsum_slices_kernel");
    colsum_add_slices_kernel<<<grid1(std::int64_t(g.G) * g.D, 256), 256, 0, s>>>(g, S, slices, colsum);
    check_launch("colsum_add_slices_kernel");
  }
  if (dw) {
    const T* z = gather<T>(g, L, x, base, s);
    for (int m = 0; m < L.M; ++m)  // zdy_m = shift_m(Z)^T [dY parts], every head at once
      product_per_head<T>(g, true, false, dD, PD, L.BR, z + m * L.ldz, L.ldz, L.z_rows * L.ldz, a, L.lda,
                          L.BR * L.lda, false, zdy + m * dD * PD, PD, lD * PD, s);
    const std::int64_t n = std::int64_t(g.G) * lD * g.D;
    if (g.D % 4 == 0 && vec::aligned16(dw))
      add_dw_kernel<T, 4><<<grid1(n / 4, 256), 256, 0, s>>>(g, L.parts, zdy, p, colsum, dw);
    else
      add_dw_kernel<T, 1><<<grid1(n, 256), 256, 0, s>>>(g, L.parts, zdy, p, colsum, dw);
    check_launch("add_dw_kernel");
  }
  if (dx) {  // dZ = A Wt^T, every head at once
    constexpr int kPer16 = vec::kVec<T>;
    const std::int64_t n = std::int64_t(g.G) * dD * L.M * g.D;
    if (g.D % kPer16 == 0 && vec::aligned16(w))
      stack_w_kernel<T, kPer16><<<grid1(n / kPer16, 256), 256, 0, s>>>(g, L.M, L.parts, L.lda, w, wt);
    else
      stack_w_kernel<T, 1><<<grid1(n, 256), 256, 0, s>>>(g, L.M, L.parts, L.lda, w, wt);
    check_launch("stack_w_kernel");
    product_per_head<T>(g, false, true, L.BR, dD, L.K, a, L.lda, L.BR * L.lda, wt, L.lda, dD * L.lda, false, dz,
                        L.ldv, L.BR * L.ldv, s);
    const std::int64_t tokens = std::int64_t(g.B) * g.T;
    if (tokens > 0) scatter_dx_kernel<T><<<unsigned(tokens), 128, 0, s>>>(g, L.R, L.ldv, dz, dx);
    check_launch("scatter_dx_kernel");
  }
  if (dp) {  // dP += colsum(dY) W^T
    compress_dp_kernel<T><<<grid1(std::int64_t(g.G) * lD * 32, 256), 256, 0, s>>>(g, w, colsum,
                                                                                 dp);
    check_launch("compress_dp_kernel");
  }
}

#define NSA_INSTANTIATE(T)                                                                      \
  template void launch_compress_forward<T>(const Geo&, const T*, const T*, const T*,           \
                                           const float2*, float*, void*, cudaStream_t);        \
  template void launch_compress_backward<T>(const Geo&, const T*, const T*, const T*,          \
                                            const float*, T*, float*, float*, void*,           \
                                            cudaStream_t);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(bf16)
#undef NSA_INSTANTIATE

}  // namespace nsatron::nsa::cuda::detail
