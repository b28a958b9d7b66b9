// CPU elementwise helpers.
#include <cstring>

#include "core/ops/elementwise.h"

namespace nsatron::cpu {

template <class T> void add(T* out, const T* a, const T* b, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T> void add_(T* acc, const T* x, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
}

void zero_rows(void* x, std::size_t row_bytes, std::int64_t N, const std::uint8_t* keep) {
  char* p = static_cast<char*>(x);
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n)
    if (!keep[n]) std::memset(p + std::size_t(n) * row_bytes, 0, row_bytes);
}

template void add<float>(float*, const float*, const float*, std::int64_t);
template void add<double>(double*, const double*, const double*, std::int64_t);
template void add_<float>(float*, const float*, std::int64_t);
template void add_<double>(double*, const double*, std::int64_t);

}  // namespace nsatron::cpu
