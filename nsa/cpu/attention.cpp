// Key-side backward passes of the three NSA branches (see attention.h). Each work item owns a
// tile of keys of one (batch, group) and visits that tile's queries in ascending order, so
// every dk/dv row is summed in one fixed order whatever the number of threads.
#include "nsa/cpu/attention.h"

#include <algorithm>

namespace nsatron::nsa::cpu {

namespace {
constexpr std::int64_t kWindowKeyTile = 64;
constexpr std::int64_t kCmpKeyTile = 16;
}  // namespace

template <class Real>
void window_backward_keys(const NsaDims& dims, const BackwardContext<Real>& ctx,
                          const Real* k_rot, const Real* v, const RopeTable<Real>& rope,
                          Real* dk, Real* dv) {
  const std::int64_t B = dims.B, T = dims.T, G = dims.G, D = dims.D, h = dims.heads_per_group();
  const std::int64_t w = dims.window, stride = G * D;
  const Real scale = Real(1) / std::sqrt(Real(D));
  const std::int64_t tiles = (T + kWindowKeyTile - 1) / kWindowKeyTile;
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t item = 0; item < B * G * tiles; ++item) {
    const std::int64_t tile = item % tiles, g = (item / tiles) % G, b = item / (tiles * G);
    const std::int64_t s0 = tile * kWindowKeyTile, s1 = std::min(T, s0 + kWindowKeyTile);
    const std::int64_t base = (b * T * G + g) * D;  // row of (b, s=0, g)
    for (std::int64_t s = s0; s < s1; ++s) {
      zero(dk + base + s * stride, D);
      zero(dv + base + s * stride, D);
    }
    const std::int64_t t_end = std::min(T, s1 - 1 + w);  // queries [s0, s1-1+w-1]
    for (std::int64_t t = s0; t < t_end; ++t) {
      const std::int64_t lo = std::max(s0, t - w + 1), hi = std::min(s1 - 1, t);
      if (lo > hi) continue;
      const std::int64_t off = base + lo * stride;
      accumulate_keys(ctx.rows(dims, kBranchWin, b, t, g), h, D, scale, k_rot + off, v + off,
                      stride, hi - lo + 1, dk + off, dv + off, stride);
    }
    for (std::int64_t s = s0; s < s1; ++s)
      rope.rotate_back(dk + base + s * stride, dk + base + s * stride, s);
  }
}

template <class Real>
void selected_backward_keys(const NsaDims& dims, const BackwardContext<Real>& ctx,
                            const SelectionInverse& inv, const Real* k_rot, const Real* v,
                            const RopeTable<Real>& rope, Real* dk, Real* dv) {
  const std::int64_t B = dims.B, T = dims.T, G = dims.G, D = dims.D, h = dims.heads_per_group();
  const std::int64_t ls = dims.sel_block, NB = dims.num_sel_blocks(), stride = G * D;
  const Real scale = Real(1) / std::sqrt(Real(D));
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t item = 0; item < B * G * NB; ++item) {
    const std::int64_t j = item % NB, g = (item / NB) % G, b = item / (NB * G);
    const std::int64_t s0 = j * ls, s1 = std::min(T, s0 + ls);
    const std::int64_t base = (b * T * G + g) * D;
    for (std::int64_t s = s0; s < s1; ++s) {
      zero(dk + base + s * stride, D);
      zero(dv + base + s * stride, D);
    }
    const std::int64_t off = base + s0 * stride;
    for (std::int64_t x = inv.offsets[static_cast<std::size_t>(item)]; x < inv.offsets[static_cast<std::size_t>(item) + 1];
         ++x) {
      const std::int64_t t = inv.queries[static_cast<std::size_t>(x)];  // t >= s0: block j <= b_t
      const std::int64_t n = std::min(s1 - 1, t) - s0 + 1;
      accumulate_keys(ctx.rows(dims, kBranchSlc, b, t, g), h, D, scale, k_rot + off, v + off,
                      stride, n, dk + off, dv + off, stride);
    }
    for (std::int64_t s = s0; s < s1; ++s)
      rope.rotate_back(dk + base + s * stride, dk + base + s * stride, s);
  }
}

template <class Real>
void compressed_backward_keys(const NsaDims& dims, const BackwardContext<Real>& ctx,
                              const Real* kc, const Real* vc, const RopeTable<Real>& rope,
                              Real* dkc, Real* dvc) {
  const std::int64_t B = dims.B, T = dims.T, G = dims.G, D = dims.D, h = dims.heads_per_group();
  const std::int64_t l = dims.cmp_block, d = dims.cmp_stride, N = dims.num_cmp_blocks();
  const std::int64_t stride = G * D;
  const Real scale = Real(1) / std::sqrt(Real(D));
  const std::int64_t tiles = (N + kCmpKeyTile - 1) / kCmpKeyTile;
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t item = 0; item < B * G * tiles; ++item) {
    const std::int64_t tile = item % tiles, g = (item / tiles) % G, b = item / (tiles * G);
    const std::int64_t i0 = tile * kCmpKeyTile, i1 = std::min(N, i0 + kCmpKeyTile);
    const std::int64_t base = (b * N * G + g) * D;  // row of (b, i=0, g)
    for (std::int64_t i = i0; i < i1; ++i) {
      zero(dkc + base + i * stride, D);
      zero(dvc + base + i * stride, D);
    }
    const std::int64_t off = base + i0 * stride;
    for (std::int64_t t = i0 * d + l - 1; t < T; ++t) {
      const std::int64_t i_last = std::min(i1 - 1, (t - l + 1) / d);  // i*d+l-1 <= t
      accumulate_keys(ctx.rows(dims, kBranchCmp, b, t, g), h, D, scale, kc + off, vc + off,
                      stride, i_last - i0 + 1, dkc + off, dvc + off, stride);
    }
    for (std::int64_t i = i0; i < i1; ++i)
      rope.rotate_back(dkc + base + i * stride, dkc + base + i * stride, i * d + l - 1);
  }
}

#define NSA_INSTANTIATE(Real)                                                                  \
  template void window_backward_keys<Real>(const NsaDims&, const BackwardContext<Real>&,       \
                                           const Real*, const Real*, const RopeTable<Real>&,   \
                                           Real*, Real*);                                      \
  template void selected_backward_keys<Real>(const NsaDims&, const BackwardContext<Real>&,     \
                                             const SelectionInverse&, const Real*, const Real*, \
                                             const RopeTable<Real>&, Real*, Real*);            \
  template void compressed_backward_keys<Real>(const NsaDims&, const BackwardContext<Real>&,   \
                                               const Real*, const Real*,                       \
                                               const RopeTable<Real>&, Real*, Real*);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(double)
#undef NSA_INSTANTIATE

}  // namespace nsatron::nsa::cpu
