// The NSA attention core (Native Sparse Attention, exactly the function of NSA_SPEC.md):
// forward and hand-written backward on the CPU, for float and double.
//
// Math (per batch b, query position t, query head a of KV group g = a / h, h = H / G,
// scale = 1/sqrt(D), RoPE as in nsa/cpu/rope.h):
//   compression  Kc_i = RoPE(flatten(k_cmp[i*d : i*d+l, g] + cmp_pk[g]) @ cmp_wk[g], i*d+l-1)
//                Vc_i =      flatten(v_cmp[i*d : i*d+l, g] + cmp_pv[g]) @ cmp_wv[g]
//                o_cmp = softmax over the blocks with i*d+l-1 <= t of scale q_t.Kc_i, times Vc
//   selection    block scores from p_cmp (overlap weights), summed over the group's heads,
//                blocks 0, b_t, b_t-1 forced, the rest by score (ties: smaller index), at
//                most n; o_slc = softmax attention over the tokens s <= t of those blocks
//   window       o_win = softmax attention over s in [max(0, t-w+1), t]
//   output       o = sigmoid(gate0) o_cmp + sigmoid(gate1) o_slc + sigmoid(gate2) o_win
// q, k_slc and k_win are rotated at their token positions; values are never rotated.
// The choice of blocks is a constant in the backward pass.
//
// Files: nsa/cpu/rope.h (RoPE), nsa/cpu/compression.h (compressed keys/values and their
// backward), nsa/cpu/selection.h (block scores, top-n, inverse index), nsa/cpu/attention.h
// (the three branches, forward and backward), nsa/cpu/nsa_cpu.cpp (this entry point).
//
// Layouts: contiguous, row-major.
//   q, out, d_out        [B, T, H, D]
//   k_*, v_*             [B, T, G, D]
//   gate                 [B, T, H, 3]     branch order (cmp, slc, win)
//   cmp_wk, cmp_wv       [G, l*D, D]
//   cmp_pk, cmp_pv       [G, l, D]
//
// What the forward saves for the backward (NsaSaved), with N = number of compressed blocks
// = floor((T-l)/d)+1 (0 when T < l), n = sel_count, and E = sizeof(Real):
//   k_cmp_blocks  [B, N, G, D]   compressed keys, RoPE applied (Kc)       B*N*G*D*E bytes
//   v_cmp_blocks  [B, N, G, D]   compressed values (Vc)                   B*N*G*D*E
//   sel_blocks    [B, T, G, n]   int32 selected blocks, ascending, -1 pad  4*B*T*G*n
//   o_branch      [3, B, T, H, D] branch outputs o_cmp, o_slc, o_win       3*B*T*H*D*E
//   lse           [3, B, T, H]   log-sum-exp of the scaled scores of each  3*B*T*H*E
//                                branch (-inf for o_cmp when t < l-1)
// In total about 3x the size of `out` plus the compressed K/V (2*T/d rows per group) and the
// selection indices; NsaSaved::bytes() gives the exact figure. The backward recomputes the
// attention probabilities from q, the keys and lse (as FlashAttention does), and the branch
// outputs give rowsum(dO*O) and the gate gradient without a second forward.
//
// Memory and work: no [T,T] matrix or mask is ever formed. Per query and head the work is
// O(D * (N_t + n*l' + w)) with N_t <= T/d visible compressed blocks, so
// O(B*H*T*D*(T/d + n*l' + w)) in all; memory is O(B*T*(H+G)*D + B*T*G*n) plus per-thread
// scratch of O(h*(T/d + n*l' + w)).
//
// Threads (OpenMP): the forward runs over (batch, query, group); the backward computes dq
// over (batch, query, group) and dk/dv over (batch, group, key block) from the keys' side
// ("each thread owns its outputs"), so there are no atomics and no per-thread partial sums.
// Every output element is summed in a fixed order: the result is bit-identical for any
// number of threads.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace nsatron::nsa {

// Shapes and NSA hyper-parameters of one attention core call.
struct NsaDims {
  std::int64_t B = 1;  // batch
  std::int64_t T = 1;  // tokens
  std::int64_t H = 1;  // query heads
  std::int64_t G = 1;  // KV heads (groups)
  std::int64_t D = 2;  // head dim (even)
  std::int64_t cmp_block = 32;   // l
  std::int64_t cmp_stride = 16;  // d
  std::int64_t sel_block = 64;   // l'
  std::int64_t sel_count = 16;   // n
  std::int64_t window = 512;     // w
  double rope_theta = 10000.0;

  std::int64_t heads_per_group() const { return H / G; }
  // Columns per KV group of the eight per-token inputs, in NsaInputs' order (q, k_cmp, v_cmp,
  // k_slc, v_slc, k_win, v_win, gate): h*D, D six times, 3h; input k is [B*T, G * width k].
  std::array<std::int64_t, 8> input_widths() const {
    const std::int64_t h = heads_per_group();
    return {h * D, D, D, D, D, D, D, 3 * h};
  }
  // N: compressed blocks, block i covering tokens [i*d, i*d+l-1].
  std::int64_t num_cmp_blocks() const {
    return T >= cmp_block ? (T - cmp_block) / cmp_stride + 1 : 0;
  }
  // Selection blocks covering [0, T): ceil(T / l').
  std::int64_t num_sel_blocks() const { return (T + sel_block - 1) / sel_block; }
  // Throws nsatron::UserError naming the offending keys (nsa.cmp_block, model.n_heads, ...)
  // when the shape or the hyper-parameters break NSA_SPEC.md's rules.
  void validate() const;
  std::string str() const;  // "B=.. T=.. H=.. G=.. D=.. l=.. d=.. l'=.. n=.. w=.. theta=.."
};

