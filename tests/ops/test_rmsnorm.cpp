// RMSNorm and the fused residual add + RMSNorm: finite differences in fp64 on every input and
// the gain, accumulate/assign conventions, aliasing, fp32 vs fp64, thread-count determinism.
#include <cmath>

#include "core/ops/rmsnorm.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

struct Case {
  Shape x;
  double eps;
};
const Case kCases[] = {{{1, 1}, 1e-5}, {{1, 7}, 1e-5}, {{3, 5}, 1e-6}, {{2, 3, 33}, 1e-5},
                       {{5, 65}, 0.1},  {{4}, 1e-5}};

TEST(RmsNorm, FiniteDifferences) {
  Rng rng(11);
  for (const Case& c : kCases) {
    const std::int64_t C = c.x.back();
    Tensor x = rng.randn(c.x), w = rng.randn({C});
    Tensor y = Tensor::empty(c.x, DType::F64), rstd = Tensor::empty({x.numel() / C}, DType::F64);
    const std::vector<double> probe = rng.normals(x.numel());
    auto loss = [&] {
      rmsnorm_forward(x, w, y, rstd, c.eps);
      return test::dot(y, probe);
    };
    loss();
    Tensor dy = Tensor::from_vector(probe, c.x, DType::F64);
    Tensor dx = test::filled(c.x, 123.0);  // assigned: must be overwritten
    Tensor dw0 = rng.randn({C});           // accumulated: starts non-zero
    Tensor dw = dw0.clone();
    rmsnorm_backward(dy, x, w, rstd, dx, dw);
    const std::string tag = "rmsnorm " + shape_str(c.x);
    test::expect_fd_grad(loss, x, dx.to_vector(), tag + " dx");
    test::expect_fd_grad(loss, w, test::minus(dw.to_vector(), dw0.to_vector()), tag + " dw");

    // With dres: dx = J^T dy + dres.
    Tensor dres = rng.randn(c.x);
    Tensor dx2 = Tensor::empty(c.x, DType::F64), dwx = Tensor::zeros({C}, DType::F64);
    rmsnorm_backward(dy, x, w, rstd, dx2, dwx, &dres);
    test::expect_close(dx2.to_vector(),
                       [&] {
                         auto v = dx.to_vector();
                         auto r = dres.to_vector();
                         for (std::size_t i = 0; i < v.size(); ++i) v[i] += r[i];
                         return v;
                       }(),
                       1e-14, 1e-14, tag + " dres");
  }
}

TEST(RmsNorm, ForwardMatchesDefinition) {
  Rng rng(12);
  Tensor x = rng.randn({3, 9}), w = rng.randn({9});
  Tensor y = Tensor::empty({3, 9}, DType::F64), rstd = Tensor::empty({3}, DType::F64);
  rmsnorm_forward(x, w, y, rstd, 1e-5);
  auto xv = x.to_vector(), wv = w.to_vector(), yv = y.to_vector(), rv = rstd.to_vector();
  for (int n = 0; n < 3; ++n) {
    double ss = 0;
    for (int c = 0; c < 9; ++c) ss += xv[n * 9 + c] * xv[n * 9 + c];
    const double r = 1 / std::sqrt(ss / 9 + 1e-5);
    EXPECT_NEAR(rv[n], r, 1e-14 * r);
    for (int c = 0; c < 9; ++c) EXPECT_NEAR(yv[n * 9 + c], xv[n * 9 + c] * r * wv[c], 1e-13);
  }
}

TEST(AddRmsNorm, FiniteDifferences) {
  Rng rng(13);
  for (const Case& c : kCases) {
    const std::int64_t C = c.x.back(), N = shape_numel(c.x) / C;
    Tensor a = rng.randn(c.x), b = rng.randn(c.x), w = rng.randn({C});
    Tensor h = Tensor::empty(c.x, DType::F64), y = Tensor::empty(c.x, DType::F64);
    Tensor rstd = Tensor::empty({N}, DType::F64);
    const std::vector<double> py = rng.normals(a.numel()), ph = rng.normals(a.numel());
    // The loss sees both outputs: y through the next sublayer, h through the residual.
    auto loss = [&] {
      add_rmsnorm_forward(a, b, w, h, y, rstd, c.eps);
      return test::dot(y, py) + test::dot(h, ph);
    };
    loss();
    Tensor dy = Tensor::from_vector(py, c.x, DType::F64);
    Tensor dh_down = Tensor::from_vector(ph, c.x, DType::F64);
    Tensor dh = test::filled(c.x, -7.0);
    Tensor dw = Tensor::zeros({C}, DType::F64);
    rmsnorm_backward(dy, h, w, rstd, dh, dw, &dh_down);
    const std::string tag = "add_rmsnorm " + shape_str(c.x);
    test::expect_fd_grad(loss, a, dh.to_vector(), tag + " da");
    test::expect_fd_grad(loss, b, dh.to_vector(), tag + " db");
    test::expect_fd_grad(loss, w, dw.to_vector(), tag + " dw");
  }
}

