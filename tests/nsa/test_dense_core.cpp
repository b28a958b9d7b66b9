// Dense causal attention on the CPU (nsa/dense.h): float64 central finite differences of
// sum(out * d_out) against the hand-written backward for every element of q, k and v at
// awkward shapes; agreement with the NSA core whose window covers the sequence and whose gates
// select the window branch alone; bit-identical results for any thread count; T = 1 (the output
// is the value); null gradient pointers; float against double; validation messages.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/util/error.h"
#include "nsa/dense.h"
#include "tests/nsa/nsa_test_util.h"

namespace nsatron::nsa::test {
namespace {

template <class Real>
struct DenseProblem {
  DenseDims dims;
  std::vector<Real> q, k, v, d_out;  // [B,T,H,D], [B,T,G,D] x2, [B,T,H,D]
};

template <class Real>
struct DenseResult {
  std::vector<Real> out, lse, dq, dk, dv;
};

template <class Real>
DenseProblem<Real> random_dense(const DenseDims& d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  DenseProblem<Real> p;
  p.dims = d;
  auto fill = [&](std::vector<Real>& x, std::int64_t n) {
    x.resize(static_cast<std::size_t>(n));
    for (auto& e : x) e = Real(normal(rng));
  };
  fill(p.q, d.B * d.T * d.H * d.D);
  fill(p.k, d.B * d.T * d.G * d.D);
  fill(p.v, d.B * d.T * d.G * d.D);
  fill(p.d_out, d.B * d.T * d.H * d.D);
  return p;
}

template <class Real>
DenseResult<Real> forward(const DenseProblem<Real>& p) {
  DenseResult<Real> r;
  r.out.resize(p.q.size());
  r.lse.resize(static_cast<std::size_t>(p.dims.B * p.dims.T * p.dims.H));
  dense_forward<Real>(p.dims, p.q.data(), p.k.data(), p.v.data(), r.out.data(), r.lse.data());
  return r;
}

template <class Real>
DenseResult<Real> forward_backward(const DenseProblem<Real>& p) {
  DenseResult<Real> r = forward(p);
  r.dq.assign(p.q.size(), Real(7));  // assigned, not accumulated: the 7s must go
  r.dk.assign(p.k.size(), Real(7));
  r.dv.assign(p.v.size(), Real(7));
  dense_backward<Real>(p.dims, p.q.data(), p.k.data(), p.v.data(), r.out.data(), r.lse.data(), p.d_out.data(),
                       r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

DenseDims dense(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t G, std::int64_t D,
                double theta = 10000.0) {
  return {B, T, H, G, D, theta};
}

struct DenseCase {
  const char* name;
  DenseDims dims;
};
void PrintTo(const DenseCase& c, std::ostream* os) { *os << c.name << " " << c.dims.str(); }

class dense_gradcheck : public ::testing::TestWithParam<DenseCase> {
 protected:
  void SetUp() override {
    threads_ = omp_get_max_threads();
    omp_set_num_threads(1);  // tiny problems, thousands of forwards
  }
  void TearDown() override { omp_set_num_threads(threads_); }
  int threads_ = 1;
};

TEST_P(dense_gradcheck, EveryElementOfQKV) {
  const DenseDims d = GetParam().dims;
  DenseProblem<double> p = random_dense<double>(d, 99 + std::uint64_t(d.T) * 13 + std::uint64_t(d.H));
  const DenseResult<double> base = forward_backward(p);
  const double eps = 1e-5;
  const char* names[3] = {"q", "k", "v"};
  std::vector<double>* inputs[3] = {&p.q, &p.k, &p.v};
  const std::vector<double>* grads[3] = {&base.dq, &base.dk, &base.dv};
  for (int which = 0; which < 3; ++which) {
    std::vector<double>& x = *inputs[which];
    const std::vector<double>& an = *grads[which];
    double max_an = 0, max_err = 0;
    for (double g : an) max_an = std::max(max_an, std::abs(g));
    for (std::size_t e = 0; e < x.size(); ++e) {
      const double x0 = x[e];
      x[e] = x0 + eps;
      const double lp = loss(forward(p).out, p.d_out);
      x[e] = x0 - eps;
      const double lm = loss(forward(p).out, p.d_out);
      x[e] = x0;
      max_err = std::max(max_err, std::abs((lp - lm) / (2 * eps) - an[e]));
    }
    if (d.T == 1 && which < 2) {  // a softmax over one key depends on neither q nor k
      EXPECT_EQ(max_an, 0.0) << names[which] << " must be exactly zero with T = 1";
      EXPECT_LT(max_err, 1e-8) << names[which];
      continue;
    }
    EXPECT_GT(max_an, 1e-3) << names[which] << " has a degenerate (near zero) gradient";
    std::printf("  d%s max|fd - analytic| / max|analytic| = %.1e over %zu elements\n", names[which], max_err / max_an,
                x.size());
    EXPECT_LT(max_err / max_an, 1e-6) << "d" << names[which] << ": max |fd - analytic| = " << max_err;
  }
}

INSTANTIATE_TEST_SUITE_P(
    dense_shapes, dense_gradcheck,
    ::testing::Values(DenseCase{"T1", dense(2, 1, 4, 2, 4)}, DenseCase{"T2_one_group", dense(1, 2, 2, 1, 4)},
                      DenseCase{"odd_T", dense(2, 13, 4, 2, 4, 100.0)},
                      DenseCase{"one_head_per_group", dense(1, 11, 3, 3, 6)},
                      DenseCase{"one_group_four_heads", dense(1, 9, 4, 1, 4, 50.0)},
                      DenseCase{"eight_heads_per_group", dense(1, 7, 8, 1, 2)},
                      DenseCase{"longer_than_a_key_tile", dense(1, 70, 2, 1, 4, 100.0)}),
    [](const ::testing::TestParamInfo<DenseCase>& info) { return std::string(info.param.name); });

// The NSA core with w = T and gate logits (-1000, -1000, +1000) is exactly its window branch
// (sigmoid gives 0, 0, 1 in double), which is dense attention over the same q, k_win, v_win.
TEST(dense_core, EqualsTheNsaWindowBranchWithWindowT) {
  for (const DenseDims& d : {dense(2, 45, 4, 2, 8), dense(1, 1, 3, 3, 4), dense(1, 130, 6, 1, 8, 500.0)}) {
    SCOPED_TRACE(d.str());
    const DenseProblem<double> dp = random_dense<double>(d, 7);
    NsaDims nd = d.as_window();
    nd.cmp_block = 8, nd.cmp_stride = 4, nd.sel_block = 16, nd.sel_count = 3;
    Problem<double> np = random_problem<double>(nd, 8);
    np.x[0] = dp.q;
    np.x[5] = dp.k;
    np.x[6] = dp.v;
    np.d_out = dp.d_out;
    for (std::size_t i = 0; i < np.x[7].size(); ++i) np.x[7][i] = i % 3 == 2 ? 1000.0 : -1000.0;
    const Result<double> nsa = run_both(np);
    const DenseResult<double> den = forward_backward(dp);
    auto close = [](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
      ASSERT_EQ(a.size(), b.size()) << what;
      double err = 0, ref = 0;
      for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i])), ref = std::max(ref, std::abs(b[i]));
      EXPECT_LE(err, 1e-13 * ref) << what;
    };
    close(den.out, nsa.out, "out");
    close(den.dq, nsa.grad[0], "dq");
    close(den.dk, nsa.grad[5], "dk");
    close(den.dv, nsa.grad[6], "dv");
  }
}

template <class Real>
void thread_invariance() {
  const DenseProblem<Real> p = random_dense<Real>(dense(2, 150, 6, 2, 8), 2025);
  const int saved = omp_get_max_threads();
  std::vector<DenseResult<Real>> r;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    r.push_back(forward_backward(p));
  }
  omp_set_num_threads(saved);
  for (int i : {1, 2}) {
    EXPECT_TRUE(r[0].out == r[std::size_t(i)].out && r[0].lse == r[std::size_t(i)].lse) << i + 1 << " threads";
    EXPECT_TRUE(r[0].dq == r[std::size_t(i)].dq && r[0].dk == r[std::size_t(i)].dk && r[0].dv == r[std::size_t(i)].dv)
        << i + 1 << " threads";
  }
}
TEST(dense_core, BitIdenticalForAnyThreadCountDouble) { thread_invariance<double>(); }
TEST(dense_core, BitIdenticalForAnyThreadCountFloat) { thread_invariance<float>(); }

