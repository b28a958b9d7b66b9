// CUDA token embedding (see embedding.h).
// Forward: a row copy per token (zeros outside the shard, NaN and a recorded error for an id
// outside the vocabulary).
// Backward, deterministic and free of float atomics: the positions are sorted by local row
// with a stable radix sort (CUB), so within each row they stay ascending; then the pieces of
// embedding.h are summed in parallel (a block per chunk of kEmbeddingGradPiece sorted positions
// and column block) and a row cut by the chunks' edges has its pieces joined in order by a
// second kernel (fp64 sums, one rounding into dW): the CPU's bits.
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

// The pieces of embedding.h: block (x, y) takes the sorted positions of chunk x,
// [x kPiece, (x + 1) kPiece), and the columns [y * blockDim.x, ...), one thread per column.
// Its keys and positions are staged in shared memory; each run of equal keys in it (a row's
// piece) is summed in fp64 from zero, each thread issuing kAccumulateAhead loads before their
// adds (the adds keep their order). A piece that is its row's whole run is added to the row at
// once; a row cut by the chunk's edges leaves its piece in `pieces` [chunks, 2, C]: slot 1 the
// row's first piece (it starts in this chunk), slot 0 a later one (the chunk's first piece),
// for embedding_join_kernel. No two blocks write the same element.
constexpr int kAccumulateAhead = 32;
constexpr int kAccumulateColumns = 128;  // threads (columns) per block
constexpr int kPiece = int(kEmbeddingGradPiece);
template <class T, class G>
__global__ void embedding_pieces_kernel(G* dtable, double* __restrict__ pieces, const T* __restrict__ dout,
                                        const unsigned* __restrict__ keys, const unsigned* __restrict__ pos,
                                        std::int64_t N, std::int64_t V_rows, std::int64_t C) {
  __shared__ unsigned staged_keys[kPiece], staged_pos[kPiece];
  const std::int64_t c = std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const std::int64_t i0 = std::int64_t(blockIdx.x) * kPiece;
  const int count = int(N - i0 < kPiece ? N - i0 : kPiece);
  for (int t = threadIdx.x; t < count; t += blockDim.x) {
    staged_keys[t] = keys[i0 + t];
    staged_pos[t] = pos[i0 + t];
  }
  __syncthreads();
  if (c >= C) return;
  for (int a = 0; a < count;) {
    const unsigned key = staged_keys[a];
    if (key >= V_rows) break;  // the positions outside the shard sort last
    int b = a + 1;
    while (b < count && staged_keys[b] == key) ++b;
    double piece = 0.0;
    int j = a;
    for (; j + kAccumulateAhead <= b; j += kAccumulateAhead) {
      float v[kAccumulateAhead];
#pragma unroll
      for (int u = 0; u < kAccumulateAhead; ++u) v[u] = to_f(dout[std::int64_t(staged_pos[j + u]) * C + c]);
#pragma unroll
      for (int u = 0; u < kAccumulateAhead; ++u) piece += double(v[u]);
    }
    for (; j < b; ++j) piece += double(to_f(dout[std::int64_t(staged_pos[j]) * C + c]));
    const bool starts = a > 0 || i0 == 0 || keys[i0 - 1] != key;
    const bool ends = b < count || i0 + b >= N || keys[i0 + b] != key;
    if (starts && ends) {
      G* row = dtable + std::int64_t(key) * C;
      row[c] = from_f<G>(float(double(to_f(row[c])) + piece));
    } else {
      pieces[(std::int64_t(blockIdx.x) * 2 + (starts ? 1 : 0)) * C + c] = piece;
    }
    a = b;
  }
}

// Block (x, y): if chunk x holds the first piece of a row that runs on into chunk x + 1, the
// row's pieces added in order (slot 1 of chunk x, then slot 0 of each next chunk the row
// reaches) to the row, one rounding.
template <class G>
__global__ void embedding_join_kernel(G* dtable, const double* __restrict__ pieces,
                                      const unsigned* __restrict__ keys, std::int64_t N, std::int64_t V_rows,
                                      std::int64_t C) {
  const std::int64_t c = std::int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const std::int64_t x = blockIdx.x, next = (x + 1) * kPiece;
  if (c >= C || next >= N) return;
  const unsigned key = keys[next - 1];
  if (key >= V_rows || keys[next] != key || (x > 0 && keys[x * kPiece - 1] == key)) return;
  G* row = dtable + std::int64_t(key) * C;
  double acc = double(to_f(row[c])) + pieces[(x * 2 + 1) * C + c];
  for (std::int64_t m = x + 1;; ++m) {
    acc += pieces[(m * 2) * C + c];
    if ((m + 1) * kPiece >= N || keys[(m + 1) * kPiece] != key) break;
  }
  row[c] = from_f<G>(float(acc));
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
  const std::int64_t chunks = (N + kPiece - 1) / kPiece;
  const std::size_t pieces_bytes = round256(std::size_t(chunks) * 2 * std::size_t(C) * sizeof(double));
  char* ws = static_cast<char*>(workspace(4 * arr + pieces_bytes + round256(cub_bytes)));
  unsigned* keys_in = reinterpret_cast<unsigned*>(ws);
  unsigned* vals_in = reinterpret_cast<unsigned*>(ws + arr);
  unsigned* keys = reinterpret_cast<unsigned*>(ws + 2 * arr);
  unsigned* pos = reinterpret_cast<unsigned*>(ws + 3 * arr);
  double* pieces = reinterpret_cast<double*>(ws + 4 * arr);
  void* cub_tmp = ws + 4 * arr + pieces_bytes;
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
      if (chunks > 0x7fffffff) throw std::invalid_argument("embedding_backward (cuda): too many tokens");
      const dim3 grid{unsigned(chunks), unsigned(col_blocks)};
      embedding_pieces_kernel<T, G><<<grid, threads>>>(static_cast<G*>(dtable), pieces,
                                                       static_cast<const T*>(dout), keys, pos, N, V, C);
      check_launch("embedding_backward (pieces)");
      embedding_join_kernel<G><<<grid, threads>>>(static_cast<G*>(dtable), pieces, keys, N, V, C);
      check_launch("embedding_backward (join)");
    });
  });
}

}  // namespace nsatron::cuda
