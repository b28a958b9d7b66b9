// CPU SwiGLU: elementwise, rows in parallel, math in fp64.
#include <cmath>

#include "core/ops/swiglu.h"

namespace nsatron::cpu {

namespace {
// 1 / (1 + e^-a), without overflow for large |a|.
inline double sigmoid(double a) {
  if (a >= 0) return 1.0 / (1.0 + std::exp(-a));
  const double e = std::exp(a);
  return e / (1.0 + e);
}
}  // namespace

template <class T>
void swiglu_forward(T* out, const T* a, const T* b, std::int64_t N, std::int64_t F,
                    std::int64_t ld_in, std::int64_t ld_out) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* ar = a + n * ld_in;
    const T* br = b + n * ld_in;
    T* o = out + n * ld_out;
    for (std::int64_t f = 0; f < F; ++f) {
      const double x = double(ar[f]);
      o[f] = T(x * sigmoid(x) * double(br[f]));
    }
  }
}

template <class T>
void swiglu_backward(T* da, T* db, const T* dout, const T* a, const T* b, std::int64_t N,
                     std::int64_t F, std::int64_t ld_in, std::int64_t ld_out) {
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* ar = a + n * ld_in;
    const T* br = b + n * ld_in;
    const T* go = dout + n * ld_out;
    T* dar = da + n * ld_in;
    T* dbr = db + n * ld_in;
    for (std::int64_t f = 0; f < F; ++f) {
      const double x = double(ar[f]), y = double(br[f]), g = double(go[f]);
      const double s = sigmoid(x);
      // Both inputs are read before either output is written (da may be a, db may be b).
      dar[f] = T(g * y * s * (1.0 + x * (1.0 - s)));
      dbr[f] = T(g * x * s);
    }
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, std::int64_t,
                                    std::int64_t, std::int64_t, std::int64_t);
template void swiglu_forward<double>(double*, const double*, const double*, std::int64_t,
                                     std::int64_t, std::int64_t, std::int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*,
                                     std::int64_t, std::int64_t, std::int64_t, std::int64_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*,
                                      const double*, std::int64_t, std::int64_t, std::int64_t,
                                      std::int64_t);

}  // namespace nsatron::cpu
