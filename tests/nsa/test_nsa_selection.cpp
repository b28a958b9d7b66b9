// The selection rule itself: forced blocks, top-n by score with ties to the smaller index,
// nothing beyond the query's own block, and the mapping of compressed blocks onto
// selection blocks (a planted winner).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "nsa/cpu/selection.h"
#include "tests/nsa/nsa_test_util.h"

namespace nsatron::nsa::test {
namespace {

std::vector<std::int32_t> select(const std::vector<double>& S, std::int64_t n) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(n)), scratch(S.size() + 1);
  cpu::select_blocks(S.data(), std::int64_t(S.size()) - 1, n, out.data(), scratch.data());
  return out;
}

using V = std::vector<std::int32_t>;

TEST(nsa_select_rule, TopScoresPlusForced) {
  // b_t = 7: forced 0, 6, 7; candidates 1..5 score 5,3,3,9,3 -> the two best are 4 and 1.
  EXPECT_EQ(select({0.1, 5, 3, 3, 9, 3, 0, 0}, 5), (V{0, 1, 4, 6, 7}));
}

TEST(nsa_select_rule, ForcedBlocksEvenWithTheLowestScores) {
  EXPECT_EQ(select({-1, 7, 8, 9, -5, -6}, 4), (V{0, 3, 4, 5}));
  EXPECT_EQ(select({-1, 7, 8, 9, -5, -6}, 3), (V{0, 4, 5}));
}

TEST(nsa_select_rule, TiesGoToTheSmallerIndex) {
  EXPECT_EQ(select({0, 2, 2, 2, 2, 2, 0, 0}, 5), (V{0, 1, 2, 6, 7}));
  EXPECT_EQ(select({0, 1, 2, 2, 1, 2, 0, 0}, 5), (V{0, 2, 3, 6, 7}));
  EXPECT_EQ(select({0, 1, 2, 2, 1, 2, 0, 0}, 4), (V{0, 2, 6, 7}));
  // All equal: the smallest non-forced indices.
  EXPECT_EQ(select(std::vector<double>(12, 0.5), 6), (V{0, 1, 2, 3, 10, 11}));
}

TEST(nsa_select_rule, NaNScoresRankLowestWithoutBreakingTheSort) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(select({0, nan, 1, 2, 0, 0}, 4), (V{0, 3, 4, 5}));
  EXPECT_EQ(select({0, nan, nan, nan, nan, 0, 0}, 4), (V{0, 1, 5, 6}));
}

TEST(nsa_select_rule, FewEligibleBlocksArePaddedWithMinusOne) {
  EXPECT_EQ(select({3}, 3), (V{0, -1, -1}));
  EXPECT_EQ(select({3, 1}, 3), (V{0, 1, -1}));
  EXPECT_EQ(select({3, 1, 2}, 3), (V{0, 1, 2}));
  EXPECT_EQ(select({3, 1, 2, 9, 9}, 10), (V{0, 1, 2, 3, 4, -1, -1, -1, -1, -1}));
}

TEST(nsa_block_scores, OverlapWeightsOfThePaperShape) {
  // l=32, d=16, l'=64: compressed blocks 4j-1 .. 4j+3 weigh 1,2,2,2,1 on block j.
  NsaDims dims = make_dims(1, 512, 1, 1, 2, 32, 16, 64, 16, 512);
  const std::int64_t n_vis = 20, b_t = 5;
  for (std::int64_t hot = 0; hot < n_vis; ++hot) {
    std::vector<double> p(static_cast<std::size_t>(n_vis), 0.0), S(static_cast<std::size_t>(b_t + 1));
    p[static_cast<std::size_t>(hot)] = 1.0;
    cpu::group_block_scores(dims, p.data(), n_vis, b_t, S.data());
    for (std::int64_t j = 0; j <= b_t; ++j) {
      // Reference: count shared tokens directly.
      std::int64_t shared = 0;
      for (std::int64_t s = hot * 16; s < hot * 16 + 32; ++s) shared += (s / 64 == j);
      EXPECT_EQ(S[static_cast<std::size_t>(j)], double(shared) / 16.0) << "i=" << hot << " j=" << j;
    }
  }
}

