// CUDA softmax cross entropy (see cross_entropy.h). One block per row works through the
// vocabulary in 16-byte pieces: pass 1 keeps a running (max, sum of exponentials) per thread
// (an online softmax by pieces, fp32), merged across the block in a fixed tree; pass 2
// (backward and fused) re-reads the row and writes dz = scale (exp(z - lse) - onehot) over
// it, in place when asked. Logits stay in their dtype (bf16 or fp32); nothing of size [N, V]
// is allocated.
// The fused pass keeps its row in shared memory where it fits (the row's bytes within the
// device's opt-in limit of a block, 16-byte pieces): each thread copies its own pieces there
// with cp.async, all at once, and both passes read them back, so the row crosses DRAM once
// each way instead of being read twice (2 R V e bytes, not 3). Each thread reads only the
// pieces it copied, in the same order as from global memory: the same bits either way.
// The loss: each row's lse - z_t is kept in fp64 scratch [N], then one block sums the rows
// in a fixed order and divides by D. D (the number of counted targets, unless the caller
// gives it) is counted on the device, so nothing waits for the host.
// The forward and the fused pass run the same code for lse and the row loss, and the
// backward reads the same fp32 lse, so fused and unfused give the same bits.
// The vocabulary-slice ops (the vocab-parallel cross entropy) are two one-block-per-row
// kernels, the slice's own (max, sum) by pass 1's online softmax with the target's logit, and
// the loss and the gradient in place, with a one-thread-per-row combination of the ranks'
// statistics between them. Their row results are fp64.
#include <cmath>
#include <type_traits>

#include "core/device/device.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/cuda/common.cuh"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

enum Mode { kForward = 0, kBackward = 1, kFused = 2 };

struct MaxSum {
  float m, s;  // running max and sum of exp(z - m)
};
// The arithmetic of lse and of the gradient is spelled out with _rn intrinsics, which the
// compiler never contracts into FMAs on its own: the forward, backward and fused kernels are
// separate instantiations, and they must round identically (same bits fused and unfused).
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, __fadd_rn(__fmul_rn(a.s, expf(__fsub_rn(a.m, m))),
                       __fmul_rn(b.s, expf(__fsub_rn(b.m, m))))};
}
// A piece of V logits into the running (max, sum): the piece's max first, the sum rescaled at
// most once per piece, then the piece's exponentials added in order (one branch per piece,
// not per logit). Exponentials here and in the gradient by __expf (ex2.approx of x log2 e):
// its arguments are <= 0, where its error is a few ulp near 0 and grows with |x| only for
// terms too small to show in the sum. fmaxf skips NaN: a NaN logit reaches the sum through
// its own exponential, or directly in a piece otherwise all -inf.
template <int V> __device__ __forceinline__ void push_piece(MaxSum& st, const float (&z)[V]) {
  float m = z[0];
#pragma unroll
  for (int i = 1; i < V; ++i) m = fmaxf(m, z[i]);
  if (m == -INFINITY) {  // nothing to add, unless a NaN hid among the -inf
    bool nan = false;
#pragma unroll
    for (int i = 0; i < V; ++i) nan |= z[i] != z[i];
    if (nan) st.s = __int_as_float(0x7fc00000);
    return;
  }
  if (m > st.m) {
    st.s = __fmul_rn(st.s, __expf(__fsub_rn(st.m, m)));  // st.m = -inf at first: 0 * 0
    st.m = m;
  }
  float add = 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) add = __fadd_rn(add, __expf(__fsub_rn(z[i], st.m)));
  st.s = __fadd_rn(st.s, add);
}

// Deterministic block merge (fixed tree), result in every thread.
__device__ MaxSum block_merge(MaxSum v, MaxSum* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = merge(v, other);
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  MaxSum t = lane < nwarps ? scratch[lane] : MaxSum{-INFINITY, 0.f};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, t.m, o), __shfl_xor_sync(0xffffffffu, t.s, o)};
    t = merge(t, other);
  }
  __syncthreads();
  return t;
}

// Pass 1 over a row of `cols` logits at `row`: each thread's pieces (V logits, `first` = its
// first column, then a block's width apart) into a running (max, sum), merged over the block.
// The fused kernel and the vocabulary slices' statistics share it.
template <class T, int V>
__device__ __forceinline__ MaxSum row_max_sum(const T* row, int cols, MaxSum* red) {
  const int step = int(blockDim.x) * V;
  MaxSum st{-INFINITY, 0.f};
  for (int c = int(threadIdx.x) * V; c < cols; c += step) {
    float zv[V];
    load<T, V>(row + c, zv);
    push_piece(st, zv);
  }
  return block_merge(st, red);
}

