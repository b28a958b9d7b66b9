// The warpgroup products of nsa/cuda/wgmma.cuh (sm_90a) against a CPU product, on fresh random
// bf16 inputs (seed printed; WGMMA_SEED=<n> reproduces): C[64][N] = A[64][K] B with A built
// from global memory in the documented register layout (not by ldmatrix), B staged in a
// tile of R rows x DP dims (wgmma.cuh layout), used K-major (C = A X^T, X the tile's [N rows][K
// dims]) and MN-major (C = A X, X the tile's [K rows][N dims]), N = 32, 64, 128 (the tile
// unswizzled at DP = 32, 128-byte swizzled above, in 64-dim halves at DP = 128) and several
// k16 steps accumulated; A also from a shared tile (K-major descriptor). Every output element is
// poisoned first and compared. Skips without
// a GPU, and on a build or device without sm_90a (the kernels then use mma.sync instead).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <type_traits>
#include <vector>

#include "core/device/cuda_check.h"
#include "core/device/device.h"
#include "nsa/cuda/wgmma.cuh"
#include "tests/ops/op_test_util.h"

namespace nsatron::nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

template <class E> E to_elem(float x);
template <> bf16 to_elem<bf16>(float x) { return __float2bfloat16(x); }
template <> __half to_elem<__half>(float x) { return __float2half(x); }
inline float from_elem(bf16 x) { return __bfloat162float(x); }
inline float from_elem(__half x) { return __half2float(x); }

// A [64][K] row-major, X [R][DP] row-major (R rows of the tile), C [64][N] fp32.
// KMAJOR: C = A X^T (R = N rows, DP = K dims); else C = A X (R = K rows, DP = N dims).
// ASMEM: A staged as a tile of 64 rows x KA dims (K = KA) and read through its
// K-major descriptor, instead of registers. E = __half: fp16 operands (wg::mma_f16: both from
// shared memory, K-major, N = 64, the compression forward's scores).
template <int N, int DP, int R, bool KMAJOR, bool ASMEM = false, int KA = 64, class E = bf16>
__global__ void product_kernel(const E* A, int K, const E* X, float* C, int* ran) {
#if NSATRON_WGMMA
  __shared__ __align__(1024) char tile[R * DP * 2];
  __shared__ __align__(1024) char atile[ASMEM ? 64 * KA * 2 : 16];
  if constexpr (ASMEM) {
    for (int idx = threadIdx.x; idx < 64 * (KA / 8); idx += blockDim.x) {
      const int r = idx / (KA / 8), ch = idx % (KA / 8);
      *reinterpret_cast<uint4*>(atile + wg::tile_offset<KA, 64>(r, ch)) =
          *reinterpret_cast<const uint4*>(A + r * K + ch * 8);
    }
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int idx = tid; idx < R * (DP / 8); idx += blockDim.x) {
    const int r = idx / (DP / 8), ch = idx % (DP / 8);
    *reinterpret_cast<uint4*>(tile + wg::tile_offset<DP, R>(r, ch)) =
        *reinterpret_cast<const uint4*>(X + r * DP + ch * 8);
  }
  wg::fence_proxy_async();
  __syncthreads();
  float d[N / 8][4];
  for (int i = 0; i < N / 8; ++i)
    for (int e = 0; e < 4; ++e) d[i][e] = 0.f;
  const int r0 = 16 * warp + lane / 4, c0 = 2 * (lane % 4);
  auto pk = [&](int r, int c) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(A + r * K + c);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  };
  for (int k = 0; k < K / 16; ++k) {
    std::uint32_t a[4] = {pk(r0, 16 * k + c0), pk(r0 + 8, 16 * k + c0),
                          pk(r0, 16 * k + c0 + 8), pk(r0 + 8, 16 * k + c0 + 8)};
    wg::pin(a);
    wg::pin(d);
    wg::fence();
    if constexpr (std::is_same_v<E, __half>) {
      static_assert(ASMEM && KMAJOR && N == 64, "fp16: shared A, K-major B, N = 64");
      wg::mma_f16<0>(d, wg::kmajor_desc<KA, 64>(atile, k), wg::kmajor_desc<DP, R>(tile, k));
    } else if constexpr (ASMEM)
      wg::mma<N, KMAJOR ? 0 : 1>(d, wg::kmajor_desc<KA, 64>(atile, k),
                                 KMAJOR ? wg::kmajor_desc<DP, R>(tile, k) : wg::mnmajor_desc<DP, R>(tile, k));
    else if constexpr (KMAJOR)
      wg::mma<N, 0>(d, a, wg::kmajor_desc<DP, R>(tile, k));
    else
      wg::mma<N, 1>(d, a, wg::mnmajor_desc<DP, R>(tile, k));
  }
  wg::commit();
  wg::wait(d);
  for (int i = 0; i < N / 8; ++i)
    for (int e = 0; e < 4; ++e) C[(r0 + 8 * (e >> 1)) * N + 8 * i + c0 + (e & 1)] = d[i][e];
  if (tid == 0) *ran = 1;