// One token: the softmax has one key, so every head's output is its group's value, lse is
// the one scaled score, and dv sums the group's heads' d_out.
TEST(dense_core, OneTokenReturnsTheValue) {
  const DenseDims d = dense(2, 1, 4, 2, 6);
  const DenseProblem<double> p = random_dense<double>(d, 3);
  const DenseResult<double> r = forward_backward(p);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t a = 0; a < 4; ++a)
      for (std::int64_t e = 0; e < 6; ++e) {
        const std::size_t g_row = std::size_t((b * 2 + a / 2) * 6 + e), h_row = std::size_t((b * 4 + a) * 6 + e);
        EXPECT_EQ(r.out[h_row], p.v[g_row]);
        if (a % 2 == 0) {
          EXPECT_DOUBLE_EQ(r.dv[g_row], p.d_out[h_row] + p.d_out[h_row + 6]);
        }
      }
}

TEST(dense_core, NullGradientPointersAreSkipped) {
  const DenseProblem<double> p = random_dense<double>(dense(1, 20, 4, 2, 4), 5);
  const DenseResult<double> all = forward_backward(p);
  std::vector<double> dk(p.k.size()), dv(p.v.size());
  dense_backward<double>(p.dims, p.q.data(), p.k.data(), p.v.data(), all.out.data(), all.lse.data(), p.d_out.data(),
                         nullptr, dk.data(), nullptr);
  EXPECT_TRUE(dk == all.dk);
  dense_backward<double>(p.dims, p.q.data(), p.k.data(), p.v.data(), all.out.data(), all.lse.data(), p.d_out.data(),
                         nullptr, nullptr, dv.data());
  EXPECT_TRUE(dv == all.dv);
  std::vector<double> out(p.q.size());  // the forward without lse gives the same output
  dense_forward<double>(p.dims, p.q.data(), p.k.data(), p.v.data(), out.data(), nullptr);
  EXPECT_TRUE(out == all.out);
}

