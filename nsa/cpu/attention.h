// Softmax attention of the three NSA branches over their sparse key sets: forward, and the
// backward split into a query side (dq) and a key side (dk, dv).
//
// For one query row q (RoPE applied) and its keys k_j, values v_j (j in the branch's key
// set of that query; keys already rotated):
//   z_j = scale * q.k_j,  lse = log sum_j exp(z_j),  P_j = exp(z_j - lse),  o = sum_j P_j v_j.
// The branch output enters out with weight g = sigmoid(gate_c), so with do = d out:
//   dO = g * do,  delta = dO.o = g * (do.o),  dP_j = dO.v_j,  dz_j = P_j (dP_j - delta)
//   dq   = scale sum_j dz_j k_j                          (query side, owned per query)
//   dk_j = scale sum_{queries} dz_j q,  dv_j = sum_{queries} P_j dO   (key side, owned per key)
// P is recomputed from the saved lse, so the backward never stores probabilities. A query
// with no keys (the compression branch when t < l-1) has o = 0 and lse = -inf.
//
// Key sets (all keys of one query form a few contiguous runs, "ranges"):
//   compression  compressed blocks i with i*d+l-1 <= t   -> one range [0, N_t)
//   selection    tokens s <= t in the selected blocks     -> one range per block
//   window       tokens s in [max(0,t-w+1), t]            -> one range
// For the key side, the queries of a key are: compression, t >= i*d+l-1; selection, the
// queries that selected the key's block (SelectionInverse) with t >= s; window, t in
// [s, s+w-1]. For each query these keys form one contiguous run within a tile of keys, which
// is what accumulate_keys() takes.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "nsa/cpu/rope.h"
#include "nsa/cpu/selection.h"
#include "nsa/cpu/vec.h"
#include "nsa/nsa.h"

