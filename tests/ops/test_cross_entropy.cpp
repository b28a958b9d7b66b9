// Cross entropy: finite differences on the logits (with ignored rows), the loss against a
// direct evaluation, the denominator and chunking contract, fused vs unfused, in-place
// backward, target checks, thread-count determinism.
#include <cmath>

#include "core/ops/cross_entropy.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

std::vector<std::int32_t> random_targets(Rng& rng, std::int64_t n, std::int64_t V,
                                         double p_ignore, std::int32_t ignore) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = rng.uniform(0, 1) < p_ignore ? ignore : std::int32_t(rng.integer(0, V - 1));
  return t;
}

// The loss straight from the definition.
double direct_loss(const Tensor& logits, const std::vector<std::int32_t>& t, std::int32_t ignore) {
  auto z = logits.to_vector();
  const std::int64_t V = logits.dim(-1);
  double sum = 0;
  int count = 0;
  for (std::size_t n = 0; n < t.size(); ++n) {
    if (t[n] == ignore) continue;
    double s = 0;
    for (std::int64_t v = 0; v < V; ++v) s += std::exp(z[n * V + v]);
    sum += std::log(s) - z[n * V + t[n]];
    ++count;
  }
  return count ? sum / count : 0.0;
}

TEST(CrossEntropy, FiniteDifferences) {
  Rng rng(41);
  struct Case {
    Shape logits;
    double p_ignore;
  };
  for (const Case& c : {Case{{1, 1}, 0.0}, Case{{1, 7}, 0.0}, Case{{5, 3}, 0.3},
                        Case{{2, 3, 11}, 0.25}, Case{{9, 64}, 0.1}}) {
    const std::int64_t V = c.logits.back(), N = shape_numel(c.logits) / V;
    Tensor z = rng.randn(c.logits, DType::F64, 2.0);
    auto t = random_targets(rng, N, V, c.p_ignore, -100);
    t[0] = std::int32_t(V - 1);  // at least one counted row
    Tensor loss = Tensor::empty({1}, DType::F64), lse = Tensor::empty({N}, DType::F64);
    auto f = [&] {
      cross_entropy_forward(z, t, loss, lse);
      return 0.7 * loss.to_vector()[0];
    };
    f();
    EXPECT_NEAR(loss.to_vector()[0], direct_loss(z, t, -100), 1e-13);
    Tensor dz = test::filled(c.logits, 42.0);
    cross_entropy_backward(z, t, lse, 0.7, dz);
    test::expect_fd_grad(f, z, dz.to_vector(), "cross_entropy " + shape_str(c.logits));
  }
}

TEST(CrossEntropy, FusedEqualsUnfusedAndInPlace) {
  Rng rng(42);
  const std::int64_t N = 37, V = 50;
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor z = rng.randn({N, V}, dt, 3.0);
    auto t = random_targets(rng, N, V, 0.2, 7);  // an ignore index inside [0, V)
    CrossEntropyOptions opt{.ignore_index = 7};
    Tensor loss = Tensor::empty({1}, dt), lse = Tensor::empty({N}, dt);
    Tensor dz = Tensor::empty({N, V}, dt);
    cross_entropy_forward(z, t, loss, lse, opt);
    cross_entropy_backward(z, t, lse, 1.0, dz, opt);
    Tensor z2 = z.clone();  // in place: dlogits over logits
    cross_entropy_backward(z2, t, lse, 1.0, z2, opt);
    EXPECT_TRUE(test::same_bits(z2, dz));
    Tensor z3 = z.clone(), loss3 = Tensor::empty({1}, dt);
    cross_entropy_fused(z3, t, loss3, 1.0, opt);
    EXPECT_TRUE(test::same_bits(z3, dz));
    EXPECT_TRUE(test::same_bits(loss3, loss));
    // Ignored rows have zero gradient, counted rows sum to zero.
    auto dv = dz.to_vector();
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (std::int64_t v = 0; v < V; ++v) {
        if (t[n] == 7) {
          EXPECT_EQ(dv[n * V + v], 0.0);
        }
        s += dv[n * V + v];
      }
      EXPECT_NEAR(s, 0.0, dt == DType::F32 ? 1e-7 : 1e-16);
    }
  }
}

