// Rotary position embedding (RoPE), rotate-half convention, as NSA_SPEC.md fixes it.
//
// For i in [0, D/2): f_i = theta^(-2i/D), angle = p * f_i, and
//   y[i]       = x[i] cos - x[i+D/2] sin
//   y[i+D/2]   = x[i+D/2] cos + x[i] sin.
// The rotation is orthogonal, so its backward is the inverse (transposed) rotation:
//   dx[i]      =  dy[i] cos + dy[i+D/2] sin
//   dx[i+D/2]  = -dy[i] sin + dy[i+D/2] cos.
// Angles are computed in double and the table is stored in Real.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace nsatron::nsa::cpu {

template <class Real>
struct RopeTable {
  std::int64_t half = 0;   // D/2
  std::vector<Real> cos;   // [positions, D/2]
  std::vector<Real> sin;   // [positions, D/2]

  RopeTable(std::int64_t positions, std::int64_t head_dim, double theta) : half(head_dim / 2) {
    cos.resize(static_cast<std::size_t>(positions * half));
    sin.resize(static_cast<std::size_t>(positions * half));
    for (std::int64_t p = 0; p < positions; ++p)
      for (std::int64_t i = 0; i < half; ++i) {
        const double freq = std::pow(theta, -2.0 * double(i) / double(head_dim));
        const double angle = double(p) * freq;
        cos[static_cast<std::size_t>(p * half + i)] = Real(std::cos(angle));
        sin[static_cast<std::size_t>(p * half + i)] = Real(std::sin(angle));
      }
  }

  // y = RoPE(x, pos); x and y may alias.
  void rotate(const Real* x, Real* y, std::int64_t pos) const {
    const Real* c = cos.data() + pos * half;
    const Real* s = sin.data() + pos * half;
    for (std::int64_t i = 0; i < half; ++i) {
      const Real x0 = x[i], x1 = x[i + half];
      y[i] = x0 * c[i] - x1 * s[i];
      y[i + half] = x1 * c[i] + x0 * s[i];
    }
  }

  // dx = RoPE(., pos)^T dy (the backward of rotate); dy and dx may alias.
  void rotate_back(const Real* dy, Real* dx, std::int64_t pos) const {
    const Real* c = cos.data() + pos * half;
    const Real* s = sin.data() + pos * half;
    for (std::int64_t i = 0; i < half; ++i) {
      const Real d0 = dy[i], d1 = dy[i + half];
      dx[i] = d0 * c[i] + d1 * s[i];
      dx[i + half] = d1 * c[i] - d0 * s[i];
    }
  }
};

// Rotates every D-row of x [B, T, heads, D] at its token position into y (may alias x).
template <class Real>
void rotate_token_rows(const RopeTable<Real>& rope, std::int64_t B, std::int64_t T, std::int64_t heads,
                       std::int64_t D, const Real* x, Real* y) {
  const std::int64_t rows = B * T * heads;
#pragma omp parallel for schedule(static)
  for (std::int64_t row = 0; row < rows; ++row) rope.rotate(x + row * D, y + row * D, (row / heads) % T);
}

}  // namespace nsatron::nsa::cpu
