// AdamW: several steps against a plain per-element transcription of the update, weight
// decay only where the segment says so, grad_scale, segment validation.
#include <cmath>

#include "core/ops/adamw.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

// One step of the update, element by element, as written in the header.
void reference_step(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                    std::vector<double>& v, const std::vector<bool>& decay, const AdamWHyper& h,
                    int t, double scale) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * scale;
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
    const double mhat = m[i] / (1 - std::pow(h.beta1, t));
    const double vhat = v[i] / (1 - std::pow(h.beta2, t));
    if (decay[i]) p[i] -= h.lr * h.weight_decay * p[i];
    p[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
  }
}

TEST(AdamW, MatchesTheUpdateRuleOverSteps) {
  Rng rng(61);
  const std::vector<ParamSegment> segs = {{0, 7, true}, {7, 1, false}, {8, 12, true}, {20, 3, false}};
  const std::int64_t n = 23;
  std::vector<bool> decay;
  for (const auto& s : segs) decay.insert(decay.end(), std::size_t(s.numel), s.decay);
  const AdamWHyper h{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.3};
  Tensor p = rng.randn({n}), m = Tensor::zeros({n}, DType::F64), v = Tensor::zeros({n}, DType::F64);
  std::vector<double> rp = p.to_vector(), rm(n, 0.0), rv(n, 0.0);
  for (int t = 1; t <= 5; ++t) {
    Tensor g = rng.randn({n});
    const double scale = t == 3 ? 0.25 : 1.0;
    adamw_step(p, g, m, v, segs, h, t, scale);
    reference_step(rp, g.to_vector(), rm, rv, decay, h, t, scale);
  }
  test::expect_close(p.to_vector(), rp, 1e-14, 1e-15, "param");
  test::expect_close(m.to_vector(), rm, 1e-14, 1e-15, "m");
  test::expect_close(v.to_vector(), rv, 1e-14, 1e-15, "v");
}

TEST(AdamW, DecayOnlyWhereFlagged) {
  // Zero gradient: m = v = 0, so only the decay moves the parameters.
  const std::vector<ParamSegment> segs = {{0, 2, false}, {2, 2, true}};
  Tensor p = Tensor::from_vector({1, 2, 3, 4}, {4}, DType::F32);
  Tensor g = Tensor::zeros({4}, DType::F32), m = Tensor::zeros({4}, DType::F32), v = Tensor::zeros({4}, DType::F32);
  adamw_step(p, g, m, v, segs, {.lr = 0.1, .weight_decay = 0.5}, 1);
  auto pv = p.to_vector();
  EXPECT_EQ(pv[0], 1.0);
  EXPECT_EQ(pv[1], 2.0);
  EXPECT_FLOAT_EQ(pv[2], 3.0f * 0.95f);
  EXPECT_FLOAT_EQ(pv[3], 4.0f * 0.95f);
  for (double x : g.to_vector()) EXPECT_EQ(x, 0.0);
}

TEST(AdamW, GradScaleDoesNotWriteTheGradient) {
  Rng rng(62);
  Tensor p = rng.randn({9}, DType::F32), g = rng.randn({9}, DType::F32);
  Tensor m = Tensor::zeros({9}, DType::F32), v = Tensor::zeros({9}, DType::F32);
  Tensor g0 = g.clone();
  const ParamSegment all{0, 9, true};
  adamw_step(p, g, m, v, std::span(&all, 1), {}, 1, 0.5);
  EXPECT_TRUE(test::same_bits(g, g0));
}

TEST(AdamW, RejectsBadSegmentsAndSteps) {
  Tensor p = Tensor::zeros({10}, DType::F32), g = Tensor::zeros({10}, DType::F32);
  Tensor m = Tensor::zeros({10}, DType::F32), v = Tensor::zeros({10}, DType::F32);
  const std::vector<ParamSegment> gap = {{0, 4, true}, {5, 5, true}};
  const std::vector<ParamSegment> short_ = {{0, 4, true}, {4, 5, true}};
  const std::vector<ParamSegment> good = {{0, 4, true}, {4, 6, false}};
  EXPECT_THROW(adamw_step(p, g, m, v, gap, {}, 1), std::invalid_argument);
  EXPECT_THROW(adamw_step(p, g, m, v, short_, {}, 1), std::invalid_argument);
  EXPECT_THROW(adamw_step(p, g, m, v, good, {}, 0), std::invalid_argument);
  Tensor m9 = Tensor::zeros({9}, DType::F32);
  EXPECT_THROW(adamw_step(p, g, m9, v, good, {}, 1), std::invalid_argument);
  EXPECT_NO_THROW(adamw_step(p, g, m, v, good, {}, 1));
}

TEST(AdamW, SameBitsForAnyThreadCount) {
  Rng rng(63);
  const std::int64_t n = 100003;
  const std::vector<ParamSegment> segs = {{0, 50000, true}, {50000, 3, false}, {50003, 50000, true}};
  Tensor p0 = rng.randn({n}, DType::F32), g = rng.randn({n}, DType::F32);
  auto run = [&](int threads) {
    Tensor p = p0.clone(), m = Tensor::zeros({n}, DType::F32), v = Tensor::zeros({n}, DType::F32);
    test::with_threads(threads, [&] {
      for (int t = 1; t <= 3; ++t) adamw_step(p, g, m, v, segs, {.weight_decay = 0.1}, t);
    });
    return p;
  };
  EXPECT_TRUE(test::same_bits(run(1), run(3)));
}

}  // namespace
}  // namespace nsatron
