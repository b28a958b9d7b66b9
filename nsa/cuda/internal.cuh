// Internal to nsa/cuda/*.cu: the shape record passed to every kernel, element helpers,
// the workspace, and the launchers each translation unit provides.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/device/cuda_check.h"
#include "nsa/cuda/fast_div.h"
#include "nsa/cuda/nsa_cuda.h"
#include "nsa/cuda/selection_loop.h"

namespace nsatron::nsa::cuda::detail {

constexpr int kKeyTile = 32;  // keys per shared-memory tile (one per lane in score loops)

// Shapes and hyper-parameters as plain ints (all products that index memory use int64).
struct Geo {
  int B, T, H, G, D, h, N, NB;
  int l, d, ls, n, w;
  int half;     // D / 2
  float scale;  // 1 / sqrt(D)
  FastDiv hdiv;  // division by h (row index -> position, head)
  FastDiv ddiv;  // division by d (position -> compressed blocks it sees)
  FastDiv Hdiv;  // division by H (pitched rows: query row index -> position, head)
  // Elements from one position's row of the per-token inputs (and their gradients) to the next
  // (TokenPitches, resolved; below 2^31: check_dims): q qp (H*D when contiguous), the keys and
  // values kvp (G*D), the gate gp (3*H). The output, d_out, the compressed keys and values and
  // every scratch tensor are contiguous. (ints, as every field, keeping the record 4-byte
  // aligned: with 64-bit pitches one H200 run had the selection forward, which reads none of
  // them, 5.7% slower at the paper's 8192; on an H100 the ints gave 1.56 against 1.58 ms,
  // docs/performance.md, fourteenth session.)
  int qp, kvp, gp;
};

// Element offset of row `row` = position * units + u of a per-token tensor whose positions are
// `pitch` elements apart and whose units (query heads or KV groups; `units` divides by their
// count) `width` elements apart: row * width where the rows are contiguous, else by a
// multiply-high division (rows below 2^31 where pitched: check_dims; a 64-bit division per row
// cost the gate's readers ~15%, docs/performance.md, 2026-11-28 thirteenth session).
__host__ __device__ inline std::int64_t pitched(std::int64_t row, const FastDiv& units, std::int64_t pitch, int width) {
  if (pitch == std::int64_t(units.d) * width) return row * width;
  int p, u;
  units.divmod(int(row), p, u);
  return std::int64_t(p) * pitch + std::int64_t(u) * width;
}
// The query row `row` = position * H + head of q (Geo::qp) and of the gate (Geo::gp).
__host__ __device__ inline std::int64_t q_offset(const Geo& g, std::int64_t row) { return pitched(row, g.Hdiv, g.qp, g.D); }
__host__ __device__ inline std::int64_t gate_offset(const Geo& g, std::int64_t row) { return pitched(row, g.Hdiv, g.gp, 3); }

// Whether the tensor-core row side can finish dq itself (RowArgs::dq_final): where D is its
// own padded size (32, 64, 128), each column's RoPE partner, D/2 away, is held by the same
// thread of the accumulator layout (columns 8 j + 2 gc: partner j +- DP/16).
inline bool dq_final_fused(int D) { return D == 32 || D == 64 || D == 128; }

inline Geo make_geo(const NsaDims& dm, const TokenPitches& tp = {}) {
  Geo g;
  g.B = int(dm.B);
  g.T = int(dm.T);
  g.H = int(dm.H);
  g.G = int(dm.G);
  g.D = int(dm.D);
  g.h = int(dm.heads_per_group());
  g.N = int(dm.num_cmp_blocks());
  g.NB = int(dm.num_sel_blocks());
  g.l = int(dm.cmp_block);
  g.d = int(dm.cmp_stride);
  g.ls = int(dm.sel_block);
  g.n = int(dm.sel_count);
  g.w = int(dm.window);
  g.half = g.D / 2;
  g.scale = float(1.0 / std::sqrt(double(dm.D)));
  g.hdiv = FastDiv(std::max(1, g.h));
  g.ddiv = FastDiv(std::max(1, g.d));
  g.Hdiv = FastDiv(std::max(1, g.H));
  g.qp = int(tp.q ? tp.q : std::int64_t(g.H) * g.D);
  g.kvp = int(tp.kv ? tp.kv : std::int64_t(g.G) * g.D);
  g.gp = int(tp.gate ? tp.gate : std::int64_t(g.H) * 3);
  return g;
}

// Branches (same numbering as nsa::NsaBranch).
enum Br : int { kCmp = 0, kSlc = 1, kWin = 2 };

__device__ __forceinline__ float ldf(float x) { return x; }
__device__ __forceinline__ float ldf(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T stf(float x);
template <> __device__ __forceinline__ float stf<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 stf<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Number of compressed blocks visible from query t (i*d + l - 1 <= t); the division by d as a
// multiply-high (Geo::ddiv: exact for the non-negative ints it sees).
__host__ __device__ inline int visible_blocks(const Geo& g, int t) {
  if (t < g.l - 1) return 0;
  const int v = g.ddiv.div(t - g.l + 1) + 1;
  return v < g.N ? v : g.N;
}

// ---- the selection rule (selection.cu, select_tc.cuh) ----
// For a position in selection block bt: the blocks 0, bt - 1, bt are forced, the candidates
// are 1..bt-2 (ncand of them), and the top-n takes the returned number of them (== ncand:
// every eligible block is chosen, the row is 0..bt).
__device__ __forceinline__ int selection_take(const Geo& g, int bt, int& ncand) {
  const int forced = 1 + (bt - 1 > 0) + (bt > 0);
  ncand = max(0, bt - 2);
  return min(max(g.n - forced, 0), ncand);
}
// Compressed block i covers tokens [i d, i d + l - 1], selection block j [j l', (j+1) l' - 1];
// with L = l / d and S = l' / d (whole numbers: the config requires d | l and d | l'), their
// bounds in units of d are [i, i + L) and [j S, (j + 1) S).
// The weight of compressed block i in the score of selection block j: the tokens they share
// over d (paper Eq. 9), without a division.
__device__ __forceinline__ float overlap_weight_units(int i, int j, int L, int S) {
  return float(min(i + L, (j + 1) * S) - max(i, j * S));
}
// The compressed blocks [i_lo, i_hi] that overlap selection block j (i < (j + 1) S and
// i + L > j S). Not clamped to N or to what a position sees.
__device__ __forceinline__ void overlapping_cmp_blocks_units(int j, int L, int S, int& i_lo, int& i_hi) {
  i_lo = max(0, j * S - L + 1);
  i_hi = (j + 1) * S - 1;
}
// The top-n order: score v1 of block j1 ranks before v2 of j2 (score descending, index
// ascending; j2 == INT_MAX: no candidate yet). Callers map NaN to -inf first.
__device__ __forceinline__ bool ranks_before(float v1, int j1, float v2, int j2) {
  return j2 == INT_MAX || v1 > v2 || (v1 == v2 && j1 < j2);
}
// Block scores are sums of probabilities (>= 0, or NaN); a candidate already taken by the
// top-n is marked with this value in the score array.
constexpr float kTakenScore = -1.f;
// Folds the candidates j = from, from + stride, ... <= last of S into (bv, bj) under
// ranks_before, skipping taken ones and ranking NaN as -inf.
__device__ __forceinline__ void scan_candidates(const float* S, int from, int last, int stride,
                                                float& bv, int& bj) {
  for (int j = from; j <= last; j += stride) {
    float v = S[j];
    if (v == kTakenScore) continue;
    if (v != v) v = -INFINITY;
    if (ranks_before(v, j, bv, bj)) {
      bv = v;
      bj = j;
    }
  }
}
// The best candidate (bv, bj) of a warp, in every lane (bj == INT_MAX: none).
__device__ __forceinline__ void warp_best_candidate(float& bv, int& bj) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oj = __shfl_xor_sync(0xffffffffu, bj, o);
    if (oj != INT_MAX && ranks_before(ov, oj, bv, bj)) {
      bv = ov;
      bj = oj;
    }
  }
}
// Writes a selection row of n entries for a position of block bt whose `take` chosen
// candidates are chosen[0, take) (sorted here, in place): 0, the candidates ascending, bt - 1,
// bt, then -1. Only for rows with a real choice (take < the number of candidates, so bt >= 3).
__device__ inline void write_selection_row(std::int32_t* out, int* chosen, int take, int bt, int n) {
  for (int x = 1; x < take; ++x) {  // insertion sort, ascending
    const int v = chosen[x];
    int y = x - 1;
    while (y >= 0 && chosen[y] > v) {
      chosen[y + 1] = chosen[y];
      --y;
    }
    chosen[y + 1] = v;
  }
  int k = 0;
  out[k++] = 0;
  for (int x = 0; x < take; ++x) out[k++] = chosen[x];
  out[k++] = bt - 1;
  out[k++] = bt;
  for (; k < n; ++k) out[k] = -1;
}