__device__ __forceinline__ double denominator(double host, const double* dev) {
  return dev ? *dev : host;
}

// Copies 16 bytes from global to shared memory without passing through registers (sm_80+).
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// CACHED (the fused mode with 16-byte pieces only): the row is staged in dynamic shared memory
// of Vn elements, each thread's pieces at their column.
template <class T, int V, int MODE, bool CACHED = false>
__global__ void ce_row_kernel(T* dz, const T* z, float* lse_io, double* __restrict__ row_loss,
                              const std::int32_t* __restrict__ targets, std::int64_t Vn,
                              std::int32_t ignore_index, double dloss, double denom_host,
                              const double* denom_dev, IdError* err) {
  static_assert(!CACHED || (MODE == kFused && V == kVec<T>), "only the fused pass caches its row");
  __shared__ MaxSum red[32];
  extern __shared__ uint4 row_cache[];  // CACHED: the row, Vn elements
  const std::int64_t n = blockIdx.x;
  const T* z_row = z + n * Vn;
  T* dz_row = dz + (MODE == kForward ? 0 : n * Vn);
  // Where both passes read the row: the staged copy, or the logits themselves.
  const T* src_row = CACHED ? reinterpret_cast<const T*>(row_cache) : z_row;
  // Columns in 32 bits (launch_per_row: Vn < 2^31), cheaper than 64-bit ones per piece.
  const int cols = int(Vn), step = int(blockDim.x) * V, first = int(threadIdx.x) * V;
  const std::int32_t t = targets[n];
  const bool ignored = t == ignore_index;
  const bool bad = !ignored && (t < 0 || t >= cols);
  if (bad && threadIdx.x == 0) {
    const int op = MODE == kForward ? kCrossEntropyForward
                                    : (MODE == kBackward ? kCrossEntropyBackward : kCrossEntropyFused);
    record_id_error(err, op, n, t, Vn);
  }
  float lse = 0.f;
  if (MODE == kBackward) {
    lse = lse_io[n];
  } else if (MODE == kForward || !ignored) {
    if constexpr (CACHED) {
      for (int c = first; c < cols; c += step)
        copy16_async(reinterpret_cast<T*>(row_cache) + c, z_row + c);
      wait_copies();  // this thread's own pieces: no barrier needed before it reads them
    }
    const MaxSum st = row_max_sum<T, V>(src_row, cols, red);
    lse = st.m == -INFINITY ? st.m : __fadd_rn(st.m, logf(st.s));
    if (threadIdx.x == 0) {
      if (MODE == kForward) lse_io[n] = lse;
      // z_t is read here, before pass 2 may overwrite it (the barrier below orders them).
      row_loss[n] = ignored ? 0.0 : (bad ? double(NAN) : double(lse) - double(to_f(z_row[t])));
    }
    __syncthreads();
  } else if (threadIdx.x == 0) {
    row_loss[n] = 0.0;  // fused, ignored row: the scratch holds whatever the last op left there
  }
  if (MODE == kForward) return;
  const double d = denominator(denom_host, denom_dev);
  const float scale = (ignored || !(d > 0)) ? 0.f : float(dloss / d);
  const float fill = bad ? __int_as_float(0x7fc00000) : 0.f;
  for (int c = first; c < cols; c += step) {
    float zv[V], g[V];
    if (ignored || bad) {
#pragma unroll
      for (int i = 0; i < V; ++i) g[i] = fill;
    } else {
      load<T, V>(src_row + c, zv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float p = __expf(__fsub_rn(zv[i], lse));
        g[i] = __fmul_rn(scale, c + i == t ? __fsub_rn(p, 1.f) : p);
      }
    }
    store<T, V>(dz_row + c, g);  // dz may be z: this thread read these elements above
  }
}

// Non-ignored targets -> *out (as a double). One block; integer counts, so exact.
__global__ void count_targets_kernel(double* out, const std::int32_t* __restrict__ targets,
                                     std::int64_t N, std::int32_t ignore_index) {
  __shared__ unsigned long long red[32];
  unsigned long long c = 0;
  for (std::int64_t n = threadIdx.x; n < N; n += blockDim.x) c += targets[n] != ignore_index;
  c = block_sum(c, red);
  if (threadIdx.x == 0) *out = double(c);
}

