// CUDA RMSNorm (see rmsnorm.h): one warp per row, 16-byte vectors where the width and the
// pointers allow, fp32 arithmetic, the row sums reduced by a fixed butterfly within the warp
// (no block barrier on the row's path). A lane keeps up to kCached (forward) or kCachedBwd
// (backward) vectors of its row in registers, as stored, between the two passes over the row
// (the row sum, then the outputs); wider rows read the rest again (from L1/L2).
//
// Forward: blocks of kWarps warps, one row per warp. Bytes: x read, y written (2 N C e; e the
// element size); fused: a and b read, h and y written (4 N C e); plus rstd (4 N) and w.
// Backward: each block takes a chunk of rows_per_chunk(N) rows (at least 32, at most 1024
// chunks), its warps the rows warp, warp + warps, ... in order. dx row by row; the column
// sums dy * xhat per warp, in registers for the cached columns and in shared memory for the
// others (each column owned by one lane: no atomics), the block's warps then added in warp
// order into one row of fp32 partial sums per chunk, and a
// second kernel adds the chunks to dw in a fixed order (fp64; column_chunks_to_grad). Bytes: dy and x read, dx
// written, dres read when fused (3 or 4 N C e), the partial sums (8 C per chunk).
// Chunking, warps per block and vector width depend on the shape (and the pointers'
// alignment) only, so the bits do not depend on the GPU.
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
constexpr int kWarps = 8;                     // warps per block (rows in flight per block)
constexpr int kCached = 4;                    // vectors per lane kept in registers: forward
constexpr int kCachedBwd = 3;                 // backward (two tensors and the column sums)
constexpr std::int64_t kMaxSharedCols = 12288;  // fp32 column sums of a block's warps in 48 KB

// Column of vector i of this lane's share of a row (i-th pass of the warp over the row).
__device__ __forceinline__ std::int64_t lane_col(int lane, int i, int V) {
  return (std::int64_t(i) * 32 + lane) * V;
}

// a != nullptr: h = a + b is written (rounded to T) and normalised; otherwise x is.
template <class T, int V>
__global__ void rmsnorm_fwd_kernel(T* __restrict__ y, float* __restrict__ rstd, T* h, const T* a,
                                   const T* b, const T* x, const T* __restrict__ w,
                                   std::int64_t N, std::int64_t C, float eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= N) return;
  const std::int64_t base = row * C;
  const T* src = a ? h : x;
  float ss = 0.f;
  // Pass 1: the row (h = a + b first when fused) and its sum of squares, in a fixed order.
  auto read = [&](std::int64_t c) {
    Packed<T, V> p;
    if (a) {
      float av[V], bv[V];
      unpack(load_packed<T, V>(a + base + c), av);
      unpack(load_packed<T, V>(b + base + c), bv);
#pragma unroll
      for (int k = 0; k < V; ++k) av[k] += bv[k];
      p = pack<T, V>(av);
      store_packed(h + base + c, p);  // h may be a or b: this lane read both first
    } else {
      p = load_packed<T, V>(x + base + c);
    }
    float f[V];
    unpack(p, f);
#pragma unroll
    for (int k = 0; k < V; ++k) ss += f[k] * f[k];
    return p;
  };
  Packed<T, V> v[kCached];
#pragma unroll
  for (int i = 0; i < kCached; ++i)
    if (lane_col(lane, i, V) < C) v[i] = read(lane_col(lane, i, V));
  for (std::int64_t c = lane_col(lane, kCached, V); c < C; c += 32 * V) read(c);
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / float(C) + eps);
  if (lane == 0) rstd[row] = r;
  // Pass 2: y = x * rstd * w (the uncached vectors read again: this lane wrote h's itself).
  auto write = [&](std::int64_t c, const Packed<T, V>& p) {
    float xv[V], wv[V], yv[V];
    unpack(p, xv);
    unpack(load_packed<T, V>(w + c), wv);
#pragma unroll
    for (int k = 0; k < V; ++k) yv[k] = xv[k] * r * wv[k];
    store_packed(y + base + c, pack<T, V>(yv));
  };