// write_selection_row by a warp, where take <= 32: the lanes with `has` hold the chosen
// candidates cj (distinct blocks), each with its place among them (ascending order).
__device__ inline void warp_write_selection_row_at(std::int32_t* out, bool has, int cj, int place, int take, int bt,
                                                   int n, int lane) {
  if (has) out[1 + place] = cj;
  if (lane == 0) out[0] = 0, out[take + 1] = bt - 1, out[take + 2] = bt;  // take may be 32
  for (int k = take + 3 + lane; k < n; k += 32) out[k] = -1;
}
// The same where lane x < take holds the chosen candidate cj, in any order: its place is the
// number of smaller ones.
__device__ inline void warp_write_selection_row(std::int32_t* out, int cj, int take, int bt, int n, int lane) {
  int place = 0;
  for (int o = 0; o < take; ++o) place += __shfl_sync(0xffffffffu, cj, o) < cj ? 1 : 0;
  warp_write_selection_row_at(out, lane < take, cj, place, take, bt, n, lane);
}

// RoPE of one element from its value xv, its partner's xp (half away) and r = (c, s) of its
// pair; lo: the element is in the first half (rope_back_pair is its inverse).
__device__ __forceinline__ float rope_pair(float xv, float xp, float2 r, bool lo) {
  return lo ? xv * r.x - xp * r.y : xv * r.x + xp * r.y;
}
// RoPE element dd of a row x (T or float) at a position whose table row is cs:
// y[i] = x[i] c - x[i+half] s, y[i+half] = x[i+half] c + x[i] s.
template <class X>
__device__ __forceinline__ float rope_elem(const X* x, int dd, int half, const float2* cs) {
  const bool lo = dd < half;
  const int i = lo ? dd : dd - half;
  return rope_pair(ldf(x[dd]), ldf(x[lo ? dd + half : dd - half]), cs[i], lo);
}
// rope_elem of the elements dd and dd + 1 of a bf16 row, by two-element loads, in two steps so
// that a caller can issue the loads of several rows before the first rotation: rope_pair_load
// (a bf16 pair, its partner pair half away, two table entries as one float4) and
// rope_pair_apply. Needs dd and half even (both elements in the same half; every load aligned:
// x's rows and cs's hold an even number of elements).
struct RopePairLoad {
  __nv_bfloat162 x, partner;
  float4 cs;  // (c, s) of pairs i and i + 1
};
__device__ __forceinline__ RopePairLoad rope_pair_load(const __nv_bfloat16* x, int dd, int half, const float2* cs) {
  const bool lo = dd < half;
  const int i = lo ? dd : dd - half;
  return {*reinterpret_cast<const __nv_bfloat162*>(x + dd),
          *reinterpret_cast<const __nv_bfloat162*>(x + (lo ? dd + half : dd - half)),
          *reinterpret_cast<const float4*>(cs + i)};
}
__device__ __forceinline__ void rope_pair_apply(const RopePairLoad& l, bool lo, float& y0, float& y1) {
  const float2 xv = __bfloat1622float2(l.x), xp = __bfloat1622float2(l.partner);
  y0 = rope_pair(xv.x, xp.x, make_float2(l.cs.x, l.cs.y), lo);
  y1 = rope_pair(xv.y, xp.y, make_float2(l.cs.z, l.cs.w), lo);
}
// Inverse rotation (the backward of rope_elem): dx[i] = dy[i] c + dy[i+half] s,
// dx[i+half] = dy[i+half] c - dy[i] s. rope_back_pair: one element from its value yv, its
// partner's yp (half away) and r = (c, s) of its pair; lo: the element is in the first half.
__device__ __forceinline__ float rope_back_pair(float yv, float yp, float2 r, bool lo) {
  return lo ? yv * r.x + yp * r.y : yv * r.x - yp * r.y;
}
// y is a float row (shared or global).
__device__ __forceinline__ float rope_back_elem(const float* y, int dd, int half,
                                                const float2* cs) {
  const bool lo = dd < half;
  const int i = lo ? dd : dd - half;
  return rope_back_pair(y[dd], y[lo ? dd + half : dd - half], cs[i], lo);
}

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("nsa cuda: ") + what + ": " + cudaGetErrorString(e));
}

