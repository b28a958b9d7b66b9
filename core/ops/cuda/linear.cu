// CUDA bias kernels of the linear layer (see linear.h); the products go through cuBLAS
// (matmul.cu). The bias gradient is a column sum over rows: each block sums a fixed chunk of
// rows for 256 columns (one thread per column, rows in order), and the chunks' fp32 partial
// sums are added to db in a fixed order in fp64 (column_chunks_to_grad). The chunking depends on the shape only.
#include "core/ops/cuda/common.cuh"
#include "core/ops/linear.h"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

constexpr int kBiasThreads = 256;

// Rows per chunk: at least 64, at most 256 chunks.
std::int64_t bias_rows_per_chunk(std::int64_t N) {
  const std::int64_t r = (N + 255) / 256;
  return r < 64 ? 64 : r;
}

template <class T, int V>
__global__ void add_bias_kernel(T* y, const T* __restrict__ b, std::int64_t out) {
  const std::int64_t n = blockIdx.x;
  const std::int64_t o = (std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (o >= out) return;
  float yv[V], bv[V];
  load<T, V>(y + n * out + o, yv);
  load<T, V>(b + o, bv);
#pragma unroll
  for (int i = 0; i < V; ++i) yv[i] += bv[i];
  store<T, V>(y + n * out + o, yv);
}

template <class T>
__global__ void bias_partial_kernel(float* __restrict__ partial, const T* __restrict__ dy,
                                    std::int64_t N, std::int64_t out, std::int64_t rows) {
  const std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  if (o >= out) return;
  const std::int64_t r0 = chunk * rows;
  const std::int64_t r1 = N < r0 + rows ? N : r0 + rows;
  float s = 0.f;
  for (std::int64_t n = r0; n < r1; ++n) s += to_f(dy[n * out + o]);
  partial[chunk * out + o] = s;
}

}  // namespace

void add_bias(DType dt, void* y, const void* b, std::int64_t N, std::int64_t out) {
  if (N == 0 || out == 0) return;
  dispatch(dt, "linear_forward (bias)", [&](auto tag) {
    using T = decltype(tag);
    T* py = static_cast<T*>(y);
    const T* pb = static_cast<const T*>(b);
    constexpr int V = kVec<T>;
    const bool vec = out % V == 0 && aligned16(py) && aligned16(pb);
    const std::int64_t units = vec ? out / V : out;
    const int threads = row_threads(units);
    const std::int64_t cols = (units + threads - 1) / threads;
    if (N > 0x7fffffff || cols > 65535)
      throw std::invalid_argument("linear_forward (bias, cuda): too many rows or columns");
    const dim3 grid = dim3(unsigned(N), unsigned(cols));
    if (vec)
      add_bias_kernel<T, V><<<grid, threads>>>(py, pb, out);
    else
      add_bias_kernel<T, 1><<<grid, threads>>>(py, pb, out);
    check_launch("linear_forward (bias)");
  });
}

void bias_backward(DType dt, DType db_dt, void* db, const void* dy, std::int64_t N,
                   std::int64_t out) {
  if (N == 0 || out == 0) return;
  dispatch(dt, "linear_backward (bias)", [&](auto tag) {
    using T = decltype(tag);
    dispatch(db_dt, "linear_backward (dbias)", [&](auto gtag) {
      using G = decltype(gtag);
      const std::int64_t rows = bias_rows_per_chunk(N);
      const std::int64_t nchunks = (N + rows - 1) / rows;
      float* partial = static_cast<float*>(workspace(std::size_t(nchunks * out) * sizeof(float)));
      const dim3 grid(unsigned((out + kBiasThreads - 1) / kBiasThreads), unsigned(nchunks));
      bias_partial_kernel<T><<<grid, kBiasThreads>>>(partial, static_cast<const T*>(dy), N, out,
                                                     rows);
      check_launch("linear_backward (bias)");
      launch_column_chunks_to_grad<G>(static_cast<G*>(db), partial, nchunks, out);
      check_launch("linear_backward (bias)");
    });
  });
}

}  // namespace nsatron::cuda
