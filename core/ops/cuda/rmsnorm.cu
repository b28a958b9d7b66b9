// CUDA RMSNorm (see rmsnorm.h): one block per row for the forward; the backward gives each
// block a chunk of rows_per_chunk(N) rows (at least 32, at most 1024 chunks), computes dx row by row and sums dy * xhat over
// its rows per column (each column owned by one thread, so no atomics), and a second kernel
// adds the chunks' partial sums to dw in chunk order (fp64). Chunking and block sizes depend
// on the shape only, so the bits do not depend on the GPU. Arithmetic in fp32, rstd in fp32.
#include "core/ops/cuda/common.cuh"
#include "core/ops/rmsnorm.h"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

// Rows per chunk of the backward: a function of N alone (never of the GPU).
std::int64_t rows_per_chunk(std::int64_t N) {
  const std::int64_t r = (N + 1023) / 1024;
  return r < 32 ? 32 : r;
}
constexpr std::int64_t kMaxSharedCols = 12032;  // fp32 column sums within 48 KB per block

// a != nullptr: h = a + b is written (rounded to T) and normalised; otherwise x is.
template <class T, int V>
__global__ void rmsnorm_fwd_kernel(T* __restrict__ y, float* __restrict__ rstd, T* h, const T* a,
                                   const T* b, const T* x, const T* __restrict__ w,
                                   std::int64_t C, float eps) {
  __shared__ float red[32];
  const std::int64_t row = blockIdx.x;
  const std::int64_t base = row * C;
  const std::int64_t step = std::int64_t(blockDim.x) * V;
  const T* src = x;
  float ss = 0.f;
  if (a) {
    src = h;
    for (std::int64_t c = std::int64_t(threadIdx.x) * V; c < C; c += step) {
      float av[V], bv[V], hv[V];
      load<T, V>(a + base + c, av);
      load<T, V>(b + base + c, bv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        hv[i] = to_f(from_f<T>(av[i] + bv[i]));
        ss += hv[i] * hv[i];
      }
      store<T, V>(h + base + c, hv);  // h may be a or b: this thread read both first
    }
  } else {
    for (std::int64_t c = std::int64_t(threadIdx.x) * V; c < C; c += step) {
      float xv[V];
      load<T, V>(x + base + c, xv);
#pragma unroll
      for (int i = 0; i < V; ++i) ss += xv[i] * xv[i];
    }
  }
  ss = block_sum(ss, red);
  const float r = 1.0f / sqrtf(ss / float(C) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  // Each thread re-reads exactly the elements it wrote to h above.
  for (std::int64_t c = std::int64_t(threadIdx.x) * V; c < C; c += step) {
    float xv[V], wv[V], yv[V];
    load<T, V>(src + base + c, xv);
    load<T, V>(w + c, wv);
#pragma unroll
    for (int i = 0; i < V; ++i) yv[i] = xv[i] * r * wv[i];
    store<T, V>(y + base + c, yv);
  }
}

// Rows [chunk * R, chunk * R + R): dx for each row, and partial[chunk, c] = sum over the
// chunk's rows of dy * x * rstd. acc: shared memory (C floats) or, for wide rows, the chunk's
// row of `partial` itself.
template <class T, int V>
__global__ void rmsnorm_bwd_kernel(T* dx, float* __restrict__ partial, const T* dy,
                                   const T* __restrict__ x, const T* __restrict__ w,
                                   const float* __restrict__ rstd, const T* dres, std::int64_t N,
                                   std::int64_t C, std::int64_t rows, bool shared_acc) {
  extern __shared__ float smem[];
  __shared__ float red[32];
  const std::int64_t chunk = blockIdx.x;
  float* acc = shared_acc ? smem : partial + chunk * C;
  const std::int64_t step = std::int64_t(blockDim.x) * V;
  const std::int64_t first = threadIdx.x * std::int64_t(V);
  for (std::int64_t c = first; c < C; c += step)
#pragma unroll
    for (int i = 0; i < V; ++i) acc[c + i] = 0.f;
  const std::int64_t r0 = chunk * rows;
  const std::int64_t r1 = N < r0 + rows ? N : r0 + rows;
  const float inv_c = 1.0f / float(C);
  for (std::int64_t n = r0; n < r1; ++n) {
    const std::int64_t base = n * C;
    const float r = rstd[n];
    float dot = 0.f;
    for (std::int64_t c = first; c < C; c += step) {
      float dyv[V], xv[V], wv[V];
      load<T, V>(dy + base + c, dyv);
      load<T, V>(x + base + c, xv);
      load<T, V>(w + c, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float xhat = xv[i] * r;
        dot += wv[i] * dyv[i] * xhat;
        acc[c + i] += dyv[i] * xhat;
      }
    }
    const float mean = block_sum(dot, red) * inv_c;
    // dx may be dy or dres: each element is read by the thread that then overwrites it.
    for (std::int64_t c = first; c < C; c += step) {
      float dyv[V], xv[V], wv[V], out[V];
      load<T, V>(dy + base + c, dyv);
      load<T, V>(x + base + c, xv);
      load<T, V>(w + c, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = r * (wv[i] * dyv[i] - xv[i] * r * mean);
      if (dres) {
        float rv[V];
        load<T, V>(dres + base + c, rv);
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] += rv[i];
      }
      store<T, V>(dx + base + c, out);
    }
  }
  if (shared_acc)
    for (std::int64_t c = first; c < C; c += step)
#pragma unroll
      for (int i = 0; i < V; ++i) partial[chunk * C + c + i] = acc[c + i];
}

template <class T> bool vec_ok(std::int64_t C, std::initializer_list<const void*> ps) {
  if (C % kVec<T> != 0) return false;
  for (const void* p : ps)
    if (p && !aligned16(p)) return false;
  return true;
}

template <class T>
void forward_impl(T* y, float* rstd, T* h, const T* a, const T* b, const T* x, const T* w,
                  std::int64_t N, std::int64_t C, double eps) {
  if (N == 0) return;  // C == 0 runs: rstd = 1/sqrt(0/0 + eps) = NaN, as on the CPU
  const bool vec = vec_ok<T>(C, {y, h, a, b, x, w});
  const int threads = row_threads(vec ? C / kVec<T> : C);
  if (vec)
    rmsnorm_fwd_kernel<T, kVec<T>><<<unsigned(N), threads>>>(y, rstd, h, a, b, x, w, C, float(eps));
  else
    rmsnorm_fwd_kernel<T, 1><<<unsigned(N), threads>>>(y, rstd, h, a, b, x, w, C, float(eps));
  check_launch("rmsnorm_forward");
}

template <class T, class DW>
void backward_impl(T* dx, DW* dw, const T* dy, const T* x, const T* w, const float* rstd,
                   const T* dres, std::int64_t N, std::int64_t C) {
  if (N == 0 || C == 0) return;
  const std::int64_t rows = rows_per_chunk(N);
  const std::int64_t nchunks = (N + rows - 1) / rows;
  float* partial = static_cast<float*>(workspace(std::size_t(nchunks * C) * sizeof(float)));
  const bool vec = vec_ok<T>(C, {dx, dy, x, w, dres});
  const int threads = row_threads(vec ? C / kVec<T> : C);
  const bool shared_acc = C <= kMaxSharedCols;
  const std::size_t smem = shared_acc ? std::size_t(C) * sizeof(float) : 0;
  if (vec)
    rmsnorm_bwd_kernel<T, kVec<T>><<<unsigned(nchunks), threads, smem>>>(
        dx, partial, dy, x, w, rstd, dres, N, C, rows, shared_acc);
  else
    rmsnorm_bwd_kernel<T, 1><<<unsigned(nchunks), threads, smem>>>(dx, partial, dy, x, w, rstd,
                                                                   dres, N, C, rows, shared_acc);
  check_launch("rmsnorm_backward");
  column_chunks_to_grad<DW><<<grid_for(C, 256, 1 << 30), 256>>>(dw, partial, nchunks, C);
  check_launch("rmsnorm_backward (dw)");
}

}  // namespace

