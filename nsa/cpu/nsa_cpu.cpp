// The NSA core on the CPU: the public forward and backward (nsa/nsa.h), built from the
// compression (compression.h), selection (selection.h), attention (attention.h) and RoPE
// (rope.h) pieces.
//
// Forward, per (batch b, query t, group g), all h heads of the group together:
//   rotate q; compression attention over the N_t visible compressed blocks (probabilities
//   kept); group block scores and the top-n choice; selected attention; window attention;
//   gated sum. The compressed K/V and the rotated k_slc / k_win are computed once up front.
// Backward:
//   1. per (b,t,head): sigmoid gates, d gate = (do.o_c) g(1-g), delta_c = g_c (do.o_c);
//   2. query side per (b,t,g): dq over the three branches' keys, rotated back;
//   3. key side per (b,g,key tile): dk/dv of the window, selected and compressed keys;
//   4. compression backward: dKc, dVc to k_cmp, v_cmp (overlapping blocks add) and to the
//      maps and position embeddings (accumulated).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/util/error.h"
#include "nsa/cpu/attention.h"
#include "nsa/cpu/compression.h"
#include "nsa/cpu/rope.h"
#include "nsa/cpu/selection.h"
#include "nsa/nsa.h"

namespace nsatron::nsa {

using cpu::KeyRange;

namespace {

template <class Real>
Real sigmoid(Real x) {
  return Real(1) / (Real(1) + std::exp(-x));
}

// Rotates every D-row of x ([B, T, heads, D]) at its token position.
template <class Real>
void rotate_rows(const NsaDims& dims, std::int64_t heads, const Real* x,
                 const cpu::RopeTable<Real>& rope, Real* y) {
  cpu::rotate_token_rows(rope, dims.B, dims.T, heads, dims.D, x, y);
}

// Number of compressed blocks visible from query t: i*d + l - 1 <= t.
inline std::int64_t visible_cmp_blocks(const NsaDims& dims, std::int64_t t) {
  if (t < dims.cmp_block - 1) return 0;
  return std::min(dims.num_cmp_blocks(), (t - dims.cmp_block + 1) / dims.cmp_stride + 1);
}

// Token ranges of the selected blocks of one query (ascending, clipped to s <= t).
inline std::int64_t selected_ranges(const NsaDims& dims, const std::int32_t* sel, std::int64_t t,
                                    KeyRange* ranges) {
  std::int64_t count = 0;
  for (std::int64_t k = 0; k < dims.sel_count && sel[k] >= 0; ++k) {
    const std::int64_t begin = std::int64_t(sel[k]) * dims.sel_block;
    ranges[count++] = {begin, std::min(begin + dims.sel_block, t + 1)};
  }
  return count;
}

}  // namespace

template <class Real>
void nsa_forward(const NsaDims& dims, const NsaInputs<Real>& in, Real* out,
                 NsaSaved<Real>* saved) {
  dims.validate();
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, G = dims.G, D = dims.D;
  const std::int64_t h = dims.heads_per_group(), N = dims.num_cmp_blocks();
  const std::int64_t NB = dims.num_sel_blocks(), n = dims.sel_count;
  const std::int64_t BTH = B * T * H;
  const Real scale = Real(1) / std::sqrt(Real(D));
  const cpu::RopeTable<Real> rope(T, D, dims.rope_theta);

  std::vector<Real> k_slc_rot(static_cast<std::size_t>(B * T * G * D)), k_win_rot(static_cast<std::size_t>(B * T * G * D));
  rotate_rows(dims, G, in.k_slc, rope, k_slc_rot.data());
  rotate_rows(dims, G, in.k_win, rope, k_win_rot.data());

  std::vector<Real> kc_local, vc_local;
  std::vector<Real>& kc = saved ? saved->k_cmp_blocks : kc_local;
  std::vector<Real>& vc = saved ? saved->v_cmp_blocks : vc_local;
  kc.resize(static_cast<std::size_t>(B * N * G * D));
  vc.resize(static_cast<std::size_t>(B * N * G * D));
  cpu::compress_forward(dims, in.k_cmp, in.cmp_wk, in.cmp_pk, &rope, kc.data());
  cpu::compress_forward<Real>(dims, in.v_cmp, in.cmp_wv, in.cmp_pv, nullptr, vc.data());
  if (saved) {
    saved->dims = dims;
    saved->sel_blocks.resize(static_cast<std::size_t>(B * T * G * n));
    saved->o_branch.resize(static_cast<std::size_t>(3 * BTH * D));
    saved->lse.resize(static_cast<std::size_t>(3 * BTH));
  }

  const std::int64_t max_keys = std::max({N, std::min(T, n * dims.sel_block), std::min(T, dims.window)});
#pragma omp parallel
  {
    std::vector<Real> qr(static_cast<std::size_t>(h * D)), scores(static_cast<std::size_t>(h * std::max<std::int64_t>(max_keys, 1)));
    std::vector<Real> p_sum(static_cast<std::size_t>(std::max<std::int64_t>(N, 1))), S(static_cast<std::size_t>(NB));
    std::vector<std::int32_t> cand(static_cast<std::size_t>(NB)), sel_local(static_cast<std::size_t>(n));
    std::vector<KeyRange> ranges(static_cast<std::size_t>(n));
    std::vector<Real> o_local(static_cast<std::size_t>(3 * h * D)), lse_local(static_cast<std::size_t>(3 * h));
#pragma omp for schedule(dynamic, 8)
    for (std::int64_t item = 0; item < B * T * G; ++item) {
      const std::int64_t g = item % G, t = (item / G) % T, b = item / (G * T);
      const std::int64_t head0 = (b * T + t) * H + g * h;
      for (std::int64_t a = 0; a < h; ++a) rope.rotate(in.q + (head0 + a) * D, qr.data() + a * D, t);
      Real* o[3];
      Real* lse[3];
      for (int c = 0; c < 3; ++c) {
        o[c] = saved ? saved->o_branch.data() + c * BTH * D + head0 * D : o_local.data() + c * h * D;
        lse[c] = saved ? saved->lse.data() + c * BTH + head0 : lse_local.data() + c * h;
      }

      // Branch 1: compression.
      const std::int64_t n_vis = visible_cmp_blocks(dims, t);
      const KeyRange cmp_range{0, n_vis};
      const std::int64_t cmp_row0 = (b * N * G + g) * D;
      cpu::attend_forward(qr.data(), h, D, scale, kc.data() + cmp_row0, vc.data() + cmp_row0,
                          G * D, &cmp_range, 1, scores.data(), o[kBranchCmp], lse[kBranchCmp]);

      // Selection: group block scores from p_cmp, then the top-n rule.
      for (std::int64_t i = 0; i < n_vis; ++i) {
        Real sum = 0;
        for (std::int64_t a = 0; a < h; ++a) sum += scores[static_cast<std::size_t>(a * n_vis + i)];
        p_sum[static_cast<std::size_t>(i)] = sum;
      }
      const std::int64_t b_t = t / dims.sel_block;
      cpu::group_block_scores(dims, p_sum.data(), n_vis, b_t, S.data());
      std::int32_t* sel = saved ? saved->sel_blocks.data() + ((b * T + t) * G + g) * n : sel_local.data();
      cpu::select_blocks(S.data(), b_t, n, sel, cand.data());

      // Branch 2: selected tokens.
      const std::int64_t tok_row0 = (b * T * G + g) * D;
      const std::int64_t n_ranges = selected_ranges(dims, sel, t, ranges.data());
      cpu::attend_forward(qr.data(), h, D, scale, k_slc_rot.data() + tok_row0, in.v_slc + tok_row0,
                          G * D, ranges.data(), n_ranges, scores.data(), o[kBranchSlc],
                          lse[kBranchSlc]);

      // Branch 3: sliding window.
      const KeyRange win_range{std::max<std::int64_t>(0, t - dims.window + 1), t + 1};
      cpu::attend_forward(qr.data(), h, D, scale, k_win_rot.data() + tok_row0, in.v_win + tok_row0,
                          G * D, &win_range, 1, scores.data(), o[kBranchWin], lse[kBranchWin]);

      // Gated sum.
      for (std::int64_t a = 0; a < h; ++a) {
        const Real* gl = in.gate + (head0 + a) * 3;
        const Real g0 = sigmoid(gl[0]), g1 = sigmoid(gl[1]), g2 = sigmoid(gl[2]);
        Real* y = out + (head0 + a) * D;
        for (std::int64_t e = 0; e < D; ++e)
          y[e] = g0 * o[0][a * D + e] + g1 * o[1][a * D + e] + g2 * o[2][a * D + e];
      }
    }
  }
}

template <class Real>
void nsa_backward(const NsaDims& dims, const NsaInputs<Real>& in, const NsaSaved<Real>& saved,
                  const Real* d_out, const NsaGrads<Real>& grads) {
  dims.validate();
  const std::int64_t B = dims.B, T = dims.T, H = dims.H, G = dims.G, D = dims.D;
  const std::int64_t h = dims.heads_per_group(), N = dims.num_cmp_blocks(), n = dims.sel_count;
  const std::int64_t BTH = B * T * H;
  NSA_CHECK(saved.dims.B == B && saved.dims.T == T && saved.dims.H == H && saved.dims.G == G &&
                saved.dims.D == D && saved.dims.cmp_block == dims.cmp_block &&
                saved.dims.cmp_stride == dims.cmp_stride && saved.dims.sel_block == dims.sel_block &&
                saved.dims.sel_count == n && saved.dims.window == dims.window &&
                saved.dims.rope_theta == dims.rope_theta,
            "nsa_backward: saved state is for ", saved.dims.str(), ", called with ", dims.str());
  NSA_CHECK(saved.o_branch.size() == static_cast<std::size_t>(3 * BTH * D), "nsa_backward: empty saved state");
  const Real scale = Real(1) / std::sqrt(Real(D));
  const cpu::RopeTable<Real> rope(T, D, dims.rope_theta);

  // Rotated queries and keys (recomputed; cheaper than saving them).
  std::vector<Real> q_rot(static_cast<std::size_t>(BTH * D));
  std::vector<Real> k_slc_rot(static_cast<std::size_t>(B * T * G * D)), k_win_rot(static_cast<std::size_t>(B * T * G * D));
  rotate_rows(dims, H, in.q, rope, q_rot.data());
  rotate_rows(dims, G, in.k_slc, rope, k_slc_rot.data());
  rotate_rows(dims, G, in.k_win, rope, k_win_rot.data());

  // 1. Gates: sigmoid, d gate, delta.
  std::vector<Real> gate_sig(static_cast<std::size_t>(3 * BTH)), delta(static_cast<std::size_t>(3 * BTH));
#pragma omp parallel for schedule(static)
  for (std::int64_t row = 0; row < BTH; ++row) {
    for (int c = 0; c < 3; ++c) {
      const Real g = sigmoid(in.gate[row * 3 + c]);
      const Real dot_o = cpu::dot(d_out + row * D, saved.o_branch.data() + c * BTH * D + row * D, D);
      gate_sig[static_cast<std::size_t>(c * BTH + row)] = g;
      delta[static_cast<std::size_t>(c * BTH + row)] = g * dot_o;
      if (grads.gate) grads.gate[row * 3 + c] = dot_o * g * (Real(1) - g);
    }
  }
  const cpu::BackwardContext<Real> ctx{q_rot.data(), d_out, gate_sig.data(), saved.lse.data(),
                                       delta.data(), BTH};

  // 2. Query side.
  if (grads.q) {
#pragma omp parallel
    {
      std::vector<Real> dqr(static_cast<std::size_t>(h * D));
      std::vector<KeyRange> ranges(static_cast<std::size_t>(n));
#pragma omp for schedule(dynamic, 8)
      for (std::int64_t item = 0; item < B * T * G; ++item) {
        const std::int64_t g = item % G, t = (item / G) % T, b = item / (G * T);
        cpu::zero(dqr.data(), h * D);
        const KeyRange cmp_range{0, visible_cmp_blocks(dims, t)};
        const std::int64_t cmp_row0 = (b * N * G + g) * D;
        cpu::attend_backward_query(ctx.rows(dims, kBranchCmp, b, t, g), h, D, scale,
                                   saved.k_cmp_blocks.data() + cmp_row0,
                                   saved.v_cmp_blocks.data() + cmp_row0, G * D, &cmp_range, 1,
                                   dqr.data());
        const std::int64_t tok_row0 = (b * T * G + g) * D;
        const std::int64_t n_ranges =
            selected_ranges(dims, saved.sel_blocks.data() + ((b * T + t) * G + g) * n, t, ranges.data());
        cpu::attend_backward_query(ctx.rows(dims, kBranchSlc, b, t, g), h, D, scale,
                                   k_slc_rot.data() + tok_row0, in.v_slc + tok_row0, G * D,
                                   ranges.data(), n_ranges, dqr.data());
        const KeyRange win_range{std::max<std::int64_t>(0, t - dims.window + 1), t + 1};
        cpu::attend_backward_query(ctx.rows(dims, kBranchWin, b, t, g), h, D, scale,
                                   k_win_rot.data() + tok_row0, in.v_win + tok_row0, G * D,
                                   &win_range, 1, dqr.data());
        const std::int64_t head0 = (b * T + t) * H + g * h;
        for (std::int64_t a = 0; a < h; ++a)
          rope.rotate_back(dqr.data() + a * D, grads.q + (head0 + a) * D, t);
      }
    }
  }

  // 3. Key side. A null gradient pointer still needs a place for its sibling's pass.
  std::vector<Real> scratch_k, scratch_v;
  auto out_or_scratch = [&](Real* p, std::vector<Real>& s, std::size_t size) {
    if (p) return p;
    s.resize(size);
    return s.data();
  };
  const std::size_t tok_size = static_cast<std::size_t>(B * T * G * D);
  if (grads.k_win || grads.v_win)
    cpu::window_backward_keys(dims, ctx, k_win_rot.data(), in.v_win, rope,
                              out_or_scratch(grads.k_win, scratch_k, tok_size),
                              out_or_scratch(grads.v_win, scratch_v, tok_size));
  if (grads.k_slc || grads.v_slc) {
    const cpu::SelectionInverse inv = cpu::invert_selection(dims, saved.sel_blocks.data());
    cpu::selected_backward_keys(dims, ctx, inv, k_slc_rot.data(), in.v_slc, rope,
                                out_or_scratch(grads.k_slc, scratch_k, tok_size),
                                out_or_scratch(grads.v_slc, scratch_v, tok_size));
  }

  // 4. Compression: compressed keys/values, then back to tokens and parameters.
  const bool need_k = grads.k_cmp || grads.cmp_wk || grads.cmp_pk;
  const bool need_v = grads.v_cmp || grads.cmp_wv || grads.cmp_pv;
  if (need_k || need_v) {
    std::vector<Real> dkc(static_cast<std::size_t>(B * N * G * D)), dvc(static_cast<std::size_t>(B * N * G * D));
    cpu::compressed_backward_keys(dims, ctx, saved.k_cmp_blocks.data(), saved.v_cmp_blocks.data(),
                                  rope, dkc.data(), dvc.data());
    if (need_k)
      cpu::compress_backward(dims, in.k_cmp, in.cmp_wk, in.cmp_pk, dkc.data(), grads.k_cmp,
                             grads.cmp_wk, grads.cmp_pk);
    if (need_v)
      cpu::compress_backward(dims, in.v_cmp, in.cmp_wv, in.cmp_pv, dvc.data(), grads.v_cmp,
                             grads.cmp_wv, grads.cmp_pv);
  }
}

template void nsa_forward<float>(const NsaDims&, const NsaInputs<float>&, float*, NsaSaved<float>*);
template void nsa_forward<double>(const NsaDims&, const NsaInputs<double>&, double*,
                                  NsaSaved<double>*);
template void nsa_backward<float>(const NsaDims&, const NsaInputs<float>&, const NsaSaved<float>&,
                                  const float*, const NsaGrads<float>&);
template void nsa_backward<double>(const NsaDims&, const NsaInputs<double>&,
                                   const NsaSaved<double>&, const double*, const NsaGrads<double>&);

}  // namespace nsatron::nsa
