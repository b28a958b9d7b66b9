// Small dense vector kernels used by the NSA CPU core.
//
// The reductions keep 8 independent partial sums (lane k sums the elements i with
// i % 8 == k) and add them in a fixed tree at the end: the compiler can map the lanes onto
// SIMD registers without -ffast-math, and the result is a fixed function of the inputs
// (no dependence on threads, alignment or vector width).
#pragma once
#include <cstdint>

namespace nsatron::nsa::cpu {

// sum_i a[i] * b[i]
template <class Real>
inline Real dot(const Real* __restrict a, const Real* __restrict b, std::int64_t n) {
  Real acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (int k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// y[i] += alpha * x[i]
template <class Real>
inline void axpy(Real alpha, const Real* __restrict x, Real* __restrict y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// y[i] = 0
template <class Real>
inline void zero(Real* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = Real(0);
}

}  // namespace nsatron::nsa::cpu
