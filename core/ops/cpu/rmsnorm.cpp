// CPU RMSNorm: rows in parallel, reductions in fp64; dw reduced per column block so that its
// bits do not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/rmsnorm.h"

namespace nsatron::cpu {

namespace {
constexpr std::int64_t kColBlock = 64;

template <class T>
inline void normalize_row(T* y, T* rstd, const T* x, const T* w, std::int64_t C, double eps) {
  double ss = 0.0;
  for (std::int64_t c = 0; c < C; ++c) ss += double(x[c]) * double(x[c]);
  const double r = 1.0 / std::sqrt(ss / double(C) + eps);
  *rstd = T(r);
  // The saved rstd is what the backward uses: normalise with the same (rounded) value.
  const double rs = double(*rstd);
  for (std::int64_t c = 0; c < C; ++c) y[c] = T(double(x[c]) * rs * double(w[c]));
}
}  // namespace

template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, std::int64_t N, std::int64_t C,
                     double eps) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) normalize_row(y + n * C, rstd + n, x + n * C, w, C, eps);
}

template <class T>
void add_rmsnorm_forward(T* h, T* y, T* rstd, const T* a, const T* b, const T* w, std::int64_t N,
                         std::int64_t C, double eps) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    T* hr = h + n * C;
    const T* ar = a + n * C;
    const T* br = b + n * C;
    for (std::int64_t c = 0; c < C; ++c) hr[c] = ar[c] + br[c];
    normalize_row(y + n * C, rstd + n, hr, w, C, eps);
  }
}

template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                      const T* dres, std::int64_t N, std::int64_t C) {
  // dw first: dx may overwrite dy.
  const std::int64_t nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (std::int64_t blk = 0; blk < nblocks; ++blk) {
    const std::int64_t c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    double acc[kColBlock] = {};
    for (std::int64_t n = 0; n < N; ++n) {
      const double r = double(rstd[n]);
      const T* dyr = dy + n * C;
      const T* xr = x + n * C;
      for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += double(dyr[c]) * double(xr[c]) * r;
    }
    for (std::int64_t c = c0; c < c1; ++c) dw[c] = T(double(dw[c]) + acc[c - c0]);
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* dyr = dy + n * C;
    const T* xr = x + n * C;
    T* dxr = dx + n * C;
    const double r = double(rstd[n]);
    double dot = 0.0;  // sum_j g_j xhat_j
    for (std::int64_t c = 0; c < C; ++c) dot += double(w[c]) * double(dyr[c]) * double(xr[c]) * r;
    const double mean = dot / double(C);
    for (std::int64_t c = 0; c < C; ++c) {
      const double g = double(w[c]) * double(dyr[c]);
      double v = r * (g - double(xr[c]) * r * mean);
      if (dres) v += double(dres[n * C + c]);
      dxr[c] = T(v);
    }
  }
}

#define NSATRON_INSTANTIATE(T)                                                                  \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, std::int64_t, std::int64_t,     \
                                   double);                                                    \
  template void add_rmsnorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t, \
                                       std::int64_t, double);                                  \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*,  \
                                    std::int64_t, std::int64_t);
NSATRON_INSTANTIATE(float)
NSATRON_INSTANTIATE(double)
#undef NSATRON_INSTANTIATE

}  // namespace nsatron::cpu
