// CPU matmul (OpenBLAS for fp32/fp64, the fp32-accumulating loop for bf16) against a naive
// fp64 loop: every transpose combination, awkward shapes, alpha, beta accumulation, beta = 0
// ignoring stale (NaN) contents, shape checks.
#include <cmath>
#include <limits>

#include "tests/ops/matmul_test_util.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

void check_case(DType dt, bool ta, bool tb, const test::GemmCase& c, double alpha, double beta,
                Rng& rng) {
  const Shape as = ta ? Shape{c.K, c.M} : Shape{c.M, c.K};
  const Shape bs = tb ? Shape{c.N, c.K} : Shape{c.K, c.N};
  Tensor a = rng.randn(as, dt), b = rng.randn(bs, dt);
  Tensor cm = beta != 0 ? rng.randn({c.M, c.N}, dt)
                        : test::filled({c.M, c.N}, std::numeric_limits<double>::quiet_NaN(), dt);
  const std::vector<double> c0 = cm.to_vector();
  matmul(a, b, cm, {.trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta});
  std::vector<double> ref, scale;
  test::naive_gemm(ta, tb, c.M, c.N, c.K, alpha, a.to_vector(), b.to_vector(), beta, c0, ref, scale);
  const auto got = cm.to_vector();
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    // Summation error (K terms) plus the rounding of the stored result.
    const double bound = 2.0 * double(c.K + 2) * test::accumulate_eps(dt) * scale[i] +
                         test::storage_eps(dt) * std::fabs(ref[i]) + 1e-300;
    if (!(std::fabs(got[i] - ref[i]) <= bound) && bad++ < 3)
      ADD_FAILURE() << dtype_name(dt) << " ta=" << ta << " tb=" << tb << " M=" << c.M
                    << " N=" << c.N << " K=" << c.K << " beta=" << beta << " [" << i
                    << "]: " << got[i] << " vs " << ref[i] << " (bound " << bound << ")";
  }
}

TEST(MatmulCpu, AllTransposesDtypesShapes) {
  Rng rng(91);
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const auto& c : test::kGemmCases) {
          check_case(dt, ta, tb, c, 1.0, 0.0, rng);
          check_case(dt, ta, tb, c, -0.75, 1.0, rng);  // accumulate (parameter gradients)
          check_case(dt, ta, tb, c, 1.0, 0.5, rng);
        }
}

TEST(MatmulCpu, BetaAccumulatesOverCalls) {
  // Two micro-batches into one gradient equal one product over the concatenation.
  Rng rng(92);
  Tensor x = rng.randn({10, 6}), dy = rng.randn({10, 4});
  Tensor dw = Tensor::zeros({4, 6}, DType::F64), dw_once = Tensor::zeros({4, 6}, DType::F64);
  for (auto [b, e] : {std::pair<std::int64_t, std::int64_t>{0, 3}, {3, 10}})
    matmul(dy.slice0(b, e), x.slice0(b, e), dw, {.trans_a = true, .beta = 1.0});
  matmul(dy, x, dw_once, {.trans_a = true});
  test::expect_close(dw.to_vector(), dw_once.to_vector(), 1e-14, 1e-14, "accumulated dW");
}

TEST(MatmulCpu, RejectsBadShapes) {
  Tensor a = Tensor::zeros({2, 3}, DType::F32), b = Tensor::zeros({4, 5}, DType::F32);
  Tensor c = Tensor::zeros({2, 5}, DType::F32);
  EXPECT_THROW(matmul(a, b, c), std::invalid_argument);
  Tensor b2 = Tensor::zeros({3, 5}, DType::F32), c2 = Tensor::zeros({5, 2}, DType::F32);
  EXPECT_THROW(matmul(a, b2, c2), std::invalid_argument);
  Tensor b3 = Tensor::zeros({3, 5}, DType::F64);
  EXPECT_THROW(matmul(a, b3, c), std::invalid_argument);
  EXPECT_NO_THROW(matmul(a, b2, c));
}

}  // namespace
}  // namespace nsatron