inline unsigned grid1(std::int64_t units, int threads) {
  std::int64_t b = (units + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 1048576) b = 1048576;
  return unsigned(b);
}

// ---- launchers (one translation unit each) -------------------------------------------------
// compression.cu: the compressed keys/values as matrix products. `scratch` holds at least
// compress_scratch_bytes(g, sizeof(T)) bytes (256-byte aligned).
std::size_t compress_scratch_bytes(const Geo& g, int elem_bytes);
template <class T>
void launch_compress_forward(const Geo& g, const T* x, const T* w, const T* p, const float2* rope,
                             float* y, void* scratch, cudaStream_t s);
template <class T>
void launch_compress_backward(const Geo& g, const T* x, const T* w, const T* p, const float* dy,
                              T* dx, float* dw, float* dp, void* scratch, cudaStream_t s);
// selection.cu
template <class T>
void launch_select(const Geo& g, const T* q, const float2* rope, const float* kc,
                   const float* lse_cmp, std::int32_t* sel, cudaStream_t s);
// attention.cu (select_tc.cuh): bf16 only. The compression branch's forward and the block
// selection in one tensor-core kernel whose scores are fp32-accurate (fp16 hi + lo parts of
// the scaled query and keys): o_cmp, its lse and sel_blocks, replacing the fp32 row kernel and
// launch_select. cmp_select_tc_smem is its shared memory for g, or 0 where it cannot run
// (more than 128 heads per group, or not even one position's NB block scores fit; a block
// takes fewer positions than 128 / h where their block scores would not fit): then the fp32
// kernels run. Scratch: kparts 2 * B*N*G*padded_dim(D) halves, kinv B*N*G floats,
// vparts 2 * B*N*G*padded_dim(D) bf16.
struct CmpSelectScratch {
  __half* kparts;
  float* kinv;
  __nv_bfloat16* vparts;
};
std::size_t cmp_select_tc_smem(const Geo& g);
void launch_cmp_select_tc(const Geo& g, const __nv_bfloat16* q, const float2* rope,
                          const float* kc, const float* vc, CmpSelectScratch scratch,
                          float* o, float* lse, std::int32_t* sel, cudaStream_t s);