namespace nsatron::nsa::cpu {

struct KeyRange {
  std::int64_t begin, end;  // key rows [begin, end)
};

// Forward for the h query heads of one group at one position. qr: [h, D] rotated queries.
// k, v: key/value row r at k + r*stride. scores: scratch of h * (keys in ranges).
// Writes o (h rows of D, contiguous) and lse[h]; returns the number of keys n_keys, and
// scores holds the probabilities [h, n_keys] on return (the selection scores use them).
template <class Real>
inline std::int64_t attend_forward(const Real* qr, std::int64_t h, std::int64_t D, Real scale,
                                   const Real* k, const Real* v, std::int64_t stride,
                                   const KeyRange* ranges, std::int64_t n_ranges, Real* scores,
                                   Real* o, Real* lse) {
  std::int64_t n_keys = 0;
  for (std::int64_t r = 0; r < n_ranges; ++r) n_keys += ranges[r].end - ranges[r].begin;
  zero(o, h * D);
  if (n_keys == 0) {
    for (std::int64_t a = 0; a < h; ++a) lse[a] = -std::numeric_limits<Real>::infinity();
    return 0;
  }
  // Scores, key-major over the ranges so each key row is loaded once for all heads.
  std::int64_t col = 0;
  for (std::int64_t r = 0; r < n_ranges; ++r)
    for (std::int64_t j = ranges[r].begin; j < ranges[r].end; ++j, ++col) {
      const Real* kj = k + j * stride;
      for (std::int64_t a = 0; a < h; ++a) scores[a * n_keys + col] = scale * dot(qr + a * D, kj, D);
    }
  // Softmax per head.
  for (std::int64_t a = 0; a < h; ++a) {
    Real* z = scores + a * n_keys;
    Real m = z[0];
    for (std::int64_t c = 1; c < n_keys; ++c) m = z[c] > m ? z[c] : m;
    Real sum = 0;
    for (std::int64_t c = 0; c < n_keys; ++c) {
      z[c] = std::exp(z[c] - m);
      sum += z[c];
    }
    const Real inv = Real(1) / sum;
    for (std::int64_t c = 0; c < n_keys; ++c) z[c] *= inv;
    lse[a] = m + std::log(sum);
  }
  // o = P V, key-major.
  col = 0;
  for (std::int64_t r = 0; r < n_ranges; ++r)
    for (std::int64_t j = ranges[r].begin; j < ranges[r].end; ++j, ++col) {
      const Real* vj = v + j * stride;
      for (std::int64_t a = 0; a < h; ++a) axpy(scores[a * n_keys + col], vj, o + a * D, D);
    }
  return n_keys;
}

// Per-query quantities of one branch for the h heads of a group at one position.
template <class Real>
struct QueryRows {
  const Real* qr;     // [h, D] rotated queries
  const Real* dout;   // [h, D] gradient of the core output
  const Real* gate;   // [h] sigmoid(gate_c)
  const Real* lse;    // [h]
  const Real* delta;  // [h] g * (do . o_c)
};

// Query side: dqr[h, D] += scale * sum_j dz_j k_j over the ranges.
template <class Real>
inline void attend_backward_query(const QueryRows<Real>& qy, std::int64_t h, std::int64_t D,
                                  Real scale, const Real* k, const Real* v, std::int64_t stride,
                                  const KeyRange* ranges, std::int64_t n_ranges, Real* dqr) {
  for (std::int64_t r = 0; r < n_ranges; ++r)
    for (std::int64_t j = ranges[r].begin; j < ranges[r].end; ++j) {
      const Real* kj = k + j * stride;
      const Real* vj = v + j * stride;
      for (std::int64_t a = 0; a < h; ++a) {
        const Real p = std::exp(scale * dot(qy.qr + a * D, kj, D) - qy.lse[a]);
        const Real dp = qy.gate[a] * dot(qy.dout + a * D, vj, D);
        const Real dz = p * (dp - qy.delta[a]);
        axpy(scale * dz, kj, dqr + a * D, D);
      }
    }
}

// Key side: one query (all h heads) into the keys [0, n) of a tile: k, v rows at stride,
// dk (rotated), dv rows at dstride.
template <class Real>
inline void accumulate_keys(const QueryRows<Real>& qy, std::int64_t h, std::int64_t D, Real scale,
                            const Real* k, const Real* v, std::int64_t stride, std::int64_t n,
                            Real* dk, Real* dv, std::int64_t dstride) {
  for (std::int64_t j = 0; j < n; ++j) {
    const Real* kj = k + j * stride;
    const Real* vj = v + j * stride;
    Real* dkj = dk + j * dstride;
    Real* dvj = dv + j * dstride;
    for (std::int64_t a = 0; a < h; ++a) {
      const Real p = std::exp(scale * dot(qy.qr + a * D, kj, D) - qy.lse[a]);
      const Real dp = qy.gate[a] * dot(qy.dout + a * D, vj, D);
      const Real dz = p * (dp - qy.delta[a]);
      axpy(scale * dz, qy.qr + a * D, dkj, D);
      axpy(p * qy.gate[a], qy.dout + a * D, dvj, D);
    }
  }
}

// What the key-side passes read, all [.., B, T, H, ..] row-major.
template <class Real>
struct BackwardContext {
  const Real* q_rot;    // [B, T, H, D] rotated queries
  const Real* d_out;    // [B, T, H, D]
  const Real* gate;     // [3, B, T, H] sigmoid of the gate logits
  const Real* lse;      // [3, B, T, H]
  const Real* delta;    // [3, B, T, H]
  // Elements from one branch's [B, T, H] block of gate, lse and delta to the next: B*T*H for
  // the NSA core; 0 for a caller with one branch (dense attention), whose arrays are [B, T, H].
  std::int64_t branch_stride;
  QueryRows<Real> rows(const NsaDims& dims, int branch, std::int64_t b, std::int64_t t,
                       std::int64_t g) const {
    const std::int64_t at = branch * branch_stride;
    const std::int64_t head0 = (b * dims.T + t) * dims.H + g * dims.heads_per_group();
    return {q_rot + head0 * dims.D, d_out + head0 * dims.D, gate + at + head0, lse + at + head0,
            delta + at + head0};
  }
};

// Key side of the window branch: k_rot (rotated k_win), v_win [B,T,G,D] ->
// dk_win, dv_win [B,T,G,D] (assigned; dk_win rotated back to the unrotated key).
template <class Real>
void window_backward_keys(const NsaDims& dims, const BackwardContext<Real>& ctx,
                          const Real* k_rot, const Real* v, const RopeTable<Real>& rope,
                          Real* dk, Real* dv);

// Key side of the selection branch, from the per-block query lists.
template <class Real>
void selected_backward_keys(const NsaDims& dims, const BackwardContext<Real>& ctx,
                            const SelectionInverse& inv, const Real* k_rot, const Real* v,
                            const RopeTable<Real>& rope, Real* dk, Real* dv);

// Key side of the compression branch: kc (rotated compressed keys), vc [B,N,G,D] ->
// dkc (w.r.t. the UNrotated compressed keys, i.e. rotated back at i*d+l-1), dvc [B,N,G,D].
template <class Real>
void compressed_backward_keys(const NsaDims& dims, const BackwardContext<Real>& ctx,
                              const Real* kc, const Real* vc, const RopeTable<Real>& rope,
                              Real* dkc, Real* dvc);

}  // namespace nsatron::nsa::cpu