#pragma unroll
  for (int i = 0; i < kCached; ++i)
    if (lane_col(lane, i, V) < C) write(lane_col(lane, i, V), v[i]);
  for (std::int64_t c = lane_col(lane, kCached, V); c < C; c += 32 * V) write(c, load_packed<T, V>(src + base + c));
}

// The chunk's rows: dx for each row, and partial[chunk, c] = sum over the chunk's rows of
// dy * x * rstd. Each lane sums its cached columns in registers and the others in acc:
// `warps` rows of C floats, one per warp, in shared memory, or (rows too wide, then
// warps = 1) the chunk's row of `partial` itself.
template <class T, int V>
__global__ void __launch_bounds__(kWarps * 32, 2) rmsnorm_bwd_kernel(T* dx, float* __restrict__ partial, const T* dy,
                                   const T* __restrict__ x, const T* __restrict__ w,
                                   const float* __restrict__ rstd, const T* dres, std::int64_t N,
                                   std::int64_t C, std::int64_t rows, bool shared_acc) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const std::int64_t chunk = blockIdx.x;
  float* acc = shared_acc ? smem + std::int64_t(warp) * C : partial + chunk * C;
  for (std::int64_t c = lane_col(lane, kCachedBwd, V); c < C; c += 32 * V)
#pragma unroll
    for (int k = 0; k < V; ++k) acc[c + k] = 0.f;
  float sums[kCachedBwd][V];
#pragma unroll
  for (int i = 0; i < kCachedBwd; ++i)
#pragma unroll
    for (int k = 0; k < V; ++k) sums[i][k] = 0.f;
  const std::int64_t r0 = chunk * rows;
  const std::int64_t r1 = N < r0 + rows ? N : r0 + rows;
  const float inv_c = 1.0f / float(C);
  for (std::int64_t n = r0 + warp; n < r1; n += warps) {
    const std::int64_t base = n * C;
    const float r = rstd[n];
    float dot = 0.f;
    // Pass 1: mean(w dy xhat) and the column sums of dy xhat.
    auto accumulate = [&](std::int64_t c, const Packed<T, V>& dyp, const Packed<T, V>& xp, float (&s)[V]) {
      float dyf[V], xf[V], wf[V];
      unpack(dyp, dyf);
      unpack(xp, xf);
      unpack(load_packed<T, V>(w + c), wf);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = xf[k] * r;
        dot += wf[k] * dyf[k] * xhat;
        s[k] += dyf[k] * xhat;
      }
    };
    // The cached columns' dres is loaded with dy and x, ahead of the row sum it does not
    // need (loaded after it, its latency was exposed once per row: 66% of the bandwidth).
    Packed<T, V> dyv[kCachedBwd], xv[kCachedBwd], rv[kCachedBwd];
#pragma unroll
    for (int i = 0; i < kCachedBwd; ++i)
      if (lane_col(lane, i, V) < C) {
        dyv[i] = load_packed<T, V>(dy + base + lane_col(lane, i, V));
        xv[i] = load_packed<T, V>(x + base + lane_col(lane, i, V));
        if (dres) rv[i] = load_packed<T, V>(dres + base + lane_col(lane, i, V));
      }
