// CUDA elementwise helpers (see elementwise.h): grid-stride loops over 16-byte vectors, the
// tail (and unaligned buffers) element by element. fp32 arithmetic, one rounding per output.
// zero_rows stores zero bits in the widest unit (up to 16 bytes) that the rows and the
// address allow, whatever the dtype.
#include "core/ops/cuda/common.cuh"
#include "core/ops/elementwise.h"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

// out = a + b over elements [0, n); out may be a or b (each element read, then written, by
// one thread).
template <class T, int V>
__global__ void add_kernel(T* out, const T* a, const T* b, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x * V;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += stride) {
    float av[V], bv[V], o[V];
    load<T, V>(a + i, av);
    load<T, V>(b + i, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = av[k] + bv[k];
    store<T, V>(out + i, o);
  }
}

template <class T> void add_impl(T* out, const T* a, const T* b, std::int64_t n) {
  if (n == 0) return;
  constexpr int V = kVec<T>;
  constexpr int threads = 256;
  std::int64_t done = 0;
  if (aligned16(out) && aligned16(a) && aligned16(b) && n >= V) {
    const std::int64_t nv = n / V * V;
    add_kernel<T, V><<<grid_for(nv / V, threads, 8192), threads>>>(out, a, b, nv);
    check_launch("add");
    done = nv;
  }
  if (done < n) {
    add_kernel<T, 1><<<grid_for(n - done, threads, 8192), threads>>>(out + done, a + done,
                                                                      b + done, n - done);
    check_launch("add");
  }
}

template <class S, class D>
__global__ void cast_kernel(D* out, const S* in, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f<D>(to_f(in[i]));
}

// x viewed as rows of `per_row` units of U (16, 8, 4, 2 or 1 bytes): a unit of a row with
// keep[row] == 0 becomes zero bits.
template <class U>
__global__ void zero_rows_kernel(U* x, std::int64_t per_row, std::int64_t total,
                                 const std::uint8_t* __restrict__ keep) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride)
    if (!keep[i / per_row]) x[i] = U{};
}

template <class U> void zero_rows_as(void* x, std::size_t row_bytes, std::int64_t N,
                                     const std::uint8_t* keep) {
  const std::int64_t per_row = std::int64_t(row_bytes / sizeof(U)), total = per_row * N;
  zero_rows_kernel<U><<<grid_for(total, 256, 8192), 256>>>(static_cast<U*>(x), per_row, total,
                                                           keep);
  check_launch("zero_rows");
}

}  // namespace

void zero_rows(void* x, std::size_t row_bytes, std::int64_t N, const std::uint8_t* keep) {
  if (N == 0 || row_bytes == 0) return;
  // The widest unit that divides the row and the address.
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(x) | std::uintptr_t(row_bytes);
  if (a % 16 == 0) return zero_rows_as<uint4>(x, row_bytes, N, keep);
  if (a % 8 == 0) return zero_rows_as<unsigned long long>(x, row_bytes, N, keep);
  if (a % 4 == 0) return zero_rows_as<unsigned int>(x, row_bytes, N, keep);
  if (a % 2 == 0) return zero_rows_as<unsigned short>(x, row_bytes, N, keep);
  zero_rows_as<unsigned char>(x, row_bytes, N, keep);
}

void cast(DType src_dt, const void* src, DType dst_dt, void* dst, std::int64_t n) {
  if (n == 0) return;
  dispatch(src_dt, "cast", [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch(dst_dt, "cast", [&](auto d_tag) {
      using D = decltype(d_tag);
      cast_kernel<S, D><<<grid_for(n, 256, 8192), 256>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
      check_launch("cast");
    });
  });
}

void add(DType dt, void* out, const void* a, const void* b, std::int64_t n) {
  dispatch(dt, "add", [&](auto tag) {
    using T = decltype(tag);
    add_impl<T>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
}

void add_(DType dt, void* acc, const void* x, std::int64_t n) {
  dispatch(dt, "add_", [&](auto tag) {
    using T = decltype(tag);
    add_impl<T>(static_cast<T*>(acc), static_cast<const T*>(acc), static_cast<const T*>(x), n);
  });
}

}  // namespace nsatron::cuda