// The rules on the shape that NSA and dense attention (nsa/dense.h) share: B, T >= 1, T fits
// int32, H, G >= 1, H % G == 0, D even and >= 2, rope_theta positive and finite. Returns the
// first broken rule as a message naming its key ("model.head_dim must be even ..."), or "".
std::string attention_shape_problem(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t G, std::int64_t D,
                                    double rope_theta);

// The twelve inputs (read-only). All pointers must be valid for their full shape.
template <class Real>
struct NsaInputs {
  const Real* q = nullptr;
  const Real* k_cmp = nullptr;
  const Real* v_cmp = nullptr;
  const Real* k_slc = nullptr;
  const Real* v_slc = nullptr;
  const Real* k_win = nullptr;
  const Real* v_win = nullptr;
  const Real* gate = nullptr;
  const Real* cmp_wk = nullptr;
  const Real* cmp_wv = nullptr;
  const Real* cmp_pk = nullptr;
  const Real* cmp_pv = nullptr;
};

// Gradient buffers, shaped like the inputs. Activation gradients (q, k_*, v_*, gate) are
// ASSIGNED; parameter gradients (cmp_wk, cmp_wv, cmp_pk, cmp_pv) are ACCUMULATED (+=), so
// micro-batches sum without extra work. A null pointer skips that gradient's output.
template <class Real>
struct NsaGrads {
  Real* q = nullptr;
  Real* k_cmp = nullptr;
  Real* v_cmp = nullptr;
  Real* k_slc = nullptr;
  Real* v_slc = nullptr;
  Real* k_win = nullptr;
  Real* v_win = nullptr;
  Real* gate = nullptr;
  Real* cmp_wk = nullptr;
  Real* cmp_wv = nullptr;
  Real* cmp_pk = nullptr;
  Real* cmp_pv = nullptr;
};

// Everything the forward keeps for the backward (see the header comment for the layouts).
// The forward resizes the vectors; reusing one NsaSaved across steps reuses its memory.
template <class Real>
struct NsaSaved {
  NsaDims dims;
  std::vector<Real> k_cmp_blocks;         // [B, N, G, D], RoPE applied
  std::vector<Real> v_cmp_blocks;         // [B, N, G, D]
  std::vector<std::int32_t> sel_blocks;   // [B, T, G, n]
  std::vector<Real> o_branch;             // [3, B, T, H, D]
  std::vector<Real> lse;                  // [3, B, T, H]

  std::size_t bytes() const;  // memory held, in bytes
  // The same figure without running the forward.
  static std::size_t bytes_for(const NsaDims& dims);
};

// Branch indices in o_branch, lse and the last axis of gate.
enum NsaBranch : int { kBranchCmp = 0, kBranchSlc = 1, kBranchWin = 2 };

// CUDA, bf16 (nsa/cuda/nsa_cuda.h, NsaSavedCuda): how many fp32 branch outputs [B, T, H, D]
// the saved state keeps for the backward's do . o_c: the selection's and the window's, and
// where the head dimension pads to 128 (64 < D <= 128) the compression branch's too, whose
// row backward then runs one pass over its keys with the forward's lse (here for the memory
// plan, core/model/plan.cpp, as well).
inline int cuda_saved_branch_outputs(std::int64_t head_dim) { return head_dim > 64 ? 3 : 2; }

// CUDA (NsaSavedCuda): the saved state as one block, its parts' byte offsets, each 256-byte
// aligned: fp32 compressed K and V [B, Nc, G, D], int32 selected blocks [B, T, G, n], fp32 lse
// [3, B, T, H] and, with keeps_outputs (bf16), the fp32 branch outputs
// [cuda_saved_branch_outputs(D), B, T, H, D]. Here, not in nsa/cuda, so that the memory plan
// (core/model/plan.cpp) counts the bytes the CUDA code allocates from the same formula.
struct CudaSavedLayout {
  std::size_t kc, vc, sel, lse, o, total;
};
inline CudaSavedLayout cuda_saved_layout(const NsaDims& dm, bool keeps_outputs) {
  const auto align = [](std::int64_t bytes) { return std::size_t((bytes + 255) / 256 * 256); };
  const std::int64_t kv = dm.B * dm.num_cmp_blocks() * dm.G * dm.D * 4;
  CudaSavedLayout L{};
  L.kc = 0;
  L.vc = L.kc + align(kv);
  L.sel = L.vc + align(kv);
  L.lse = L.sel + align(dm.B * dm.T * dm.G * dm.sel_count * 4);
  L.o = L.lse + align(3 * dm.B * dm.T * dm.H * 4);
  L.total = L.o + (keeps_outputs ? align(cuda_saved_branch_outputs(dm.D) * dm.B * dm.T * dm.H * dm.D * 4) : 0);
  return L;
}

// Forward: writes out [B,T,H,D]. With `saved` non-null it is filled for nsa_backward;
// with null the forward keeps only what it needs while it runs (inference).
// Validates dims (UserError on bad hyper-parameters).
template <class Real>
void nsa_forward(const NsaDims& dims, const NsaInputs<Real>& in, Real* out,
                 NsaSaved<Real>* saved);

// Backward of sum(out * d_out): d_out [B,T,H,D], `saved` from nsa_forward on the same
// inputs. Assigns the activation gradients, accumulates the parameter gradients.
template <class Real>
void nsa_backward(const NsaDims& dims, const NsaInputs<Real>& in, const NsaSaved<Real>& saved,
                  const Real* d_out, const NsaGrads<Real>& grads);

}  // namespace nsatron::nsa
