// NSA compression branch: compressed keys/values and their backward (see compression.h).
#include "nsa/cpu/compression.h"

#include <algorithm>
#include <vector>

#include "nsa/cpu/vec.h"

namespace nsatron::nsa::cpu {

template <class Real>
void compress_forward(const NsaDims& dims, const Real* x, const Real* w, const Real* p,
                      const RopeTable<Real>* rope, Real* y) {
  const std::int64_t B = dims.B, G = dims.G, D = dims.D;
  const std::int64_t l = dims.cmp_block, d = dims.cmp_stride, N = dims.num_cmp_blocks();
  const std::int64_t items = B * N * G;
#pragma omp parallel for schedule(static)
  for (std::int64_t item = 0; item < items; ++item) {
    const std::int64_t g = item % G, i = (item / G) % N, b = item / (G * N);
    Real* yi = y + item * D;  // [B, N, G, D] row (b, i, g)
    zero(yi, D);
    for (std::int64_t r = 0; r < l; ++r) {
      const Real* xr = x + ((b * dims.T + i * d + r) * G + g) * D;
      const Real* pr = p + (g * l + r) * D;
      const Real* wr = w + (g * l * D + r * D) * D;  // rows r*D .. r*D+D-1 of W[g]
      for (std::int64_t c = 0; c < D; ++c) axpy(xr[c] + pr[c], wr + c * D, yi, D);
    }
    if (rope) rope->rotate(yi, yi, i * d + l - 1);
  }
}

template <class Real>
void compress_backward(const NsaDims& dims, const Real* x, const Real* w, const Real* p,
                       const Real* dy, Real* dx, Real* dw, Real* dp) {
  const std::int64_t B = dims.B, T = dims.T, G = dims.G, D = dims.D;
  const std::int64_t l = dims.cmp_block, d = dims.cmp_stride, N = dims.num_cmp_blocks();

  // dx: each token row (b, s, g) collects from the blocks that contain s.
  if (dx) {
    const std::int64_t rows = B * T * G;
#pragma omp parallel for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t g = row % G, s = (row / G) % T, b = row / (G * T);
      Real* out = dx + row * D;
      zero(out, D);
      // i*d <= s <= i*d + l - 1  and  0 <= i < N
      const std::int64_t i_lo = std::max<std::int64_t>(0, (s - l + d) / d);  // ceil((s-l+1)/d)
      const std::int64_t i_hi = std::min<std::int64_t>(N - 1, s / d);
      for (std::int64_t i = i_lo; i <= i_hi; ++i) {
        const std::int64_t r = s - i * d;
        const Real* dyi = dy + ((b * N + i) * G + g) * D;
        const Real* wr = w + (g * l * D + r * D) * D;
        for (std::int64_t c = 0; c < D; ++c) out[c] += dot(wr + c * D, dyi, D);
      }
    }
  }
  if (N == 0) return;

  // dp: W[g] rows times the sum of dY over (b, i).
  if (dp) {
    std::vector<Real> dy_sum(static_cast<std::size_t>(G * D), Real(0));
    for (std::int64_t g = 0; g < G; ++g)
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < N; ++i)
          axpy(Real(1), dy + ((b * N + i) * G + g) * D, dy_sum.data() + g * D, D);
    const std::int64_t rows = G * l * D;
#pragma omp parallel for schedule(static)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t g = row / (l * D);
      dp[row] += dot(w + row * D, dy_sum.data() + g * D, D);
    }
  }

  // dW: row (g, r, c) sums X_{b,i}[r, c] * dY_{b,i} over (b, i).
  if (dw) {
    const std::int64_t rows = G * l * D;
#pragma omp parallel
    {
      std::vector<Real> acc(static_cast<std::size_t>(D));
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::int64_t c = row % D, r = (row / D) % l, g = row / (l * D);
        zero(acc.data(), D);
        const Real prc = p[(g * l + r) * D + c];
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t i = 0; i < N; ++i) {
            const Real xv = x[((b * T + i * d + r) * G + g) * D + c] + prc;
            axpy(xv, dy + ((b * N + i) * G + g) * D, acc.data(), D);
          }
        axpy(Real(1), acc.data(), dw + row * D, D);
      }
    }
  }
}

#define NSA_INSTANTIATE(Real)                                                                \
  template void compress_forward<Real>(const NsaDims&, const Real*, const Real*, const Real*, \
                                       const RopeTable<Real>*, Real*);                        \
  template void compress_backward<Real>(const NsaDims&, const Real*, const Real*, const Real*, \
                                        const Real*, Real*, Real*, Real*);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsatron::nsa::cpu
