// Global gradient norm and clipping: against a direct sum, thread-count determinism,
// clipping factor, non-finite norms, the one-element result tensor.
#include <cmath>
#include <limits>

#include "core/ops/grad_norm.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

TEST(GradNorm, MatchesDirectSum) {
  Rng rng(71);
  // Buffer sizes around the chunk size, one empty, mixed dtypes.
  std::vector<Tensor> bufs = {rng.randn({1}), rng.randn({kNormChunk + 3}, DType::F32),
                              Tensor::zeros({0}, DType::F64), rng.randn({3, 7}),
                              rng.randn({2 * kNormChunk}, DType::F32)};
  double direct = 0;
  for (const Tensor& b : bufs)
    for (double x : b.to_vector()) direct += x * x;
  Tensor ss = Tensor::empty({1}, DType::F64), norm = Tensor::empty({1}, DType::F64);
  sum_squares(bufs, ss);
  global_norm(bufs, norm);
  EXPECT_NEAR(ss.to_vector()[0], direct, 1e-12 * direct);
  EXPECT_NEAR(norm.to_vector()[0], std::sqrt(direct), 1e-12 * std::sqrt(direct));
}

TEST(GradNorm, SameBitsForAnyThreadCount) {
  Rng rng(72);
  std::vector<Tensor> bufs = {rng.randn({100001}, DType::F32), rng.randn({77}, DType::F32)};
  auto run = [&](int threads) {
    Tensor norm = Tensor::empty({1}, DType::F64);
    test::with_threads(threads, [&] { global_norm(bufs, norm); });
    return norm;
  };
  EXPECT_TRUE(test::same_bits(run(1), run(2)));
  EXPECT_TRUE(test::same_bits(run(1), run(7)));
}

TEST(GradNorm, ClipScalesOnlyAboveMaxNorm) {
  Rng rng(73);
  std::vector<Tensor> bufs = {rng.randn({50}), rng.randn({4, 5})};
  Tensor norm = Tensor::empty({1}, DType::F64);
  global_norm(bufs, norm);
  const double n = norm.to_vector()[0];
  std::vector<std::vector<double>> before;
  for (auto& b : bufs) before.push_back(b.to_vector());

  clip_by_global_norm_(bufs, norm, n * 2);  // below the limit: untouched
  for (std::size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(bufs[i].to_vector(), before[i]);

  clip_by_global_norm_(bufs, norm, 1.0);
  const double c = 1.0 / (n + 1e-6);
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    auto after = bufs[i].to_vector();
    for (std::size_t j = 0; j < after.size(); ++j) EXPECT_NEAR(after[j], before[i][j] * c, 1e-15);
  }
  Tensor norm2 = Tensor::empty({1}, DType::F64);
  global_norm(bufs, norm2);
  EXPECT_NEAR(norm2.to_vector()[0], 1.0, 1e-6);
}

TEST(GradNorm, NonFiniteNormLeavesBuffersAlone) {
  std::vector<Tensor> bufs = {Tensor::from_vector({1, std::numeric_limits<double>::infinity()}, {2}, DType::F64)};
  Tensor norm = Tensor::empty({1}, DType::F32);
  global_norm(bufs, norm);
  EXPECT_TRUE(std::isinf(norm.to_vector()[0]));
  EXPECT_EQ(clip_coefficient(std::nan(""), 1.0), 1.0);
  clip_by_global_norm_(bufs, norm, 1.0);
  EXPECT_EQ(bufs[0].to_vector()[0], 1.0);
}

TEST(GradNorm, ScaleAndArgumentChecks) {
  std::vector<Tensor> bufs = {Tensor::from_vector({1, -2}, {2}, DType::F32)};
  scale_(bufs, -0.5);
  EXPECT_EQ(bufs[0].to_vector(), (std::vector<double>{-0.5, 1.0}));
  Tensor two = Tensor::empty({2}, DType::F32);
  EXPECT_THROW(global_norm(bufs, two), std::invalid_argument);
  Tensor norm = Tensor::from_vector({1}, {1}, DType::F32);
  EXPECT_THROW(clip_by_global_norm_(bufs, norm, 0.0), std::invalid_argument);
}

}  // namespace
}  // namespace nsatron