#else
  if (threadIdx.x == 0) *ran = 0;
#endif
}

std::uint64_t seed() {
  static const std::uint64_t s = nsatron::test::seed_from_env("WGMMA_SEED", "wgmma tests");
  return s;
}

template <int N, int DP, int R, bool KMAJOR, bool ASMEM = false, class E = bf16>
void check(int K) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(seed() + N * 7 + DP + (KMAJOR ? 1 : 0));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<E> A(64 * K), X(R * DP);
  for (auto& v : A) v = to_elem<E>(normal(rng));
  for (auto& v : X) v = to_elem<E>(normal(rng));
  E *dA, *dX;
  float* dC;
  int* dran;
  CUDA_CHECK(cudaMalloc(&dA, A.size() * 2));
  CUDA_CHECK(cudaMalloc(&dX, X.size() * 2));
  CUDA_CHECK(cudaMalloc(&dC, 64 * N * 4));
  CUDA_CHECK(cudaMalloc(&dran, 4));
  CUDA_CHECK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dX, X.data(), X.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dC, 0xFF, 64 * N * 4));  // NaN poison
  CUDA_CHECK(cudaMemset(dran, 0, 4));
  product_kernel<N, DP, R, KMAJOR, ASMEM, ASMEM ? (KMAJOR ? DP : R) : 64, E><<<1, 128>>>(dA, K, dX, dC, dran);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> C(64 * N);
  int ran = 0;
  CUDA_CHECK(cudaMemcpy(C.data(), dC, C.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&ran, dran, 4, cudaMemcpyDeviceToHost));
  cudaFree(dA);
  cudaFree(dX);
  cudaFree(dC);
  cudaFree(dran);
  if (!ran) GTEST_SKIP() << "built without sm_90a (CMAKE_CUDA_ARCHITECTURES 90a): no wgmma";
  double worst = 0.0;
  int bad = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < K; ++k) {
        const double a = from_elem(A[m * K + k]);
        const double x = KMAJOR ? from_elem(X[n * DP + k]) : from_elem(X[k * DP + n]);
        ref += a * x;
        mag += std::fabs(a * x);
      }
      // fp32 accumulation of K exact bf16 products: error below K 2^-23 sum |a x|.
      const double err = std::fabs(double(C[m * N + n]) - ref) / (mag + 1e-30);
      if (!(err <= K * 1.2e-7)) ++bad;  // NaN (an unwritten element) counts as bad
      if (err > worst || std::isnan(err)) worst = err;
    }
  EXPECT_EQ(bad, 0) << "N=" << N << " DP=" << DP << " K=" << K << (KMAJOR ? " K-major" : " MN-major")
                    << ": worst relative error " << worst;
}

TEST(Wgmma, KMajorN64) { check<64, 64, 64, true>(64); }      // S = Q K^T at D = 64
TEST(Wgmma, KMajorN64D128) { check<64, 128, 64, true>(128); }
TEST(Wgmma, KMajorN64D32) { check<64, 32, 64, true>(32); }
TEST(Wgmma, KMajorN32) { check<32, 64, 32, true>(64); }
TEST(Wgmma, KMajorN128) { check<128, 64, 128, true>(64); }
TEST(Wgmma, MNMajorN64) { check<64, 64, 64, false>(64); }    // O += P V at D = 64
TEST(Wgmma, MNMajorN128) { check<128, 128, 64, false>(64); }  // D = 128
TEST(Wgmma, MNMajorN32) { check<32, 32, 64, false>(64); }    // D = 32
TEST(Wgmma, MNMajorK32) { check<64, 64, 32, false>(32); }
// A from a shared tile (the key side's K and V): S^T = K Q^T with N = 32 rows, D = 32 / 64 /
// 128; dV += P^T dO with 32 rows (MN-major, 2 k steps) at D = 128 (two swizzled halves).
TEST(Wgmma, SharedAKMajorN32D32) { check<32, 32, 32, true, true>(32); }
TEST(Wgmma, SharedAKMajorN32) { check<32, 64, 32, true, true>(64); }
TEST(Wgmma, SharedAKMajorN32D128) { check<32, 128, 32, true, true>(128); }
// N = 64 rows (key_group_rows at D = 64 and 128).
TEST(Wgmma, SharedAKMajorN64) { check<64, 64, 64, true, true>(64); }
TEST(Wgmma, SharedAKMajorN64D128) { check<64, 128, 64, true, true>(128); }
TEST(Wgmma, SharedAKMajorN128D128) { check<128, 128, 128, true, true>(128); }  // 128-key tiles (row_ws.cuh)
TEST(Wgmma, MNMajorN128K32) { check<128, 128, 32, false>(32); }
TEST(Wgmma, MNMajorN128K128) { check<128, 128, 128, false>(128); }  // P V over a 128-key tile (row_ws.cuh)
// fp16, both operands from shared tiles (the fused compression + selection's scores).
TEST(Wgmma, F16SharedAKMajorN64D32) { check<64, 32, 64, true, true, __half>(32); }
TEST(Wgmma, F16SharedAKMajorN64) { check<64, 64, 64, true, true, __half>(64); }
TEST(Wgmma, F16SharedAKMajorN64D128) { check<64, 128, 64, true, true, __half>(128); }

