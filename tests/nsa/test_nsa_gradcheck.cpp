// Float64 central finite differences of sum(out * d_out) against the hand-written backward,
// for every element of every input and parameter, on several shapes (the awkward ones
// included). The choice of blocks is a constant of the backward pass, so an element whose
// +-eps perturbation changes the selection is skipped (counted; must stay rare).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tests/nsa/nsa_test_util.h"

namespace nsatron::nsa::test {
namespace {

struct GradcheckCase {
  const char* name;
  NsaDims dims;
};

void PrintTo(const GradcheckCase& c, std::ostream* os) { *os << c.name << " " << c.dims.str(); }

// The problems are tiny: one thread avoids OpenMP start-up costs on each of the thousands of
// forwards (results do not depend on the thread count; see test_nsa_core.cpp).
class nsa_gradcheck : public ::testing::TestWithParam<GradcheckCase> {
 protected:
  void SetUp() override {
    threads_ = omp_get_max_threads();
    omp_set_num_threads(1);
  }
  void TearDown() override { omp_set_num_threads(threads_); }
  int threads_ = 1;
};

TEST_P(nsa_gradcheck, EveryInputAndParameter) {
  const NsaDims dims = GetParam().dims;
  Problem<double> p = random_problem<double>(dims, 1234 + std::uint64_t(dims.T) * 7 + dims.H);
  const Result<double> base = run_both(p);
  const double eps = 1e-5;
  std::int64_t skipped = 0, checked = 0;
  for (int k = 0; k < 12; ++k) {
    const std::vector<double>& an = base.grad[k];
    double max_an = 0, max_err = 0;
    for (double v : an) max_an = std::max(max_an, std::abs(v));
    for (std::size_t e = 0; e < p.x[k].size(); ++e) {
      const double x0 = p.x[k][e];
      p.x[k][e] = x0 + eps;
      const Result<double> plus = run_forward(p);
      p.x[k][e] = x0 - eps;
      const Result<double> minus = run_forward(p);
      p.x[k][e] = x0;
      if (plus.saved.sel_blocks != base.saved.sel_blocks ||
          minus.saved.sel_blocks != base.saved.sel_blocks) {
        ++skipped;
        continue;
      }
      ++checked;
      const double fd = (loss(plus.out, p.d_out) - loss(minus.out, p.d_out)) / (2 * eps);
      max_err = std::max(max_err, std::abs(fd - an[e]));
    }
    // T < l: no compressed block exists. w = 1: a softmax over one key does not depend on it.
    const bool structurally_zero =
        (dims.num_cmp_blocks() == 0 && (k == 1 || k == 2 || k == 8 || k == 9 || k == 10 || k == 11)) ||
        (dims.window == 1 && k == 5);
    if (structurally_zero) {
      EXPECT_EQ(max_an, 0.0) << kNames[k] << " must be exactly zero for this shape";
      EXPECT_LT(max_err, 1e-8) << kNames[k];
    } else {
      // The test is only worth something if the gradient is not trivially zero.
      EXPECT_GT(max_an, 1e-3) << kNames[k] << " has a degenerate (near zero) gradient";
      std::printf("  %-7s max|fd - analytic| / max|analytic| = %.1e over %zu elements\n", kNames[k],
                  max_err / max_an, p.x[k].size());
      EXPECT_LT(max_err / max_an, 1e-6)
          << kNames[k] << ": max |fd - analytic| = " << max_err << ", max |analytic| = " << max_an;
    }
  }
  EXPECT_LE(skipped * 100, checked) << "too many selection flips under +-eps";
}

// B, T, H, G, D, l, d, l', n, w, theta
INSTANTIATE_TEST_SUITE_P(
    nsa_shapes, nsa_gradcheck,
    ::testing::Values(
        // d < l (overlapping compressed blocks), a real top-n choice, two groups of two heads
        GradcheckCase{"overlap", make_dims(2, 45, 4, 2, 4, 4, 2, 8, 4, 5, 100.0)},
        // l = d = l', one group of three heads, T not a multiple of the block
        GradcheckCase{"l_eq_d_eq_lsel", make_dims(1, 19, 3, 1, 4, 4, 4, 4, 4, 7, 50.0)},
        // T < l: no compressed block at all; one head per group
        GradcheckCase{"T_lt_l", make_dims(1, 5, 2, 2, 4, 8, 4, 8, 3, 2)},
        // w = 1, l = l', 8 heads per group
        GradcheckCase{"w1_8heads", make_dims(1, 17, 8, 1, 6, 4, 2, 4, 4, 1, 100.0)},
        // w > T, n > number of selection blocks
        GradcheckCase{"w_gt_T_n_gt_blocks", make_dims(1, 13, 2, 1, 4, 4, 4, 8, 5, 20)},
        // paper ratios scaled down (l=2d, l'=4d) with several selection rounds
        GradcheckCase{"paper_ratios", make_dims(1, 70, 2, 1, 4, 4, 2, 8, 5, 6, 100.0)}),
    [](const ::testing::TestParamInfo<GradcheckCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace nsatron::nsa::test
