// CPU elementwise helpers.
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

template void add<float>(float*, const float*, const float*, std::int64_t);
template void add<double>(double*, const double*, const double*, std::int64_t);
template void add_<float>(float*, const float*, std::int64_t);
template void add_<double>(double*, const double*, std::int64_t);

}  // namespace nsatron::cpu
