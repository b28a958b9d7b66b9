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
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/device/cuda_check.h"
#include "core/device/device.h"
#include "nsa/cuda/wgmma.cuh"
#include "tests/ops/op_test_util.h"

namespace nsatron::nsa::cuda {
namespace {

using bf16 = __nv_bfloat16;

// A [64][K] row-major, X [R][DP] row-major (R rows of the tile), C [64][N] fp32.
// KMAJOR: C = A X^T (R = N rows, DP = K dims); else C = A X (R = K rows, DP = N dims).
// ASMEM: A staged as a tile of 64 rows x KA dims (K = KA) and read through its
// K-major descriptor, instead of registers.
template <int N, int DP, int R, bool KMAJOR, bool ASMEM = false, int KA = 64>
__global__ void product_kernel(const bf16* A, int K, const bf16* X, float* C, int* ran) {
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
    if constexpr (ASMEM)
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

template <int N, int DP, int R, bool KMAJOR, bool ASMEM = false>
void check(int K) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(seed() + N * 7 + DP + (KMAJOR ? 1 : 0));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<bf16> A(64 * K), X(R * DP);
  for (auto& v : A) v = __float2bfloat16(normal(rng));
  for (auto& v : X) v = __float2bfloat16(normal(rng));
  bf16 *dA, *dX;
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
  product_kernel<N, DP, R, KMAJOR, ASMEM, ASMEM ? (KMAJOR ? DP : R) : 64><<<1, 128>>>(dA, K, dX, dC, dran);
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
        const double a = __bfloat162float(A[m * K + k]);
        const double x = KMAJOR ? __bfloat162float(X[n * DP + k]) : __bfloat162float(X[k * DP + n]);
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
TEST(Wgmma, MNMajorN128K32) { check<128, 128, 32, false>(32); }

}  // namespace
}  // namespace nsatron::nsa::cuda
