// Helpers for the op tests: random tensors, central finite differences in fp64, and a way
// to run something at a given OpenMP thread count (for the determinism checks).
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/box.h"
#include "core/tensor/tensor.h"

namespace nsatron::test {

// A fresh random base seed for a test binary's random inputs, printed, or the one the
// environment variable `var` holds (to reproduce a failing run).
inline std::uint64_t seed_from_env(const char* var, const char* what) {
  const char* env = std::getenv(var);
  const std::uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("%s: seed %llu (%s reproduces)\n", what, static_cast<unsigned long long>(s), var);
  return s;
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(std::uint64_t seed) : gen(seed) {}
  double normal(double sd = 1.0) { return std::normal_distribution<double>(0.0, sd)(gen); }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen);
  }
  std::vector<double> normals(std::int64_t n, double sd = 1.0) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = normal(sd);
    return v;
  }
  Tensor randn(const Shape& s, DType t = DType::F64, double sd = 1.0) {
    return Tensor::from_vector(normals(shape_numel(s), sd), s, t);
  }
};

// A tensor of `shape` filled with a value that must be overwritten (activation gradients
// are assigned, so stale contents must not leak through).
inline Tensor filled(const Shape& s, double value, DType t = DType::F64) {
  return Tensor::from_vector(std::vector<double>(std::size_t(shape_numel(s)), value), s, t);
}

// sum_i a_i * b_i in fp64.
inline double dot(const Tensor& a, const std::vector<double>& b) {
  std::vector<double> av = a.to_vector();
  EXPECT_EQ(av.size(), b.size());
  double s = 0;
  for (std::size_t i = 0; i < av.size(); ++i) s += av[i] * b[i];
  return s;
}

// Central finite differences of the scalar f with respect to every element of the fp64
// tensor x (perturbed in place and restored), compared with `analytic`.
// h = 1e-5 in fp64: truncation ~h^2 |f'''| ~ 1e-10, rounding ~1e-16 |f| / h ~ 1e-11 |f|;
// the bound 1e-7 * max(1, |g|) leaves room for both with |f| up to ~1e3.
inline void expect_fd_grad(const std::function<double()>& f, const Tensor& x,
                           const std::vector<double>& analytic, const std::string& what,
                           double h = 1e-5, double tol = 1e-7) {
  ASSERT_EQ(x.dtype(), DType::F64) << what;
  ASSERT_EQ(std::size_t(x.numel()), analytic.size()) << what;
  double* p = x.data<double>();
  int bad = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double keep = p[i];
    p[i] = keep + h;
    const double fp = f();
    p[i] = keep - h;
    const double fm = f();
    p[i] = keep;
    const double num = (fp - fm) / (2 * h);
    const double ana = analytic[std::size_t(i)];
    const double bound = tol * std::max(1.0, std::fabs(ana));
    if (!(std::fabs(num - ana) <= bound) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << ana << " vs finite difference "
                    << num << " (|diff| " << std::fabs(num - ana) << " > " << bound << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << x.numel() << " elements differ";
}

// Element-wise difference of two vectors.
inline std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

// |a - b| <= atol + rtol |b| element-wise, reporting the first few failures.
inline void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rtol,
                         double atol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= atol + rtol * std::fabs(b[i])) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

// Byte-identical tensors.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Runs f with `threads` OpenMP threads, restoring the previous setting.
template <class F> void with_threads(int threads, F&& f) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(threads);
  f();
  omp_set_num_threads(prev);
}

// A CPU [N, pitch] tensor of t's dtype holding the CPU [N, V] tensor t (V <= pitch) in its first
// V columns and `fill` in the pad columns [V, pitch).
inline Tensor padded_columns(const Tensor& t, std::int64_t pitch, double fill) {
  const std::int64_t N = t.dim(0), V = t.dim(1);
  const std::vector<double> v = t.to_vector();
  std::vector<double> out(std::size_t(N * pitch), fill);
  insert_box(out.data(), {N, pitch}, {0, 0}, {N, V}, v.data());
  return Tensor::from_vector(out, {N, pitch}, t.dtype());
}

// Columns [b, e) of a CPU [N, V] tensor, as a new [N, e - b] tensor of the same dtype.
inline Tensor columns(const Tensor& z, std::int64_t b, std::int64_t e) {
  const std::int64_t N = z.dim(0), V = z.dim(1);
  const std::vector<double> v = z.to_vector();
  std::vector<double> out(std::size_t(N * (e - b)));
  extract_box(v.data(), {N, V}, {0, b}, {N, e - b}, out.data());
  return Tensor::from_vector(out, {N, e - b}, z.dtype());
}

}  // namespace nsatron::test
