// CPU linear: matrix products by cpu::gemm (OpenBLAS), the bias by the loops below.
#include <algorithm>

#include "core/ops/linear.h"
#include "core/ops/matmul.h"

namespace nsatron::cpu {

namespace {
constexpr std::int64_t kColBlock = 64;
}

template <class T> void add_bias(T* y, const T* b, std::int64_t N, std::int64_t out) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    T* yr = y + n * out;
    for (std::int64_t o = 0; o < out; ++o) yr[o] = yr[o] + b[o];
  }
}

template <class T> void bias_backward(T* db, const T* dy, std::int64_t N, std::int64_t out) {
  const std::int64_t nblocks = (out + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (std::int64_t blk = 0; blk < nblocks; ++blk) {
    const std::int64_t o0 = blk * kColBlock, o1 = std::min(out, o0 + kColBlock);
    double acc[kColBlock] = {};
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t o = o0; o < o1; ++o) acc[o - o0] += double(dy[n * out + o]);
    for (std::int64_t o = o0; o < o1; ++o) db[o] = T(double(db[o]) + acc[o - o0]);
  }
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::int64_t N, std::int64_t in,
                    std::int64_t out) {
  if (N == 0 || out == 0) return;
  if (in == 0)
    std::fill(y, y + N * out, T(0));
  else
    gemm<T>(false, true, N, out, in, 1.0, x, in, w, in, 0.0, y, out);
  if (b) add_bias<T>(y, b, N, out);
}

template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::int64_t N,
                     std::int64_t in, std::int64_t out, bool accumulate_dx) {
  if (N == 0) return;
  if (dx && in > 0) {
    if (out == 0) {
      if (!accumulate_dx) std::fill(dx, dx + N * in, T(0));
    } else {
      gemm<T>(false, false, N, in, out, 1.0, dy, out, w, in, accumulate_dx ? 1.0 : 0.0, dx, in);
    }
  }
  if (dw && out > 0 && in > 0) gemm<T>(true, false, out, in, N, 1.0, dy, out, x, in, 1.0, dw, in);
  if (db) bias_backward<T>(db, dy, N, out);
}

#define NSATRON_INSTANTIATE(T)                                                               \
  template void add_bias<T>(T*, const T*, std::int64_t, std::int64_t);                      \
  template void bias_backward<T>(T*, const T*, std::int64_t, std::int64_t);                 \
  template void linear_forward<T>(T*, const T*, const T*, const T*, std::int64_t,           \
                                  std::int64_t, std::int64_t);                              \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t,  \
                                   std::int64_t, std::int64_t, bool);
NSATRON_INSTANTIATE(float)
NSATRON_INSTANTIATE(double)
#undef NSATRON_INSTANTIATE

}  // namespace nsatron::cpu
