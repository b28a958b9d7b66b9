// CPU sum of squares (fixed chunks, ordered partial sums) and in-place scaling.
#include <algorithm>
#include <vector>

#include "core/ops/grad_norm.h"

namespace nsatron::cpu {

template <class T> double sum_squares(const T* x, std::int64_t n) {
  const std::int64_t nchunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(std::size_t(nchunks), 0.0);
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < nchunks; ++k) {
    const std::int64_t b = k * kNormChunk, e = std::min(n, b + kNormChunk);
    double s = 0.0;
    for (std::int64_t i = b; i < e; ++i) s += double(x[i]) * double(x[i]);
    partial[std::size_t(k)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

template <class T> void scale(T* x, std::int64_t n, double factor) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) x[i] = T(double(x[i]) * factor);
}

template double sum_squares<float>(const float*, std::int64_t);
template double sum_squares<double>(const double*, std::int64_t);
template void scale<float>(float*, std::int64_t, double);
template void scale<double>(double*, std::int64_t, double);

}  // namespace nsatron::cpu
