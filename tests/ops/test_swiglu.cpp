// SwiGLU, fused [.., 2F] and split layouts: finite differences in fp64, in-place backward,
// large-|a| stability, argument checks.
#include <cmath>

#include "core/ops/swiglu.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

const Shape kOutShapes[] = {{1, 1}, {1, 5}, {3, 7}, {2, 3, 9}, {6}, {4, 64}};

Shape doubled(Shape s) {
  s.back() *= 2;
  return s;
}

TEST(SwiGLU, FusedFiniteDifferences) {
  Rng rng(21);
  for (const Shape& os : kOutShapes) {
    const Shape us = doubled(os);
    Tensor u = rng.randn(us, DType::F64, 2.0);
    Tensor out = Tensor::empty(os, DType::F64);
    const std::vector<double> probe = rng.normals(out.numel());
    auto loss = [&] {
      swiglu_forward(u, out);
      return test::dot(out, probe);
    };
    Tensor dout = Tensor::from_vector(probe, os, DType::F64);
    Tensor du = test::filled(us, 99.0);
    swiglu_backward(dout, u, du);
    test::expect_fd_grad(loss, u, du.to_vector(), "swiglu fused " + shape_str(us) + " du");
  }
}

TEST(SwiGLU, SplitFiniteDifferences) {
  Rng rng(22);
  for (const Shape& s : kOutShapes) {
    Tensor a = rng.randn(s, DType::F64, 2.0), b = rng.randn(s);
    Tensor out = Tensor::empty(s, DType::F64);
    const std::vector<double> probe = rng.normals(out.numel());
    auto loss = [&] {
      swiglu_forward(a, b, out);
      return test::dot(out, probe);
    };
    Tensor dout = Tensor::from_vector(probe, s, DType::F64);
    Tensor da = test::filled(s, 5.0), db = test::filled(s, -5.0);
    swiglu_backward(dout, a, b, da, db);
    test::expect_fd_grad(loss, a, da.to_vector(), "swiglu split " + shape_str(s) + " da");
    test::expect_fd_grad(loss, b, db.to_vector(), "swiglu split " + shape_str(s) + " db");
  }
}

TEST(SwiGLU, FusedEqualsSplitAndDefinition) {
  Rng rng(23);
  const std::int64_t N = 3, F = 5;
  Tensor u = rng.randn({N, 2 * F});
  auto uv = u.to_vector();
  std::vector<double> av, bv;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t f = 0; f < 2 * F; ++f) (f < F ? av : bv).push_back(uv[n * 2 * F + f]);
  Tensor a = Tensor::from_vector(av, {N, F}, DType::F64), b = Tensor::from_vector(bv, {N, F}, DType::F64);
  Tensor o1 = Tensor::empty({N, F}, DType::F64), o2 = Tensor::empty({N, F}, DType::F64);
  swiglu_forward(u, o1);
  swiglu_forward(a, b, o2);
  EXPECT_TRUE(test::same_bits(o1, o2));
  auto ov = o1.to_vector();
  for (std::size_t i = 0; i < av.size(); ++i)
    EXPECT_NEAR(ov[i], av[i] / (1 + std::exp(-av[i])) * bv[i], 1e-15 * (1 + std::fabs(ov[i])));
}

TEST(SwiGLU, InPlaceBackward) {
  Rng rng(24);
  const Shape us{4, 18}, os{4, 9};
  Tensor u = rng.randn(us), dout = rng.randn(os);
  Tensor du = Tensor::empty(us, DType::F64);
  swiglu_backward(dout, u, du);
  Tensor u2 = u.clone();
  swiglu_backward(dout, u2, u2);  // du written over u
  EXPECT_TRUE(test::same_bits(u2, du));
}

TEST(SwiGLU, StableForLargeInputs) {
  std::vector<double> av = {-800, -60, -1e-300, 0, 60, 800}, bv(6, 2.0), gv(6, 1.0);
  Tensor a = Tensor::from_vector(av, {6}, DType::F32), b = Tensor::from_vector(bv, {6}, DType::F32);
  Tensor g = Tensor::from_vector(gv, {6}, DType::F32);
  Tensor o = Tensor::empty({6}, DType::F32), da = Tensor::empty({6}, DType::F32), db = Tensor::empty({6}, DType::F32);
  swiglu_forward(a, b, o);
  swiglu_backward(g, a, b, da, db);
  auto ov = o.to_vector(), dav = da.to_vector(), dbv = db.to_vector();
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(std::isfinite(ov[i]) && std::isfinite(dav[i]) && std::isfinite(dbv[i])) << av[i];
  }
  EXPECT_EQ(ov[0], 0.0);
  EXPECT_FLOAT_EQ(ov[5], 1600.0f);
  EXPECT_FLOAT_EQ(dav[5], 2.0f);  // d silu -> 1 for large a
  EXPECT_EQ(dav[0], 0.0);
}

TEST(SwiGLU, RejectsBadArguments) {
  Tensor u = Tensor::zeros({2, 7}, DType::F32), out = Tensor::empty({2, 3}, DType::F32);
  EXPECT_THROW(swiglu_forward(u, out), std::invalid_argument);  // odd fused width
  Tensor u8 = Tensor::zeros({2, 8}, DType::F32), out5 = Tensor::empty({2, 5}, DType::F32);
  EXPECT_THROW(swiglu_forward(u8, out5), std::invalid_argument);
  Tensor a = Tensor::zeros({2, 4}, DType::F32), b = Tensor::zeros({2, 5}, DType::F32);
  Tensor o = Tensor::empty({2, 4}, DType::F32);
  EXPECT_THROW(swiglu_forward(a, b, o), std::invalid_argument);
}

}  // namespace
}  // namespace nsatron
