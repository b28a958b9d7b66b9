// CUDA token embedding (see embedding.h).
// Forward: a row copy per token (zeros outside the shard, NaN and a recorded error for an id
// outside the vocabulary).
// Backward, deterministic and free of float atomics: the positions are sorted by local row
// with a stable radix sort (CUB), so within each row they stay ascending; then the block that
// meets a run's first sorted position owns that table row (a block per column chunk) and adds
// its positions' gradients in ascending order (fp64 sums, one rounding into dW). No two blocks
// touch the same element.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "core/ops/cuda/common.cuh"
#include "core/ops/embedding.h"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

template <class T, int V>
__global__ void embedding_fwd_kernel(T* __restrict__ out, const std::int32_t* __restrict__ tokens,
                                     const T* __restrict__ table, std::int64_t V_rows,
                                     std::int64_t C, std::int64_t vocab_start,
                                     std::int64_t vocab_size, IdError* err) {
  const std::int64_t n = blockIdx.x;
  const std::int64_t c = (std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V;
  if (c >= C) return;
  const std::int64_t t = tokens[n];
  float v[V];
  if (t < 0 || t >= vocab_size) {
    if (c == 0) record_id_error(err, kEmbeddingForward, n, t, vocab_size);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = __int_as_float(0x7fc00000);  // NaN
  } else if (t - vocab_start < 0 || t - vocab_start >= V_rows) {
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = 0.f;
  } else {
    load<T, V>(table + (t - vocab_start) * C + c, v);
  }
  store<T, V>(out + n * C + c, v);
}

// key = local row, or V_rows for "no gradient" (outside the shard, or a bad id).
__global__ void embedding_keys_kernel(unsigned* __restrict__ keys, unsigned* __restrict__ vals,
                                      const std::int32_t* __restrict__ tokens, std::int64_t N,
                                      std::int64_t V_rows, std::int64_t vocab_start,
                                      std::int64_t vocab_size, IdError* err) {
  const std::int64_t n = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const std::int64_t t = tokens[n];
  std::int64_t key = V_rows;
  if (t < 0 || t >= vocab_size)
    record_id_error(err, kEmbeddingBackward, n, t, vocab_size);
  else if (t - vocab_start >= 0 && t - vocab_start < V_rows)
    key = t - vocab_start;
  keys[n] = unsigned(key);
  vals[n] = unsigned(n);
}

// Blocks (x, y) take the sorted positions i = x, x + gridDim.x, ...; where i starts a run of
// equal keys (a table row), the block sums the run into the row's columns [y * blockDim.x, ...),
// one thread per column, the positions in ascending order. A frequent token's run can hold
// thousands of positions (the KJV text's byte ' ': ~6000 of 32768) and its time is the run's
// length in load latencies, so the run's positions are staged in shared memory by the whole
// block (coalesced) kStagedPositions at a time, and each thread issues the loads of
// kAccumulateAhead positions before their adds (the adds keep their order). The run's end: an
// exponential then a binary search (the keys ascend), a few loads for a short run. Every thread
// of a block sees the same positions and runs, so the barriers are uniform. A block per
// position (the former grid) spent most of its time launching blocks that return at once.
constexpr int kAccumulateAhead = 32;
constexpr int kAccumulateColumns = 128;   // threads (columns) per block
constexpr int kStagedPositions = 1024;    // 4 KB of shared memory
constexpr std::int64_t kRunBlocks = 4096; // grid.x: positions are taken round robin
template <class T, class G>
__global__ void embedding_accumulate_kernel(G* dtable, const T* __restrict__ dout,
                                            const unsigned* __restrict__ keys,
                                            const unsigned* __restrict__ pos, std::int64_t N,
                                            std::int64_t V_rows, std::int64_t C) {
  __shared__ unsigned staged[kStagedPositions];
  const std::int64_t c = std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const bool active = c < C;
  for (std::int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const unsigned key = keys[i];
    if (key >= V_rows || (i > 0 && keys[i - 1] == key)) continue;  // not a run's start
    std::int64_t step = 1, lo = i + 1, hi = i + 1;  // keys[lo - 1] == key; find the first past the run
    while (hi < N && keys[hi] == key) {
      lo = hi + 1;
      hi = i + (step <<= 1);
    }
    if (hi > N) hi = N;
    while (lo < hi) {
      const std::int64_t mid = (lo + hi) >> 1;
      if (keys[mid] == key) lo = mid + 1;
      else hi = mid;
    }
    const std::int64_t end = lo;
    G* row = dtable + std::int64_t(key) * C;
    double acc = active ? double(to_f(row[c])) : 0.0;
    for (std::int64_t s = i; s < end; s += kStagedPositions) {
      const int count = int(end - s < kStagedPositions ? end - s : kStagedPositions);
      __syncthreads();  // the previous stage's positions are read
      for (int t = threadIdx.x; t < count; t += blockDim.x) staged[t] = pos[s + t];
      __syncthreads();
      if (!active) continue;
      int j = 0;
      for (; j + kAccumulateAhead <= count; j += kAccumulateAhead) {
        float v[kAccumulateAhead];
#pragma unroll
        for (int u = 0; u < kAccumulateAhead; ++u) v[u] = to_f(dout[std::int64_t(staged[j + u]) * C + c]);
#pragma unroll
        for (int u = 0; u < kAccumulateAhead; ++u) acc += double(v[u]);
      }
      for (; j < count; ++j) acc += double(to_f(dout[std::int64_t(staged[j]) * C + c]));
    }
    if (active) row[c] = from_f<G>(float(acc));
  }
}

int bits_for(std::int64_t v) {  // bits to hold 0..v
  int b = 1;
  while (b < 32 && (std::int64_t(1) << b) <= v) ++b;
  return b;
}

std::size_t round256(std::size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

void embedding_forward(DType dt, void* out, const std::int32_t* tokens, const void* table,
                       std::int64_t N, std::int64_t V, std::int64_t C, std::int64_t vocab_start,
                       std::int64_t vocab_size) {
  if (N == 0 || C == 0) return;
  IdError* err = id_error_slot();
  dispatch(dt, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    const T* tab = static_cast<const T*>(table);
    constexpr int VV = kVec<T>;
    const bool vec = C % VV == 0 && aligned16(o) && aligned16(tab);
    const std::int64_t units = vec ? C / VV : C;
    const int threads = row_threads(units);
    const std::int64_t cols = (units + threads - 1) / threads;
    if (N > 0x7fffffff || cols > 65535)
      throw std::invalid_argument("embedding_forward (cuda): too many tokens or columns");
    const dim3 grid = dim3(unsigned(N), unsigned(cols));
    if (vec)
      embedding_fwd_kernel<T, VV><<<grid, threads>>>(o, tokens, tab, V, C, vocab_start,
                                                     vocab_size, err);
    else
      embedding_fwd_kernel<T, 1><<<grid, threads>>>(o, tokens, tab, V, C, vocab_start, vocab_size,
                                                    err);
    check_launch("embedding_forward");
  });
}

void embedding_backward(DType dt, DType dtable_dt, void* dtable, const std::int32_t* tokens,
                        const void* dout, std::int64_t N, std::int64_t V, std::int64_t C,
                        std::int64_t vocab_start, std::int64_t vocab_size) {
  if (N == 0 || C == 0 || V == 0) return;
  if (N > 0x7fffffff || V >= 0x7fffffff)
    throw std::invalid_argument("embedding_backward (cuda): too many tokens or table rows");
  IdError* err = id_error_slot();
  // Scratch: keys and positions, in and sorted, then CUB's own temporary storage.
  const int end_bit = bits_for(V);
  std::size_t cub_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, (const unsigned*)nullptr,
                                             (unsigned*)nullptr, (const unsigned*)nullptr,
                                             (unsigned*)nullptr, int(N), 0, end_bit));
  const std::size_t arr = round256(std::size_t(N) * sizeof(unsigned));
  char* ws = static_cast<char*>(workspace(4 * arr + round256(cub_bytes)));
  unsigned* keys_in = reinterpret_cast<unsigned*>(ws);
  unsigned* vals_in = reinterpret_cast<unsigned*>(ws + arr);
  unsigned* keys = reinterpret_cast<unsigned*>(ws + 2 * arr);
  unsigned* pos = reinterpret_cast<unsigned*>(ws + 3 * arr);
  void* cub_tmp = ws + 4 * arr;
  embedding_keys_kernel<<<grid_for(N, 256, 1 << 30), 256>>>(keys_in, vals_in, tokens, N, V,
                                                            vocab_start, vocab_size, err);
  check_launch("embedding_backward (keys)");
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, keys_in, keys, vals_in, pos,
                                             int(N), 0, end_bit));
  dispatch(dt, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch(dtable_dt, "embedding_backward (dtable)", [&](auto gtag) {
      using G = decltype(gtag);
      const int threads = int(std::min<std::int64_t>(kAccumulateColumns, (C + 31) / 32 * 32));
      const std::int64_t col_blocks = (C + threads - 1) / threads;
      if (col_blocks > 65535) throw std::invalid_argument("embedding_backward (cuda): too many columns");
      const unsigned run_blocks = unsigned(std::min<std::int64_t>(N, kRunBlocks));
      embedding_accumulate_kernel<T, G><<<dim3(run_blocks, unsigned(col_blocks)), threads>>>(
          static_cast<G*>(dtable), static_cast<const T*>(dout), keys, pos, N, V, C);
      check_launch("embedding_backward");
    });
  });
}

}  // namespace nsatron::cuda