TEST(CrossEntropy, ChunksWithAGlobalDenominatorAddUp) {
  Rng rng(43);
  const std::int64_t N = 20, V = 9;
  Tensor z = rng.randn({N, V});
  auto t = random_targets(rng, N, V, 0.3, -100);
  t[0] = 1;
  const std::int64_t D = count_targets(t, -100);
  Tensor loss = Tensor::empty({1}, DType::F64), dz = z.clone();
  cross_entropy_fused(dz, t, loss, 1.0);
  // Rows [0, 8) and [8, 20) with D of the whole batch, the loss accumulated.
  Tensor loss_c = Tensor::zeros({}, DType::F64), dz_c = z.clone();
  for (auto [b, e] : {std::pair<std::int64_t, std::int64_t>{0, 8}, {8, 20}}) {
    Tensor chunk = dz_c.slice0(b, e);
    std::span<const std::int32_t> tc(t.data() + b, std::size_t(e - b));
    cross_entropy_fused(chunk, tc, loss_c, 1.0,
                        {.denominator = double(D), .accumulate_loss = true});
  }
  EXPECT_NEAR(loss_c.to_vector()[0], loss.to_vector()[0], 1e-15);
  EXPECT_TRUE(test::same_bits(dz_c, dz));
}

TEST(CrossEntropy, AllIgnoredGivesZero) {
  Tensor z = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::F64);
  std::vector<std::int32_t> t = {-100, -100};
  Tensor loss = Tensor::empty({1}, DType::F64), dz = z.clone();
  cross_entropy_fused(dz, t, loss, 1.0);
  EXPECT_EQ(loss.to_vector()[0], 0.0);
  for (double v : dz.to_vector()) EXPECT_EQ(v, 0.0);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  Tensor z = Tensor::from_vector({1000, -1000, 999, 0}, {1, 4}, DType::F32);
  std::vector<std::int32_t> t = {2};
  Tensor loss = Tensor::empty({1}, DType::F32), lse = Tensor::empty({1}, DType::F32);
  cross_entropy_forward(z, t, loss, lse);
  EXPECT_NEAR(loss.to_vector()[0], std::log1p(std::exp(1.0)), 1e-4);
}

TEST(CrossEntropy, RejectsBadTargets) {
  Tensor z = Tensor::zeros({3, 4}, DType::F32), loss = Tensor::empty({1}, DType::F32);
  Tensor lse = Tensor::empty({3}, DType::F32);
  std::vector<std::int32_t> bad = {0, 4, 1};
  try {
    cross_entropy_forward(z, bad, loss, lse);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("position 1"), std::string::npos) << e.what();
  }
  std::vector<std::int32_t> two = {0, 1};
  EXPECT_THROW(cross_entropy_forward(z, two, loss, lse), std::invalid_argument);
  std::vector<std::int32_t> ok = {0, 1, 2};
  Tensor loss2 = Tensor::empty({2}, DType::F32);
  EXPECT_THROW(cross_entropy_forward(z, ok, loss2, lse), std::invalid_argument);
}

TEST(CrossEntropy, SameBitsForAnyThreadCount) {
  Rng rng(44);
  const std::int64_t N = 301, V = 257;
  Tensor z = rng.randn({N, V}, DType::F32, 2.0);
  auto t = random_targets(rng, N, V, 0.1, -100);
  auto run = [&](int threads) {
    Tensor loss = Tensor::empty({1}, DType::F32), d = z.clone();
    test::with_threads(threads, [&] { cross_entropy_fused(d, t, loss, 1.0); });
    return std::pair{loss, d};
  };
  auto [l1, d1] = run(1);
  auto [l3, d3] = run(3);
  EXPECT_TRUE(test::same_bits(l1, l3));
  EXPECT_TRUE(test::same_bits(d1, d3));
}

}  // namespace
}  // namespace nsatron