// attention.cu
struct RowArgs {  // row-side kernels (forward, and dq in the backward)
  // The per-token inputs and their gradients: positions' rows Geo::qp (q), kvp (keys, values)
  // and gp (gate) elements apart (TokenPitches); everything else contiguous.
  const void* q;       // T [B,T,H,D]
  const void* k;       // branch keys: T [B,T,G,D] (slc, win) or fp32 [B,N,G,D] (cmp)
  const void* v;
  const float2* rope;  // [T, D/2] (cos, sin)
  const std::int32_t* sel;  // [B,T,G,n]
  // forward
  void* o;             // [B,T,H,D] branch output: fp32 when o_f32 (the NSA branch outputs, kept
  bool o_f32;          // for the backward's do . o_c), else T (dense attention's output)
  float* lse;          // [B,T,H]
  // backward (one branch): reads d_out, the gate logits and lse, and writes dq (when dq is
  // set). With dot_in (do . o_c per row, [B,T,H]: branch_dot_kernel from the saved branch
  // output) or o_dot the row side makes one pass over the keys for dq; without either, it first recomputes
  // do . o_c = sum_j p_j (do . v_j) in fp32 in a pass of its own and writes sigmoid(gate_c),
  // delta_c = g_c (do . o_c) and the gate gradient (when dgate is set). The compression
  // branch's one pass (padded D = 128, dot_in set) writes them too, from its own lsum.
  const float* dot_in;
  // bf16 tensor-core backward at padded D <= 64, instead of dot_in: the branch's saved fp32
  // output [B,T,H,D], from which the row kernel sums do . o_c itself (the quantity
  // branch_dot_kernel gives, summed in another order; in its prologue under the first tile's
  // copies; d_out's rows read as bf16 pairs: D is even, d_out 4-byte aligned) and writes
  // sigmoid(gate_c), delta_c and the gate gradient as without dot_in.
  const float* o_dot;
  const void* dout;    // T [B,T,H,D]
  const void* gate;    // T [B,T,H,3]; null: the gate is 1 (dense attention, nsa/cuda/dense.h)
  // bf16 tensor-core forward of the window branch (the last): also the gated sum
  // out = sum_c sigmoid(gate_c) o_c (as combine_kernel) into gated_out (bf16 [B,T,H,D]), from
  // the other branches' fp32 outputs o_cmp_in, o_slc_in and this one's.
  void* gated_out;
  const float* o_cmp_in;
  const float* o_slc_in;
  const float* lse_in; // [B,T,H]
  float* gsig;         // [B,T,H]
  float* delta;        // [B,T,H]
  void* dgate;         // T [B,T,H,3] or null
  float* dq;           // fp32 [B,T,H,D], rotated space, or null
  bool accumulate;     // dq += (else =)
  // bf16 tensor-core row side, the last branch, where D is 32, 64 or 128 (dq_final_fused): the
  // finished query gradient, rotated back (as dq_rotate_kernel would) and stored as bf16
  // [B,T,H,D] here instead of the fp32 sum in dq (which it still reads when accumulate).
  void* dq_final;
  float* lse_tc;       // bf16 compression backward: the lse of the tensor-core scores, [B,T,H]
                       // (the key side's probabilities must match the row side's)
  // bf16 compression backward in one pass (with dot_in): the mean of the first j + 1
  // compressed keys, fp32 [B,N,G,D] (cmp_prefix_mean_kernel), the mean part of the reference c
  // of the pass's correction (row_kernel: dq = A / S0 - (S1 / S0 - do . o_c) c, c = w k_top +
  // (1 - w) mean with the row's most probable key k_top from k), or null.
  const float* cmp_ref;
  // bf16 only, optional: padded bf16 copies [B, NK, G, padded_dim(D)] of the branch keys
  // (RoPE applied) and values (launch_tc_pad); when set, the tensor-core kernel runs. The
  // compression branch's backward takes its fp32 keys and values as cmp_kv_parts(DP) parts each,
  // B*N*G*padded_dim(D) elements apart.
  const void* tck;
  const void* tcv;
  // bf16 tensor-core kernels: padded bf16 copies [B, T, H, padded_dim(D)] of the rotated
  // queries and (backward) of d_out, from which the row kernels stage their rows.
  const void* tcq;
  const void* tcql;    // the rotated q's bf16 rounding residuals (win_score_parts(DP) == 2), or null
  const void* tcdo;
};
// Padded bf16 copy of src [B, NK, G, D] (S = bf16 or float) into dst [B, NK, G, padded_dim(D)],
// rotated at position s (the row's key index) when rope is non-null; zeros past D. With
// parts > 1, also the bf16 rounding residuals, part p at dst + p * B*NK*G*padded_dim(D): 2 parts
// carry ~16 significant bits, 3 parts ~24 (fp32).
// The compression branch's tensor-core backward (row and key sides) reads its fp32 compressed
// keys and values as cmp_kv_parts(padded D) bf16 parts: up to padded D = 64, hi + lo (~16 bits;
// the other branches' keys and values are bf16 inputs already), so their rounding adds no
// error of its own to the products (with one part, grad_cmp_pk reached 9.6e-3 of the 1e-2
// bound at D = 6, and at D = 48 with one head per group grad_q's worst was 8.1e-3 over 25
// seeds, one of them past the bound in an earlier session; with two, at most 5.7e-3 of 30);
// at padded D = 128, one part, the bf16 rounding (the compression backward's products halve:
// docs/performance.md, 2026-11-26 and 2026-11-28 twelfth session, with what each choice costs).
constexpr int cmp_kv_parts(int DP) { return DP <= 64 ? 2 : 1; }
template <class S>
void launch_tc_pad(const Geo& g, const S* src, __nv_bfloat16* dst, const float2* rope, int NK,
                   cudaStream_t s, int parts = 1, std::int64_t pitch = 0);  // pitch 0: G * D
