// The NSA core on CUDA: entry points (nsa_cuda.h), the saved state, the workspace, and the
// small element-wise kernels (RoPE table, gate combination, dq rotation). The branch kernels are in attention.cu, selection.cu and compression.cu.
//
// Forward:  RoPE table (cached) -> compressed K (rotated) and V -> compression attention
//           (o_cmp, lse_cmp) -> selection (from q, Kc and lse_cmp) -> selected attention ->
//           window attention -> gated sum.
// Backward: per branch, the row side recomputes P and gets do . o_c = sum_j p_j (do . v_j),
//           hence delta_c = g_c (do . o_c), d gate and dq (fp32, rotated; inverse rotation
//           after the three branches) -> key side of the window, selected and compressed
//           keys -> compression backward (tokens, W, p).
#include <algorithm>
#include <climits>
#include <map>
#include <type_traits>
#include <mutex>

#include "core/util/error.h"
#include "nsa/cuda/internal.cuh"
#include "nsa/cuda/dense.h"

namespace nsatron::nsa::cuda {

namespace {
// bf16: whether the compression branch's row backward makes one pass over its keys or two.
// Two: its own tensor-core lse and lsum = do . o_c in a first pass, so that its probabilities
// sum to one over its bf16 scores, then dq. One (where the head dimension pads to 128: the
// paper's shapes, where the second walk over every visible compressed key was half of row cmp
// bwd's 21 ms at 64k): the forward's lse and do . o_c from the saved fp32 output, as the
// selection and window do, with the correction of row_kernel (the row sums S0 = sum p~ and
// S1 = sum p~ dP, and the prefix means of the compressed keys, cmp_prefix_mean_kernel) that
// takes dq back to the two-pass value up to (S1/S0 - do . o_c)(kbar - c); without it the bf16
// parity failed (grad_q 1.15e-2, docs/performance.md, 2026-11-28 sixteenth session).
bool cmp_backward_one_pass(std::int64_t head_dim) { return cuda_saved_branch_outputs(head_dim) == 3; }
}  // namespace

namespace detail {

int padded_dim(int D) {
  if (D <= 32) return 32;
  if (D <= 64) return 64;
  if (D <= 128) return 128;
  throw UserError("NSA attention on CUDA: model.head_dim " + std::to_string(D) +
                  " is not supported (at most 128)");
}

namespace {
int current_device_attribute(cudaDeviceAttr attribute) {
  int dev = 0, value = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, dev));
  return value;
}
}  // namespace

int smem_optin() { return current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin); }
int sm_count() { return current_device_attribute(cudaDevAttrMultiProcessorCount); }
int compute_capability_major() { return current_device_attribute(cudaDevAttrComputeCapabilityMajor); }

namespace {

std::size_t align_up(std::size_t x) { return (x + 255) & ~std::size_t(255); }

__global__ void rope_table_kernel(float2* cs, int T, int half, int D, double theta) {
  const std::int64_t total = std::int64_t(T) * half;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int p = int(idx / half), i = int(idx % half);
    const double freq = pow(theta, -2.0 * double(i) / double(D));
    const double angle = double(p) * freq;
    cs[idx] = make_float2(float(cos(angle)), float(sin(angle)));
  }
}


// out = sum_c sigmoid(gate_c) o_c over the three branch outputs (fp32 [B,T,H,D] each).
template <class T>
__global__ void combine_kernel(Geo g, T* __restrict__ out, const float* __restrict__ o_cmp,
                               const float* __restrict__ o_slc, const float* __restrict__ o_win,
                               const T* __restrict__ gate, std::int64_t BTH, int D) {
  const std::int64_t total = BTH * D;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const T* gt = gate + gate_offset(g, idx / D);
    const float g0 = sigmoidf(ldf(gt[0])), g1 = sigmoidf(ldf(gt[1])), g2 = sigmoidf(ldf(gt[2]));
    out[idx] = stf<T>(g0 * o_cmp[idx] + g1 * o_slc[idx] + g2 * o_win[idx]);
  }
}

// One warp per row of [0, rows), the grid striding over them: fn(row) in every lane of the
// row's warp.
template <class F>
__device__ __forceinline__ void for_each_warp_row(std::int64_t rows, F&& fn) {
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t row = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps)
    fn(row);
}

// The saved fp32 branch outputs' order (NsaSavedCuda::o_slc_win): the selection's, the window's,
// then (cmp_backward_one_pass) the compression's: the branch of a slot, and the slot of a branch.
constexpr int saved_output_branch(int slot) { return slot == 0 ? kSlc : (slot == 1 ? kWin : kCmp); }
constexpr int saved_output_slot(int br) { return br == kSlc ? 0 : (br == kWin ? 1 : 2); }

// The backward's per-row gate terms of the branches whose outputs the forward saved, o [NO][B,T,H,D]
// (fp32: slc, win and, with NO = 3, cmp; see o_slc_win), one warp per row (b, t, head), each
// sum in a fixed order: for each such branch c,
//   dot_c = d_out . o_c,  gsig_c = sigmoid(gate_c),  delta_c = gsig_c dot_c (the key side's
//   row term: dO_c = gsig_c d_out),  d gate_c = dot_c gsig_c (1 - gsig_c),
// but for the compression branch only dot_c (its one-pass row side writes the others from its
// own lsum). dot, gsig and delta are [3][B,T,H]. NO = 3 at padded D = 128; NO = 1 (the
// selection's alone, for its inverted loop) at padded D <= 64, where the row kernels sum the
// others' do . o_c themselves (RowArgs::o_dot). Their row side then needs one pass over the
// keys (RowArgs::dot_in). VEC = 4:
// lane i reads elements 4i..4i+3 with 16-byte loads of o (D % 4 == 0); VEC = 1: lane i reads
// i, i+32, ...
template <class T, int VEC, int NO>
__global__ void branch_dot_kernel(Geo g, const T* __restrict__ d_out, const float* __restrict__ o,
                                  const T* __restrict__ gate, float* __restrict__ dot,
                                  float* __restrict__ gsig, float* __restrict__ delta,
                                  T* __restrict__ dgate, std::int64_t BTH, int D) {
  const int lane = threadIdx.x & 31;
  for_each_warp_row(BTH, [&](std::int64_t row) {
    const T* dr = d_out + row * D;
    float acc[NO] = {};
    for (int dd = lane * VEC; dd < D; dd += 32 * VEC) {
      float x[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) x[e] = ldf(dr[dd + e]);
#pragma unroll
      for (int i = 0; i < NO; ++i) {
        const float* orow = o + (std::int64_t(i) * BTH + row) * D + dd;
        if constexpr (VEC == 4) {
          const float4 v = *reinterpret_cast<const float4*>(orow);
          acc[i] += x[0] * v.x + x[1] * v.y + x[2] * v.z + x[3] * v.w;
        } else {
          acc[i] += x[0] * orow[0];
        }
      }
    }
#pragma unroll
    for (int i = 0; i < NO; ++i) {
      const float dt = warp_sum(acc[i]);
      if (lane == 0) {
        const int c = saved_output_branch(i);
        const std::int64_t go = gate_offset(g, row) + c;
        dot[c * BTH + row] = dt;
        if (c != kCmp) {  // (the compression's: its one-pass row side, from its own lsum)
          const float gs = sigmoidf(ldf(gate[go]));
          gsig[c * BTH + row] = gs;
          delta[c * BTH + row] = gs * dt;
          if (dgate) dgate[go] = stf<T>(dt * gs * (1.f - gs));
        }
      }
    }
  });
}

