// Properties of the NSA CPU core beyond the gradient check: bit-identical results for any
// thread count, the accumulate/assign gradient convention, float against double, degenerate
// branches that reduce to known values, the saved-state size, and the config validation.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "core/util/error.h"
#include "tests/nsa/nsa_test_util.h"

namespace nsatron::nsa::test {
namespace {

template <class Real>
void expect_bitwise_equal(const Result<Real>& a, const Result<Real>& b, const std::string& what) {
  EXPECT_TRUE(a.out == b.out) << what << ": out differs";
  EXPECT_TRUE(a.saved.sel_blocks == b.saved.sel_blocks) << what << ": sel_blocks differ";
  for (int k = 0; k < 12; ++k) EXPECT_TRUE(a.grad[k] == b.grad[k]) << what << ": grad " << kNames[k];
}

template <class Real>
void thread_invariance() {
  const NsaDims dims = make_dims(2, 300, 6, 2, 8, 8, 4, 16, 5, 40);
  const Problem<Real> p = random_problem<Real>(dims, 2024);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Result<Real> one = run_both(p);
  omp_set_num_threads(2);
  const Result<Real> two = run_both(p);
  omp_set_num_threads(3);
  const Result<Real> three = run_both(p);
  omp_set_num_threads(saved_threads);
  expect_bitwise_equal(one, two, "1 vs 2 threads");
  expect_bitwise_equal(one, three, "1 vs 3 threads");
}
TEST(nsa_core, BitIdenticalForAnyThreadCountDouble) { thread_invariance<double>(); }
TEST(nsa_core, BitIdenticalForAnyThreadCountFloat) { thread_invariance<float>(); }

TEST(nsa_core, ParameterGradsAccumulateActivationGradsAssign) {
  const NsaDims dims = make_dims(1, 70, 4, 2, 8, 8, 4, 16, 4, 10);
  const Problem<double> p = random_problem<double>(dims, 3);
  const Result<double> once = run_both(p);
  std::array<std::vector<double>, 12> g;
  for (int k = 0; k < 12; ++k)
    g[k].assign(p.x[k].size(), is_param(k) ? 0.0 : std::numeric_limits<double>::quiet_NaN());
  nsa_backward(p.dims, p.inputs(), once.saved, p.d_out.data(), grads_of(g));
  nsa_backward(p.dims, p.inputs(), once.saved, p.d_out.data(), grads_of(g));
  for (int k = 0; k < 12; ++k)
    for (std::size_t e = 0; e < g[k].size(); ++e) {
      const double want = is_param(k) ? 2.0 * once.grad[k][e] : once.grad[k][e];
      ASSERT_EQ(g[k][e], want) << kNames[k] << "[" << e << "]";
    }
}

TEST(nsa_core, NullGradientPointersAreSkipped) {
  const NsaDims dims = make_dims(1, 50, 4, 2, 8, 8, 4, 16, 4, 10);
  const Problem<double> p = random_problem<double>(dims, 4);
  const Result<double> full = run_both(p);
  for (int keep = 0; keep < 12; ++keep) {
    std::vector<double> only(p.x[keep].size(), 0.0);
    NsaGrads<double> gr;
    double** slots[12] = {&gr.q,     &gr.k_cmp,  &gr.v_cmp,  &gr.k_slc,  &gr.v_slc,  &gr.k_win,
                          &gr.v_win, &gr.gate,   &gr.cmp_wk, &gr.cmp_wv, &gr.cmp_pk, &gr.cmp_pv};
    *slots[keep] = only.data();
    nsa_backward(p.dims, p.inputs(), full.saved, p.d_out.data(), gr);
    EXPECT_TRUE(only == full.grad[keep]) << kNames[keep];
  }
}

TEST(nsa_core, ForwardWithoutSavedStateGivesTheSameOutput) {
  const NsaDims dims = make_dims(2, 77, 4, 1, 8, 8, 4, 16, 4, 10);
  const Problem<double> p = random_problem<double>(dims, 5);
  const Result<double> r = run_forward(p);
  std::vector<double> out(r.out.size());
  nsa_forward<double>(p.dims, p.inputs(), out.data(), nullptr);
  EXPECT_TRUE(out == r.out);
}

TEST(nsa_core, FloatAgreesWithDouble) {
  const NsaDims dims = make_dims(1, 200, 4, 2, 16, 8, 4, 16, 5, 24);
  const Problem<double> pd = random_problem<double>(dims, 6);
  const Result<double> rd = run_both(pd);
  const Result<float> rf = run_both(pd.cast<float>());
  ASSERT_TRUE(rd.saved.sel_blocks == rf.saved.sel_blocks);
  auto rel = [](const auto& a, const auto& b) {
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      err = std::max(err, std::abs(double(a[i]) - double(b[i])));
      ref = std::max(ref, std::abs(double(b[i])));
    }
    return err / ref;
  };
  EXPECT_LT(rel(rf.out, rd.out), 1e-5);
  for (int k = 0; k < 12; ++k) EXPECT_LT(rel(rf.grad[k], rd.grad[k]), 1e-4) << kNames[k];
}

// w = 1: the window branch attends to its own token only, so o_win = v_win[t] exactly.
TEST(nsa_core, WindowOfOneReturnsTheOwnValue) {
  const NsaDims dims = make_dims(1, 30, 4, 2, 8, 4, 2, 8, 3, 1);
  const Problem<double> p = random_problem<double>(dims, 8);
  const Result<double> r = run_forward(p);
  const std::int64_t BTH = dims.B * dims.T * dims.H, h = dims.heads_per_group();
  for (std::int64_t t = 0; t < dims.T; ++t)
    for (std::int64_t a = 0; a < dims.H; ++a)
      for (std::int64_t e = 0; e < dims.D; ++e)
        ASSERT_EQ(r.saved.o_branch[static_cast<std::size_t>(2 * BTH * dims.D + (t * dims.H + a) * dims.D + e)],
                  p.x[6][static_cast<std::size_t>((t * dims.G + a / h) * dims.D + e)]);
}

// With the same keys/values in both branches, n covering every block and w >= T, the
// selected and window branches are both full causal attention and must agree.
TEST(nsa_core, SelectionOfEveryBlockEqualsFullWindow) {
  const NsaDims dims = make_dims(2, 45, 4, 2, 8, 4, 2, 8, 6, 64);
  Problem<double> p = random_problem<double>(dims, 9);
  p.x[3] = p.x[5];
  p.x[4] = p.x[6];
  const Result<double> r = run_forward(p);
  const std::size_t n = static_cast<std::size_t>(dims.B * dims.T * dims.H * dims.D);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_NEAR(r.saved.o_branch[n + i], r.saved.o_branch[2 * n + i], 1e-13);
}

// T < l: no compressed block; o_cmp = 0, lse = -inf, and no gradient reaches the compression.
TEST(nsa_core, ShorterThanACompressedBlock) {
  const NsaDims dims = make_dims(2, 7, 4, 2, 8, 8, 4, 16, 3, 4);
  const Problem<double> p = random_problem<double>(dims, 10);
  const Result<double> r = run_both(p);
  const std::size_t n = static_cast<std::size_t>(dims.B * dims.T * dims.H * dims.D);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(r.saved.o_branch[i], 0.0);
  for (std::size_t i = 0; i < static_cast<std::size_t>(dims.B * dims.T * dims.H); ++i)
    ASSERT_EQ(r.saved.lse[i], -std::numeric_limits<double>::infinity());
  for (int k : {1, 2, 8, 9, 10, 11})
    for (double v : r.grad[k]) ASSERT_EQ(v, 0.0) << kNames[k];
}

TEST(nsa_core, SavedStateSize) {
  const NsaDims dims = make_dims(2, 100, 6, 2, 8, 8, 4, 16, 5, 40);
  const Result<float> r = run_forward(random_problem<float>(dims, 1));
  EXPECT_EQ(r.saved.bytes(), NsaSaved<float>::bytes_for(dims));
  const std::int64_t N = (100 - 8) / 4 + 1;
  EXPECT_EQ(r.saved.bytes(), std::size_t(4 * (2 * 2 * N * 2 * 8 + 3 * 2 * 100 * 6 * 8 +
                                             3 * 2 * 100 * 6) + 4 * 2 * 100 * 2 * 5));
}

TEST(nsa_core, ValidationNamesTheKey) {
  auto message = [](NsaDims d) -> std::string {
    try {
      d.validate();
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  const NsaDims ok = make_dims(1, 10, 4, 2, 8, 32, 16, 64, 16, 512);
  EXPECT_EQ(message(ok), "");
  NsaDims d = ok;
  d.cmp_stride = 12;
  EXPECT_NE(message(d).find("nsa.cmp_stride must divide nsa.cmp_block"), std::string::npos);
  d = ok;
  d.sel_block = 72;
  EXPECT_NE(message(d).find("nsa.cmp_stride must divide nsa.sel_block"), std::string::npos);
  d = ok;
  d.sel_block = 16;
  EXPECT_NE(message(d).find("nsa.cmp_block must be <= nsa.sel_block"), std::string::npos);
  d = ok;
  d.sel_count = 2;
  EXPECT_NE(message(d).find("nsa.sel_count"), std::string::npos);
  d = ok;
  d.window = 0;
  EXPECT_NE(message(d).find("nsa.window"), std::string::npos);
  d = ok;
  d.H = 3;
  EXPECT_NE(message(d).find("model.n_heads"), std::string::npos);
  d = ok;
  d.D = 7;
  EXPECT_NE(message(d).find("model.head_dim"), std::string::npos);
  d = ok;
  d.rope_theta = 0;
  EXPECT_NE(message(d).find("model.rope_theta"), std::string::npos);
}

}  // namespace
}  // namespace nsatron::nsa::test