TEST(AddRmsNorm, InPlaceResidualAndAliasedGradients) {
  Rng rng(14);
  const Shape s{4, 19};
  Tensor a = rng.randn(s), b = rng.randn(s), w = rng.randn({19});
  Tensor h = Tensor::empty(s, DType::F64), y = Tensor::empty(s, DType::F64);
  Tensor rstd = Tensor::empty({4}, DType::F64), rstd2 = Tensor::empty({4}, DType::F64);
  add_rmsnorm_forward(a, b, w, h, y, rstd, 1e-5);
  Tensor a2 = a.clone(), y2 = Tensor::empty(s, DType::F64);
  add_rmsnorm_forward(a2, b, w, a2, y2, rstd2, 1e-5);  // h written over a
  EXPECT_TRUE(test::same_bits(a2, h));
  EXPECT_TRUE(test::same_bits(y2, y));

  Tensor dy = rng.randn(s), dres = rng.randn(s);
  Tensor dx = Tensor::empty(s, DType::F64), dw = Tensor::zeros({19}, DType::F64);
  rmsnorm_backward(dy, h, w, rstd, dx, dw, &dres);
  // dx written over dy, and over dres.
  Tensor dy2 = dy.clone(), dw2 = Tensor::zeros({19}, DType::F64);
  rmsnorm_backward(dy2, h, w, rstd, dy2, dw2, &dres);
  EXPECT_TRUE(test::same_bits(dy2, dx));
  EXPECT_TRUE(test::same_bits(dw2, dw));
  Tensor dres2 = dres.clone(), dw3 = Tensor::zeros({19}, DType::F64);
  rmsnorm_backward(dy, h, w, rstd, dres2, dw3, &dres2);
  EXPECT_TRUE(test::same_bits(dres2, dx));
}

TEST(RmsNorm, Fp32MatchesFp64) {
  Rng rng(15);
  const Shape s{7, 130};
  Tensor x = rng.randn(s), w = rng.randn({130}), dy = rng.randn(s);
  Tensor x32 = x.to_dtype(DType::F32), w32 = w.to_dtype(DType::F32), dy32 = dy.to_dtype(DType::F32);
  // Reference from the fp32-rounded inputs in fp64.
  Tensor xr = x32.to_dtype(DType::F64), wr = w32.to_dtype(DType::F64), dyr = dy32.to_dtype(DType::F64);
  Tensor y = Tensor::empty(s, DType::F64), r = Tensor::empty({7}, DType::F64);
  Tensor dx = Tensor::empty(s, DType::F64), dw = Tensor::zeros({130}, DType::F64);
  rmsnorm_forward(xr, wr, y, r, 1e-5);
  rmsnorm_backward(dyr, xr, wr, r, dx, dw);
  Tensor y32 = Tensor::empty(s, DType::F32), r32 = Tensor::empty({7}, DType::F32);
  Tensor dx32 = Tensor::empty(s, DType::F32), dw32 = Tensor::zeros({130}, DType::F32);
  rmsnorm_forward(x32, w32, y32, r32, 1e-5);
  rmsnorm_backward(dy32, x32, w32, r32, dx32, dw32);
  test::expect_close(y32.to_vector(), y.to_vector(), 1e-6, 1e-6, "y");
  test::expect_close(dx32.to_vector(), dx.to_vector(), 1e-5, 1e-5, "dx");
  test::expect_close(dw32.to_vector(), dw.to_vector(), 1e-5, 1e-5, "dw");
}

TEST(RmsNorm, SameBitsForAnyThreadCount) {
  Rng rng(16);
  const Shape s{257, 130};
  Tensor x = rng.randn(s, DType::F32), w = rng.randn({130}, DType::F32), dy = rng.randn(s, DType::F32);
  auto run = [&](int threads) {
    Tensor y = Tensor::empty(s, DType::F32), r = Tensor::empty({257}, DType::F32);
    Tensor dx = Tensor::empty(s, DType::F32), dw = Tensor::zeros({130}, DType::F32);
    test::with_threads(threads, [&] {
      rmsnorm_forward(x, w, y, r, 1e-5);
      rmsnorm_backward(dy, x, w, r, dx, dw);
    });
    return std::vector<Tensor>{y, r, dx, dw};
  };
  auto one = run(1), three = run(3);
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(test::same_bits(one[i], three[i])) << i;
}

TEST(RmsNorm, RejectsBadArguments) {
  Tensor x = Tensor::zeros({2, 4}, DType::F32), w = Tensor::zeros({5}, DType::F32);
  Tensor y = Tensor::empty({2, 4}, DType::F32), r = Tensor::empty({2}, DType::F32);
  EXPECT_THROW(rmsnorm_forward(x, w, y, r, 1e-5), std::invalid_argument);  // w width
  Tensor w4 = Tensor::zeros({4}, DType::F64);
  EXPECT_THROW(rmsnorm_forward(x, w4, y, r, 1e-5), std::invalid_argument);  // dtype
  Tensor w4f = Tensor::zeros({4}, DType::F32), r3 = Tensor::empty({3}, DType::F32);
  EXPECT_THROW(rmsnorm_forward(x, w4f, y, r3, 1e-5), std::invalid_argument);  // rstd size
  Tensor xb = Tensor::zeros({2, 4}, DType::BF16), wb = Tensor::zeros({4}, DType::BF16);
  Tensor yb = Tensor::empty({2, 4}, DType::BF16), rb = Tensor::empty({2}, DType::BF16);
  EXPECT_THROW(rmsnorm_forward(xb, wb, yb, rb, 1e-5), std::invalid_argument);  // bf16 on CPU
}

}  // namespace
}  // namespace nsatron