void rmsnorm_forward(DType dt, void* y, float* rstd, const void* x, const void* w, std::int64_t N,
                     std::int64_t C, double eps) {
  dispatch(dt, "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    forward_impl<T>(static_cast<T*>(y), rstd, nullptr, nullptr, nullptr,
                    static_cast<const T*>(x), static_cast<const T*>(w), N, C, eps);
  });
}

void add_rmsnorm_forward(DType dt, void* h, void* y, float* rstd, const void* a, const void* b,
                         const void* w, std::int64_t N, std::int64_t C, double eps) {
  dispatch(dt, "add_rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    forward_impl<T>(static_cast<T*>(y), rstd, static_cast<T*>(h), static_cast<const T*>(a),
                    static_cast<const T*>(b), nullptr, static_cast<const T*>(w), N, C, eps);
  });
}

void rmsnorm_backward(DType dt, DType dw_dt, void* dx, void* dw, const void* dy, const void* x,
                      const void* w, const float* rstd, const void* dres, std::int64_t N,
                      std::int64_t C) {
  dispatch(dt, "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch(dw_dt, "rmsnorm_backward (dw)", [&](auto dtag) {
      using DW = decltype(dtag);
      backward_impl<T, DW>(static_cast<T*>(dx), static_cast<DW*>(dw), static_cast<const T*>(dy),
                           static_cast<const T*>(x), static_cast<const T*>(w), rstd,
                           static_cast<const T*>(dres), N, C);
    });
  });
}

}  // namespace nsatron::cuda