// Every row of a real forward: forced blocks present, ascending, unique, <= b_t, the right
// count, -1 padding; and the choice is not trivially the smallest indices.
TEST(nsa_selection, RowsFollowTheRuleOnRandomInputs) {
  const NsaDims dims = make_dims(2, 300, 4, 2, 8, 8, 4, 16, 5, 32);
  Problem<double> p = random_problem<double>(dims, 42);
  for (auto& v : p.x[0]) v *= 3.0;  // peaked compression scores
  const Result<double> r = run_forward(p);
  std::int64_t non_trivial = 0;
  for (std::int64_t b = 0; b < dims.B; ++b)
    for (std::int64_t t = 0; t < dims.T; ++t)
      for (std::int64_t g = 0; g < dims.G; ++g) {
        const std::int32_t* row = r.saved.sel_blocks.data() + ((b * dims.T + t) * dims.G + g) * dims.sel_count;
        const std::int64_t b_t = t / dims.sel_block;
        const std::int64_t expect_count = std::min<std::int64_t>(dims.sel_count, b_t + 1);
        std::set<std::int32_t> chosen;
        for (std::int64_t k = 0; k < dims.sel_count; ++k) {
          if (k < expect_count) {
            ASSERT_GE(row[k], 0);
            ASSERT_LE(row[k], b_t) << "block beyond the query's own block, t=" << t;
            if (k > 0) {
              ASSERT_LT(row[k - 1], row[k]) << "not ascending, t=" << t;
            }
            chosen.insert(row[k]);
          } else {
            ASSERT_EQ(row[k], -1) << "padding, t=" << t;
          }
        }
        ASSERT_TRUE(chosen.count(0));
        ASSERT_TRUE(chosen.count(std::int32_t(b_t)));
        if (b_t >= 1) {
          ASSERT_TRUE(chosen.count(std::int32_t(b_t - 1)));
        }
        // Smallest-index choice would be {0, 1, .., n-3, b_t-1, b_t}.
        if (b_t >= dims.sel_count && !chosen.count(1)) ++non_trivial;
      }
  EXPECT_GT(non_trivial, 50) << "selection looks degenerate (always the smallest indices)";
}

// q = 0: uniform compression probabilities, so every interior block scores the same and the
// ties must go to the smallest indices.
TEST(nsa_selection, ExactTiesPickTheSmallestIndices) {
  const NsaDims dims = make_dims(1, 200, 4, 2, 8, 8, 4, 16, 5, 32);
  Problem<double> p = random_problem<double>(dims, 7);
  std::fill(p.x[0].begin(), p.x[0].end(), 0.0);
  const Result<double> r = run_forward(p);
  for (std::int64_t t = 0; t < dims.T; ++t)
    for (std::int64_t g = 0; g < dims.G; ++g) {
      const std::int64_t b_t = t / dims.sel_block;
      if (b_t < dims.sel_count) continue;
      const std::int32_t* row = r.saved.sel_blocks.data() + (t * dims.G + g) * dims.sel_count;
      EXPECT_EQ(V(row, row + dims.sel_count), (V{0, 1, 2, std::int32_t(b_t - 1), std::int32_t(b_t)}))
          << "t=" << t;
    }
}

// Rotate-half RoPE by an arbitrary (possibly negative) position, written out for this test.
std::vector<double> rope(const std::vector<double>& x, double pos, double theta) {
  const std::size_t D = x.size(), half = D / 2;
  std::vector<double> y(D);
  for (std::size_t i = 0; i < half; ++i) {
    const double a = pos * std::pow(theta, -2.0 * double(i) / double(D));
    y[i] = x[i] * std::cos(a) - x[i + half] * std::sin(a);
    y[i + half] = x[i + half] * std::cos(a) + x[i] * std::sin(a);
  }
  return y;
}

