// Float64 central finite differences of the whole model's loss with respect to every
// parameter tensor (every layer's attn_norm, wqkv, cmp_wk/wv/pk/pv, wo, mlp_norm, w_gate, w_up, w_out,
// the embedding, the final norm, the untied head), against the hand-written backward; with
// NSA attention and with dense attention (no compression parameters).
//
// Error budget, eps = 1e-6 in fp64: truncation ~eps^2 |f'''| / 6 ~ 1e-13; rounding of the
// loss (~2.4, a few ulp ~ 1e-15) over 2 eps gives ~1e-9. The bound is 1e-6 |g| + 1e-8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "tests/model/model_test_util.h"

namespace nsatron::test {
namespace {

constexpr double kEps = 1e-6;
constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-8;

struct FdCase {
  ModelDims dims;
  std::int64_t B = 2, T = 13;
  double random_sd = 0;            // 0: the model's own init; else random normal weights
  std::int64_t head_chunk = 1024;  // rows of the LM head at once
  std::int64_t max_per_tensor = 64;  // elements checked per tensor: all up to this, else a random
                                   // sample of this many plus the largest component
  bool expect_cmp_grads = true;    // false when T < l: the compression branch is empty
};

void check_fd(const FdCase& c, std::uint64_t seed) {
  NsaTransformer model(c.dims, DType::F64);
  model.params().initialize(seed);
  if (c.random_sd > 0) randomize_weights(model, c.random_sd, seed + 1);
  model.set_head_chunk(c.head_chunk);
  const Batch b = random_batch(c.dims.V, c.B, c.T, seed + 2);

  model.params().zero_grads();
  const double loss_fb = model.forward_backward(b.tokens, b.targets, b.B, b.T);
  const double loss_ev = model.evaluate(b.tokens, b.targets, b.B, b.T);
  ASSERT_TRUE(std::isfinite(loss_fb));
  EXPECT_NEAR(loss_fb, loss_ev, 1e-13 * std::fabs(loss_ev)) << "forward_backward and evaluate disagree";
  const std::vector<double> grad = model.params().flat_grads().to_vector();

  double* w = model.params().flat_weights().data<double>();
  auto loss_at = [&](std::int64_t k, double v) {
    const double keep = w[k];
    w[k] = v;
    const double f = model.evaluate(b.tokens, b.targets, b.B, b.T);
    w[k] = keep;
    return f;
  };

  std::mt19937_64 gen(seed + 3);
  std::int64_t checked = 0;
  for (const auto& p : model.params().infos()) {
    std::vector<std::int64_t> idx(std::size_t(p.numel));
    std::iota(idx.begin(), idx.end(), 0);
    double gmax = 0;
    std::int64_t imax = 0;
    for (std::int64_t i = 0; i < p.numel; ++i)
      if (std::fabs(grad[std::size_t(p.offset + i)]) > gmax) gmax = std::fabs(grad[std::size_t(p.offset + i)]), imax = i;
    if (p.numel > c.max_per_tensor) {
      std::shuffle(idx.begin(), idx.end(), gen);
      idx.resize(std::size_t(c.max_per_tensor));
      idx.push_back(imax);  // always the largest component
    }
    const bool is_cmp = p.name.find("/cmp_") != std::string::npos;
    if (is_cmp && !c.expect_cmp_grads) {
      EXPECT_EQ(gmax, 0.0) << p.name << ": the compression branch is empty, yet it has a gradient";
    } else {
      EXPECT_GT(gmax, c.random_sd > 0 ? 1e-4 : 1e-7) << p.name << ": gradient (near) zero: degenerate check";
    }

    int bad = 0;
    double worst = 0;
    for (std::int64_t i : idx) {
      const std::int64_t k = p.offset + i;
      const double fp = loss_at(k, w[k] + kEps), fm = loss_at(k, w[k] - kEps);
      const double num = (fp - fm) / (2 * kEps), ana = grad[std::size_t(k)];
      const double bound = kRtol * std::fabs(ana) + kAtol;
      worst = std::max(worst, std::fabs(num - ana) / bound);
      if (!(std::fabs(num - ana) <= bound) && bad++ < 5)
        ADD_FAILURE() << p.name << "[" << i << "]: analytic " << ana << " vs finite difference " << num
                      << " (|diff| " << std::fabs(num - ana) << " > " << bound << ")";
      ++checked;
    }
    EXPECT_EQ(bad, 0) << p.name << ": " << bad << " of " << idx.size() << " checked elements differ";
    std::printf("  %-28s numel %5lld checked %5zu  max|g| %.3e  worst |diff|/bound %.3f\n", p.name.c_str(),
                (long long)p.numel, idx.size(), gmax, worst);
  }
  std::printf("  loss %.12f, %lld elements checked\n", loss_ev, (long long)checked);
}

TEST(ModelGradcheck, DefaultInitTied) { check_fd({.dims = tiny_dims(true)}, 11); }

TEST(ModelGradcheck, DefaultInitUntied) { check_fd({.dims = tiny_dims(false)}, 12); }

// Every element of every tensor.
TEST(ModelGradcheck, RandomWeightsTiedAllElements) {
  check_fd({.dims = tiny_dims(true), .random_sd = 0.4, .max_per_tensor = 1 << 30}, 13);
}

// Untied head, LM head run in row chunks of 5 (26 rows: the last chunk is partial).
TEST(ModelGradcheck, RandomWeightsUntiedChunkedHead) {
  check_fd({.dims = tiny_dims(false), .random_sd = 0.4, .head_chunk = 5}, 14);
}

// One KV group: all four heads share the keys and values.
TEST(ModelGradcheck, RandomWeightsOneGroup) { check_fd({.dims = tiny_dims(true, 1), .random_sd = 0.4}, 15); }

// One head per group (H = G = 4).
TEST(ModelGradcheck, RandomWeightsOneHeadPerGroup) {
  check_fd({.dims = tiny_dims(false, 4), .random_sd = 0.35}, 16);
}

// Nine KV groups of one head each: the projection's split runs 72 (group, part) pairs, more
// than one raw call of split_columns takes (two calls, whole groups at a time).
TEST(ModelGradcheck, RandomWeightsNineGroups) {
  ModelDims d = tiny_dims(false, 9);
  d.H = 9;
  d.L = 1;
  check_fd({.dims = d, .random_sd = 0.35}, 19);
}

// n = 4 with T = 21 (6 selection blocks): beyond the three forced blocks the top-n choice is
// real for t >= 16, so the chosen blocks depend on the scores.
TEST(ModelGradcheck, RandomWeightsSelectionWithChoice) {
  ModelDims d = tiny_dims(true);
  d.sel_count = 4;
  d.L = 3;
  check_fd({.dims = d, .B = 2, .T = 21, .random_sd = 0.4}, 17);
}

// T < l: no compressed block; the compression parameters get exactly zero gradient and the
// selection has only its forced blocks.
TEST(ModelGradcheck, RandomWeightsShortSequence) {
  check_fd({.dims = tiny_dims(false), .B = 3, .T = 3, .random_sd = 0.4, .expect_cmp_grads = false}, 18);
}

// Dense attention (model.attention = "dense"): every element of every tensor.
TEST(ModelGradcheck, DenseRandomWeightsTiedAllElements) {
  check_fd({.dims = dense(tiny_dims(true)), .random_sd = 0.4, .max_per_tensor = 1 << 30}, 19);
}

// Dense, one KV group, untied head in row chunks of 5.
TEST(ModelGradcheck, DenseRandomWeightsOneGroupUntiedChunkedHead) {
  check_fd({.dims = dense(tiny_dims(false, 1)), .random_sd = 0.4, .head_chunk = 5}, 20);
}

// Dense, one head per group, at its own init.
TEST(ModelGradcheck, DenseDefaultInitOneHeadPerGroup) { check_fd({.dims = dense(tiny_dims(false, 4))}, 21); }

// Dense, one token per sequence: each query attends to itself only.
TEST(ModelGradcheck, DenseOneToken) { check_fd({.dims = dense(tiny_dims(true)), .B = 3, .T = 1, .random_sd = 0.4}, 22); }

}  // namespace
}  // namespace nsatron::test
