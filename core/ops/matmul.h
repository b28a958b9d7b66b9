// Matrix products, the op family that shows the pattern every op follows:
//   this header   - the math and the Tensor-level entry point (shape checks, dispatch)
//   cpu/matmul.cpp - the CPU implementation (OpenBLAS; bf16 through an fp32-accumulating loop)
//   cuda/matmul.cu - the CUDA implementation (cuBLASLt; cuBLAS for fp64), fp32 accumulation
//
// Math (row-major): C[M,N] = alpha * op(A) @ op(B) + beta * C,
//   op(A) = A [M,K] or A^T with A stored [K,M]; op(B) = B [K,N] or B^T with B stored [N,K].
// beta = 1 accumulates into C, which is how parameter gradients are summed over
// micro-batches (parameter gradients accumulate, activation gradients assign).
//
// Backward of C = A @ B (no transposes): dA = dC @ B^T, dB = A^T @ dC.
//
// Leading columns: a_cols / c_cols (0: all) make A or C the first columns of its
// stored rows, X[:, :cols] of a row-major X [rows, pitch]; the rows keep their pitch (the
// leading dimension), the columns past `cols` are neither read nor written. E.g. a product
// into a row-padded C: the pad keeps the rows 16-byte aligned for cuBLASLt's fast kernels.
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

struct CUstream_st;  // cudaStream_t, without the CUDA headers

namespace nsatron {

struct MatmulOptions {
  bool trans_a = false;
  bool trans_b = false;
  double alpha = 1.0;
  double beta = 0.0;
  std::int64_t a_cols = 0, c_cols = 0;  // leading columns used (0: all), see above
};

// A, B, C: 2-D tensors of one dtype on one device; on CUDA, C may also be fp32 when A and B
// are bf16 (a bf16 product accumulated into fp32 parameter gradients). Throws
// std::invalid_argument naming the shapes when they do not fit.
void matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& opt = {});

namespace cpu {
// Row-major GEMM on raw pointers with leading dimensions (elements per row as stored).
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
          const T* A, std::int64_t lda, const T* B, std::int64_t ldb, double beta, T* C,
          std::int64_t ldc);
}  // namespace cpu

namespace cuda {
// Same contract as cpu::gemm, on device pointers: A and B of `dtype`, C of `c_dtype` (equal,
// or fp32 with bf16 A and B), on `stream` (a cudaStream_t; null: the default stream). Any
// pointer alignment works (the algorithm is chosen for the alignment the pointers have).
void gemm(DType dtype, DType c_dtype, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
          double alpha, const void* A, std::int64_t lda, const void* B, std::int64_t ldb,
          double beta, void* C, std::int64_t ldc, CUstream_st* stream = nullptr);
// `batch` such products in one call (cuBLASLt's strided batch), product i on A + i stride_a,
// B + i stride_b, C + i stride_c (strides in elements, > 0): the same results as `batch`
// calls of gemm to rounding (the algorithm may differ), for one launch instead of `batch`
// (small products fill the GPU together). fp32 and bf16 only.
void gemm_strided_batched(DType dtype, DType c_dtype, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
                          std::int64_t K, double alpha, const void* A, std::int64_t lda, std::int64_t stride_a,
                          const void* B, std::int64_t ldb, std::int64_t stride_b, double beta, void* C,
                          std::int64_t ldc, std::int64_t stride_c, int batch, CUstream_st* stream = nullptr);
}  // namespace cuda

}  // namespace nsatron
