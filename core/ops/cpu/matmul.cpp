// CPU matrix products: OpenBLAS for fp32/fp64; bf16 by a loop that accumulates in fp32.
#include <cblas.h>

#include "core/ops/matmul.h"

namespace nsatron::cpu {

template <>
void gemm<float>(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
                 const float* A, std::int64_t lda, const float* B, std::int64_t ldb, double beta,
                 float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(M), int(N), int(K), float(alpha), A, int(lda), B, int(ldb), float(beta), C,
              int(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
                  const double* A, std::int64_t lda, const double* B, std::int64_t ldb,
                  double beta, double* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

template <>
void gemm<bf16>(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
                const bf16* A, std::int64_t lda, const bf16* B, std::int64_t ldb, double beta,
                bf16* C, std::int64_t ldc) {
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      float acc = 0.f;
      for (std::int64_t k = 0; k < K; ++k) {
        float a = float(ta ? A[k * lda + i] : A[i * lda + k]);
        float b = float(tb ? B[j * ldb + k] : B[k * ldb + j]);
        acc += a * b;
      }
      float prev = beta != 0.0 ? float(beta) * float(C[i * ldc + j]) : 0.f;
      C[i * ldc + j] = bf16(float(alpha) * acc + prev);
    }
  }
}

}  // namespace nsatron::cpu