// The mean part of the compression backward's one-pass reference (row_kernel, RowArgs::cmp_ref;
// the row's most probable key is the other part): for every
// (b, j, g), the mean of the compressed keys 0..j, kc [B,N,G,D] fp32 -> ref, the same layout.
// Block (b g, 32 columns): thread (x, y) sums column x over the y-th of 32 runs of blocks, then
// walks it again from the runs before it (fixed order: deterministic).
__global__ void cmp_prefix_mean_kernel(const float* __restrict__ kc, float* __restrict__ ref, int N, int G, int D) {
  __shared__ float run_sum[32][33];
  const int b = blockIdx.x / G, gi = blockIdx.x % G, d = blockIdx.y * 32 + threadIdx.x, y = threadIdx.y;
  const int per = (N + 31) / 32, j0 = min(N, y * per), j1 = min(N, j0 + per);
  const std::int64_t stride = std::int64_t(G) * D, base = (std::int64_t(b) * N * G + gi) * D + d;
  float s = 0.f;
  if (d < D)
    for (int j = j0; j < j1; ++j) s += kc[base + j * stride];
  run_sum[y][threadIdx.x] = s;
  __syncthreads();
  if (d >= D) return;
  float before = 0.f;
  for (int r = 0; r < y; ++r) before += run_sum[r][threadIdx.x];
  for (int j = j0; j < j1; ++j) {
    before += kc[base + j * stride];
    ref[base + j * stride] = before / float(j + 1);
  }
}

// Dense attention's bf16 backward: dot = delta = do . out per row (out: the forward's output),
// gsig = 1 (no gate), one warp per row, summed in a fixed order (lane-strided, then the xor
// tree of warp_sum).
template <class T>
__global__ void dense_dot_kernel(const T* __restrict__ d_out, const T* __restrict__ out,
                                 float* __restrict__ dot, float* __restrict__ gsig,
                                 float* __restrict__ delta, std::int64_t BTH, int D) {
  const int lane = threadIdx.x & 31;
  for_each_warp_row(BTH, [&](std::int64_t row) {
    float acc = 0.f;
    for (int dd = lane; dd < D; dd += 32) acc += ldf(d_out[row * D + dd]) * ldf(out[row * D + dd]);
    const float s = warp_sum(acc);
    if (lane == 0) {
      dot[row] = s;
      gsig[row] = 1.f;
      delta[row] = s;
    }
  });
}

template <class T>
__global__ void dq_rotate_kernel(Geo g, T* __restrict__ dq_out, const float* __restrict__ dq,
                                 const float2* __restrict__ rope, std::int64_t BTH) {
  const int D = g.D, half = D / 2;
  const std::int64_t total = BTH * D;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = idx / D;
    const int dd = int(idx % D);
    const int t = int((row / g.H) % g.T);
    dq_out[q_offset(g, row) + dd] = stf<T>(rope_back_elem(dq + row * D, dd, half, rope + std::int64_t(t) * half));
  }
}

// Grow-only device buffers per host thread and device; the RoPE table is cached.
class Workspace {
 public:
  enum Slot : int {
    kRope, kKc, kVc, kSel, kO, kLse, kGsig, kDelta, kDot, kDq, kDkc, kDvc, kTokK, kTokV, kCmpScratch,
    kTcK, kTcV, kSplit, kTcQ, kTcO, kInvMask, kInvCnt, kInvOff, kInvPos, kSlcPart, kTicket,
    kTcKc, kTcVc, kLseTc, kCmpPart, kCmpTicket, kTcKinv, kInvBlk, kInvPart, kInvPartLse, kTcKs, kTcVs, kCmpRef,
    kNumSlots
  };
  ~Workspace() {
    for (auto& b : bufs_)
      if (b.p) cudaFree(b.p);  // errors ignored: the runtime may be gone at exit
    for (Side& d : sides_) {
      if (d.fork) cudaEventDestroy(d.fork);
      if (d.join) cudaEventDestroy(d.join);
      if (d.stream) cudaStreamDestroy(d.stream);
    }
  }
  // The backward's side streams (non-blocking: no implicit order with the legacy default
  // stream) and the events that order each against the caller's stream, made on first use.
  // fork(s, i): work then put on side(i) runs after everything queued on s so far; join(s, i):
  // work queued on s afterwards runs after everything put on side(i) before.
  static constexpr int kSides = 2;
  cudaStream_t side(int i) {
    Side& d = sides_[i];
    if (!d.stream) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&d.fork, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&d.join, cudaEventDisableTiming));
    }
    return d.stream;
  }
  void fork(cudaStream_t s, int i) {
    cudaStream_t to = side(i);
    CUDA_CHECK(cudaEventRecord(sides_[i].fork, s));
    CUDA_CHECK(cudaStreamWaitEvent(to, sides_[i].fork, 0));
  }
  void join(cudaStream_t s, int i) {
    CUDA_CHECK(cudaEventRecord(sides_[i].join, sides_[i].stream));
    CUDA_CHECK(cudaStreamWaitEvent(s, sides_[i].join, 0));
  }
  void* get(Slot slot, std::size_t bytes, cudaStream_t s) {
    Buf& b = bufs_[slot];
    if (bytes > b.cap) {
      if (b.p) {
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaFree(b.p));
        b.p = nullptr;
        b.cap = 0;
        if (slot == kRope) rope_T_ = -1;
      }
      CUDA_CHECK(cudaMalloc(&b.p, align_up(bytes)));
      b.cap = align_up(bytes);
    }
    return b.p;
  }
  const float2* rope(const NsaDims& dm, cudaStream_t s) {
    const int half = int(dm.D / 2);
    auto* p = static_cast<float2*>(get(kRope, std::size_t(dm.T) * half * sizeof(float2), s));
    if (rope_T_ < dm.T || rope_D_ != dm.D || rope_theta_ != dm.rope_theta) {
      rope_table_kernel<<<grid1(dm.T * half, 256), 256, 0, s>>>(p, int(dm.T), half, int(dm.D),
                                                                 dm.rope_theta);
      check_launch("rope_table_kernel");
      rope_T_ = dm.T;
      rope_D_ = dm.D;
      rope_theta_ = dm.rope_theta;
    }
    return p;
  }

 private:
  struct Buf {
    void* p = nullptr;
    std::size_t cap = 0;
  };
  Buf bufs_[kNumSlots];
  std::int64_t rope_T_ = -1, rope_D_ = -1;
  double rope_theta_ = 0;
  struct Side {
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
  };
  Side sides_[kSides];
};

