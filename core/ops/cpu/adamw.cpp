// CPU AdamW: elementwise over each segment, arithmetic in fp64.
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/ops/adamw.h"

namespace nsatron::cpu {

void check_segments(std::span<const ParamSegment> segments, std::int64_t n) {
  std::int64_t next = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const ParamSegment& s = segments[i];
    if (s.offset != next || s.numel < 0)
      throw std::invalid_argument("adamw: segment " + std::to_string(i) + " (offset " +
                                  std::to_string(s.offset) + ", numel " + std::to_string(s.numel) +
                                  ") does not start where the previous one ends (" +
                                  std::to_string(next) + ")");
    next += s.numel;
  }
  if (next != n)
    throw std::invalid_argument("adamw: the segments cover " + std::to_string(next) +
                                " elements but the buffer has " + std::to_string(n));
}

template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, std::int64_t n,
                std::span<const ParamSegment> segments, const AdamWHyper& hp, std::int64_t step,
                double grad_scale) {
  check_segments(segments, n);
  if (step < 1) throw std::invalid_argument("adamw: the step count starts at 1, got " +
                                            std::to_string(step));
  const double b1 = hp.beta1, b2 = hp.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, double(step)));
  const double step_size = hp.lr / bc1;
  const double decay_factor = 1.0 - hp.lr * hp.weight_decay;
#pragma omp parallel
  for (const ParamSegment& s : segments) {
    const double keep = s.decay ? decay_factor : 1.0;
    const std::int64_t end = s.offset + s.numel;
#pragma omp for schedule(static) nowait
    for (std::int64_t i = s.offset; i < end; ++i) {
      const double g = double(grad[i]) * grad_scale;
      const double mi = b1 * double(m[i]) + (1.0 - b1) * g;
      const double vi = b2 * double(v[i]) + (1.0 - b2) * g * g;
      m[i] = T(mi);
      v[i] = T(vi);
      const double denom = std::sqrt(double(v[i])) / bc2_sqrt + hp.eps;
      param[i] = T(double(param[i]) * keep - step_size * double(m[i]) / denom);
    }
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, std::int64_t,
                                std::span<const ParamSegment>, const AdamWHyper&, std::int64_t,
                                double);
template void adamw_step<double>(double*, const double*, double*, double*, std::int64_t,
                                 std::span<const ParamSegment>, const AdamWHyper&, std::int64_t,
                                 double);

}  // namespace nsatron::cpu
