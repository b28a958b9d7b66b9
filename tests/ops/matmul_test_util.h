// Shared by the matmul tests: a naive fp64 reference of C = alpha op(A) op(B) + beta C and
// an error bound per dtype.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/matmul.h"

namespace nsatron::test {

struct GemmCase {
  std::int64_t M, N, K;
};
// Awkward shapes: ones, odd sizes, sizes just past powers of two, skinny products.
inline const GemmCase kGemmCases[] = {{1, 1, 1},  {1, 7, 3},   {5, 1, 9},   {3, 4, 1},
                                      {17, 13, 31}, {64, 33, 65}, {2, 129, 5}, {33, 2, 257}};

// Reference in fp64 from the (already rounded) stored inputs; also returns, per element,
// sum_k |a_ik b_kj| + |beta c_ij|, the scale of the rounding error of any summation order.
inline void naive_gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K,
                       double alpha, const std::vector<double>& A, const std::vector<double>& B,
                       double beta, const std::vector<double>& C0, std::vector<double>& C,
                       std::vector<double>& scale) {
  C.assign(std::size_t(M * N), 0.0);
  scale.assign(std::size_t(M * N), 0.0);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double acc = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[std::size_t(k * M + i)] : A[std::size_t(i * K + k)];
        const double b = tb ? B[std::size_t(j * K + k)] : B[std::size_t(k * N + j)];
        acc += a * b;
        mag += std::fabs(a * b);
      }
      const double prev = beta != 0 ? beta * C0[std::size_t(i * N + j)] : 0.0;
      C[std::size_t(i * N + j)] = alpha * acc + prev;
      scale[std::size_t(i * N + j)] = std::fabs(alpha) * mag + std::fabs(prev);
    }
}

// Unit roundoff of the accumulation, and of the stored result.
inline double accumulate_eps(DType t) { return t == DType::F64 ? 1.2e-16 : 6.0e-8; }
inline double storage_eps(DType t) {
  return t == DType::BF16 ? 1.0 / 256 : (t == DType::F32 ? 6.0e-8 : 1.2e-16);
}

}  // namespace nsatron::test