Workspace& workspace() {
  thread_local std::map<int, Workspace> per_device;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return per_device[dev];
}

void check_dims(const NsaDims& dims, const TokenPitches& p = {}) {
  dims.validate();
  auto check_pitch = [](std::int64_t pitch, std::int64_t width, const char* what) {
    if (pitch != 0 && pitch < width)
      throw UserError(std::string("NSA attention on CUDA: the ") + what + " pitch " + std::to_string(pitch) +
                      " is below its rows' width " + std::to_string(width));
    if (std::max(pitch, width) > INT_MAX)
      throw UserError(std::string("NSA attention on CUDA: the ") + what + " rows are too wide");
  };
  check_pitch(p.q, dims.H * dims.D, "q");
  check_pitch(p.kv, dims.G * dims.D, "keys' and values'");
  check_pitch(p.gate, dims.H * 3, "gate");
  if ((p.q || p.kv || p.gate) && dims.B * dims.T * dims.H >= (std::int64_t(1) << 31))
    throw UserError("NSA attention on CUDA: pitched rows need batch * seq_len * n_heads below 2^31");
  padded_dim(int(dims.D));
  const std::int64_t rows = dims.B * dims.T * dims.H;
  if (rows * dims.D * 3 > (std::int64_t(1) << 62))
    throw UserError("NSA attention on CUDA: tensor too large");
  if (dims.B * dims.G > 65535)
    throw UserError("NSA attention on CUDA: batch * model.n_kv_heads must be at most 65535");
}

// An unrotated padded bf16 copy of src (rows of g.G heads, NK positions `pitch` elements
// apart, 0: contiguous; `parts` parts of `bytes` each) in workspace slot `slot`, or src itself
// where it already is one: bf16, one part, contiguous, D already 32, 64 or 128, 16-byte aligned.
// (Values read in place with a pitch cost the tensor-core kernels 2-6%, docs/performance.md,
// 2026-11-28 thirteenth session: pitched values are copied.)
template <class S>
const bf16* padded_or_self(const Geo& g, Workspace& ws, Workspace::Slot slot, const S* src, int NK,
                           std::size_t bytes, int parts, cudaStream_t s, std::int64_t pitch = 0) {
  if constexpr (std::is_same_v<S, bf16>)
    if (parts == 1 && padded_dim(g.D) == g.D && (pitch == 0 || pitch == std::int64_t(g.G) * g.D) &&
        reinterpret_cast<std::uintptr_t>(src) % 16 == 0)
      return src;
  auto* dst = static_cast<bf16*>(ws.get(slot, bytes * parts, s));
  launch_tc_pad<S>(g, src, dst, nullptr, NK, s, parts, pitch);
  return dst;
}

// bf16: padded bf16 copies of a branch's keys (rotated when rope is set) and values for the
// tensor-core kernels (RowArgs::tck, tcv), in workspace slots ks, vs; fp32: nothing (the fp32
// kernels read the inputs). The positions' rows `pitch` elements apart (0: contiguous).
template <class T, class S>
void tc_prepare(const Geo& g, Workspace& ws, RowArgs& a, const S* k, const S* v,
                const float2* rope, int NK, cudaStream_t s,
                Workspace::Slot ks = Workspace::kTcK, Workspace::Slot vs = Workspace::kTcV,
                int parts = 1, std::int64_t pitch = 0) {
  a.tck = a.tcv = nullptr;
  if constexpr (std::is_same_v<T, bf16>) {
    const std::size_t bytes =
        std::size_t(std::max<std::int64_t>(1, std::int64_t(g.B) * NK * g.G * padded_dim(g.D))) * 2;
    auto* kd = static_cast<bf16*>(ws.get(ks, bytes * parts, s));
    launch_tc_pad<S>(g, k, kd, rope, NK, s, parts, pitch);
    a.tck = kd;
    a.tcv = padded_or_self<S>(g, ws, vs, v, NK, bytes, parts, s, pitch);  // values: no rotation
  }
}
// The selection branch's keys and values (per-token inputs, Geo::kvp apart); the backward
// keeps them in slots of their own (kTcKs, kTcVs) for its key side.
template <class T, class S>
void tc_prepare_selection(const Geo& g, Workspace& ws, RowArgs& a, const S* k, const S* v, const float2* rope,
                          cudaStream_t s, Workspace::Slot ks = Workspace::kTcK, Workspace::Slot vs = Workspace::kTcV) {
  tc_prepare<T>(g, ws, a, k, v, rope, g.T, s, ks, vs, 1, g.kvp);
}

// The window branch's keys and values (dense attention's too; per-token, Geo::kvp apart), in
// the parts its scores take (win_score_parts: hi + lo at padded D = 32).
template <class T, class S>
void tc_prepare_window(const Geo& g, Workspace& ws, RowArgs& a, const S* k, const S* v, const float2* rope,
                       cudaStream_t s) {
  tc_prepare<T>(g, ws, a, k, v, rope, g.T, s, Workspace::kTcK, Workspace::kTcV, win_score_parts(padded_dim(g.D)),
                g.kvp);
}

// bf16 tensor-core kernels: padded bf16 copies of q (rotated; with its rounding residuals where
// q_parts == 2, the key side's key_q_parts(DP)) and of d_out (when given), rows [B, T, H, DP],
// which the row kernels stage their rows from and the key side its row tiles; d_out is used
// as it is when D is already padded and it is 16-byte aligned. (The q slot keeps room for two
// parts at every DP: the memory plan counts it so.)
struct TcRows {
  const bf16* q = nullptr;
  const bf16* q_lo = nullptr;  // the residuals (q_parts == 2), else null
  const bf16* dout = nullptr;
};
inline TcRows tc_prepare_rows(const Geo& g, Workspace& ws, const bf16* q, const bf16* d_out,
                              const float2* rope, std::int64_t BTH, int q_parts, cudaStream_t stream) {
  const int DP = padded_dim(g.D);
  Geo gq = g;
  gq.G = g.H;
  const std::size_t bytes = std::size_t(std::max<std::int64_t>(1, BTH * DP)) * 2;
  auto* qd = static_cast<bf16*>(ws.get(Workspace::kTcQ, 2 * bytes, stream));
  launch_tc_pad<bf16>(gq, q, qd, rope, g.T, stream, q_parts, g.qp);
  TcRows r;
  r.q = qd;
  r.q_lo = q_parts == 2 ? qd + bytes / 2 : nullptr;
  if (d_out) r.dout = padded_or_self<bf16>(gq, ws, Workspace::kTcO, d_out, g.T, bytes, 1, stream);
  return r;
}
inline void set_rows(RowArgs& a, const TcRows& r) {
  a.tcq = r.q;
  a.tcql = r.q_lo;
  a.tcdo = r.dout;
}
inline void set_rows(KeyArgs& ka, const TcRows& r) {
  ka.tcq = r.q;
  ka.tcql = r.q_lo;
  ka.tcdo = r.dout;
}

