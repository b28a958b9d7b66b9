// Helpers for the NSA core tests: owned random inputs, one forward+backward, the loss.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "nsa/nsa.h"
#include "tests/ops/op_test_util.h"

namespace nsatron::nsa::test {

using nsatron::test::seed_from_env;  // tests/ops/op_test_util.h

inline const std::array<const char*, 12> kNames = {"q",     "k_cmp",  "v_cmp",  "k_slc",
                                                   "v_slc", "k_win",  "v_win",  "gate",
                                                   "cmp_wk", "cmp_wv", "cmp_pk", "cmp_pv"};
inline bool is_param(int k) { return k >= 8; }

inline std::vector<std::int64_t> input_shape(const NsaDims& d, int k) {
  switch (k) {
    case 0: return {d.B, d.T, d.H, d.D};
    case 7: return {d.B, d.T, d.H, 3};
    case 8:
    case 9: return {d.G, d.cmp_block * d.D, d.D};
    case 10:
    case 11: return {d.G, d.cmp_block, d.D};
    default: return {d.B, d.T, d.G, d.D};
  }
}
inline std::int64_t numel(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}

// Twelve inputs and d_out, owned.
template <class Real>
struct Problem {
  NsaDims dims;
  std::array<std::vector<Real>, 12> x;
  std::vector<Real> d_out;

  NsaInputs<Real> inputs() const {
    return {x[0].data(), x[1].data(), x[2].data(), x[3].data(),  x[4].data(),  x[5].data(),
            x[6].data(), x[7].data(), x[8].data(), x[9].data(), x[10].data(), x[11].data()};
  }
  std::int64_t out_numel() const { return dims.B * dims.T * dims.H * dims.D; }

  template <class Other>
  Problem<Other> cast() const {
    Problem<Other> p;
    p.dims = dims;
    for (int k = 0; k < 12; ++k) p.x[k].assign(x[k].begin(), x[k].end());
    p.d_out.assign(d_out.begin(), d_out.end());
    return p;
  }
};

// Random inputs with O(1) attention scores: normal entries, the compression maps scaled by
// 1/sqrt(l*D) so compressed keys stay O(1).
template <class Real>
Problem<Real> random_problem(const NsaDims& dims, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Problem<Real> p;
  p.dims = dims;
  for (int k = 0; k < 12; ++k) {
    const double sd = (k == 8 || k == 9) ? 1.0 / std::sqrt(double(dims.cmp_block * dims.D)) : 1.0;
    p.x[k].resize(static_cast<std::size_t>(numel(input_shape(dims, k))));
    for (auto& v : p.x[k]) v = Real(sd * normal(rng));
  }
  p.d_out.resize(static_cast<std::size_t>(p.out_numel()));
  for (auto& v : p.d_out) v = Real(normal(rng));
  return p;
}

// Forward (+ backward) results, owned.
template <class Real>
struct Result {
  std::vector<Real> out;
  NsaSaved<Real> saved;
  std::array<std::vector<Real>, 12> grad;
};

template <class Real>
Result<Real> run_forward(const Problem<Real>& p) {
  Result<Real> r;
  r.out.resize(static_cast<std::size_t>(p.out_numel()));
  nsa_forward(p.dims, p.inputs(), r.out.data(), &r.saved);
  return r;
}

template <class Real>
NsaGrads<Real> grads_of(std::array<std::vector<Real>, 12>& g) {
  return {g[0].data(), g[1].data(), g[2].data(), g[3].data(),  g[4].data(),  g[5].data(),
          g[6].data(), g[7].data(), g[8].data(), g[9].data(), g[10].data(), g[11].data()};
}

// Forward and backward; parameter gradient buffers start at zero.
template <class Real>
Result<Real> run_both(const Problem<Real>& p) {
  Result<Real> r = run_forward(p);
  for (int k = 0; k < 12; ++k) r.grad[k].assign(p.x[k].size(), Real(0));
  nsa_backward(p.dims, p.inputs(), r.saved, p.d_out.data(), grads_of(r.grad));
  return r;
}

// sum(out * d_out), accumulated in double.
template <class Real>
double loss(const std::vector<Real>& out, const std::vector<Real>& d_out) {
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i) s += double(out[i]) * double(d_out[i]);
  return s;
}

inline NsaDims make_dims(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t G,
                         std::int64_t D, std::int64_t l, std::int64_t d, std::int64_t ls,
                         std::int64_t n, std::int64_t w, double theta = 10000.0) {
  NsaDims dims;
  dims.B = B;
  dims.T = T;
  dims.H = H;
  dims.G = G;
  dims.D = D;
  dims.cmp_block = l;
  dims.cmp_stride = d;
  dims.sel_block = ls;
  dims.sel_count = n;
  dims.window = w;
  dims.rope_theta = theta;
  return dims;
}

}  // namespace nsatron::nsa::test
