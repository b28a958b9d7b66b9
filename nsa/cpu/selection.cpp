// NSA block selection: block scores, the top-n rule and its inverse index (see selection.h).
#include "nsa/cpu/selection.h"

#include <algorithm>
#include <limits>

namespace nsatron::nsa::cpu {

template <class Real>
void group_block_scores(const NsaDims& dims, const Real* p_sum, std::int64_t n_visible,
                        std::int64_t b_t, Real* S) {
  const std::int64_t l = dims.cmp_block, d = dims.cmp_stride, ls = dims.sel_block;
  for (std::int64_t j = 0; j <= b_t; ++j) S[j] = Real(0);
  for (std::int64_t i = 0; i < n_visible; ++i) {
    const std::int64_t first = i * d, last = i * d + l - 1;  // tokens of compressed block i
    const std::int64_t j0 = first / ls, j1 = last / ls;       // j1 <= j0 + 1 since l <= l'
    if (j0 == j1) {
      S[j0] += Real(l / d) * p_sum[i];
    } else {
      const std::int64_t in_j0 = (j0 + 1) * ls - first;  // tokens of block i inside block j0
      S[j0] += Real(in_j0 / d) * p_sum[i];
      S[j1] += Real((l - in_j0) / d) * p_sum[i];
    }
  }
}

template <class Real>
std::int64_t select_blocks(const Real* S, std::int64_t b_t, std::int64_t sel_count,
                           std::int32_t* out, std::int32_t* scratch) {
  // Forced blocks: 0, b_t, b_t - 1 (deduplicated), in ascending order.
  std::int32_t chosen_forced[3];
  std::int64_t n_forced = 0;
  chosen_forced[n_forced++] = 0;
  if (b_t - 1 > 0) chosen_forced[n_forced++] = std::int32_t(b_t - 1);
  if (b_t > 0) chosen_forced[n_forced++] = std::int32_t(b_t);
  // Candidates: the eligible blocks that are not forced, i.e. 1 .. b_t-2.
  std::int64_t n_cand = 0;
  for (std::int64_t j = 1; j <= b_t - 2; ++j) scratch[n_cand++] = std::int32_t(j);
  const std::int64_t take = std::min<std::int64_t>(std::max<std::int64_t>(sel_count - n_forced, 0),
                                                   n_cand);
  // Order: score descending, index ascending. A NaN score (only from NaN inputs) counts as
  // -inf so the comparator stays a strict weak order.
  auto score = [S](std::int32_t j) {
    return S[j] == S[j] ? S[j] : -std::numeric_limits<Real>::infinity();
  };
  if (take < n_cand)
    std::partial_sort(scratch, scratch + take, scratch + n_cand,
                      [&score](std::int32_t x, std::int32_t y) {
                        const Real sx = score(x), sy = score(y);
                        return sx > sy || (sx == sy && x < y);
                      });
  std::sort(scratch, scratch + take);
  // Merge: block 0, then the chosen candidates (all in 1..b_t-2), then b_t-1, b_t.
  std::int64_t k = 0;
  out[k++] = chosen_forced[0];
  for (std::int64_t c = 0; c < take; ++c) out[k++] = scratch[c];
  for (std::int64_t f = 1; f < n_forced; ++f) out[k++] = chosen_forced[f];
  for (std::int64_t r = k; r < sel_count; ++r) out[r] = -1;
  return k;
}

SelectionInverse invert_selection(const NsaDims& dims, const std::int32_t* sel_blocks) {
  const std::int64_t B = dims.B, T = dims.T, G = dims.G, n = dims.sel_count;
  const std::int64_t NB = dims.num_sel_blocks();
  SelectionInverse inv;
  inv.offsets.assign(static_cast<std::size_t>(B * G * NB + 1), 0);
  // Count (offsets shifted by one), then prefix-sum, then fill in ascending t.
#pragma omp parallel for schedule(static)
  for (std::int64_t bg = 0; bg < B * G; ++bg) {
    const std::int64_t b = bg / G, g = bg % G;
    std::int64_t* count = inv.offsets.data() + bg * NB + 1;
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int32_t* row = sel_blocks + ((b * T + t) * G + g) * n;
      for (std::int64_t k = 0; k < n && row[k] >= 0; ++k) ++count[row[k]];
    }
  }
  for (std::size_t x = 1; x < inv.offsets.size(); ++x) inv.offsets[x] += inv.offsets[x - 1];
  inv.queries.resize(static_cast<std::size_t>(inv.offsets.back()));
#pragma omp parallel
  {
    std::vector<std::int64_t> fill(static_cast<std::size_t>(NB));
#pragma omp for schedule(static)
    for (std::int64_t bg = 0; bg < B * G; ++bg) {
      const std::int64_t b = bg / G, g = bg % G;
      for (std::int64_t j = 0; j < NB; ++j) fill[static_cast<std::size_t>(j)] = inv.offsets[static_cast<std::size_t>(bg * NB + j)];
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int32_t* row = sel_blocks + ((b * T + t) * G + g) * n;
        for (std::int64_t k = 0; k < n && row[k] >= 0; ++k)
          inv.queries[static_cast<std::size_t>(fill[static_cast<std::size_t>(row[k])]++)] = std::int32_t(t);
      }
    }
  }
  return inv;
}

#define NSA_INSTANTIATE(Real)                                                                   \
  template void group_block_scores<Real>(const NsaDims&, const Real*, std::int64_t, std::int64_t, \
                                         Real*);                                                 \
  template std::int64_t select_blocks<Real>(const Real*, std::int64_t, std::int64_t,            \
                                            std::int32_t*, std::int32_t*);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsatron::nsa::cpu