// The inverse selection index of sel (launch_inverse_index) in the workspace: per unit
// (b, g, j) the positions that chose block j, ascending.
struct InverseIndex {
  const int* off;
  const int* pos;
};
InverseIndex inverse_index(const Geo& g, Workspace& ws, const std::int32_t* sel, cudaStream_t stream) {
  const std::int64_t U = std::int64_t(g.B) * g.G * g.NB;
  const std::int64_t W = (g.T + 31) / 32;
  auto* mask = static_cast<std::uint32_t*>(
      ws.get(Workspace::kInvMask, std::size_t(std::max<std::int64_t>(1, U * W)) * 4, stream));
  auto* cnt = static_cast<int*>(ws.get(Workspace::kInvCnt, std::size_t(std::max<std::int64_t>(1, U)) * 4, stream));
  auto* off = static_cast<int*>(ws.get(Workspace::kInvOff, std::size_t(U + 1) * 4, stream));
  auto* pos = static_cast<int*>(ws.get(
      Workspace::kInvPos, std::size_t(std::max<std::int64_t>(1, std::int64_t(g.B) * g.T * g.G * g.n)) * 4, stream));
  launch_inverse_index(g, sel, mask, cnt, off, pos, stream);
  return {off, pos};
}

// Whether the selection row side runs the inverted loop: bf16, chosen by selection_loop.h for
// these dims, and within what the device holds.
template <class T>
bool inverted_loop(const NsaDims& dims, const Geo& g) {
  return std::is_same_v<T, bf16> && selection_inverted(dims) && slc_inverted_fits(g);
}

// The selection row side's inverted loop (selection_loop.h): its index and partial states.
SlcInvIndex slc_inverted_scratch(const Geo& g, Workspace& ws, const InverseIndex& ix, cudaStream_t stream) {
  const std::int64_t U = std::int64_t(g.B) * g.G * g.NB;
  auto* blk = static_cast<int*>(ws.get(Workspace::kInvBlk, std::size_t(2 * U + 1) * 4, stream));
  SlcInvIndex r;
  r.off = ix.off;
  r.pos = ix.pos;
  r.nblk = blk;
  r.choff = blk + U;
  r.part = static_cast<float*>(
      ws.get(Workspace::kInvPart, std::size_t(std::max<std::int64_t>(1, slc_inv_part_floats(g))) * 4, stream));
  r.part_lse = static_cast<float*>(
      ws.get(Workspace::kInvPartLse, std::size_t(std::max<std::int64_t>(1, slc_inv_lse_floats(g))) * 4, stream));
  return r;
}

}  // namespace
}  // namespace detail

using namespace detail;

// ---- saved state ----------------------------------------------------------------------------
namespace {
// bf16 keeps the selection and window branches' fp32 outputs, and at padded D = 128 the
// compression branch's (the tensor-core backward's do . o_c, see o_slc_win); fp32 does not.
bool keeps_branch_outputs(int elem_bytes) { return elem_bytes == 2; }
CudaSavedLayout saved_layout(const NsaDims& dm, int elem_bytes) {
  return cuda_saved_layout(dm, keeps_branch_outputs(elem_bytes));
}
}  // namespace

NsaSavedCuda::~NsaSavedCuda() {
  if (block_) cudaFree(block_);
}

std::size_t NsaSavedCuda::bytes_for(const NsaDims& dims, int elem_bytes) {
  return saved_layout(dims, elem_bytes).total;
}

std::size_t NsaSavedCuda::bytes() const {
  return elem_bytes ? saved_layout(dims, elem_bytes).total : 0;
}

void NsaSavedCuda::reserve(const NsaDims& dm, int eb) {
  const CudaSavedLayout L = saved_layout(dm, eb);
  if (L.total > capacity_) {
    if (block_) {
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaFree(block_));
      block_ = nullptr;
      capacity_ = 0;
    }
    CUDA_CHECK(cudaMalloc(&block_, L.total));
    capacity_ = L.total;
  }
  char* base = static_cast<char*>(block_);
  dims = dm;
  elem_bytes = eb;
  k_cmp_blocks = reinterpret_cast<float*>(base + L.kc);
  v_cmp_blocks = reinterpret_cast<float*>(base + L.vc);
  sel_blocks = reinterpret_cast<std::int32_t*>(base + L.sel);
  lse = reinterpret_cast<float*>(base + L.lse);
  o_slc_win = keeps_branch_outputs(eb) ? reinterpret_cast<float*>(base + L.o) : nullptr;
}