template <class T>
void launch_row(const Geo& g, int branch, bool backward, const RowArgs& a, cudaStream_t s);

struct KeyArgs {  // key-side backward kernels
  const void* q;       // T [B,T,H,D] (rows Geo::qp apart, as RowArgs::q)
  const void* dout;    // T
  const void* k;       // branch keys (as in RowArgs)
  const void* v;
  const float2* rope;
  const std::int32_t* sel;
  const float* lse;    // [B,T,H] of this branch
  const float* gsig;
  const float* delta;
  void* dk;            // T [B,T,G,D] (slc, win; rows Geo::kvp apart) or fp32 [B,N,G,D] (cmp), unrotated
  void* dv;
  // compression only: the queries are split into cmp_key_splits(g) position ranges; with
  // more than one, each range writes its partial dK, dV to split_dk/split_dv
  // [splits][B,N,G,D] and a second pass sums the ranges in ascending order.
  float* split_dk;
  float* split_dv;
  // bf16 only, optional (selection and window): padded bf16 copies [B, T, G, DP] of the keys
  // (rotated) and values, and [B, T, H, DP] of q (rotated; tcql: its rounding residuals, only
  // where key_q_parts(DP) == 2) and d_out; the selection branch
  // also needs the inverse index (inv_off [B*G*NB + 1], inv_pos: launch_inverse_index).
  // When tck is set, the tensor-core kernel runs.
  const void* tck;
  const void* tcv;
  const void* tcq;
  const void* tcql;
  const void* tcdo;
  const int* inv_off;
  const int* inv_pos;
  // selection, tensor core: scratch for split row lists (key_split_floats(g) floats) and
  // one zeroed ticket per (b, g, block, 64-key sub-tile) (key_tickets(g) ints).
  float* slc_part;
  int* slc_ticket;
};
// Tensor-core selection key side: a block's row list is split every key_rows_per_split(g)
// (position, head) rows, a multiple of the kernel's row batches and a function of the shape
// only (the splits' fp32 partials are added in split order: the bits depend on it). The first
// block is chosen by every position, so its list (T h rows per (b, g)) is the kernel's longest
// path: with a fixed 8192 it set the kernel's time at a tensor-parallel rank's share of the
// 125M layer (H = 6, G = 1: 0.33 ms for 8 sequences, 0.38 for 16; docs/performance.md,
// fourteenth session). So the split is the total rows over kKeySplitShare, within
// [kKeyRowSplitMin, kKeyRowSplitMax]: large shapes keep 8192 (the paper's 8192 and 64k, the
// whole 125M layer), small ones split finer.
constexpr int kKeyRowSplitMin = 1024, kKeyRowSplitMax = 8192, kKeySplitShare = 512;
// Every (position, head) row of every selection list: B T G n h.
__host__ __device__ inline std::int64_t key_total_rows(const Geo& g) {
  return std::int64_t(g.B) * g.T * g.G * g.n * g.h;
}
__host__ __device__ inline int key_rows_per_split(const Geo& g) {
  std::int64_t per = (key_total_rows(g) / kKeySplitShare + 63) / 64 * 64;
  if (per < kKeyRowSplitMin) per = kKeyRowSplitMin;  // (constexprs: usable in device code)
  if (per > kKeyRowSplitMax) per = kKeyRowSplitMax;
  return int(per);
}
inline int key_max_splits(const Geo& g) {
  const int per = key_rows_per_split(g);
  return int((std::int64_t(g.T) * g.h + per - 1) / per);
}
inline int key_subtiles(const Geo& g) { return (g.ls + 63) / 64; }
inline std::int64_t key_tickets(const Geo& g) {
  return std::int64_t(g.B) * g.G * g.NB * key_subtiles(g);
}
inline std::int64_t key_split_floats(const Geo& g, int DP) {
  // slots: total rows / key_rows_per_split + units + 1, each [subtiles][2][64][DP]
  const std::int64_t slots = key_total_rows(g) / key_rows_per_split(g) + std::int64_t(g.B) * g.G * g.NB + 1;
  return slots * key_subtiles(g) * 2 * 64 * DP;
}
// Inverse selection index: for each unit (b, g, j) of B*G*NB, the positions t >= j*l' whose
// selected blocks contain j, ascending, at pos[off[unit] .. off[unit+1]). mask needs
// B*G*NB*ceil(T/32) words and cnt B*G*NB ints of scratch; pos at most B*T*G*n ints.
void launch_inverse_index(const Geo& g, const std::int32_t* sel, std::uint32_t* mask, int* cnt,
                          int* off, int* pos, cudaStream_t s);
