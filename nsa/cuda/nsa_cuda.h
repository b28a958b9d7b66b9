// The NSA attention core on CUDA: the same function as the CPU reference (nsa/nsa.h,
// NSA_SPEC.md), forward and backward, on device pointers. Built only with CUDA
// (NSATRON_WITH_CUDA); docs/nsa.md ("CUDA kernels") describes the kernels.
//
// Element type T: float (fp32 storage and math) or __nv_bfloat16 (bf16 storage of the
// inputs, outputs and activation gradients; accumulation in fp32; the row side of the
// selection and window branches multiplies bf16 operands on the tensor cores, the rest is
// fp32 arithmetic).
// Layouts are those of nsa/nsa.h (contiguous, row-major): q, out, d_out [B,T,H,D];
// k_*, v_* [B,T,G,D]; gate [B,T,H,3]; cmp_wk, cmp_wv [G,l*D,D]; cmp_pk, cmp_pv [G,l,D].
//
// Gradient convention (as on the CPU): activation gradients (q, k_*, v_*, gate) are
// ASSIGNED, in T; parameter gradients (cmp_wk, cmp_wv, cmp_pk, cmp_pv) are ACCUMULATED (+=)
// into fp32 buffers for either T (the master-weight gradients of a bf16 model stay fp32).
// A null pointer skips that gradient.
//
// Row pitches (TokenPitches): the per-token inputs q, k_*, v_* and gate, and their gradients,
// may each be a column range of wider rows, as the model's fused projection writes them
// (core/model/model.h): position p's row of q then starts at q + p * pitches.q (the H heads'
// D elements each, adjacent), of each key or value tensor at k + p * pitches.kv, of the gate at
// gate + p * pitches.gate. The gradients are written with the same pitches; nothing else in
// their rows is read or written. out and d_out stay contiguous.
//
// Limits: head dim D <= 128 (even, as always). Everything runs on the given stream; the
// scratch memory (RoPE table, backward temporaries) is a grow-only workspace per host
// thread, so one host thread must not run two NSA calls on different streams at once.
// Growing the workspace or a saved state calls cudaMalloc/cudaFree (which synchronise);
// at steady state (same shapes) there is no host synchronisation.
//
// Determinism: every output element is produced by one thread in a fixed order (no float
// atomics); results are bit-identical from run to run on the same GPU model.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nsa/nsa.h"

namespace nsatron::nsa::cuda {

using bf16 = __nv_bfloat16;

// Elements from one position's row to the next; 0: contiguous (H*D for q, G*D for the keys and
// values, 3*H for the gate). A non-zero pitch is at least that width.
struct TokenPitches {
  std::int64_t q = 0;
  std::int64_t kv = 0;  // each of k_cmp, v_cmp, k_slc, v_slc, k_win, v_win
  std::int64_t gate = 0;
};

// Gradient buffers on the device (see the header comment for the convention).
template <class T>
struct NsaGradsCuda {
  T* q = nullptr;
  T* k_cmp = nullptr;
  T* v_cmp = nullptr;
  T* k_slc = nullptr;
  T* v_slc = nullptr;
  T* k_win = nullptr;
  T* v_win = nullptr;
  T* gate = nullptr;
  float* cmp_wk = nullptr;  // fp32, accumulated
  float* cmp_wv = nullptr;
  float* cmp_pk = nullptr;
  float* cmp_pv = nullptr;
};

// What the forward keeps for the backward, in device memory owned by this object
// (grow-only: reusing one object across steps reuses its memory).
//   k_cmp_blocks, v_cmp_blocks  fp32 [B,N,G,D]  compressed keys (RoPE applied) / values
//   sel_blocks                  int32 [B,T,G,n]  ascending, -1 padded (as on the CPU)
//   lse                         fp32 [3,B,T,H]   per-branch log-sum-exp (-inf: no keys)
//   o_slc_win                   fp32 [k,B,T,H,D] the selection and window branch outputs
//                               and, at padded D = 128, the compression branch's (k =
//                               nsa::cuda_saved_branch_outputs(D): 2 or 3), bf16 only (null
//                               for fp32)
// bf16: the backward's do . o_c of the selection and window branches comes from o_slc_win,
// kept in fp32 (a bf16-rounded o_c would move dq by the rounding of o_c times
// sum_j p_j k_j), so their tensor-core row side needs one pass over the keys for dq instead
// of two. So does the compression branch's at padded D = 128, with the forward's lse and a
// correction for its bf16 scores' probabilities (row_kernel, cmp_backward_one_pass); at
// padded D <= 64 its row side recomputes its own lse and do . o_c = sum_j p_j (do . v_j) in a
// pass of its own (see nsa_backward), and so does the fp32 row kernel, in its single pass.
class NsaSavedCuda {
 public:
  NsaSavedCuda() = default;
  ~NsaSavedCuda();
  NsaSavedCuda(const NsaSavedCuda&) = delete;
  NsaSavedCuda& operator=(const NsaSavedCuda&) = delete;

  NsaDims dims;
  int elem_bytes = 0;  // sizeof(T) of the forward that filled it
  float* k_cmp_blocks = nullptr;
  float* v_cmp_blocks = nullptr;
  std::int32_t* sel_blocks = nullptr;
  float* lse = nullptr;
  float* o_slc_win = nullptr;

  std::size_t bytes() const;  // device memory in use for the current dims
  static std::size_t bytes_for(const NsaDims& dims, int elem_bytes);
  // Copies sel_blocks to the host (synchronises the stream).
  std::vector<std::int32_t> sel_blocks_host(cudaStream_t stream = nullptr) const;

  // Makes room for `dims` (internal; called by nsa_forward).
  void reserve(const NsaDims& dims, int elem_bytes);

 private:
  void* block_ = nullptr;
  std::size_t capacity_ = 0;
};

// Forward: out [B,T,H,D] (device). With `saved` non-null it is filled for nsa_backward;
// null keeps only scratch (inference). Validates dims (nsatron::UserError).
template <class T>
void nsa_forward(const NsaDims& dims, const NsaInputs<T>& in, T* out, NsaSavedCuda* saved,
                 cudaStream_t stream = nullptr, const TokenPitches& pitches = {});

// Backward of sum(out * d_out) with `saved` from nsa_forward on the same inputs and dims.
// (`pitches` as the forward's.)
template <class T>
void nsa_backward(const NsaDims& dims, const NsaInputs<T>& in, const NsaSavedCuda& saved,
                  const T* d_out, const NsaGradsCuda<T>& grads, cudaStream_t stream = nullptr,
                  const TokenPitches& pitches = {});

}  // namespace nsatron::nsa::cuda