// The row forward's loop in miniature, to find why the forward at padded D = 64 needed
// kSplitS (docs/performance.md, 2026-11-26): 64 query rows (A = Q in registers, loaded once)
// against NT tiles of 64 keys; per tile S = Q K^T (one m64n64k16 product per 16 dims, or two
// m64n32k16 with SPLIT), an online softmax (running max, the accumulator rescaled), then
// O += P V (m64n64k16, P rounded to bf16); O / l against a CPU softmax attention.
template <bool SPLIT>
__global__ void row_loop_kernel(const bf16* Q, const bf16* K, const bf16* V, int NT, float* O,
                                int* ran) {
#if NSATRON_WGMMA
  constexpr int DP = 64, KT = 64;
  __shared__ __align__(1024) char kt[KT * DP * 2];
  __shared__ __align__(1024) char vt[KT * DP * 2];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = 16 * warp + lane / 4, c0 = 2 * (lane % 4);
  auto pk = [&](int r, int c) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(Q + r * DP + c);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  };
  std::uint32_t qf[DP / 16][4];
  for (int k = 0; k < DP / 16; ++k) {
    qf[k][0] = pk(r0, 16 * k + c0);
    qf[k][1] = pk(r0 + 8, 16 * k + c0);
    qf[k][2] = pk(r0, 16 * k + c0 + 8);
    qf[k][3] = pk(r0 + 8, 16 * k + c0 + 8);
  }
  float acc[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int j = 0; j < 8; ++j)
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  for (int t = 0; t < NT; ++t) {
    __syncthreads();  // the previous tile's products are done (each batch waits)
    for (int idx = tid; idx < KT * (DP / 8); idx += blockDim.x) {
      const int r = idx / (DP / 8), ch = idx % (DP / 8);
      const std::size_t g = (std::size_t(t) * KT + r) * DP + ch * 8;
      *reinterpret_cast<uint4*>(kt + wg::tile_offset<DP, KT>(r, ch)) = *reinterpret_cast<const uint4*>(K + g);
      *reinterpret_cast<uint4*>(vt + wg::tile_offset<DP, KT>(r, ch)) = *reinterpret_cast<const uint4*>(V + g);
    }
    wg::fence_proxy_async();
    __syncthreads();
    float s[8][4];
    for (int n = 0; n < 8; ++n)
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
    wg::pin(s);
    wg::pin(qf);
    wg::fence();
#pragma unroll
    for (int k = 0; k < DP / 16; ++k) {
      if constexpr (SPLIT) {
        wg::mma_rs_n32_at<0, 0>(s, qf[k], wg::kmajor_desc<DP, KT>(kt, k));
        wg::mma_rs_n32_at<0, 4>(s, qf[k], wg::kmajor_desc<DP, KT>(kt + wg::row_group_offset<DP>(32), k));
      } else {
        wg::mma<64, 0>(s, qf[k], wg::kmajor_desc<DP, KT>(kt, k));
      }
    }
    wg::commit();
    wg::wait(s);
    std::uint32_t pa[4][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
      for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[h], mx * 0.125f), corr = expf(m[h] - mn);
      float sum = 0.f;
      for (int n = 0; n < 8; ++n)
        for (int c = 0; c < 2; ++c) {
          s[n][2 * h + c] = expf(s[n][2 * h + c] * 0.125f - mn);
          sum += s[n][2 * h + c];
        }
      l[h] = l[h] * corr + sum;
      m[h] = mn;
      for (int j = 0; j < 8; ++j) {
        acc[j][2 * h] *= corr;
        acc[j][2 * h + 1] *= corr;
      }
    }
    for (int k2 = 0; k2 < 4; ++k2) {
      auto p2 = [](float a, float b) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<const std::uint32_t*>(&v);
      };
      pa[k2][0] = p2(s[2 * k2][0], s[2 * k2][1]);
      pa[k2][1] = p2(s[2 * k2][2], s[2 * k2][3]);
      pa[k2][2] = p2(s[2 * k2 + 1][0], s[2 * k2 + 1][1]);
      pa[k2][3] = p2(s[2 * k2 + 1][2], s[2 * k2 + 1][3]);
    }
    wg::pin(acc);
    wg::pin(pa);
    wg::fence();