// attention.cu (select_inv.cuh): the selection branch's row side as the inverted loop (bf16
// only; selection_loop.h says when). The partial states of a pass of slc_inv_bg_per_pass(g)
// (b, g) pairs: part slc_inv_part_floats(g) floats, part_lse slc_inv_lse_floats(g); nblk
// B*G*NB ints and choff B*G*NB + 1 ints of scratch; off, pos: launch_inverse_index's. A pass
// takes as many (b, g) pairs as fit inverted_pass_bytes() (1 GiB unless a test sets it), at
// least one (selection_loop.h bounds one pair's bytes where auto chooses the loop).
inline int slc_inv_bg_per_pass(const Geo& g) {
  const std::int64_t per_bg = std::max<std::int64_t>(1, inverted_pair_bytes(g.T, g.h, g.n, g.D));
  const std::int64_t bg = std::int64_t(g.B) * g.G;
  return int(std::max<std::int64_t>(1, std::min<std::int64_t>(bg, inverted_pass_bytes() / per_bg)));
}
inline std::int64_t slc_inv_lse_floats(const Geo& g) {
  return std::int64_t(slc_inv_bg_per_pass(g)) * g.T * g.h * g.n;
}
inline std::int64_t slc_inv_part_floats(const Geo& g) { return slc_inv_lse_floats(g) * g.D; }
struct SlcInvIndex {
  const int* off;
  const int* pos;
  int* nblk;
  int* choff;
  float* part;
  float* part_lse;
};
// Whether the device can run the inverted loop at g: l' within kInvMaxSub 64-key tiles whose
// shared memory (the backward's, the larger) fits the device's opt-in limit, and T h < 2^31.
bool slc_inverted_fits(const Geo& g);
// Forward (backward false): writes a.o (fp32) and a.lse of the selection branch from a.tcq,
// a.tck, a.tcv, a.sel. Backward: dq (a.dq, += when a.accumulate) from a.tcq, a.tcdo, a.tck,
// a.tcv, a.lse_in, a.dot_in and a.gate.
void launch_slc_inverted(const Geo& g, bool backward, const RowArgs& a, const SlcInvIndex& ix, cudaStream_t s);
// Tensor-core compression key side (bf16): blocks of 64 compressed keys; a block's rows (the
// positions from its first key's i*d + l - 1 on, x h heads) are split into ranges of
// cmp_key_rows_per_split(g) rows (a function of the shape only), at most kCmpKeyMaxSplits,
// whose fp32 partials the last block to finish adds in order (as for split selection lists):
// scratch of cmp_key_split_floats(g, DP) floats and cmp_key_blocks(g) * B * G zeroed tickets.
constexpr int kCmpKeyMaxSplits = 16;
// The fewest rows a range holds: at the 125M shape (T = 2048, h = 6) 8192 gave 2 key tiles x
// 2 ranges x 32 (b, g) = 128 blocks on 132 SMs (ncu: 6% achieved occupancy, 0.58 ms);
// 2048 gave up to 6 ranges per tile, 96 blocks for a tensor-parallel rank's share of it on 8
// sequences (0.091 ms against 0.109 for 16: docs/performance.md, fourteenth session); 768
// gives 16.
constexpr int kCmpKeyMinRows = 768;
inline int cmp_key_blocks(const Geo& g) { return (g.N + 63) / 64; }
__host__ __device__ inline int cmp_key_rows_per_split(const Geo& g) {
  const std::int64_t rows = std::int64_t(g.T - g.l + 1 > 0 ? g.T - g.l + 1 : 0) * g.h;
  std::int64_t per = (rows + kCmpKeyMaxSplits - 1) / kCmpKeyMaxSplits;
  if (per < kCmpKeyMinRows) per = kCmpKeyMinRows;  // (a constexpr: usable in device code)
  return int((per + 63) / 64 * 64);
}
inline int cmp_key_max_splits(const Geo& g) {
  const std::int64_t rows = std::int64_t(g.T - g.l + 1 > 0 ? g.T - g.l + 1 : 0) * g.h;
  const std::int64_t s = (rows + cmp_key_rows_per_split(g) - 1) / cmp_key_rows_per_split(g);
  return int(s < 1 ? 1 : s);
}
inline std::int64_t cmp_key_tickets(const Geo& g) {
  return std::int64_t(g.B) * g.G * cmp_key_blocks(g);
}
inline std::int64_t cmp_key_split_floats(const Geo& g, int DP) {
  return cmp_key_tickets(g) * kCmpKeyMaxSplits * 2 * 64 * DP;
}
inline int cmp_key_splits(const Geo& g) {
  if (g.N == 0) return 1;
  const int s = g.T / 512;
  return s < 1 ? 1 : (s > 16 ? 16 : s);
}
template <class T>
void launch_keys(const Geo& g, int branch, const KeyArgs& a, cudaStream_t s);

