// CUDA matrix products. fp32 and bf16 (into bf16 or fp32) go through cuBLASLt, with the
// algorithm chosen once per shape by cuBLASLt's heuristic and cached; fp64 (tests only) goes
// through cublasGemmEx. Both libraries are column-major: a row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, so the operands are passed swapped. fp32 products use
// plain fp32 math (no TF32), so they match the CPU to fp32 rounding.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "core/device/cuda_check.h"
#include "core/device/device.h"
#include "core/ops/matmul.h"

namespace nsatron::cuda {

namespace {

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt ") + what + " failed with status " + std::to_string(int(st)));
}

cublasHandle_t blas_handle() {
  thread_local cublasHandle_t h = [] {
    cublasHandle_t created = nullptr;
    if (cublasCreate(&created) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    return created;
  }();
  return h;
}

// One cuBLASLt plan per problem: descriptors and the chosen algorithm.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// (types, transposes, M, N, K, lda, ldb, ldc, alignments of A, B, C, batch, strides of A, B, C)
using PlanKey = std::tuple<int, int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, int, int, int, int, std::int64_t, std::int64_t, std::int64_t>;

// A batch of `count` matrices `stride` elements apart (count 1: a single matrix).
struct Batch {
  int count = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Largest power of two (at most 256, cuBLASLt's default assumption) dividing the address:
// an algorithm is chosen that works at this alignment.
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

constexpr std::size_t kWorkspaceBytes = 32u << 20;

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mutex;
  std::map<PlanKey, Plan> plans;
};

LtState& lt() {
  static LtState* s = [] {
    auto* st = new LtState();
    check_lt(cublasLtCreate(&st->handle), "create");
    st->workspace = cuda_alloc(kWorkspaceBytes);
    return st;
  }();
  return *s;
}

const Plan& plan_for(cudaDataType_t ab, cudaDataType_t c_type, bool ta, bool tb, std::int64_t M, std::int64_t N,
                     std::int64_t K, std::int64_t lda, std::int64_t ldb, std::int64_t ldc, int align_a, int align_b,
                     int align_c, const Batch& batch) {
  LtState& s = lt();
  std::lock_guard<std::mutex> lock(s.mutex);
  PlanKey key{int(ab),        int(c_type),    ta,        tb,          M,
              N,              K,              lda,       ldb,         ldc,
              align_a,        align_b,        align_c,   batch.count, batch.stride_a,
              batch.stride_b, batch.stride_c};
  if (auto it = s.plans.find(key); it != s.plans.end()) return it->second;
  Plan p;
  check_lt(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  // Column-major view: first operand is our B (op = tb), second is our A (op = ta).
  cublasOperation_t op_first = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second), "transb");
  // Stored (column-major) shapes: B is [N, K] (or [K, N] when transposed), A is [K, M] (or [M, K]).
  check_lt(cublasLtMatrixLayoutCreate(&p.a, ab, tb ? K : N, tb ? N : K, ldb), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, ab, ta ? M : K, ta ? K : M, lda), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p.c, c_type, N, M, ldc), "layout C");
  if (batch.count > 1) {  // (cuBLASLt's A is our B, its B our A)
    const std::int32_t count = batch.count;
    const std::pair<cublasLtMatrixLayout_t, std::int64_t> layouts[3] = {
        {p.a, batch.stride_b}, {p.b, batch.stride_a}, {p.c, batch.stride_c}};
    for (const auto& [layout, stride] : layouts) {
      check_lt(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
               "batch count");
      check_lt(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                sizeof stride),
               "batch stride");
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  std::size_t ws = kWorkspaceBytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "ws");
  // cuBLASLt's A is our B (see above), its B our A; C and D are our C.
  const std::uint32_t al[4] = {std::uint32_t(align_b), std::uint32_t(align_a), std::uint32_t(align_c),
                               std::uint32_t(align_c)};
  const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]), "alignment");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(s.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found), "heuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) throw std::runtime_error("cuBLASLt found no algorithm for this matrix product");
  p.algo = result.algo;
  return s.plans.emplace(key, p).first->second;
}