#pragma unroll
    for (int k2 = 0; k2 < 4; ++k2) wg::mma<64, 1>(acc, pa[k2], wg::mnmajor_desc<DP, KT>(vt, k2));
    wg::commit();
    wg::wait(acc);
  }
  for (int h = 0; h < 2; ++h) {
    const float lt = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 1);
    const float ls = lt + __shfl_xor_sync(0xffffffffu, lt, 2);
    for (int j = 0; j < 8; ++j)
      for (int c = 0; c < 2; ++c) O[(r0 + 8 * h) * DP + 8 * j + c0 + c] = acc[j][2 * h + c] / ls;
  }
  if (tid == 0) *ran = 1;
#else
  if (threadIdx.x == 0) *ran = 0;
#endif
}

template <bool SPLIT>
void check_row_loop(int NT) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int DP = 64;
  std::mt19937_64 rng(seed() + 977 + NT);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<bf16> Q(64 * DP), K(std::size_t(NT) * 64 * DP), V(K.size());
  for (auto& v : Q) v = __float2bfloat16(normal(rng));
  for (auto& v : K) v = __float2bfloat16(normal(rng));
  for (auto& v : V) v = __float2bfloat16(normal(rng));
  bf16 *dQ, *dK, *dV;
  float* dO;
  int* dran;
  CUDA_CHECK(cudaMalloc(&dQ, Q.size() * 2));
  CUDA_CHECK(cudaMalloc(&dK, K.size() * 2));
  CUDA_CHECK(cudaMalloc(&dV, V.size() * 2));
  CUDA_CHECK(cudaMalloc(&dO, 64 * DP * 4));
  CUDA_CHECK(cudaMalloc(&dran, 4));
  CUDA_CHECK(cudaMemcpy(dQ, Q.data(), Q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dK, K.data(), K.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dV, V.data(), V.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dO, 0xFF, 64 * DP * 4));
  CUDA_CHECK(cudaMemset(dran, 0, 4));
  row_loop_kernel<SPLIT><<<1, 128>>>(dQ, dK, dV, NT, dO, dran);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> O(64 * DP);
  int ran = 0;
  CUDA_CHECK(cudaMemcpy(O.data(), dO, O.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&ran, dran, 4, cudaMemcpyDeviceToHost));
  cudaFree(dQ);
  cudaFree(dK);
  cudaFree(dV);
  cudaFree(dO);
  cudaFree(dran);
  if (!ran) GTEST_SKIP() << "built without sm_90a: no wgmma";
  double worst = 0.0, omax = 0.0;
  std::vector<double> ref(64 * DP, 0.0);
  const int nk = NT * 64;
  for (int r = 0; r < 64; ++r) {
    std::vector<double> sc(nk);
    double mx = -1e300, sum = 0.0;
    for (int j = 0; j < nk; ++j) {
      double d = 0.0;
      for (int c = 0; c < DP; ++c) d += double(__bfloat162float(Q[r * DP + c])) * __bfloat162float(K[std::size_t(j) * DP + c]);
      sc[j] = d * 0.125;
      mx = std::max(mx, sc[j]);
    }
    for (int j = 0; j < nk; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
    for (int c = 0; c < DP; ++c) {
      double o = 0.0;
      for (int j = 0; j < nk; ++j) o += sc[j] * __bfloat162float(V[std::size_t(j) * DP + c]);
      ref[r * DP + c] = o / sum;
      omax = std::max(omax, std::fabs(ref[r * DP + c]));
    }
  }
  for (int i = 0; i < 64 * DP; ++i) {
    const double e = std::fabs(double(O[i]) - ref[i]);
    if (!(e <= worst)) worst = std::isnan(e) ? 1e30 : std::max(worst, e);
  }
  // P is rounded to bf16 (2^-9 relative) before P V: 1e-2 of the largest output bounds it.
  EXPECT_LE(worst / omax, 1e-2) << (SPLIT ? "split S" : "one N = 64 S") << ", " << NT << " tiles";
}

TEST(WgmmaRowLoop, OneN64Product) { check_row_loop<false>(6); }
TEST(WgmmaRowLoop, TwoN32Products) { check_row_loop<true>(6); }

}  // namespace
}  // namespace nsatron::nsa::cuda