#pragma unroll
    for (int i = 0; i < kCachedBwd; ++i)
      if (lane_col(lane, i, V) < C) accumulate(lane_col(lane, i, V), dyv[i], xv[i], sums[i]);
    for (std::int64_t c = lane_col(lane, kCachedBwd, V); c < C; c += 32 * V) {
      float s[V];
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] = acc[c + k];
      accumulate(c, load_packed<T, V>(dy + base + c), load_packed<T, V>(x + base + c), s);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[c + k] = s[k];
    }
    const float mean = warp_sum(dot) * inv_c;
    // Pass 2: dx (dx may be dy or dres: each element is read by the lane that overwrites it).
    auto write = [&](std::int64_t c, const Packed<T, V>& dyp, const Packed<T, V>& xp, const Packed<T, V>* rp) {
      float dyf[V], xf[V], wf[V], out[V];
      unpack(dyp, dyf);
      unpack(xp, xf);
      unpack(load_packed<T, V>(w + c), wf);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = r * (wf[k] * dyf[k] - xf[k] * r * mean);
      if (rp) {
        float rf[V];
        unpack(*rp, rf);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] += rf[k];
      }
      store_packed(dx + base + c, pack<T, V>(out));
    };
#pragma unroll
    for (int i = 0; i < kCachedBwd; ++i)
      if (lane_col(lane, i, V) < C) write(lane_col(lane, i, V), dyv[i], xv[i], dres ? &rv[i] : nullptr);
    for (std::int64_t c = lane_col(lane, kCachedBwd, V); c < C; c += 32 * V) {
      Packed<T, V> rc;
      if (dres) rc = load_packed<T, V>(dres + base + c);
      write(c, load_packed<T, V>(dy + base + c), load_packed<T, V>(x + base + c), dres ? &rc : nullptr);
    }
  }
#pragma unroll
  for (int i = 0; i < kCachedBwd; ++i)
    if (lane_col(lane, i, V) < C)
#pragma unroll
      for (int k = 0; k < V; ++k) acc[lane_col(lane, i, V) + k] = sums[i][k];
  if (!shared_acc) return;
  __syncthreads();
  // The warps' column sums, added in warp order.
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < warps; ++k) s += smem[std::int64_t(k) * C + c];
    partial[chunk * C + c] = s;
  }
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
  const unsigned blocks = unsigned((N + kWarps - 1) / kWarps);
  if (vec_ok<T>(C, {y, h, a, b, x, w}))
    rmsnorm_fwd_kernel<T, kVec<T>><<<blocks, kWarps * 32>>>(y, rstd, h, a, b, x, w, N, C, float(eps));
  else
    rmsnorm_fwd_kernel<T, 1><<<blocks, kWarps * 32>>>(y, rstd, h, a, b, x, w, N, C, float(eps));
  check_launch("rmsnorm_forward");
}

template <class T, class DW>
void backward_impl(T* dx, DW* dw, const T* dy, const T* x, const T* w, const float* rstd,
                   const T* dres, std::int64_t N, std::int64_t C) {
  if (N == 0 || C == 0) return;
  const std::int64_t rows = rows_per_chunk(N);
  const std::int64_t nchunks = (N + rows - 1) / rows;
  float* partial = static_cast<float*>(workspace(std::size_t(nchunks * C) * sizeof(float)));
  // As many warps (at most kWarps) as have their column sums in shared memory; rows wider
  // than that: one warp, summing into its chunk's row of `partial`.
  const std::int64_t fit = kMaxSharedCols / C;
  const int warps = fit >= kWarps ? kWarps : fit >= 1 ? int(fit) : 1;
  const bool shared_acc = fit >= 1;
  const std::size_t smem = shared_acc ? std::size_t(warps) * std::size_t(C) * sizeof(float) : 0;
  if (vec_ok<T>(C, {dx, dy, x, w, dres}))
    rmsnorm_bwd_kernel<T, kVec<T>><<<unsigned(nchunks), warps * 32, smem>>>(dx, partial, dy, x, w, rstd, dres, N,
                                                                             C, rows, shared_acc);
  else
    rmsnorm_bwd_kernel<T, 1><<<unsigned(nchunks), warps * 32, smem>>>(dx, partial, dy, x, w, rstd, dres, N, C,
                                                                      rows, shared_acc);
  check_launch("rmsnorm_backward");
  launch_column_chunks_to_grad<DW>(dw, partial, nchunks, C);
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