TEST(dense_core, FloatAgreesWithDouble) {
  const DenseProblem<double> p = random_dense<double>(dense(2, 64, 4, 2, 8), 11);
  DenseProblem<float> pf;
  pf.dims = p.dims;
  pf.q.assign(p.q.begin(), p.q.end());
  pf.k.assign(p.k.begin(), p.k.end());
  pf.v.assign(p.v.begin(), p.v.end());
  pf.d_out.assign(p.d_out.begin(), p.d_out.end());
  const DenseResult<double> rd = forward_backward(p);
  const DenseResult<float> rf = forward_backward(pf);
  auto rel = [](const std::vector<float>& a, const std::vector<double>& b) {
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < b.size(); ++i) err = std::max(err, std::abs(double(a[i]) - b[i])), ref = std::max(ref, std::abs(b[i]));
    return err / ref;
  };
  EXPECT_LT(rel(rf.out, rd.out), 1e-5);
  EXPECT_LT(rel(rf.dq, rd.dq), 1e-5);
  EXPECT_LT(rel(rf.dk, rd.dk), 1e-5);
  EXPECT_LT(rel(rf.dv, rd.dv), 1e-5);
}

TEST(dense_core, ValidationNamesTheKey) {
  auto message = [](const DenseDims& d) {
    try {
      d.validate();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message(dense(1, 4, 4, 3, 4)).find("model.n_kv_heads"), std::string::npos);
  EXPECT_NE(message(dense(1, 4, 4, 2, 5)).find("model.head_dim"), std::string::npos);
  EXPECT_NE(message(dense(1, 0, 4, 2, 4)).find("sequence length"), std::string::npos);
  EXPECT_NE(message(dense(1, 4, 4, 2, 4, -1.0)).find("model.rope_theta"), std::string::npos);
  EXPECT_EQ(message(dense(1, 4, 4, 2, 4)), "(accepted)");
}

}  // namespace
}  // namespace nsatron::nsa::test