// loss (=|+=) sum_n row_loss[n] / D, the rows summed in a fixed order in fp64; loss fp32
// (the cross entropy's) or fp64 (a vocab-parallel running total).
template <class L>
__global__ void ce_finalize_kernel(L* loss, const double* __restrict__ row_loss,
                                   std::int64_t N, double denom_host, const double* denom_dev,
                                   bool accumulate) {
  __shared__ double red[32];
  double s = 0.0;
  for (std::int64_t n = threadIdx.x; n < N; n += blockDim.x) s += row_loss[n];
  s = block_sum(s, red);
  if (threadIdx.x == 0) {
    const double d = denominator(denom_host, denom_dev);
    const double value = d > 0 ? s / d : 0.0;
    *loss = accumulate ? L(double(*loss) + value) : L(value);
  }
}

struct Scratch {
  double* row_loss = nullptr;
  double* denom = nullptr;  // null: the caller's denominator
};
Scratch scratch(std::int64_t N, bool count) {
  const std::size_t rows = (std::size_t(N) * sizeof(double) + 255) / 256 * 256;
  char* ws = static_cast<char*>(workspace(rows + 256));
  return {reinterpret_cast<double*>(ws), count ? reinterpret_cast<double*>(ws + rows) : nullptr};
}

// Launches one block per row through launch(std::integral_constant<int, VEC>, threads): VEC =
// kVec<T> (16-byte pieces) when `aligned` (the rows' data is 16-byte aligned) and V is a
// multiple of it, else 1 (element by element).
template <class T, class F>
void launch_per_row(bool aligned, std::int64_t N, std::int64_t V, const char* what, F&& launch) {
  if (N > 0x7fffffff) throw std::invalid_argument(std::string(what) + " (cuda): too many rows");
  if (V > 0x7fffffff - 1024 * kVec<T>)
    throw std::invalid_argument(std::string(what) + " (cuda): vocabulary too wide");
  if (N == 0) return;
  if (aligned && V % kVec<T> == 0)
    launch(std::integral_constant<int, kVec<T>>{}, row_threads(V / kVec<T>, 512));
  else
    launch(std::integral_constant<int, 1>{}, row_threads(V, 512));
  check_launch(what);
}

// The current device's opt-in shared memory of one block, bytes, less the kernel's static
// reduction scratch.
std::size_t row_cache_limit() {
  return std::size_t(cuda_block_shared_memory_optin_bytes()) - sizeof(MaxSum) * 32;
}

template <class T, int MODE>
void launch_rows(T* dz, const T* z, float* lse, double* row_loss, const std::int32_t* targets,
                 std::int64_t N, std::int64_t V, std::int32_t ignore_index, double dloss,
                 double denom_host, const double* denom_dev, const char* what) {
  IdError* err = id_error_slot();
  launch_per_row<T>(aligned16(z) && aligned16(dz ? dz : z), N, V, what, [&](auto vec, int threads) {
    constexpr int kPiece = decltype(vec)::value;
    const std::size_t row_bytes = std::size_t(V) * sizeof(T);
    if constexpr (MODE == kFused && kPiece == kVec<T>) {
      if (row_bytes <= row_cache_limit()) {
        auto kernel = ce_row_kernel<T, kPiece, MODE, true>;
        // Set per launch to this row's bytes: one host thread drives a device here (two that
        // shared one could lower it under each other's launch).
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(row_bytes)));
        kernel<<<unsigned(N), threads, row_bytes>>>(dz, z, lse, row_loss, targets, V, ignore_index,
                                                    dloss, denom_host, denom_dev, err);
        return;
      }
    }
    ce_row_kernel<T, kPiece, MODE><<<unsigned(N), threads>>>(
        dz, z, lse, row_loss, targets, V, ignore_index, dloss, denom_host, denom_dev, err);
  });
}

// ---- vocabulary slices (cross_entropy.h) ------------------------------------------------
// One block per row, the row in 16-byte pieces where the width and the pointer allow.

__device__ __forceinline__ bool bad_target(std::int32_t t, std::int32_t ignore_index,
                                           std::int64_t vocab_size) {
  return t != ignore_index && (t < 0 || (vocab_size > 0 && std::int64_t(t) >= vocab_size));
}