// nsa_cuda.cu helpers used by the others
int padded_dim(int D);  // 32, 64 or 128; throws above 128
int smem_optin();       // the current device's opt-in shared memory limit of one block, bytes
int sm_count();         // the current device's multiprocessors
int compute_capability_major();  // the current device's
// Parts of the rotated q in the tensor-core key side's dK += dS^T Q: bf16 hi + lo (2) at
// DP = 32, where with one part grad_k reached 1.04e-2 of the 1e-2 bound (D = 6); one above.
constexpr int key_q_parts(int DP) { return DP <= 32 ? 2 : 1; }
// Parts of dS in the key side's dK += dS^T Q: bf16 hi + lo (2) up to DP = 64; one at 128, as
// flash attention rounds it (one product of the five per row group less: backward -3% at the
// paper's 8192, -4% at 125M; the parity cases' worst grad_k rose from 4.8e-3 to 5.5e-3 at
// D = 128, docs/performance.md, 2026-11-27). At D = 48 with one head per group one part left
// grad_k_win / grad_k_slc at up to 8.1e-3 over 25 fresh seeds, near the 1e-2 bound (one
// session's run failed it); two parts, with cmp_kv_parts' two, keep every gradient's worst at
// 6.4e-3 over 30 (docs/performance.md, 2026-11-28 twelfth session: the 125M core's backward
// +9%).
constexpr int key_ds_parts(int DP) { return DP <= 64 ? 2 : 1; }
// Parts of dS in the row side's dq += dS K: bf16 hi + lo (2) up to DP = 64, one at 128 (as
// key_ds_parts). With one part, dense attention's dq exceeded the 1e-2 bound at D = 32 on one
// seed of 30 (1.1e-2; 4.3e-3 with two) and came nearer it at D = 2 (its dS terms cancel:
// sum_j dS_j = 0; the key side's split is for the same reason); D = 2's remaining excess is the
// scores' (docs/performance.md, 2026-11-27, second session). At D = 64 one part failed
// DenseCuda.Bf16MatchesCpu at T = 300 on one seed (dq 1.02e-2; bench/bf16_error_model.py on
// that seed's inputs: 1.018e-2 with one part, 5.98e-3 with two; the GPU then 6.0e-3). Cost: the
// 125M core's backward +5%, training -3.7% (docs/performance.md, 2026-11-29, twenty-third
// session). At 128 the model's worst over 120 seeds (T = 1000) is 8.8e-3 with one part.
constexpr int row_ds_parts(int DP) { return DP <= 64 ? 2 : 1; }
// Parts of the rotated q and k in the window branch's scores (so dense attention's too) at
// padded D = 32: bf16 hi + lo, s = q_hi k_hi + q_hi k_lo + q_lo k_hi (the values then go as
// two parts as well, the second zero); one above. With one part, the scores of D = 2 (two
// terms each) put dense dq above the 1e-2 bound on ~10% of seeds (bench/bf16_error_model.py).
constexpr int win_score_parts(int DP) { return DP <= 32 ? 2 : 1; }

}  // namespace nsatron::nsa::cuda::detail
