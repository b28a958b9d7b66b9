// Dense causal attention: the baseline the engine compares NSA against (model.attention =
// "dense"). Grouped-query attention with RoPE, forward and hand-written backward on the CPU,
// for float and double. The CUDA version is nsa/cuda/dense.h.
//
// Math (per batch b, query position t, query head a of KV group g = a / h, h = H / G,
// scale = 1/sqrt(D), RoPE rotate-half as in NSA_SPEC.md and nsa/cpu/rope.h):
//   qr_t = RoPE(q[t,a], t),  kr_s = RoPE(k[s,g], s)
//   z_s = scale * qr_t . kr_s  for s <= t,   lse = log sum_s exp(z_s),   P_s = exp(z_s - lse)
//   o[t,a] = sum_s P_s v[s,g]
// Backward of sum(o * d_out), do = d_out[t,a]:
//   delta = do . o,   dz_s = P_s (do . v_s - delta)
//   dqr_t = scale sum_s dz_s kr_s,  dkr_s = scale sum_{t >= s} dz_s qr_t,  dv_s = sum_{t >= s} P_s do
//   dq = RoPE(., t)^T dqr,  dk = RoPE(., s)^T dkr   (the inverse rotation).
// This is NSA_SPEC's window branch with w = T and its gate fixed at 1, so the code is that
// branch's code (nsa/cpu/attention.h: attend_forward, attend_backward_query and
// window_backward_keys with the window covering the whole sequence). P is recomputed from
// lse in the backward (no [T,T] matrix is stored); delta comes from the output itself, so the
// forward saves only lse.
//
// Layouts: contiguous, row-major: q, out, d_out, dq [B,T,H,D]; k, v, dk, dv [B,T,G,D];
// lse [B,T,H]. Every gradient is ASSIGNED (the op has no parameters).
//
// Threads (OpenMP) as in the NSA core: the forward and dq over (batch, query, group), dk/dv
// over (batch, group, key tile); every element is summed in a fixed order, so the result is
// bit-identical for any number of threads. Work O(B*H*T^2*D / 2), memory O(B*T*(H+G)*D).
#pragma once
#include <cstdint>
#include <string>

#include "nsa/nsa.h"

namespace nsatron::nsa {

struct DenseDims {
  std::int64_t B = 1, T = 1, H = 1, G = 1, D = 2;
  double rope_theta = 10000.0;

  std::int64_t heads_per_group() const { return H / G; }
  // Throws nsatron::UserError naming the keys (model.n_heads, model.head_dim, ...).
  void validate() const;
  std::string str() const;  // "B=.. T=.. H=.. G=.. D=.. theta=.."
  // The same shape as NSA dims whose window covers the whole sequence (w = T), with the NSA
  // block settings at valid defaults that the window branch does not read.
  NsaDims as_window() const;
};

// Forward: out [B,T,H,D]; lse [B,T,H] when non-null (the backward needs it).
template <class Real>
void dense_forward(const DenseDims& dims, const Real* q, const Real* k, const Real* v, Real* out, Real* lse);

// Backward of sum(out * d_out): `out` and `lse` from dense_forward on the same inputs.
// Assigns dq, dk, dv (each may be null to skip it; dk and dv are computed together).
template <class Real>
void dense_backward(const DenseDims& dims, const Real* q, const Real* k, const Real* v, const Real* out,
                    const Real* lse, const Real* d_out, Real* dq, Real* dk, Real* dv);

}  // namespace nsatron::nsa
