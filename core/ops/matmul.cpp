#include "core/ops/matmul.h"

#include <stdexcept>
#include <string>

namespace nsatron {

void matmul(const Tensor& a, const Tensor& b, Tensor& c, const MatmulOptions& opt) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("matmul(" + a.describe() + (opt.trans_a ? "^T" : "") + ", " +
                                b.describe() + (opt.trans_b ? "^T" : "") + " -> " + c.describe() +
                                "): " + why);
  };
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2) fail("operands must be 2-D");
  const bool bf16_into_fp32 = a.device() == Device::CUDA && a.dtype() == DType::BF16 && c.dtype() == DType::F32;
  if (a.dtype() != b.dtype() || (a.dtype() != c.dtype() && !bf16_into_fp32)) fail("dtypes differ");
  if (a.device() != b.device() || a.device() != c.device()) fail("devices differ");
  // The columns of each operand the product uses: the first `used` of its stored rows.
  auto columns = [&](const Tensor& t, std::int64_t used, const char* name) {
    if (used < 0 || used > t.dim(1))
      fail(std::string(name) + "_cols = " + std::to_string(used) + " is not within the " +
           std::to_string(t.dim(1)) + " stored columns");
    return used == 0 ? t.dim(1) : used;
  };
  const std::int64_t a_cols = columns(a, opt.a_cols, "a"), c_cols = columns(c, opt.c_cols, "c");
  const std::int64_t M = opt.trans_a ? a_cols : a.dim(0);
  const std::int64_t K = opt.trans_a ? a.dim(0) : a_cols;
  const std::int64_t Kb = opt.trans_b ? b.dim(1) : b.dim(0);
  const std::int64_t N = opt.trans_b ? b.dim(0) : b.dim(1);
  if (K != Kb) fail("inner dimensions differ");
  if (c.dim(0) != M || c_cols != N) fail("output shape must be [M, N]");
  const std::int64_t lda = a.dim(1), ldb = b.dim(1), ldc = c.dim(1);

  if (a.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::gemm(a.dtype(), c.dtype(), opt.trans_a, opt.trans_b, M, N, K, opt.alpha, a.raw(), lda, b.raw(), ldb,
               opt.beta, c.raw(), ldc);
    return;
#else
    fail("this build has no CUDA");
#endif
  }
  switch (a.dtype()) {
    case DType::F32:
      cpu::gemm<float>(opt.trans_a, opt.trans_b, M, N, K, opt.alpha, a.data<float>(), lda,
                       b.data<float>(), ldb, opt.beta, c.data<float>(), ldc);
      break;
    case DType::F64:
      cpu::gemm<double>(opt.trans_a, opt.trans_b, M, N, K, opt.alpha, a.data<double>(), lda,
                        b.data<double>(), ldb, opt.beta, c.data<double>(), ldc);
      break;
    case DType::BF16:
      cpu::gemm<bf16>(opt.trans_a, opt.trans_b, M, N, K, opt.alpha, a.data<bf16>(), lda,
                      b.data<bf16>(), ldb, opt.beta, c.data<bf16>(), ldc);
      break;
  }
}

}  // namespace nsatron