// stats[n], stats[N + n] = this slice's (m_rn, s_rn): the fused kernel's pass 1 (row_max_sum)
// over the slice; stats[2N + n] = the target's logit if this slice holds it.
template <class T, int V>
__global__ void slice_stats_kernel(double* __restrict__ stats, const T* __restrict__ z,
                                   const std::int32_t* __restrict__ targets, std::int64_t N,
                                   std::int64_t Vn, std::int64_t vocab_start,
                                   std::int32_t ignore_index, std::int64_t vocab_size, IdError* err) {
  __shared__ MaxSum red[32];
  const std::int64_t n = blockIdx.x;
  const T* z_row = z + n * Vn;
  const MaxSum st = row_max_sum<T, V>(z_row, int(Vn), red);
  if (threadIdx.x == 0) {
    const std::int32_t t = targets[n];
    stats[n] = double(st.m);
    if (bad_target(t, ignore_index, vocab_size)) {
      record_id_error(err, kCrossEntropySliceStats, n, t, vocab_size);
      stats[N + n] = stats[2 * N + n] = double(NAN);
      return;
    }
    const std::int64_t col = t == ignore_index ? -1 : std::int64_t(t) - vocab_start;
    stats[N + n] = double(st.s);
    stats[2 * N + n] = col >= 0 && col < Vn ? double(to_f(z_row[col])) : 0.0;
  }
}

// One thread per row: the slices' statistics, laid end to end, combined in slice order (the
// CPU's arithmetic in the CPU's order).
__global__ void slice_combine_kernel(double* __restrict__ row_max, double* __restrict__ sums,
                                     const double* __restrict__ gathered, std::int64_t N,
                                     std::int64_t parts) {
  const std::int64_t n = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  double m = -INFINITY;
  for (std::int64_t r = 0; r < parts; ++r) m = fmax(m, gathered[r * 3 * N + n]);
  double s = 0.0, zt = 0.0;
  for (std::int64_t r = 0; r < parts; ++r) {
    const double* part = gathered + r * 3 * N;
    if (part[n] != -INFINITY) s = __dadd_rn(s, __dmul_rn(part[N + n], exp(part[n] - m)));
    zt += part[2 * N + n];
  }
  row_max[n] = m;
  sums[n] = s;
  sums[N + n] = zt;
}

// row_loss[n] = log s_n + m_n - zt_n (fp64); z <- scale (exp(z - m_n) / s_n - onehot) in fp32,
// in place (each thread rewrites the elements it read).
template <class T, int V>
__global__ void slice_grad_kernel(T* z, double* __restrict__ row_loss,
                                  const std::int32_t* __restrict__ targets, std::int64_t N,
                                  std::int64_t Vn, std::int64_t vocab_start,
                                  std::int32_t ignore_index, const double* __restrict__ row_max,
                                  const double* __restrict__ sums, float scale, IdError* err) {
  const std::int64_t n = blockIdx.x;
  const std::int64_t base = n * Vn;
  const std::int64_t step = std::int64_t(blockDim.x) * V;
  const std::int32_t t = targets[n];
  const bool ignored = t == ignore_index;
  const bool bad = bad_target(t, ignore_index, 0);
  const double md = row_max[n], s = sums[n];
  if (threadIdx.x == 0) {
    if (bad) record_id_error(err, kCrossEntropySliceGrad, n, t, 0);
    row_loss[n] = ignored ? 0.0 : (bad ? double(NAN) : log(s) + md - sums[N + n]);
  }
  const float m = float(md);
  const float inv_s = float(1.0 / s);
  const std::int64_t col = (ignored || bad) ? -1 : std::int64_t(t) - vocab_start;
  const float fill = bad ? __int_as_float(0x7fc00000) : 0.f;
  for (std::int64_t c = std::int64_t(threadIdx.x) * V; c < Vn; c += step) {
    float zv[V], g[V];
    if (ignored || bad) {
#pragma unroll
      for (int i = 0; i < V; ++i) g[i] = fill;
    } else {
      load<T, V>(z + base + c, zv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float p = __fmul_rn(__expf(__fsub_rn(zv[i], m)), inv_s);
        g[i] = __fmul_rn(scale, c + i == col ? __fsub_rn(p, 1.f) : p);
      }
    }
    store<T, V>(z + base + c, g);
  }
}

}  // namespace

void cross_entropy_slice_stats(DType dt, double* stats, const void* logits,
                               const std::int32_t* targets, std::int64_t N, std::int64_t V,
                               std::int64_t vocab_start, std::int32_t ignore_index,
                               std::int64_t vocab_size) {
  const char* what = "cross_entropy_slice_stats";
  IdError* err = id_error_slot();
  dispatch(dt, what, [&](auto tag) {
    using T = decltype(tag);
    const T* z = static_cast<const T*>(logits);
    launch_per_row<T>(aligned16(z), N, V, what, [&](auto vec, int threads) {
      slice_stats_kernel<T, decltype(vec)::value><<<unsigned(N), threads>>>(
          stats, z, targets, N, V, vocab_start, ignore_index, vocab_size, err);
    });
  });
}

