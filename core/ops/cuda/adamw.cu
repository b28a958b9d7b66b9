// CUDA AdamW (see adamw.h): one fused elementwise kernel over the flat fp32 master buffer and
// its fp32 moments, optionally writing the compute copy of the updated weights (bf16 or fp32)
// in the same pass and taking the clipping factor from a norm in device memory. Arithmetic in
// fp64, m and v rounded to fp32 before the update uses them, exactly as the CPU loop.
// Segments with equal decay flags are merged into runs; each launch carries up to kMaxRuns
// run ends in its parameters (a model of a few hundred tensors needs one or two launches).
#include <cmath>
#include <vector>

#include "core/ops/adamw.h"
#include "core/ops/cuda/common.cuh"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

constexpr int kMaxRuns = 240;

struct Runs {
  std::int64_t begin;            // first element of the first run
  std::int64_t end[kMaxRuns];    // run r covers [end[r-1] (or begin), end[r])
  unsigned char decay[kMaxRuns];
  int count;
};

struct Step {
  double b1, b2, one_minus_b1, one_minus_b2, bc2_sqrt, step_size, decay_factor, eps, grad_scale;
  double max_norm;
};

template <class CT>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ grad,
                             float* __restrict__ m, float* __restrict__ v, CT* __restrict__ copy,
                             const __grid_constant__ Runs runs, const Step s,
                             const void* norm, bool norm_is_f64) {
  double scale = s.grad_scale;
  if (norm) {
    const double nv = norm_is_f64 ? *static_cast<const double*>(norm)
                                  : double(*static_cast<const float*>(norm));
    if (!isfinite(nv)) return;  // non-finite gradient norm: the step is skipped
    const double c = s.max_norm / (nv + 1e-6);
    if (c < 1.0) scale *= c;
  }
  const std::int64_t end = runs.end[runs.count - 1];
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = runs.begin + std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += stride) {
    int lo = 0, hi = runs.count - 1;  // first run whose end is > i
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (runs.end[mid] > i) hi = mid; else lo = mid + 1;
    }
    const double keep = runs.decay[lo] ? s.decay_factor : 1.0;
    const double g = double(grad[i]) * scale;
    const float mi = float(s.b1 * double(m[i]) + s.one_minus_b1 * g);
    const float vi = float(s.b2 * double(v[i]) + s.one_minus_b2 * g * g);
    m[i] = mi;
    v[i] = vi;
    const double denom = sqrt(double(vi)) / s.bc2_sqrt + s.eps;
    const float pi = float(double(p[i]) * keep - s.step_size * double(mi) / denom);
    p[i] = pi;
    if (copy) copy[i] = from_f<CT>(pi);
  }
}

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, DType copy_dt, void* copy,
                std::int64_t n, std::span<const ParamSegment> segments, const AdamWHyper& hp,
                std::int64_t step, double grad_scale, const void* clip_norm, DType norm_dt,
                double max_norm) {
  cpu::check_segments(segments, n);
  if (n == 0) return;
  Step s{};
  s.b1 = hp.beta1;
  s.b2 = hp.beta2;
  s.one_minus_b1 = 1.0 - hp.beta1;
  s.one_minus_b2 = 1.0 - hp.beta2;
  s.bc2_sqrt = std::sqrt(1.0 - std::pow(hp.beta2, double(step)));
  s.step_size = hp.lr / (1.0 - std::pow(hp.beta1, double(step)));
  s.decay_factor = 1.0 - hp.lr * hp.weight_decay;
  s.eps = hp.eps;
  s.grad_scale = grad_scale;
  s.max_norm = max_norm;
  if (clip_norm && norm_dt != DType::F32 && norm_dt != DType::F64)
    throw std::invalid_argument("adamw_step (cuda): the clipping norm must be fp32 or fp64");
  // Runs of equal decay flags, empty segments dropped.
  std::vector<std::pair<std::int64_t, bool>> runs;  // (end, decay)
  for (const ParamSegment& seg : segments) {
    if (seg.numel == 0) continue;
    if (!runs.empty() && runs.back().second == seg.decay)
      runs.back().first = seg.offset + seg.numel;
    else
      runs.emplace_back(seg.offset + seg.numel, seg.decay);
  }
  std::int64_t begin = 0;
  for (std::size_t r0 = 0; r0 < runs.size(); r0 += kMaxRuns) {
    Runs launch{};
    launch.begin = begin;
    launch.count = int(std::min<std::size_t>(kMaxRuns, runs.size() - r0));
    for (int k = 0; k < launch.count; ++k) {
      launch.end[k] = runs[r0 + std::size_t(k)].first;
      launch.decay[k] = runs[r0 + std::size_t(k)].second ? 1 : 0;
    }
    const std::int64_t len = launch.end[launch.count - 1] - begin;
    const unsigned grid = grid_for(len, 256, 132 * 16);
    const bool f64 = norm_dt == DType::F64;
    if (!copy) {
      adamw_kernel<float><<<grid, 256>>>(param, grad, m, v, nullptr, launch, s, clip_norm, f64);
    } else {
      dispatch(copy_dt, "adamw_step (compute copy)", [&](auto tag) {
        using CT = decltype(tag);
        adamw_kernel<CT><<<grid, 256>>>(param, grad, m, v, static_cast<CT*>(copy), launch, s,
                                        clip_norm, f64);
      });
    }
    check_launch("adamw_step");
    begin = launch.end[launch.count - 1];
  }
}

}  // namespace nsatron::cuda
