// Shared by the CUDA op families (core/ops/cuda/*.cu), and for its vector loads and stores by
// nsa/cuda/compression.cu; not a public header.
//   - element types: DType::F32 -> float, DType::BF16 -> __nv_bfloat16, arithmetic in fp32
//   - vector loads/stores of 16 bytes (VEC elements) with a scalar fallback
//   - deterministic block reductions (fixed tree, fixed order across warps)
//   - a per-device scratch workspace (grow-only) for the partial sums of ordered reductions
//   - the device-side record of a bad token id / target (no host synchronisation in an op)
// Everything runs on the legacy default stream, like the cuBLAS products in matmul.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/device/cuda_check.h"
#include "core/tensor/dtype.h"

namespace nsatron::cuda_detail {

using bf16_t = __nv_bfloat16;

// ---- element conversions ------------------------------------------------------------------
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16_t x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16_t from_f<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}

// Elements per 16-byte vector.
template <class T> constexpr int kVec = 16 / int(sizeof(T));

// V consecutive elements starting at p (V = 1, or kVec<T> with p 16-byte aligned).
template <class T, int V> __device__ __forceinline__ void load(const T* p, float (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = to_f(p[0]);
  } else {
    static_assert(V * sizeof(T) == 16, "vector loads are 16 bytes");
    union {
      uint4 u;
      T e[V];
    } r;
    r.u = *reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_f(r.e[i]);
  }
}
template <class T, int V> __device__ __forceinline__ void store(T* p, const float (&in)[V]) {
  if constexpr (V == 1) {
    p[0] = from_f<T>(in[0]);
  } else {
    static_assert(V * sizeof(T) == 16, "vector stores are 16 bytes");
    union {
      uint4 u;
      T e[V];
    } r;
#pragma unroll
    for (int i = 0; i < V; ++i) r.e[i] = from_f<T>(in[i]);
    *reinterpret_cast<uint4*>(p) = r.u;
  }
}

// V elements kept as stored (a 16-byte register vector when V = kVec<T>): rows cached in
// registers at half the registers of fp32 copies for bf16.
template <class T, int V> struct alignas(sizeof(T) * V) Packed {
  T e[V];
};
template <class T, int V> __device__ __forceinline__ Packed<T, V> load_packed(const T* p) {
  return *reinterpret_cast<const Packed<T, V>*>(p);
}
template <class T, int V> __device__ __forceinline__ void unpack(const Packed<T, V>& p, float (&out)[V]) {
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = to_f(p.e[i]);
}
template <class T, int V> __device__ __forceinline__ Packed<T, V> pack(const float (&in)[V]) {
  Packed<T, V> p;
#pragma unroll
  for (int i = 0; i < V; ++i) p.e[i] = from_f<T>(in[i]);
  return p;
}
template <class T, int V> __device__ __forceinline__ void store_packed(T* p, const Packed<T, V>& v) {
  *reinterpret_cast<Packed<T, V>*>(p) = v;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// ---- deterministic reductions ------------------------------------------------------------
template <class A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// The order is fixed by blockDim alone. `scratch` holds 32 values of A; the call ends with a
// barrier after the read, so the scratch may be reused by the next call.
template <class A> __device__ A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A total = lane < nwarps ? scratch[lane] : A(0);
  total = warp_sum(total);
  __syncthreads();
  return total;
}

// Threads for a row kernel over `units` work items per row: a multiple of 32 in [32, cap].
inline int row_threads(std::int64_t units, int cap = 256) {
  std::int64_t t = (units + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > cap) t = cap;
  return int(t);
}

inline void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": kernel launch failed: " +
                             cudaGetErrorString(e));
}

// Grid size for a grid-stride loop over `units` items with `threads` per block.
inline unsigned grid_for(std::int64_t units, int threads, std::int64_t max_blocks = 65536) {
  std::int64_t b = (units + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return unsigned(b);
}

namespace {  // kernels: internal to each translation unit that launches them
// g[c] += sum over chunks k of partial[k, c], summed in fp64: the second stage of the column
// reductions (dw of RMSNorm, the bias gradient), whose first stage writes one row of fp32
// partial sums per chunk of rows. A block of kChunkWarps warps owns 32 columns (lane =
// column: coalesced rows); warp w sums the chunks w, w + kChunkWarps, ... in order, then the
// warps' sums are added in warp order: a fixed order for the shape (deterministic). (One
// thread per column summing every chunk ran C / 256 blocks: 3 at C = 768, each thread 1024
// dependent-latency loads.)
constexpr int kChunkWarps = 32;
template <class G>
__global__ void __launch_bounds__(kChunkWarps * 32) column_chunks_to_grad(G* g, const float* __restrict__ partial,
                                                                          std::int64_t nchunks, std::int64_t C) {
  __shared__ double part[kChunkWarps][33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t c = blockIdx.x * std::int64_t(32) + lane;
  double s = 0.0;
  if (c < C)
    for (std::int64_t k = warp; k < nchunks; k += kChunkWarps) s += double(partial[k * C + c]);
  part[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && c < C) {
    double t = 0.0;
    for (int w = 0; w < kChunkWarps; ++w) t += part[w][lane];
    g[c] = from_f<G>(float(double(to_f(g[c])) + t));
  }
}
template <class G>
void launch_column_chunks_to_grad(G* g, const float* partial, std::int64_t nchunks, std::int64_t C) {
  if (C <= 0) return;
  column_chunks_to_grad<G><<<grid_for(C, 32, 1 << 30), kChunkWarps * 32>>>(g, partial, nchunks, C);
}
}  // namespace

// ---- scratch workspace -------------------------------------------------------------------
// A device buffer of at least `bytes`, owned per host thread and device, grown on demand.
// Ops use it between their own kernels on the default stream, so consecutive ops reuse it
// safely in stream order. Growing waits for the device before freeing the old buffer.
void* workspace(std::size_t bytes);

// ---- bad ids ------------------------------------------------------------------------------
// Kernels that take token ids or targets record the first bad one here (atomicCAS on
// `flag`), and produce NaN where the CPU would have thrown. cuda::check_id_errors() (declared
// in embedding.h and cross_entropy.h) reads the record, clears it and throws.
struct IdError {
  int flag;        // 0: none
  int op;          // which op (IdOp)
  long long position;
  long long value;
  long long limit; // the id range's end (vocabulary size / V); 0: not known (a negative id)
};
enum IdOp : int { kEmbeddingForward = 1, kEmbeddingBackward, kCrossEntropyForward,
                  kCrossEntropyBackward, kCrossEntropyFused, kCrossEntropySliceStats,
                  kCrossEntropySliceGrad };
IdError* id_error_slot();  // device memory, zeroed at first use

__device__ __forceinline__ void record_id_error(IdError* e, int op, long long pos, long long value,
                                                long long limit) {
  if (atomicCAS(&e->flag, 0, 1) == 0) {
    e->op = op;
    e->position = pos;
    e->value = value;
    e->limit = limit;
    __threadfence();
  }
}

// ---- dtype dispatch -----------------------------------------------------------------------
// Calls f(float{}) or f(bf16_t{}); fp64 has no CUDA path.
template <class F> void dispatch(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16_t{}); return;
    default:
      throw std::invalid_argument(std::string(op) +
                                  ": the CUDA path computes in fp32 or bf16, not fp64");
  }
}

}  // namespace nsatron::cuda_detail
