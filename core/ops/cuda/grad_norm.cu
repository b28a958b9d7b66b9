// CUDA gradient norm and clipping (see grad_norm.h). Each buffer is cut into chunks of
// kNormChunk elements; one block per chunk sums the squares in fp64 (fixed tree) into a
// scratch array of partial sums, and one block adds all partials in a fixed order (thread
// strides, then a fixed tree) and writes the sum or its root to the output in device memory.
// The chunking and every order depend on the buffer sizes alone: two runs give the same bits.
// Clipping reads the norm on the device, so no host synchronisation is needed.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/cuda/common.cuh"
#include "core/ops/grad_norm.h"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

constexpr int kMaxGroup = 64;   // buffers per launch
constexpr int kNormThreads = 256;

struct Group {
  const void* data[kMaxGroup];
  std::int64_t n[kMaxGroup];
  std::int64_t first_chunk[kMaxGroup + 1];  // prefix sums of the buffers' chunk counts
  int count;
};

template <class T>
__global__ void chunk_sumsq_kernel(double* __restrict__ partial, const __grid_constant__ Group g) {
  __shared__ double red[32];
  const std::int64_t chunk = blockIdx.x;  // within the group
  int lo = 0, hi = g.count - 1;            // the buffer holding this chunk
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (g.first_chunk[mid] <= chunk) lo = mid; else hi = mid - 1;
  }
  const T* x = static_cast<const T*>(g.data[lo]);
  const std::int64_t b = (chunk - g.first_chunk[lo]) * kNormChunk;
  const std::int64_t e = std::min(g.n[lo], b + kNormChunk);
  double s = 0.0;
  for (std::int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    const double v = double(to_f(x[i]));
    s += v * v;
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) partial[chunk] = s;
}

template <class O>
__global__ void sumsq_finalize_kernel(O* out, const double* __restrict__ partial,
                                      std::int64_t nchunks, bool take_sqrt) {
  __shared__ double red[32];
  double s = 0.0;
  for (std::int64_t k = threadIdx.x; k < nchunks; k += blockDim.x) s += partial[k];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *out = O(take_sqrt ? sqrt(s) : s);
}

// x *= factor; with norm != nullptr the factor is min(1, max_norm / (norm + 1e-6)) read on
// the device, and nothing changes when the norm is not finite or the factor is 1.
template <class T>
__global__ void scale_kernel(T* x, std::int64_t n, double factor, const void* norm,
                             bool norm_is_f64, double max_norm) {
  if (norm) {
    const double nv = norm_is_f64 ? *static_cast<const double*>(norm)
                                  : double(*static_cast<const float*>(norm));
    if (!isfinite(nv)) return;
    factor = max_norm / (nv + 1e-6);
    if (!(factor < 1.0)) return;
  }
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = from_f<T>(float(double(to_f(x[i])) * factor));
}

void scale_one(const NormBuffer& b, double factor, const void* norm, DType norm_dt,
               double max_norm) {
  if (b.n == 0) return;
  dispatch(b.dtype, "scale_", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(b.n, 256, 4096), 256>>>(static_cast<T*>(b.data), b.n, factor, norm,
                                                       norm_dt == DType::F64, max_norm);
    check_launch("scale_");
  });
}

}  // namespace

void sum_squares(std::span<const NormBuffer> buffers, void* out, DType out_dt, bool take_sqrt) {
  if (out_dt != DType::F32 && out_dt != DType::F64)
    throw std::invalid_argument("sum_squares (cuda): the result must be fp32 or fp64");
  std::int64_t total = 0;
  for (const NormBuffer& b : buffers) total += (b.n + kNormChunk - 1) / kNormChunk;
  double* partial = static_cast<double*>(workspace(std::size_t(std::max<std::int64_t>(total, 1)) *
                                                   sizeof(double)));
  // Groups of up to kMaxGroup non-empty buffers of one dtype, one launch each; a group's
  // chunks fill partial[base, base + its chunk count).
  std::int64_t base = 0;
  std::size_t i = 0;
  while (i < buffers.size()) {
    Group g{};
    const DType dt = buffers[i].dtype;
    int k = 0;
    for (; i < buffers.size() && k < kMaxGroup && buffers[i].dtype == dt; ++i) {
      if (buffers[i].n == 0) continue;
      g.data[k] = buffers[i].data;
      g.n[k] = buffers[i].n;
      g.first_chunk[k + 1] = g.first_chunk[k] + (buffers[i].n + kNormChunk - 1) / kNormChunk;
      ++k;
    }
    g.count = k;
    if (k == 0) continue;
    const std::int64_t nchunks = g.first_chunk[k];
    if (nchunks > 0x7fffffff) throw std::invalid_argument("sum_squares (cuda): buffers too large");
    dispatch(dt, "sum_squares", [&](auto tag) {
      using T = decltype(tag);
      chunk_sumsq_kernel<T><<<unsigned(nchunks), kNormThreads>>>(partial + base, g);
      check_launch("sum_squares");
    });
    base += nchunks;
  }
  if (out_dt == DType::F64)
    sumsq_finalize_kernel<double><<<1, 1024>>>(static_cast<double*>(out), partial, total,
                                               take_sqrt);
  else
    sumsq_finalize_kernel<float><<<1, 1024>>>(static_cast<float*>(out), partial, total,
                                              take_sqrt);
  check_launch("sum_squares (total)");
}

void scale_(std::span<const NormBuffer> buffers, double factor) {
  for (const NormBuffer& b : buffers) scale_one(b, factor, nullptr, DType::F32, 0.0);
}

void clip_by_norm_(std::span<const NormBuffer> buffers, const void* norm, DType norm_dt,
                   double max_norm) {
  if (norm_dt != DType::F32 && norm_dt != DType::F64)
    throw std::invalid_argument("clip_by_global_norm_ (cuda): the norm must be fp32 or fp64");
  for (const NormBuffer& b : buffers) scale_one(b, 1.0, norm, norm_dt, max_norm);
}

}  // namespace nsatron::cuda
