// CUDA matrix products through cuBLAS. cuBLAS is column-major; a row-major C = op(A) op(B)
// is the column-major C^T = op(B)^T op(A)^T, so the operands are passed swapped.
#include <cublas_v2.h>

#include <stdexcept>
#include <string>

#include "core/device/cuda_check.h"
#include "core/ops/matmul.h"

namespace nsatron::cuda {

namespace {
cublasHandle_t handle() {
  thread_local cublasHandle_t h = [] {
    cublasHandle_t created = nullptr;
    if (cublasCreate(&created) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("cublasCreate failed");
    return created;
  }();
  return h;
}
}  // namespace

void gemm(DType dtype, DType c_dtype, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K,
          double alpha, const void* A, std::int64_t lda, const void* B, std::int64_t ldb,
          double beta, void* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  cudaDataType_t type;
  cublasComputeType_t compute;
  float alpha32 = float(alpha), beta32 = float(beta);
  const void* pa = &alpha32;
  const void* pb = &beta32;
  switch (dtype) {
    case DType::F32: type = CUDA_R_32F; compute = CUBLAS_COMPUTE_32F; break;
    case DType::BF16: type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
    case DType::F64:
      type = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F;
      pa = &alpha; pb = &beta;
      break;
    default: throw std::logic_error("gemm: bad dtype");
  }
  cudaDataType_t c_type = type;
  if (c_dtype != dtype) {
    if (!(dtype == DType::BF16 && c_dtype == DType::F32)) throw std::logic_error("gemm: bad output dtype");
    c_type = CUDA_R_32F;
  }
  cublasStatus_t st = cublasGemmEx(
      handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(N), int(M),
      int(K), pa, B, type, int(ldb), A, type, int(lda), pb, C, c_type, int(ldc), compute,
      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("cublasGemmEx failed with status " + std::to_string(int(st)));
}

}  // namespace nsatron::cuda
