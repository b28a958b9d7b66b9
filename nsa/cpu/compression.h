// NSA branch 1, the compression of keys and values into block summaries.
//
// Compressed block i (i in [0, N), N = floor((T-l)/d)+1 or 0 when T < l) covers tokens
// [i*d, i*d+l-1]. For KV head g, with X_i = x[i*d : i*d+l, g, :] + p[g] (an l x D matrix),
//   Y_i = flatten(X_i) @ W[g]                 (flatten: token-in-block major, channel minor)
// so Y_i[e] = sum_{r<l, c<D} (x[i*d+r, g, c] + p[g, r, c]) * W[g][r*D + c, e].
// Keys: Kc_i = RoPE(Y_i, i*d+l-1) with x = k_cmp, W = cmp_wk, p = cmp_pk.
// Values: Vc_i = Y_i with x = v_cmp, W = cmp_wv, p = cmp_pv.
//
// Backward, given dY_i (for keys: dKc_i rotated back at i*d+l-1):
//   dx[s, g, c]  = sum over blocks i containing s, r = s - i*d, of sum_e W[g][r*D+c, e] dY_i[e]
//                  (blocks overlap when d < l, so a token collects from up to l/d blocks;
//                   tokens in no block get 0)                                   ASSIGNED
//   dp[g, r, c] += sum_e W[g][r*D+c, e] * (sum_{b,i} dY_{b,i}[e])               ACCUMULATED
//   dW[g][r*D+c, e] += sum_{b,i} X_{b,i}[r, c] dY_{b,i}[e]                       ACCUMULATED
// Parallel over output rows; each row is summed in a fixed order (b, then i).
#pragma once
#include "nsa/cpu/rope.h"
#include "nsa/nsa.h"

namespace nsatron::nsa::cpu {

// Y [B, N, G, D] for one side (keys or values). With `rope` non-null, each Y_i is rotated at
// position i*d+l-1 (the key side).
template <class Real>
void compress_forward(const NsaDims& dims, const Real* x, const Real* w, const Real* p,
                      const RopeTable<Real>* rope, Real* y);

// Backward of compress_forward for one side, given dY [B, N, G, D] with respect to the
// UNrotated Y (the caller rotates key gradients back first). dx is assigned; dw and dp are
// accumulated. Any of dx, dw, dp may be null (skipped).
template <class Real>
void compress_backward(const NsaDims& dims, const Real* x, const Real* w, const Real* p,
                       const Real* dy, Real* dx, Real* dw, Real* dp);

}  // namespace nsatron::nsa::cpu
