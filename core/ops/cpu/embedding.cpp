// CPU token embedding. The backward groups the token positions by id (a counting sort,
// stable, so positions stay ascending within each id: the sorted order of embedding.h) and
// then gives each table row to one thread, which sums its pieces as embedding.h defines: no
// races, same bits for any thread count.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/ops/embedding.h"

namespace nsatron::cpu {

void check_token_ids(const std::int32_t* tokens, std::int64_t N, std::int64_t vocab_size,
                     const char* what) {
  for (std::int64_t n = 0; n < N; ++n) {
    if (tokens[n] < 0 || tokens[n] >= vocab_size)
      throw std::invalid_argument(std::string(what) + ": token id " + std::to_string(tokens[n]) +
                                  " at position " + std::to_string(n) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                  ")");
  }
}

template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* table, std::int64_t N,
                       std::int64_t V, std::int64_t C, std::int64_t vocab_start,
                       std::int64_t vocab_size) {
  check_token_ids(tokens, N, vocab_size, "embedding_forward");
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t v = std::int64_t(tokens[n]) - vocab_start;
    T* o = out + n * C;
    if (v < 0 || v >= V) {
      for (std::int64_t c = 0; c < C; ++c) o[c] = T(0);
    } else {
      const T* row = table + v * C;
      for (std::int64_t c = 0; c < C; ++c) o[c] = row[c];
    }
  }
}

template <class T>
void embedding_backward(T* dtable, const std::int32_t* tokens, const T* dout, std::int64_t N,
                        std::int64_t V, std::int64_t C, std::int64_t vocab_start,
                        std::int64_t vocab_size) {
  check_token_ids(tokens, N, vocab_size, "embedding_backward");
  // Counting sort of the positions by local row.
  std::vector<std::int64_t> start(std::size_t(V) + 1, 0);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t v = std::int64_t(tokens[n]) - vocab_start;
    if (v >= 0 && v < V) ++start[std::size_t(v) + 1];
  }
  for (std::int64_t v = 0; v < V; ++v) start[std::size_t(v) + 1] += start[std::size_t(v)];
  std::vector<std::int64_t> pos(static_cast<std::size_t>(start[std::size_t(V)]));
  {
    std::vector<std::int64_t> fill(start.begin(), start.end() - 1);
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t v = std::int64_t(tokens[n]) - vocab_start;
      if (v >= 0 && v < V) pos[std::size_t(fill[std::size_t(v)]++)] = n;
    }
  }
#pragma omp parallel
  {
    std::vector<double> acc(static_cast<std::size_t>(C)), piece(static_cast<std::size_t>(C));
#pragma omp for schedule(dynamic, 16)
    for (std::int64_t v = 0; v < V; ++v) {
      const std::int64_t b = start[std::size_t(v)], e = start[std::size_t(v) + 1];
      if (b == e) continue;
      T* row = dtable + v * C;
      for (std::int64_t c = 0; c < C; ++c) acc[std::size_t(c)] = double(row[c]);
      for (std::int64_t i = b; i < e;) {  // a piece: to the row's end or the next multiple
        const std::int64_t end = std::min(e, (i / kEmbeddingGradPiece + 1) * kEmbeddingGradPiece);
        std::fill(piece.begin(), piece.end(), 0.0);
        for (; i < end; ++i) {
          const T* g = dout + pos[std::size_t(i)] * C;
          for (std::int64_t c = 0; c < C; ++c) piece[std::size_t(c)] += double(g[c]);
        }
        for (std::int64_t c = 0; c < C; ++c) acc[std::size_t(c)] += piece[std::size_t(c)];
      }
      for (std::int64_t c = 0; c < C; ++c) row[c] = T(acc[std::size_t(c)]);
    }
  }
}

#define NSATRON_INSTANTIATE(T)                                                                \
  template void embedding_forward<T>(T*, const std::int32_t*, const T*, std::int64_t,        \
                                     std::int64_t, std::int64_t, std::int64_t, std::int64_t); \
  template void embedding_backward<T>(T*, const std::int32_t*, const T*, std::int64_t,       \
                                      std::int64_t, std::int64_t, std::int64_t, std::int64_t);
NSATRON_INSTANTIATE(float)
NSATRON_INSTANTIATE(double)
#undef NSATRON_INSTANTIATE

}  // namespace nsatron::cpu