// cuBLASLt's type of a bf16 or fp32 operand.
cudaDataType_t lt_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// C = alpha op(A) op(B) + beta C with a plan of plan_for.
void run_plan(const Plan& p, double alpha, const void* A, const void* B, double beta, void* C, cudaStream_t stream) {
  const float alpha32 = float(alpha), beta32 = float(beta);
  LtState& s = lt();
  check_lt(cublasLtMatmul(s.handle, p.op, &alpha32, B, p.a, A, p.b, &beta32, C, p.c, C, p.c, &p.algo, s.workspace,
                          kWorkspaceBytes, stream),
           "matmul");
}

}  // namespace

void gemm(DType dtype, DType c_dtype, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K,
          double alpha, const void* A, std::int64_t lda, const void* B, std::int64_t ldb,
          double beta, void* C, std::int64_t ldc, CUstream_st* stream) {
  if (M == 0 || N == 0) return;
  if (c_dtype != dtype && !(dtype == DType::BF16 && c_dtype == DType::F32))
    throw std::logic_error("gemm: bad output dtype");
  if (dtype == DType::F64) {
    if (cublasSetStream(blas_handle(), stream) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("cublasSetStream failed");
    cublasStatus_t st = cublasGemmEx(blas_handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     int(N), int(M), int(K), &alpha, B, CUDA_R_64F, int(ldb), A, CUDA_R_64F, int(lda),
                                     &beta, C, CUDA_R_64F, int(ldc), CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("cublasGemmEx failed with status " + std::to_string(int(st)));
    return;
  }
  const cudaDataType_t ab = lt_type(dtype), c_type = lt_type(c_dtype);
  if (K == 0) {  // C = beta C: cuBLASLt wants K >= 1
    if (beta == 0.0) CUDA_CHECK(cudaMemset2DAsync(C, std::size_t(ldc) * (c_dtype == DType::BF16 ? 2 : 4), 0,
                                                  std::size_t(N) * (c_dtype == DType::BF16 ? 2 : 4), std::size_t(M), stream));
    else if (beta != 1.0) throw std::logic_error("gemm: K = 0 with beta other than 0 or 1");
    return;
  }
  const Plan& p = plan_for(ab, c_type, ta, tb, M, N, K, lda, ldb, ldc, alignment_of(A), alignment_of(B), alignment_of(C),
                           Batch{});
  run_plan(p, alpha, A, B, beta, C, stream);
}

void gemm_strided_batched(DType dtype, DType c_dtype, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K,
                          double alpha, const void* A, std::int64_t lda, std::int64_t stride_a, const void* B,
                          std::int64_t ldb, std::int64_t stride_b, double beta, void* C, std::int64_t ldc,
                          std::int64_t stride_c, int batch, CUstream_st* stream) {
  if (batch <= 0 || M == 0 || N == 0) return;
  if (batch == 1) {
    gemm(dtype, c_dtype, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);
    return;
  }
  if ((dtype != DType::BF16 && dtype != DType::F32) || (c_dtype != dtype && c_dtype != DType::F32))
    throw std::logic_error("gemm_strided_batched: fp32, or bf16 into bf16 or fp32");
  if (K == 0 || stride_a <= 0 || stride_b <= 0 || stride_c <= 0)
    throw std::logic_error("gemm_strided_batched: K and the strides must be positive");
  const cudaDataType_t ab = lt_type(dtype), c_type = lt_type(c_dtype);
  const std::size_t e = dtype_size(dtype), ec = dtype_size(c_dtype);
  // Every matrix of the batch at the alignment the algorithm assumes: the first one's, and
  // the strides'.
  auto align = [](const void* p, std::int64_t stride_bytes) {
    return std::min(alignment_of(p), alignment_of(reinterpret_cast<const void*>(std::uintptr_t(stride_bytes))));
  };
  const Plan& p = plan_for(ab, c_type, ta, tb, M, N, K, lda, ldb, ldc, align(A, stride_a * std::int64_t(e)),
                           align(B, stride_b * std::int64_t(e)), align(C, stride_c * std::int64_t(ec)),
                           Batch{batch, stride_a, stride_b, stride_c});
  run_plan(p, alpha, A, B, beta, C, stream);
}

}  // namespace nsatron::cuda
