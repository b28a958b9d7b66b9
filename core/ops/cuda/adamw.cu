// CUDA AdamW (see adamw.h): one fused elementwise kernel over the flat fp32 master buffer and
// its fp32 moments, optionally writing the compute copy of the updated weights (bf16 or fp32)
// in the same pass and taking the clipping factor from a norm in device memory. Arithmetic in
// fp64, m and v rounded to fp32 before the update uses them, exactly as the CPU loop.
// Segments with equal decay flags are merged into runs; each launch carries up to kMaxRuns
// run ends in its parameters (a model of a few hundred tensors needs one or two launches).
// Bytes per element: p, grad, m, v read (16), p, m, v written (12), the compute copy (2 in
// bf16): 30 at 125M parameters is 3.7 GB, ~1.25 ms at 3 TB/s. A thread updates kVecElems
// consecutive elements per iteration through 16-byte loads and stores (one 4-byte element
// per thread left ~4 loads in flight per thread: 1.7 ms per step on an H100); the elements
// before the first multiple of kVecElems and after the last take the one-element kernel. The
// arithmetic of an element is the same in both (same bits).
#include <algorithm>
#include <cmath>
#include <type_traits>
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

constexpr int kVecElems = 4;  // fp32 elements per 16-byte access

// The update of element i of run `decay`: torch.optim.AdamW in fp64, m and v rounded to fp32
// before the update uses them (as the CPU loop).
struct Moments {
  float p, m, v;
};
__device__ __forceinline__ Moments adamw_element(float p, float g32, float m, float v, bool decay,
                                                 const Step& s, double scale) {
  const double keep = decay ? s.decay_factor : 1.0;
  const double g = double(g32) * scale;
  const float mi = float(s.b1 * double(m) + s.one_minus_b1 * g);
  const float vi = float(s.b2 * double(v) + s.one_minus_b2 * g * g);
  const double denom = sqrt(double(vi)) / s.bc2_sqrt + s.eps;
  const float pi = float(double(p) * keep - s.step_size * double(mi) / denom);
  return {pi, mi, vi};
}

// The run holding element i: the first whose end is > i.
__device__ __forceinline__ int run_of(const Runs& runs, std::int64_t i) {
  int lo = 0, hi = runs.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (runs.end[mid] > i) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// Elements [lo, hi) of the launch's runs, E consecutive ones per thread and iteration (E = 1,
// or kVecElems with lo a multiple of it, hi - lo too, and the buffers 16-byte aligned).
template <class CT, int E>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ grad,
                             float* __restrict__ m, float* __restrict__ v, CT* __restrict__ copy,
                             std::int64_t lo, std::int64_t hi, const __grid_constant__ Runs runs,
                             const Step s, const void* norm, bool norm_is_f64) {
  double scale = s.grad_scale;
  if (norm) {
    const double nv = norm_is_f64 ? *static_cast<const double*>(norm)
                                  : double(*static_cast<const float*>(norm));
    if (!isfinite(nv)) return;  // non-finite gradient norm: the step is skipped
    const double c = s.max_norm / (nv + 1e-6);
    if (c < 1.0) scale *= c;
  }
  using F = Packed<float, E>;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x * E;
  for (std::int64_t i = lo + (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * E; i < hi; i += stride) {
    const F pv = load_packed<float, E>(p + i), gv = load_packed<float, E>(grad + i);
    const F mv = load_packed<float, E>(m + i), vv = load_packed<float, E>(v + i);
    F po, mo, vo;
    Packed<CT, E> co;
    int r = run_of(runs, i);
#pragma unroll
    for (int k = 0; k < E; ++k) {
      while (runs.end[r] <= i + k) ++r;  // a run may end inside the vector
      const Moments u = adamw_element(pv.e[k], gv.e[k], mv.e[k], vv.e[k], runs.decay[r] != 0, s, scale);
      po.e[k] = u.p;
      mo.e[k] = u.m;
      vo.e[k] = u.v;
      co.e[k] = from_f<CT>(u.p);
    }
    store_packed(p + i, po);
    store_packed(m + i, mo);
    store_packed(v + i, vo);
    if (copy) store_packed(copy + i, co);
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
    const std::int64_t end = launch.end[launch.count - 1];
    const bool f64 = norm_dt == DType::F64;
    auto run = [&](auto tag) {
      using CT = decltype(tag);
      CT* c = static_cast<CT*>(copy);
      auto elements = [&](auto width, std::int64_t lo, std::int64_t hi) {
        constexpr int E = decltype(width)::value;
        if (hi <= lo) return;
        const unsigned grid = grid_for((hi - lo) / E, 256, 132 * 16);
        adamw_kernel<CT, E><<<grid, 256>>>(param, grad, m, v, c, lo, hi, launch, s, clip_norm, f64);
        check_launch("adamw_step");
      };
      using One = std::integral_constant<int, 1>;
      using Vec = std::integral_constant<int, kVecElems>;
      // 16-byte accesses from element 0 of every buffer (the copy: kVecElems elements).
      const bool vec = aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v) &&
                       (reinterpret_cast<std::uintptr_t>(c) % (kVecElems * sizeof(CT))) == 0;
      if (!vec) return elements(One{}, begin, end);
      const std::int64_t a0 = std::min(end, (begin + kVecElems - 1) / kVecElems * kVecElems);
      const std::int64_t a1 = a0 + (end - a0) / kVecElems * kVecElems;
      elements(One{}, begin, a0);
      elements(Vec{}, a0, a1);
      elements(One{}, a1, end);
    };
    if (!copy) run(float{});
    else dispatch(copy_dt, "adamw_step (compute copy)", run);
    begin = end;
  }
}

}  // namespace nsatron::cuda