void cross_entropy_slice_combine(double* row_max, double* sums, const double* gathered,
                                 std::int64_t N, std::int64_t parts) {
  if (N == 0) return;
  const int threads = 256;
  slice_combine_kernel<<<unsigned((N + threads - 1) / threads), threads>>>(row_max, sums, gathered,
                                                                          N, parts);
  check_launch("cross_entropy_slice_combine");
}

void cross_entropy_slice_grad(DType dt, void* logits, double* row_loss,
                              const std::int32_t* targets, std::int64_t N, std::int64_t V,
                              std::int64_t vocab_start, std::int32_t ignore_index,
                              const double* row_max, const double* sums, double scale) {
  const char* what = "cross_entropy_slice_grad";
  IdError* err = id_error_slot();
  dispatch(dt, what, [&](auto tag) {
    using T = decltype(tag);
    T* z = static_cast<T*>(logits);
    launch_per_row<T>(aligned16(z), N, V, what, [&](auto vec, int threads) {
      slice_grad_kernel<T, decltype(vec)::value><<<unsigned(N), threads>>>(
          z, row_loss, targets, N, V, vocab_start, ignore_index, row_max, sums, float(scale), err);
    });
  });
}

void cross_entropy_forward(DType dt, float* loss, float* lse, const void* logits,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int32_t ignore_index, double denominator, bool accumulate_loss) {
  const bool count = !(denominator > 0);
  const Scratch s = scratch(N, count);
  if (N > 0) {
    dispatch(dt, "cross_entropy_forward", [&](auto tag) {
      using T = decltype(tag);
      launch_rows<T, kForward>(nullptr, static_cast<const T*>(logits), lse, s.row_loss, targets, N,
                               V, ignore_index, 0.0, denominator, nullptr,
                               "cross_entropy_forward");
    });
    if (count) {
      count_targets_kernel<<<1, 1024>>>(s.denom, targets, N, ignore_index);
      check_launch("cross_entropy_forward (count)");
    }
  }
  ce_finalize_kernel<<<1, 1024>>>(loss, s.row_loss, N, denominator, N > 0 ? s.denom : nullptr,
                                  accumulate_loss);
  check_launch("cross_entropy_forward (loss)");
}

void cross_entropy_backward(DType dt, void* dlogits, const void* logits, const float* lse,
                            const std::int32_t* targets, std::int64_t N, std::int64_t V,
                            std::int32_t ignore_index, double dloss, double denominator) {
  if (N == 0) return;
  const bool count = !(denominator > 0);
  const Scratch s = scratch(N, count);
  if (count) {
    count_targets_kernel<<<1, 1024>>>(s.denom, targets, N, ignore_index);
    check_launch("cross_entropy_backward (count)");
  }
  dispatch(dt, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_rows<T, kBackward>(static_cast<T*>(dlogits), static_cast<const T*>(logits),
                              const_cast<float*>(lse), nullptr, targets, N, V, ignore_index, dloss,
                              denominator, s.denom, "cross_entropy_backward");
  });
}

void cross_entropy_fused(DType dt, void* logits, float* loss, const std::int32_t* targets,
                         std::int64_t N, std::int64_t V, std::int32_t ignore_index, double dloss,
                         double denominator, bool accumulate_loss) {
  const bool count = !(denominator > 0);
  const Scratch s = scratch(N, count);
  if (N > 0) {
    if (count) {
      count_targets_kernel<<<1, 1024>>>(s.denom, targets, N, ignore_index);
      check_launch("cross_entropy_fused (count)");
    }
    dispatch(dt, "cross_entropy_fused", [&](auto tag) {
      using T = decltype(tag);
      launch_rows<T, kFused>(static_cast<T*>(logits), static_cast<const T*>(logits), nullptr,
                             s.row_loss, targets, N, V, ignore_index, dloss, denominator, s.denom,
                             "cross_entropy_fused");
    });
  }
  ce_finalize_kernel<<<1, 1024>>>(loss, s.row_loss, N, denominator, N > 0 ? s.denom : nullptr,
                                  accumulate_loss);
  check_launch("cross_entropy_fused (loss)");
}

void cross_entropy_slice_loss(double* loss, const double* row_loss, std::int64_t N, double denominator) {
  ce_finalize_kernel<<<1, 1024>>>(loss, row_loss, N, denominator, nullptr, true);
  check_launch("cross_entropy_slice_loss");
}

}  // namespace nsatron::cuda