// A planted winner: the compression map picks the last token of each block, and the last
// token of compressed block 16 (tokens 32..35, inside selection block 4) is made to align
// with the last query; block 4 must then be the one non-forced choice of that query.
TEST(nsa_selection, PlantedBlockIsChosen) {
  const NsaDims dims = make_dims(1, 64, 1, 1, 8, 4, 2, 8, 4, 3);
  Problem<double> p = random_problem<double>(dims, 99);
  const std::int64_t D = dims.D, l = dims.cmp_block, t = dims.T - 1;
  std::fill(p.x[8].begin(), p.x[8].end(), 0.0);
  for (std::int64_t c = 0; c < D; ++c) p.x[8][static_cast<std::size_t>(((l - 1) * D + c) * D + c)] = 1.0;
  std::fill(p.x[10].begin(), p.x[10].end(), 0.0);
  for (auto& v : p.x[1]) v *= 0.1;
  const std::int64_t token = 16 * 2 + l - 1;  // last token of compressed block 16
  std::vector<double> q_t(p.x[0].begin() + t * D, p.x[0].begin() + (t + 1) * D);
  // RoPE(k, token) = 10 RoPE(q_t, t)  <=>  k = 10 RoPE(q_t, t - token)
  const std::vector<double> k = rope(q_t, double(t - token), dims.rope_theta);
  for (std::int64_t c = 0; c < D; ++c) p.x[1][static_cast<std::size_t>(token * D + c)] = 10.0 * k[static_cast<std::size_t>(c)];
  const Result<double> r = run_forward(p);
  const std::int32_t* row = r.saved.sel_blocks.data() + t * dims.sel_count;
  EXPECT_EQ(V(row, row + dims.sel_count), (V{0, 4, 6, 7}));
}

// Nothing beyond the query's own position matters: changing every input at positions > t0
// leaves out[.., <= t0, ..] and the selections of those rows bit-identical.
TEST(nsa_selection, CausalNoFutureLeaks) {
  const NsaDims dims = make_dims(2, 90, 4, 2, 8, 8, 4, 16, 4, 12);
  const Problem<double> p = random_problem<double>(dims, 5);
  Problem<double> f = p;
  const std::int64_t t0 = 37;
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int k = 0; k < 8; ++k) {
    const auto shape = input_shape(dims, k);
    const std::int64_t row = shape[2] * shape[3];
    for (std::int64_t b = 0; b < dims.B; ++b)
      for (std::int64_t t = t0 + 1; t < dims.T; ++t)
        for (std::int64_t e = 0; e < row; ++e) f.x[k][static_cast<std::size_t>((b * dims.T + t) * row + e)] = normal(rng);
  }
  const Result<double> a = run_forward(p), c = run_forward(f);
  for (std::int64_t b = 0; b < dims.B; ++b) {
    for (std::int64_t t = 0; t < dims.T; ++t) {
      const std::int64_t o0 = (b * dims.T + t) * dims.H * dims.D, o1 = o0 + dims.H * dims.D;
      const std::int64_t s0 = (b * dims.T + t) * dims.G * dims.sel_count, s1 = s0 + dims.G * dims.sel_count;
      const bool same_out = std::equal(a.out.begin() + o0, a.out.begin() + o1, c.out.begin() + o0);
      const bool same_sel = std::equal(a.saved.sel_blocks.begin() + s0, a.saved.sel_blocks.begin() + s1,
                                       c.saved.sel_blocks.begin() + s0);
      if (t <= t0) {
        EXPECT_TRUE(same_out && same_sel) << "b=" << b << " t=" << t;
      } else {
        EXPECT_FALSE(same_out) << "the perturbation did not reach t=" << t;
      }
    }
  }
}

}  // namespace
}  // namespace nsatron::nsa::test
