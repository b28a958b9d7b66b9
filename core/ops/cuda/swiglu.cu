// CUDA SwiGLU (see swiglu.h): elementwise, fp32 arithmetic. Grid: x over rows, y over column
// blocks of each row; 16-byte vectors when the row width and the pointers allow them.
#include "core/ops/cuda/common.cuh"
#include "core/ops/swiglu.h"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

// 1 / (1 + e^-a): e^-a overflows to inf for a < -88 and the quotient is then 0, never NaN.
__device__ __forceinline__ float sigmoidf(float a) { return 1.0f / (1.0f + expf(-a)); }

template <class T, int V>
__global__ void swiglu_fwd_kernel(T* __restrict__ out, const T* __restrict__ a,
                                  const T* __restrict__ b, std::int64_t F, std::int64_t ld_in,
                                  std::int64_t ld_out) {
  const std::int64_t n = blockIdx.x;
  const std::int64_t f = (std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (f >= F) return;
  float av[V], bv[V], o[V];
  load<T, V>(a + n * ld_in + f, av);
  load<T, V>(b + n * ld_in + f, bv);
#pragma unroll
  for (int i = 0; i < V; ++i) o[i] = av[i] * sigmoidf(av[i]) * bv[i];
  store<T, V>(out + n * ld_out + f, o);
}

// da may be a and db may be b: each element is read before the same thread writes it.
template <class T, int V>
__global__ void swiglu_bwd_kernel(T* da, T* db, const T* __restrict__ dout, const T* a,
                                  const T* b, std::int64_t F, std::int64_t ld_in,
                                  std::int64_t ld_out) {
  const std::int64_t n = blockIdx.x;
  const std::int64_t f = (std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (f >= F) return;
  float av[V], bv[V], g[V], dav[V], dbv[V];
  load<T, V>(a + n * ld_in + f, av);
  load<T, V>(b + n * ld_in + f, bv);
  load<T, V>(dout + n * ld_out + f, g);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float s = sigmoidf(av[i]);
    dav[i] = g[i] * bv[i] * s * (1.0f + av[i] * (1.0f - s));
    dbv[i] = g[i] * av[i] * s;
  }
  store<T, V>(da + n * ld_in + f, dav);
  store<T, V>(db + n * ld_in + f, dbv);
}

template <class T> bool vec_ok(std::int64_t F, std::int64_t ld_in, std::int64_t ld_out,
                               std::initializer_list<const void*> ps) {
  constexpr int V = kVec<T>;
  if (F % V || ld_in % V || ld_out % V) return false;
  for (const void* p : ps)
    if (!aligned16(p)) return false;
  return true;
}

struct Launch {
  dim3 grid;
  int threads;
};
Launch shape(std::int64_t N, std::int64_t units) {
  const int threads = row_threads(units);
  const std::int64_t cols = (units + threads - 1) / threads;
  if (N > 0x7fffffff || cols > 65535)
    throw std::invalid_argument("swiglu (cuda): too many rows or too wide a row");
  return {dim3(unsigned(N), unsigned(cols)), threads};
}

}  // namespace

void swiglu_forward(DType dt, void* out, const void* a, const void* b, std::int64_t N,
                    std::int64_t F, std::int64_t ld_in, std::int64_t ld_out) {
  if (N == 0 || F == 0) return;
  dispatch(dt, "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    if (vec_ok<T>(F, ld_in, ld_out, {o, pa, pb})) {
      const Launch l = shape(N, F / kVec<T>);
      swiglu_fwd_kernel<T, kVec<T>><<<l.grid, l.threads>>>(o, pa, pb, F, ld_in, ld_out);
    } else {
      const Launch l = shape(N, F);
      swiglu_fwd_kernel<T, 1><<<l.grid, l.threads>>>(o, pa, pb, F, ld_in, ld_out);
    }
    check_launch("swiglu_forward");
  });
}

void swiglu_backward(DType dt, void* da, void* db, const void* dout, const void* a, const void* b,
                     std::int64_t N, std::int64_t F, std::int64_t ld_in, std::int64_t ld_out) {
  if (N == 0 || F == 0) return;
  dispatch(dt, "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    T* pda = static_cast<T*>(da);
    T* pdb = static_cast<T*>(db);
    const T* g = static_cast<const T*>(dout);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    if (vec_ok<T>(F, ld_in, ld_out, {pda, pdb, g, pa, pb})) {
      const Launch l = shape(N, F / kVec<T>);
      swiglu_bwd_kernel<T, kVec<T>><<<l.grid, l.threads>>>(pda, pdb, g, pa, pb, F, ld_in, ld_out);
    } else {
      const Launch l = shape(N, F);
      swiglu_bwd_kernel<T, 1><<<l.grid, l.threads>>>(pda, pdb, g, pa, pb, F, ld_in, ld_out);
    }
    check_launch("swiglu_backward");
  });
}

}  // namespace nsatron::cuda