std::vector<std::int32_t> NsaSavedCuda::sel_blocks_host(cudaStream_t stream) const {
  std::vector<std::int32_t> h(std::size_t(dims.B * dims.T * dims.G * dims.sel_count));
  if (!h.empty()) {
    CUDA_CHECK(cudaMemcpyAsync(h.data(), sel_blocks, h.size() * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return h;
}

// ---- forward --------------------------------------------------------------------------------
template <class T>
void nsa_forward(const NsaDims& dims, const NsaInputs<T>& in, T* out, NsaSavedCuda* saved,
                 cudaStream_t stream, const TokenPitches& pitches) {
  check_dims(dims, pitches);
  const Geo g = make_geo(dims, pitches);
  Workspace& ws = workspace();
  const float2* rope = ws.rope(dims, stream);
  const std::int64_t BTH = dims.B * dims.T * dims.H;
  const std::size_t kvn = std::size_t(dims.B * dims.num_cmp_blocks() * dims.G * dims.D);
  float *kc, *vc, *lse, *o_sw = nullptr;  // o_sw: the selection and window outputs
  std::int32_t* sel;
  if (saved) {
    saved->reserve(dims, int(sizeof(T)));
    kc = saved->k_cmp_blocks;
    vc = saved->v_cmp_blocks;
    sel = saved->sel_blocks;
    lse = saved->lse;
    o_sw = saved->o_slc_win;  // bf16: kept for the backward
  } else {
    kc = static_cast<float*>(ws.get(Workspace::kKc, kvn * 4 + 4, stream));
    vc = static_cast<float*>(ws.get(Workspace::kVc, kvn * 4 + 4, stream));
    sel = static_cast<std::int32_t*>(
        ws.get(Workspace::kSel, std::size_t(dims.B * dims.T * dims.G * dims.sel_count) * 4, stream));
    lse = static_cast<float*>(ws.get(Workspace::kLse, std::size_t(3 * BTH) * 4, stream));
  }
  // The branch outputs (fp32): in the saved state (bf16 training; the compression branch's
  // there too where cmp_backward_one_pass, else in the workspace until the gated sum) or all
  // in the workspace.
  const std::size_t on = std::size_t(BTH * dims.D);
  float* o_cmp;
  if (o_sw && cmp_backward_one_pass(dims.D)) {
    o_cmp = o_sw + saved_output_slot(kCmp) * on;
  } else {
    o_cmp = static_cast<float*>(ws.get(Workspace::kO, (o_sw ? 1 : 3) * on * 4, stream));
    if (!o_sw) o_sw = o_cmp + on;
  }
  void* cmp_scratch = ws.get(Workspace::kCmpScratch, compress_scratch_bytes(g, sizeof(T)), stream);
  launch_compress_forward<T>(g, in.k_cmp, in.cmp_wk, in.cmp_pk, rope, kc, cmp_scratch, stream);
  launch_compress_forward<T>(g, in.v_cmp, in.cmp_wv, in.cmp_pv, nullptr, vc, cmp_scratch, stream);

  RowArgs a{};
  a.q = in.q;
  a.rope = rope;
  a.sel = sel;
  a.k = kc;
  a.v = vc;
  a.o = o_cmp;
  a.o_f32 = true;
  a.lse = lse;
  // The compression branch's forward feeds the selection, whose block scores must rank as the
  // fp32 reference's do: bf16 runs the fused tensor-core kernel with fp32-accurate scores where
  // it fits (select_tc.cuh), otherwise (and for fp32) the fp32 row kernel and launch_select.
  // (bf16 products of the rotated query moved selections beyond the tie tolerance,
  // docs/performance.md.)
  bool fused = false;
  if constexpr (std::is_same_v<T, bf16>) {
    if (cmp_select_tc_smem(g) > 0) {
      const std::size_t rows = std::size_t(std::max<std::int64_t>(1, std::int64_t(g.B) * g.N * g.G));
      const std::size_t part_bytes = rows * std::size_t(padded_dim(g.D)) * 2;
      CmpSelectScratch cs{static_cast<__half*>(ws.get(Workspace::kTcKc, 2 * part_bytes, stream)),
                          static_cast<float*>(ws.get(Workspace::kTcKinv, rows * 4, stream)),
                          static_cast<bf16*>(ws.get(Workspace::kTcVc, 2 * part_bytes, stream))};
      launch_cmp_select_tc(g, in.q, rope, kc, vc, cs, o_cmp, lse, sel, stream);
      fused = true;
    }
  }
  if (!fused) {
    launch_row<T>(g, kCmp, false, a, stream);
    launch_select<T>(g, in.q, rope, kc, lse, sel, stream);
  }
  if constexpr (std::is_same_v<T, bf16>)  // the rotated queries the row kernels stage
    set_rows(a, tc_prepare_rows(g, ws, in.q, nullptr, rope, BTH, win_score_parts(padded_dim(g.D)), stream));
  a.k = in.k_slc;
  a.v = in.v_slc;
  tc_prepare_selection<T>(g, ws, a, in.k_slc, in.v_slc, rope, stream);
  a.o = o_sw;
  a.lse = lse + BTH;
  if (inverted_loop<T>(dims, g))
    launch_slc_inverted(g, false, a, slc_inverted_scratch(g, ws, inverse_index(g, ws, sel, stream), stream), stream);
  else
    launch_row<T>(g, kSlc, false, a, stream);
  a.k = in.k_win;
  a.v = in.v_win;
  tc_prepare_window<T>(g, ws, a, in.k_win, in.v_win, rope, stream);
  a.o = o_sw + on;
  a.lse = lse + 2 * BTH;
  if constexpr (std::is_same_v<T, bf16>) {  // the window branch (the last) writes the gated sum
    a.gated_out = out;
    a.gate = in.gate;
    a.o_cmp_in = o_cmp;
    a.o_slc_in = o_sw;
  }
  launch_row<T>(g, kWin, false, a, stream);
  if constexpr (!std::is_same_v<T, bf16>) {
    combine_kernel<T><<<grid1(BTH * dims.D, 256), 256, 0, stream>>>(g, out, o_cmp, o_sw, o_sw + on,
                                                                       in.gate, BTH, int(dims.D));
    check_launch("combine_kernel");
  }
}

// ---- backward -------------------------------------------------------------------------------
template <class T>
void nsa_backward(const NsaDims& dims, const NsaInputs<T>& in, const NsaSavedCuda& saved,
                  const T* d_out, const NsaGradsCuda<T>& grads, cudaStream_t stream,
                  const TokenPitches& pitches) {
  check_dims(dims, pitches);
  const NsaDims& sd = saved.dims;
  NSA_CHECK(saved.elem_bytes == int(sizeof(T)) && sd.B == dims.B && sd.T == dims.T &&
                sd.H == dims.H && sd.G == dims.G && sd.D == dims.D &&
                sd.cmp_block == dims.cmp_block && sd.cmp_stride == dims.cmp_stride &&
                sd.sel_block == dims.sel_block && sd.sel_count == dims.sel_count &&
                sd.window == dims.window && sd.rope_theta == dims.rope_theta,
            "nsa cuda backward: saved state is for ", sd.str(), " (element size ",
            saved.elem_bytes, "), called with ", dims.str());
  const Geo g = make_geo(dims, pitches);
  Workspace& ws = workspace();
  const float2* rope = ws.rope(dims, stream);
  const std::int64_t BTH = dims.B * dims.T * dims.H, D = dims.D;
  const std::size_t kvn = std::size_t(dims.B * dims.num_cmp_blocks() * dims.G * dims.D);
  const std::size_t tokn = std::size_t(dims.B * dims.T * g.kvp);  // a key gradient's scratch, rows as the inputs'
  // Row side, per branch: sigmoid(gate), delta, d gate, and dq (fp32, rotated; summed over
  // the branches in the order cmp, slc, win, then rotated back).
  auto* gsig = static_cast<float*>(ws.get(Workspace::kGsig, std::size_t(3 * BTH) * 4, stream));
  auto* delta = static_cast<float*>(ws.get(Workspace::kDelta, std::size_t(3 * BTH) * 4, stream));
  float* dq = grads.q ? static_cast<float*>(ws.get(Workspace::kDq, std::size_t(BTH * D) * 4, stream))
                      : nullptr;
  const void* win_tck = nullptr;  // bf16: padded window keys/values left by the row side
  const void* win_tcv = nullptr;
  const void* slc_tck = nullptr;  // bf16: the selection's, in their own slots (kTcKs, kTcVs)
  const void* slc_tcv = nullptr;
  const void* cmp_tck = nullptr;  // bf16: padded compressed keys/values (their own slots)
  const void* cmp_tcv = nullptr;
  // bf16: the compression branch's row side runs on the tensor cores with its own lse (the
  // forward's fp32 lse feeds the selection; the backward's probabilities sum to one over the
  // tensor-core scores, see attention_tc.cuh), which the key side then reads: from a first
  // pass at padded D <= 64, from the one pass's row sums at 128 (cmp_backward_one_pass), whose
  // correction takes the prefix means of the compressed keys (cmp_ref).
  const bool cmp_one_pass = std::is_same_v<T, bf16> && cmp_backward_one_pass(D);
  float* lse_tc = std::is_same_v<T, bf16>
                      ? static_cast<float*>(ws.get(Workspace::kLseTc, std::size_t(BTH) * 4, stream))
                      : nullptr;
  float* cmp_ref = nullptr;
  if (cmp_one_pass && grads.q) {
    cmp_ref = static_cast<float*>(ws.get(Workspace::kCmpRef, kvn * 4 + 4, stream));
    const dim3 grid(unsigned(dims.B * dims.G), unsigned((D + 31) / 32)), block(32, 32);
    cmp_prefix_mean_kernel<<<grid, block, 0, stream>>>(saved.k_cmp_blocks, cmp_ref, int(dims.num_cmp_blocks()),
                                                       int(dims.G), int(D));
    check_launch("cmp_prefix_mean_kernel");
  }
  // bf16: do . o_c, the gate terms and the gate gradient of the selection and window branches
  // (and at padded D = 128 the compression branch's) from the saved branch outputs, so that
  // their tensor-core row side makes one pass over the keys for dq (the fp32 row kernel gets
  // do . o_c in its own single pass). At padded D <= 64 the compression branch's row side keeps
  // its lsum pass: its backward probabilities come from bf16 scores and their own lse, not the
  // forward's fp32-accurate ones; do . o_c from the forward's output raised the worst bf16
  // grad_q error of the parity tests from 6.3e-3 to 7.8e-3 on one seed (docs/performance.md,
  // change 9). Its first pass gets lsum online with the lse instead.
  // At padded D <= 64 (bf16 without cmp_one_pass) the row kernels sum do . o_c themselves
  // (RowArgs::o_dot, in their prologues, where the loads run under the other resident blocks'
  // products: the 125M backward -0.9%); branch_dot_kernel remains for padded D = 128, where the prologue's loads were exposed
  // (one block per SM at ~238 registers: the 64k backward +3.6 ms against branch_dot's 1.8 ms,
  // docs/performance.md, seventeenth session), and for the selection's inverted loop (whose
  // per-block partials need do . o_slc first, select_inv.cuh).
  float* dot = nullptr;
  // (the setting is read once: the selection's row side below runs one loop or the other)
  const bool inverted = inverted_loop<T>(dims, g);
  const bool slc_inverted = inverted && grads.q;
  if constexpr (std::is_same_v<T, bf16>) {
    NSA_CHECK(saved.o_slc_win, "nsa cuda backward: the saved state has no branch outputs");
    if (cmp_one_pass || inverted) {
      dot = static_cast<float*>(ws.get(Workspace::kDot, std::size_t(3 * BTH) * 4, stream));
      // over the first NO saved outputs: all three, or the selection's alone
      auto launch_dot = [&](auto vec_kernel, auto scalar_kernel) {
        const auto kernel = D % 4 == 0 ? vec_kernel : scalar_kernel;
        kernel<<<grid1(BTH * 32, 256), 256, 0, stream>>>(g, d_out, saved.o_slc_win, in.gate, dot, gsig, delta,
                                                         grads.gate, BTH, int(D));
      };
      if (cmp_one_pass)
        launch_dot(branch_dot_kernel<T, 4, 3>, branch_dot_kernel<T, 1, 3>);
      else
        launch_dot(branch_dot_kernel<T, 4, 1>, branch_dot_kernel<T, 1, 1>);
      check_launch("branch_dot_kernel");
    }
  }
  // bf16, D/2 a multiple of 8: the window branch's row kernel (the last) finishes dq.
  // (It stores element pairs: q's rows must start at even elements.)
  const bool dq_fused = std::is_same_v<T, bf16> && grads.q && dq_final_fused(int(D)) && g.qp % 2 == 0;
  // bf16: the padded rotated queries (with the key side's residual part) and d_out, staged by
  // the row kernels and the key side.
  TcRows tc_rows;
  if constexpr (std::is_same_v<T, bf16>)
    tc_rows = tc_prepare_rows(g, ws, in.q, d_out, rope, BTH, key_q_parts(padded_dim(g.D)), stream);
  // bf16: the inverse selection index, for the selection key side and (where the selection
  // row side runs the inverted loop) its dq.
  const bool need_slc = grads.k_slc || grads.v_slc;
  InverseIndex inv{};
  if (std::is_same_v<T, bf16> && (need_slc || slc_inverted)) inv = inverse_index(g, ws, saved.sel_blocks, stream);
  {
    RowArgs a{};
    set_rows(a, tc_rows);
    a.q = in.q;
    a.rope = rope;
    a.sel = saved.sel_blocks;
    a.dout = d_out;
    a.gate = in.gate;
    a.dgate = grads.gate;
    a.dq = dq;
    for (int br = 0; br < 3; ++br) {
      a.k = br == kCmp ? static_cast<const void*>(saved.k_cmp_blocks)
                       : (br == kSlc ? static_cast<const void*>(in.k_slc) : in.k_win);
      a.v = br == kCmp ? static_cast<const void*>(saved.v_cmp_blocks)
                       : (br == kSlc ? static_cast<const void*>(in.v_slc) : in.v_win);
      a.lse_in = saved.lse + br * BTH;
      a.gsig = gsig + br * BTH;
      a.delta = delta + br * BTH;
      // do . o_c (bf16): from branch_dot_kernel (every branch at padded D = 128, the inverted
      // selection's), or summed by the row kernel from the saved output (the others but the
      // compression's two passes, which sum their own)
      const bool from_dot_kernel = dot && (cmp_one_pass || br == kSlc);
      a.dot_in = from_dot_kernel ? dot + br * BTH : nullptr;
      a.o_dot = std::is_same_v<T, bf16> && !from_dot_kernel && br != kCmp
                    ? saved.o_slc_win + std::size_t(saved_output_slot(br)) * std::size_t(BTH * D)
                    : nullptr;
      a.accumulate = br != kCmp;
      a.lse_tc = br == kCmp ? lse_tc : nullptr;
      a.cmp_ref = br == kCmp ? cmp_ref : nullptr;
      if (br == kCmp) {
        tc_prepare<T>(g, ws, a, saved.k_cmp_blocks, saved.v_cmp_blocks, nullptr, g.N, stream,
                      Workspace::kTcKc, Workspace::kTcVc, cmp_kv_parts(padded_dim(g.D)));
        cmp_tck = a.tck;
        cmp_tcv = a.tcv;
      } else if (br == kSlc)
        tc_prepare_selection<T>(g, ws, a, in.k_slc, in.v_slc, rope, stream, Workspace::kTcKs, Workspace::kTcVs);
      else
        tc_prepare_window<T>(g, ws, a, in.k_win, in.v_win, rope, stream);
      if (br == kSlc) {
        slc_tck = a.tck;
        slc_tcv = a.tcv;
      }
      if (br == kWin && dq_fused) a.dq_final = grads.q;  // the last branch finishes dq
      if (br == kSlc && slc_inverted)
        launch_slc_inverted(g, true, a, slc_inverted_scratch(g, ws, inv, stream), stream);
      else if (br != kSlc || !inverted)
        launch_row<T>(g, br, true, a, stream);  // (the inverted loop without dq: nothing to do)
    }
    win_tck = a.tck;
    win_tcv = a.tcv;
  }
  if (grads.q && !dq_fused) {
    dq_rotate_kernel<T><<<grid1(BTH * D, 256), 256, 0, stream>>>(g, grads.q, dq, rope, BTH);
    check_launch("dq_rotate_kernel");
  }

  KeyArgs ka{};
  ka.q = in.q;
  ka.dout = d_out;
  ka.rope = rope;
  ka.sel = saved.sel_blocks;
  const bool need_win = grads.k_win || grads.v_win;
  const bool need_k = grads.k_cmp || grads.cmp_wk || grads.cmp_pk;
  const bool need_v = grads.v_cmp || grads.cmp_wv || grads.cmp_pv;
  if constexpr (std::is_same_v<T, bf16>) {
    set_rows(ka, tc_rows);  // tensor-core key side (every branch)
    if (need_slc) {
      ka.inv_off = inv.off;
      ka.inv_pos = inv.pos;
      ka.slc_part = static_cast<float*>(ws.get(
          Workspace::kSlcPart, std::size_t(key_split_floats(g, padded_dim(g.D))) * 4, stream));
      const std::size_t tb = std::size_t(std::max<std::int64_t>(1, key_tickets(g))) * 4;
      ka.slc_ticket = static_cast<int*>(ws.get(Workspace::kTicket, tb, stream));
      CUDA_CHECK(cudaMemsetAsync(ka.slc_ticket, 0, tb, stream));
    }
  }
  auto key_pass = [&](int br, const void* k, const void* v, void* dk, void* dv, cudaStream_t on) {
    ka.k = k;
    ka.v = v;
    ka.lse = br == kCmp && lse_tc ? lse_tc : saved.lse + br * BTH;
    ka.gsig = gsig + br * BTH;
    ka.delta = delta + br * BTH;
    ka.dk = dk;
    ka.dv = dv;
    launch_keys<T>(g, br, ka, on);
  };
  auto tok_or_scratch = [&](T* p, Workspace::Slot slot) -> void* {
    return p ? static_cast<void*>(p) : ws.get(slot, tokn * sizeof(T), stream);
  };
  // The window's key side on the workspace's side stream 0 and, with 3 streams, the
  // compression's key side and backward products on side stream 1, beside the selection's on
  // the caller's stream (key_side_streams, selection_loop.h): each reads only what the row side
  // wrote before its fork, buffers nothing on the other streams touches, and writes its own
  // gradients; joined at the end.
  const bool need_cmp = need_k || need_v;
  const bool win_beside = key_side_streams() >= 2 && need_win && grads.k_win && grads.v_win && (need_slc || need_cmp);
  const bool cmp_beside = key_side_streams() >= 3 && need_cmp && need_slc;
  if (need_win) {
    ka.tck = win_tck;  // still the window's copies (the row side did the window last)
    ka.tcv = win_tcv;
    if (win_beside) ws.fork(stream, 0);
    key_pass(kWin, in.k_win, in.v_win, tok_or_scratch(grads.k_win, Workspace::kTokK),
             tok_or_scratch(grads.v_win, Workspace::kTokV), win_beside ? ws.side(0) : stream);
  }
  if (need_slc) {
    ka.tck = slc_tck;  // the row side's copies (bf16; null for fp32)
    ka.tcv = slc_tcv;
    key_pass(kSlc, in.k_slc, in.v_slc, tok_or_scratch(grads.k_slc, Workspace::kTokK),
             tok_or_scratch(grads.v_slc, Workspace::kTokV), stream);
  }
  ka.tck = ka.tcv = nullptr;

  if (need_cmp) {
    // (the workspace's buffers taken before the fork: growing one synchronises)
    auto* dkc = static_cast<float*>(ws.get(Workspace::kDkc, kvn * 4 + 4, stream));
    auto* dvc = static_cast<float*>(ws.get(Workspace::kDvc, kvn * 4 + 4, stream));
    void* scratch = ws.get(Workspace::kCmpScratch, compress_scratch_bytes(g, sizeof(T)), stream);
    const int nsplit = cmp_key_splits(g);
    std::size_t ticket_bytes = 0;  // bf16: the split lists' tickets, zeroed on the compression's stream
    if (std::is_same_v<T, bf16>) {  // tensor-core key side: its own split scratch and lse
      ka.tck = cmp_tck;
      ka.tcv = cmp_tcv;
      ka.slc_part = static_cast<float*>(ws.get(
          Workspace::kCmpPart,
          std::size_t(std::max<std::int64_t>(1, cmp_key_split_floats(g, padded_dim(g.D)))) * 4,
          stream));
      ticket_bytes = std::size_t(std::max<std::int64_t>(1, cmp_key_tickets(g))) * 4;
      ka.slc_ticket = static_cast<int*>(ws.get(Workspace::kCmpTicket, ticket_bytes, stream));
    } else if (nsplit > 1) {
      auto* part = static_cast<float*>(
          ws.get(Workspace::kSplit, std::size_t(2 * nsplit) * kvn * 4 + 4, stream));
      ka.split_dk = part;
      ka.split_dv = part + std::size_t(nsplit) * kvn;
    }
    if (cmp_beside) ws.fork(stream, 1);
    const cudaStream_t cs = cmp_beside ? ws.side(1) : stream;  // the compression's stream
    if (ticket_bytes) CUDA_CHECK(cudaMemsetAsync(ka.slc_ticket, 0, ticket_bytes, cs));
    key_pass(kCmp, saved.k_cmp_blocks, saved.v_cmp_blocks, dkc, dvc, cs);  // lse: see key_pass
    if (need_k)
      launch_compress_backward<T>(g, in.k_cmp, in.cmp_wk, in.cmp_pk, dkc, grads.k_cmp,
                                  grads.cmp_wk, grads.cmp_pk, scratch, cs);
    if (need_v)
      launch_compress_backward<T>(g, in.v_cmp, in.cmp_wv, in.cmp_pv, dvc, grads.v_cmp,
                                  grads.cmp_wv, grads.cmp_pv, scratch, cs);
  }
  if (win_beside) ws.join(stream, 0);
  if (cmp_beside) ws.join(stream, 1);
}

template void nsa_forward<float>(const NsaDims&, const NsaInputs<float>&, float*, NsaSavedCuda*,
                                 cudaStream_t, const TokenPitches&);
template void nsa_forward<bf16>(const NsaDims&, const NsaInputs<bf16>&, bf16*, NsaSavedCuda*,
                                cudaStream_t, const TokenPitches&);
template void nsa_backward<float>(const NsaDims&, const NsaInputs<float>&, const NsaSavedCuda&,
                                  const float*, const NsaGradsCuda<float>&, cudaStream_t, const TokenPitches&);
template void nsa_backward<bf16>(const NsaDims&, const NsaInputs<bf16>&, const NsaSavedCuda&,
                                 const bf16*, const NsaGradsCuda<bf16>&, cudaStream_t, const TokenPitches&);


// ---- dense attention (dense.h): the window branch with w = T and no gate ---------------------
namespace {
NsaDims window_dims(const DenseDims& dims) {
  dims.validate();
  const NsaDims w = dims.as_window();
  check_dims(w);
  return w;
}
}  // namespace

template <class T>
void dense_forward(const DenseDims& dims, const T* q, const T* k, const T* v, T* o, float* lse,
                   cudaStream_t stream) {
  const NsaDims wd = window_dims(dims);
  const Geo g = make_geo(wd);
  Workspace& ws = workspace();
  const float2* rope = ws.rope(wd, stream);
  RowArgs a{};
  a.q = q;
  a.rope = rope;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = lse;
  if constexpr (std::is_same_v<T, bf16>)
    set_rows(a, tc_prepare_rows(g, ws, q, nullptr, rope, wd.B * wd.T * wd.H, win_score_parts(padded_dim(g.D)), stream));
  tc_prepare_window<T>(g, ws, a, k, v, rope, stream);
  launch_row<T>(g, kWin, false, a, stream);
}

template <class T>
void dense_backward(const DenseDims& dims, const T* q, const T* k, const T* v, const T* out,
                    const float* lse, const T* d_out, T* dq, T* dk, T* dv, cudaStream_t stream) {
  NSA_CHECK(dq && dk && dv, "dense_backward (CUDA): dq, dk and dv are all required");
  const NsaDims wd = window_dims(dims);
  const Geo g = make_geo(wd);
  Workspace& ws = workspace();
  const float2* rope = ws.rope(wd, stream);
  const std::int64_t BTH = wd.B * wd.T * wd.H, D = wd.D;
  auto* gsig = static_cast<float*>(ws.get(Workspace::kGsig, std::size_t(BTH) * 4, stream));
  auto* delta = static_cast<float*>(ws.get(Workspace::kDelta, std::size_t(BTH) * 4, stream));
  auto* dqf = static_cast<float*>(ws.get(Workspace::kDq, std::size_t(BTH * D) * 4, stream));
  RowArgs a{};
  a.q = q;
  a.rope = rope;
  a.k = k;
  a.v = v;
  a.dout = d_out;
  a.gate = nullptr;  // no gate: the row side takes g = 1
  a.lse_in = lse;
  a.gsig = gsig;
  a.delta = delta;
  a.dq = dqf;
  a.accumulate = false;
  if constexpr (std::is_same_v<T, bf16>) {  // delta = do . out: the row side's one pass
    NSA_CHECK(out, "dense_backward (CUDA, bf16): the forward's output is required");
    auto* dot = static_cast<float*>(ws.get(Workspace::kDot, std::size_t(BTH) * 4, stream));
    dense_dot_kernel<T><<<grid1(BTH * 32, 256), 256, 0, stream>>>(d_out, out, dot, gsig, delta, BTH,
                                                                   int(D));
    check_launch("dense_dot_kernel");
    a.dot_in = dot;
  }
  TcRows tc_rows;
  if constexpr (std::is_same_v<T, bf16>) {
    tc_rows = tc_prepare_rows(g, ws, q, d_out, rope, BTH, key_q_parts(padded_dim(g.D)), stream);
    set_rows(a, tc_rows);
  }
  tc_prepare_window<T>(g, ws, a, k, v, rope, stream);
  const bool dq_fused = std::is_same_v<T, bf16> && dq_final_fused(int(D));
  if (dq_fused) a.dq_final = dq;  // the row kernel finishes dq itself
  launch_row<T>(g, kWin, true, a, stream);
  if (!dq_fused) {
    dq_rotate_kernel<T><<<grid1(BTH * D, 256), 256, 0, stream>>>(g, dq, dqf, rope, BTH);
    check_launch("dq_rotate_kernel");
  }
  KeyArgs ka{};
  ka.q = q;
  ka.dout = d_out;
  ka.rope = rope;
  ka.k = k;
  ka.v = v;
  ka.lse = lse;
  ka.gsig = gsig;
  ka.delta = delta;
  ka.dk = dk;
  ka.dv = dv;
  if constexpr (std::is_same_v<T, bf16>) {
    set_rows(ka, tc_rows);
    ka.tck = a.tck;
    ka.tcv = a.tcv;
  }
  launch_keys<T>(g, kWin, ka, stream);
}

template void dense_forward<float>(const DenseDims&, const float*, const float*, const float*,
                                   float*, float*, cudaStream_t);
template void dense_forward<bf16>(const DenseDims&, const bf16*, const bf16*, const bf16*, bf16*,
                                  float*, cudaStream_t);
template void dense_backward<float>(const DenseDims&, const float*, const float*, const float*,
                                    const float*, const float*, const float*, float*, float*,
                                    float*, cudaStream_t);
template void dense_backward<bf16>(const DenseDims&, const bf16*, const bf16*, const bf16*,
                                   const bf16*, const float*, const bf16*, bf16*, bf16*, bf16*,
                                   cudaStream_t);

}  // namespace nsatron::nsa::cuda
