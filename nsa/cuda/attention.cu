// Branch attention of the NSA core on CUDA, flash-style (fp32 math, T storage):
//
// Row side (forward, and dq in the backward): a block owns R <= 32 query rows of one
// (batch, KV group): QT consecutive positions x hc heads of the group (for the selection
// branch one position, since each position has its own blocks). Keys stream through shared
// memory in tiles of 32 (lane = key for the scores), RoPE applied on the way in, and every
// loaded K/V tile serves all rows of the block, i.e. all query heads of the group
// (group-centric loading). The forward keeps an online softmax (running max, sum and
// output per row in registers) and writes the branch output and its log-sum-exp; the
// backward recomputes P = exp(scale q.k - lse) and accumulates dq (fp32, rotated space).
//
// Key side (dk, dv): a block owns a tile of 32 keys of one (batch, group) and visits the
// queries that see them in ascending position order, 32 rows (position x head) at a time:
// phase A computes P and dZ for (row, key) with lane = key, phase B accumulates
// dK[key] += dZ q, dV[key] += P g dO with thread (key = lane, a quarter of the dims = warp),
// so each dK/dV element belongs to one thread and is summed in a fixed order. At the end dK
// is rotated back. The queries of a key tile: window, t in [s, s+w-1]; compression,
// t >= i*d+l-1; selection, the positions whose selected blocks contain the tile's block
// (found by scanning sel_blocks 128 positions at a time and compacting with a ballot, which
// keeps them in ascending order).
//
// For bf16 the row side of the selection and window branches runs the tensor-core kernel of
// attention_tc.cuh instead (RowArgs::tck set), and so does their key side (KeyArgs::tck set;
// the selection's rows then come from the inverse index of launch_inverse_index rather than
// from the sel_blocks scan below). The compression key side is split over query
// ranges (cmp_key_splits) whose partial sums split_sum_kernel adds in ascending order.
//
// Masks: window s in (t-w, t]; compression i*d+l-1 <= t; selection s <= t.
#include <algorithm>
#include <climits>
#include <type_traits>

#include <cuda_fp16.h>

#include "core/device/device.h"
#include "nsa/cuda/internal.cuh"
#include "nsa/cuda/selection_loop.h"
#include "nsa/cuda/wgmma.cuh"

namespace nsatron::nsa::cuda::detail {

namespace {

constexpr int KT = kKeyTile;
constexpr int RW = 4;            // rows per warp (row side)
constexpr int RMAX = 32;         // rows per block (row side)
constexpr int RQ = 32;           // rows per batch (key side)
constexpr int KEY_THREADS = 128; // key side: 4 warps
constexpr int PC = KEY_THREADS;  // positions scanned per chunk (selection key side)

template <class T, int BR>
struct KeyType {
  using type = T;
};
template <class T>
struct KeyType<T, kCmp> {
  using type = float;
};

template <int BR>
__device__ __forceinline__ bool key_mask(const Geo& g, int t, int s) {
  if constexpr (BR == kWin) return s <= t && s > t - g.w;
  if constexpr (BR == kCmp) return s * g.d + g.l - 1 <= t;
  return s <= t;
}

// Keys s0 .. s0+cnt-1 of branch BR into Ks, Vs ([KT][DP+4] fp32; zeros past cnt and D).
template <class T, int DP, int BR>
__device__ void load_key_tile(const Geo& g, int b, int gi, int s0, int cnt,
                              const typename KeyType<T, BR>::type* __restrict__ k,
                              const typename KeyType<T, BR>::type* __restrict__ v,
                              const float2* __restrict__ rope, float* Ks, float* Vs) {
  constexpr int STR = DP + 4;
  for (int idx = threadIdx.x; idx < KT * DP; idx += blockDim.x) {
    const int kk = idx / DP, dd = idx % DP;
    float kv = 0.f, vv = 0.f;
    if (kk < cnt && dd < g.D) {
      const int s = s0 + kk;
      if constexpr (BR == kCmp) {
        const std::int64_t base = ((std::int64_t(b) * g.N + s) * g.G + gi) * g.D;
        kv = k[base + dd];
        vv = v[base + dd];
      } else {
        const std::int64_t base = (std::int64_t(b) * g.T + s) * g.kvp + std::int64_t(gi) * g.D;
        kv = rope_elem(k + base, dd, g.half, rope + std::int64_t(s) * g.half);
        vv = ldf(v[base + dd]);
      }
    }
    Ks[kk * STR + dd] = kv;
    Vs[kk * STR + dd] = vv;
  }
}

#include "nsa/cuda/attention_tc.cuh"
#include "nsa/cuda/select_tc.cuh"
#include "nsa/cuda/select_inv.cuh"
#include "nsa/cuda/row_ws.cuh"

__device__ __forceinline__ float dot4(const float4 a, const float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

template <int DP, bool BWD>
constexpr std::size_t row_smem_bytes() {
  constexpr int STR = DP + 4;
  return std::size_t(RMAX * STR + 2 * KT * STR + (BWD ? RMAX * STR : 0) + 2 * RMAX) * 4;
}

template <class T, int DP, int BR, bool BWD>
__global__ void __launch_bounds__(256) row_kernel(Geo g, RowArgs a, int hc, int QT) {
  using KTy = typename KeyType<T, BR>::type;
  constexpr int STR = DP + 4, NJ = DP / 32;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [RMAX][STR] rotated queries
  float* Ks = Qs + RMAX * STR;                  // [KT][STR]
  float* Vs = Ks + KT * STR;                    // [KT][STR]
  float* Os = Vs + KT * STR;                    // [RMAX][STR] d_out (backward)
  float* rl = Os + (BWD ? RMAX * STR : 0);      // [2][RMAX] lse, sigmoid(gate) (backward)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NW = blockDim.x >> 5;
  const int b = blockIdx.z / g.G, gi = blockIdx.z % g.G;
  const int a0 = blockIdx.y * hc;
  const int hcnt = min(hc, g.h - a0);
  const int t0 = blockIdx.x * QT;
  const int R = QT * hc;
  const int RF = NW * RW;  // rows touched by the warps (>= R); rows R..RF-1 are zero
  const T* q = static_cast<const T*>(a.q);
  const KTy* kp = static_cast<const KTy*>(a.k);
  const KTy* vp = static_cast<const KTy*>(a.v);

  auto row_index = [&](int r) -> std::int64_t {  // global row of block row r (valid rows)
    const int t = t0 + r / hc;
    return (std::int64_t(b) * g.T + t) * g.H + gi * g.h + a0 + r % hc;
  };
  auto row_valid = [&](int r) { return r < R && t0 + r / hc < g.T && (r % hc) < hcnt; };

  for (int idx = threadIdx.x; idx < RF * DP; idx += blockDim.x) {
    const int r = idx / DP, dd = idx % DP;
    float qv = 0.f, ov = 0.f;
    if (row_valid(r) && dd < g.D) {
      const std::int64_t row = row_index(r);
      const int t = t0 + r / hc;
      qv = rope_elem(q + q_offset(g, row), dd, g.half, a.rope + std::int64_t(t) * g.half);
      if constexpr (BWD) ov = ldf(static_cast<const T*>(a.dout)[row * g.D + dd]);
    }
    Qs[r * STR + dd] = qv;
    if constexpr (BWD) Os[r * STR + dd] = ov;
  }
  if constexpr (BWD) {
    for (int r = threadIdx.x; r < RF; r += blockDim.x) {
      float L = 0.f, Gs = 0.f;
      if (row_valid(r)) {
        const std::int64_t row = row_index(r);
        L = a.lse_in[row];
        Gs = a.gate ? 1.f / (1.f + expf(-ldf(static_cast<const T*>(a.gate)[gate_offset(g, row) + BR]))) : 1.f;
      }
      rl[r] = L;
      rl[RMAX + r] = Gs;
    }
  }
  // The staged rows before any use: a block with no key tile (the compression branch where
  // every row precedes the first block) goes straight to the epilogue, which reads rl of rows
  // other threads staged (without this barrier it could read them unwritten: NaN gradients).
  __syncthreads();

  int rt[RW];
  bool rv[RW];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    const int r = warp + NW * rr;
    rt[rr] = t0 + r / hc;
    rv[rr] = row_valid(r);
  }
  // forward: acc = sum_j p_j v_j (unnormalised), m, lsum: running max and sum.
  // backward: acc = sum_j p_j (do.v_j) k_j, bk = sum_j p_j k_j, lsum = sum_j p_j (do.v_j)
  // (= do.o_c, exact in fp32), so dq = scale g (acc - lsum bk) and delta = g lsum.
  float acc[RW][NJ], bk[BWD ? RW : 1][NJ];
  float m[RW], lsum[RW];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    m[rr] = -INFINITY;
    lsum[rr] = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      acc[rr][j] = 0.f;
      if constexpr (BWD) bk[rr][j] = 0.f;
    }
  }

  // Key ranges: selection, one per selected block (clipped to s <= t); others, one.
  const int tlast = min(g.T - 1, t0 + QT - 1);
  const std::int32_t* selrow =
      BR == kSlc ? a.sel + ((std::int64_t(b) * g.T + t0) * g.G + gi) * g.n : nullptr;
  const int nranges = BR == kSlc ? g.n : 1;
  for (int ri = 0; ri < nranges; ++ri) {
    int beg, end;
    if constexpr (BR == kSlc) {
      const int j = selrow[ri];
      if (j < 0) break;
      beg = j * g.ls;
      end = min(beg + g.ls, t0 + 1);
    } else if constexpr (BR == kWin) {
      beg = max(0, t0 - g.w + 1);
      end = tlast + 1;
    } else {
      beg = 0;
      end = visible_blocks(g, tlast);
    }
    for (int s0 = beg; s0 < end; s0 += KT) {
      const int cnt = min(KT, end - s0);
      __syncthreads();
      load_key_tile<T, DP, BR>(g, b, gi, s0, cnt, kp, vp, a.rope, Ks, Vs);
      __syncthreads();
      float sc[RW], dpv[RW];
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) sc[rr] = dpv[rr] = 0.f;
#pragma unroll 4
      for (int d4 = 0; d4 < DP; d4 += 4) {
        const float4 kv = *reinterpret_cast<const float4*>(Ks + lane * STR + d4);
        float4 vv;
        if constexpr (BWD) vv = *reinterpret_cast<const float4*>(Vs + lane * STR + d4);
#pragma unroll
        for (int rr = 0; rr < RW; ++rr) {
          const int r = warp + NW * rr;
          sc[rr] += dot4(*reinterpret_cast<const float4*>(Qs + r * STR + d4), kv);
          if constexpr (BWD) dpv[rr] += dot4(*reinterpret_cast<const float4*>(Os + r * STR + d4), vv);
        }
      }
      const int s = s0 + lane;
      float c[RW];
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const bool valid = rv[rr] && lane < cnt && key_mask<BR>(g, rt[rr], s);
        if constexpr (!BWD) {
          const float z = valid ? sc[rr] * g.scale : -INFINITY;
          const float mnew = fmaxf(m[rr], warp_max(z));
          if (mnew == -INFINITY) {
            c[rr] = 0.f;
            continue;
          }
          const float corr = expf(m[rr] - mnew);
          c[rr] = valid ? expf(z - mnew) : 0.f;
          lsum[rr] = lsum[rr] * corr + warp_sum(c[rr]);
#pragma unroll
          for (int j = 0; j < NJ; ++j) acc[rr][j] *= corr;
          m[rr] = mnew;
        } else {
          const int r = warp + NW * rr;
          c[rr] = valid ? expf(sc[rr] * g.scale - rl[r]) : 0.f;  // p
          dpv[rr] = c[rr] * dpv[rr];                              // p (do.v)
          lsum[rr] += warp_sum(dpv[rr]);
        }
      }
      // forward: acc += P V;  backward: acc += P (do.v) K, bk += P K
      const float* src = BWD ? Ks : Vs;
      for (int kk = 0; kk < cnt; ++kk) {
        float x[NJ];
#pragma unroll
        for (int j = 0; j < NJ; ++j) x[j] = src[kk * STR + lane + 32 * j];
#pragma unroll
        for (int rr = 0; rr < RW; ++rr) {
          const float ck = __shfl_sync(0xffffffffu, c[rr], kk);
          if constexpr (BWD) {
            const float ek = __shfl_sync(0xffffffffu, dpv[rr], kk);
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
              acc[rr][j] += ek * x[j];
              bk[rr][j] += ck * x[j];
            }
          } else {
#pragma unroll
            for (int j = 0; j < NJ; ++j) acc[rr][j] += ck * x[j];
          }
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    if (!rv[rr]) continue;
    const int r = warp + NW * rr;
    const std::int64_t row = row_index(r);
    if constexpr (!BWD) {
      const bool any = lsum[rr] > 0.f;
      const float inv = any ? 1.f / lsum[rr] : 0.f;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int dd = lane + 32 * j;
        if (dd >= g.D) continue;
        if (a.o_f32)
          static_cast<float*>(a.o)[row * g.D + dd] = acc[rr][j] * inv;
        else
          static_cast<T*>(a.o)[row * g.D + dd] = stf<T>(acc[rr][j] * inv);
      }
      if (lane == 0) a.lse[row] = any ? m[rr] + logf(lsum[rr]) : -INFINITY;
    } else {
      const float gs = rl[RMAX + r], dot = lsum[rr];
      if (lane == 0) {
        a.gsig[row] = gs;
        a.delta[row] = gs * dot;
        if (a.dgate) static_cast<T*>(a.dgate)[gate_offset(g, row) + BR] = stf<T>(dot * gs * (1.f - gs));
      }
      if (a.dq) {
        float* dq = a.dq + row * g.D;
        const float f = g.scale * gs;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const int dd = lane + 32 * j;
          const float v = f * (acc[rr][j] - dot * bk[rr][j]);
          if (dd < g.D) dq[dd] = a.accumulate ? dq[dd] + v : v;
        }
      }
    }
  }
}

template <int DP>
constexpr std::size_t key_smem_bytes() {
  constexpr int STR = DP + 4;
  return std::size_t(2 * KT * STR + 2 * RQ * STR + 2 * RQ * (KT + 1) + 3 * RQ) * 4 +
         std::size_t(2 * RQ + PC + 8) * 4 + std::size_t(2 * KT * STR) * 4;
}

template <class T, int DP, int BR>
__global__ void __launch_bounds__(KEY_THREADS) key_kernel(Geo g, KeyArgs a, int subtiles) {
  using KTy = typename KeyType<T, BR>::type;
  constexpr int STR = DP + 4, PS = KT + 1, DW = DP / 4;  // DW dims per thread (phase B)
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);
  float* Vs = Ks + KT * STR;
  float* Qs = Vs + KT * STR;   // [RQ][STR] rotated q
  float* Os = Qs + RQ * STR;   // [RQ][STR] d_out
  float* Ps = Os + RQ * STR;   // [RQ][PS] p * g
  float* Zs = Ps + RQ * PS;    // [RQ][PS] scale * dz
  float* rl = Zs + RQ * PS;    // [3][RQ]
  int* rowt = reinterpret_cast<int*>(rl + 3 * RQ);  // [RQ] position (-1: none)
  int* rowh = rowt + RQ;                             // [RQ] head
  int* plist = rowh + RQ;                            // [PC] positions (selection)
  int* wcount = plist + PC;                          // [8]
  float* Tk = reinterpret_cast<float*>(wcount + 8);  // [KT][STR] running dK totals
  float* Tv = Tk + KT * STR;                         // [KT][STR] running dV totals

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.z / g.G, gi = blockIdx.z % g.G;
  int s0, s1, jblk = 0;
  if constexpr (BR == kWin) {
    s0 = blockIdx.x * KT;
    s1 = min(g.T, s0 + KT);
  } else if constexpr (BR == kCmp) {
    s0 = blockIdx.x * KT;
    s1 = min(g.N, s0 + KT);
  } else {
    jblk = blockIdx.x / subtiles;
    s0 = jblk * g.ls + (blockIdx.x % subtiles) * KT;
    s1 = min(min(g.T, jblk * g.ls + g.ls), s0 + KT);
  }
  if (s0 >= s1) return;  // block-uniform
  const int cnt = s1 - s0;
  const T* q = static_cast<const T*>(a.q);
  const T* dout = static_cast<const T*>(a.dout);
  load_key_tile<T, DP, BR>(g, b, gi, s0, cnt, static_cast<const KTy*>(a.k),
                           static_cast<const KTy*>(a.v), a.rope, Ks, Vs);

  // Two-level sums: dK, dV in registers over one batch of RQ rows, then added to the
  // thread's own totals in shared memory (fp32 error grows with the batch count, not rows).
  float dK[DW], dV[DW];
  const int dbase = warp * DW;
#pragma unroll
  for (int j = 0; j < DW; ++j) {
    dK[j] = dV[j] = 0.f;
    Tk[lane * STR + dbase + j] = 0.f;
    Tv[lane * STR + dbase + j] = 0.f;
  }

  int pbeg, pend;
  if constexpr (BR == kWin) {
    pbeg = s0;
    pend = min(g.T, s1 - 1 + g.w);
  } else if constexpr (BR == kCmp) {
    pbeg = s0 * g.d + g.l - 1;
    pend = g.T;
    if (gridDim.y > 1) {  // this block's range of query positions
      const int span = (g.T + gridDim.y - 1) / gridDim.y;
      pbeg = max(pbeg, int(blockIdx.y) * span);
      pend = min(pend, int(blockIdx.y + 1) * span);
    }
  } else {
    pbeg = s0;
    pend = g.T;
  }
  for (int c0 = pbeg; c0 < pend; c0 += PC) {
    int npos;
    if constexpr (BR == kSlc) {
      __syncthreads();  // plist and wcount are free
      const int t = c0 + threadIdx.x;
      bool f = false;
      if (t < pend) {
        const std::int32_t* row = a.sel + ((std::int64_t(b) * g.T + t) * g.G + gi) * g.n;
        for (int k = 0; k < g.n; ++k) {
          const int x = row[k];
          if (x < 0 || x > jblk) break;  // rows are ascending, -1 padded
          if (x == jblk) {
            f = true;
            break;
          }
        }
      }
      const unsigned bal = __ballot_sync(0xffffffffu, f);
      if (lane == 0) wcount[warp] = __popc(bal);
      __syncthreads();
      int off = 0;
      npos = 0;
      for (int w2 = 0; w2 < KEY_THREADS / 32; ++w2) {
        if (w2 < warp) off += wcount[w2];
        npos += wcount[w2];
      }
      if (f) plist[off + __popc(bal & ((1u << lane) - 1u))] = t;
    } else {
      npos = min(PC, pend - c0);
    }
    const int nrows = npos * g.h;
    for (int rb = 0; rb < nrows; rb += RQ) {
      const int rcount = min(RQ, nrows - rb);
      __syncthreads();  // previous batch consumed; plist written
      for (int r = threadIdx.x; r < RQ; r += blockDim.x) {
        int t = -1, head = 0;
        float L = 0.f, Gs = 0.f, Dl = 0.f;
        if (r < rcount) {
          const int rho = rb + r, pi = rho / g.h;
          head = gi * g.h + rho % g.h;
          if constexpr (BR == kSlc) t = plist[pi];
          else t = c0 + pi;
          const std::int64_t row = (std::int64_t(b) * g.T + t) * g.H + head;
          L = a.lse[row];
          Gs = a.gsig[row];
          Dl = a.delta[row];
        }
        rowt[r] = t;
        rowh[r] = head;
        rl[r] = L;
        rl[RQ + r] = Gs;
        rl[2 * RQ + r] = Dl;
      }
      __syncthreads();
      for (int idx = threadIdx.x; idx < RQ * DP; idx += blockDim.x) {
        const int r = idx / DP, dd = idx % DP;
        const int t = rowt[r];
        float qv = 0.f, ov = 0.f;
        if (t >= 0 && dd < g.D) {
          const std::int64_t row = (std::int64_t(b) * g.T + t) * g.H + rowh[r];
          qv = rope_elem(q + q_offset(g, row), dd, g.half, a.rope + std::int64_t(t) * g.half);
          ov = ldf(dout[row * g.D + dd]);
        }
        Qs[r * STR + dd] = qv;
        Os[r * STR + dd] = ov;
      }
      __syncthreads();
      // Phase A: P and dZ, lane = key, warp w takes rows w, w+4, ...
      constexpr int RA = RQ / (KEY_THREADS / 32);
      float sc[RA], dpv[RA];
#pragma unroll
      for (int rr = 0; rr < RA; ++rr) sc[rr] = dpv[rr] = 0.f;
#pragma unroll 2
      for (int d4 = 0; d4 < DP; d4 += 4) {
        const float4 kv = *reinterpret_cast<const float4*>(Ks + lane * STR + d4);
        const float4 vv = *reinterpret_cast<const float4*>(Vs + lane * STR + d4);
#pragma unroll
        for (int rr = 0; rr < RA; ++rr) {
          const int r = warp + (KEY_THREADS / 32) * rr;
          sc[rr] += dot4(*reinterpret_cast<const float4*>(Qs + r * STR + d4), kv);
          dpv[rr] += dot4(*reinterpret_cast<const float4*>(Os + r * STR + d4), vv);
        }
      }
#pragma unroll
      for (int rr = 0; rr < RA; ++rr) {
        const int r = warp + (KEY_THREADS / 32) * rr;
        const int t = rowt[r];
        const bool valid = t >= 0 && lane < cnt && key_mask<BR>(g, t, s0 + lane);
        const float p = valid ? expf(sc[rr] * g.scale - rl[r]) : 0.f;
        Ps[r * PS + lane] = p * rl[RQ + r];
        Zs[r * PS + lane] = valid ? g.scale * p * (rl[RQ + r] * dpv[rr] - rl[2 * RQ + r]) : 0.f;
      }
      __syncthreads();
      // Phase B: thread (key = lane, dims dbase..dbase+DW) over the rows in order.
      for (int r = 0; r < rcount; ++r) {
        const float cz = Zs[r * PS + lane], cp = Ps[r * PS + lane];
#pragma unroll
        for (int j4 = 0; j4 < DW; j4 += 4) {
          const float4 qv = *reinterpret_cast<const float4*>(Qs + r * STR + dbase + j4);
          const float4 ov = *reinterpret_cast<const float4*>(Os + r * STR + dbase + j4);
          dK[j4 + 0] += cz * qv.x;
          dK[j4 + 1] += cz * qv.y;
          dK[j4 + 2] += cz * qv.z;
          dK[j4 + 3] += cz * qv.w;
          dV[j4 + 0] += cp * ov.x;
          dV[j4 + 1] += cp * ov.y;
          dV[j4 + 2] += cp * ov.z;
          dV[j4 + 3] += cp * ov.w;
        }
      }
#pragma unroll
      for (int j = 0; j < DW; ++j) {
        Tk[lane * STR + dbase + j] += dK[j];
        Tv[lane * STR + dbase + j] += dV[j];
        dK[j] = dV[j] = 0.f;
      }
    }
  }

  // Rotate dK back (at the key's position; compressed keys at i*d+l-1) and store.
  __syncthreads();
  for (int idx = threadIdx.x; idx < cnt * DP; idx += blockDim.x) {
    const int kk = idx / DP, dd = idx % DP;
    if (dd >= g.D) continue;
    const int s = s0 + kk;
    const int pos = BR == kCmp ? s * g.d + g.l - 1 : s;
    const float dk = rope_back_elem(Tk + kk * STR, dd, g.half, a.rope + std::int64_t(pos) * g.half);
    const float dv = Tv[kk * STR + dd];
    if constexpr (BR == kCmp) {
      const std::int64_t o = ((std::int64_t(b) * g.N + s) * g.G + gi) * g.D + dd;
      if (gridDim.y > 1) {
        const std::int64_t so = std::int64_t(blockIdx.y) * g.B * g.N * g.G * g.D + o;
        a.split_dk[so] = dk;
        a.split_dv[so] = dv;
      } else {
        static_cast<float*>(a.dk)[o] = dk;
        static_cast<float*>(a.dv)[o] = dv;
      }
    } else {
      const std::int64_t o = (std::int64_t(b) * g.T + s) * g.kvp + std::int64_t(gi) * g.D + dd;
      static_cast<T*>(a.dk)[o] = stf<T>(dk);
      static_cast<T*>(a.dv)[o] = stf<T>(dv);
    }
  }
}

// dk[i] = sum over the splits in ascending order of part_k[split][i] (and dv alike).
__global__ void split_sum_kernel(const float* __restrict__ pk, const float* __restrict__ pv,
                                 float* __restrict__ dk, float* __restrict__ dv, std::int64_t n,
                                 int nsplit) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    float sk = 0.f, sv = 0.f;
    for (int sp = 0; sp < nsplit; ++sp) {
      sk += pk[sp * n + i];
      sv += pv[sp * n + i];
    }
    dk[i] = sk;
    dv[i] = sv;
  }
}

void check_grid_z(const Geo& g) {
  if (std::int64_t(g.B) * g.G > 65535)
    throw std::runtime_error("nsa cuda: B * G must be at most 65535");
}

// Whether the window branch's forward (padded D = 128, bf16 tiles) runs the warp-specialised
// kernel with 128-key tiles (row_ws.cuh): the setting (selection_loop.h, window_forward_wide), a
// build with sm_90a code on a compute capability 9.0 device, its shared memory within the
// device's and its registers enough for setmaxnreg's split (row_fwd_ws_registers_fit).
bool window_forward_wide_applies(const Geo& g) {
#ifdef NSATRON_BUILD_SM90A
  if (!window_forward_wide(window_past_half_l2(g.w, g.T, cuda_l2_cache_bytes())) || compute_capability_major() != 9)
    return false;
  return tc::ws_smem().total <= std::size_t(smem_optin()) && tc::row_fwd_ws_registers_fit();
#else
  (void)g;
  return false;
#endif
}

template <class T, int DP, int BR, bool BWD>
void row_impl(const Geo& g, const RowArgs& a, cudaStream_t s) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (a.tck) {
      if constexpr (DP == 128 && !BWD && BR == kWin) {
        if (window_forward_wide_applies(g)) {
          tc::row_fwd_ws_launch(g, a, s);
          return;
        }
      }
      tc::row_launch<DP, BR, BWD>(g, a, s);
      return;
    }
  }
  const int nch = (g.h + RMAX - 1) / RMAX;
  const int hc = (g.h + nch - 1) / nch;
  const int QT = BR == kSlc ? 1 : std::max(1, RMAX / hc);
  const int R = QT * hc;
  const int NW = (R + RW - 1) / RW;
  constexpr std::size_t smem = row_smem_bytes<DP, BWD>();
  CUDA_CHECK(cudaFuncSetAttribute(row_kernel<T, DP, BR, BWD>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((g.T + QT - 1) / QT), unsigned(nch), unsigned(g.B * g.G));
  row_kernel<T, DP, BR, BWD><<<grid, NW * 32, smem, s>>>(g, a, hc, QT);
  check_launch("row_kernel");
}

template <class T, int DP, int BR>
void keys_impl(const Geo& g, const KeyArgs& a, cudaStream_t s) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (a.tck) {
      tc::key_launch<DP, BR>(g, a, s);
      return;
    }
  }
  int tiles = 0, subtiles = 1;
  if (BR == kWin) tiles = (g.T + KT - 1) / KT;
  if (BR == kCmp) tiles = (g.N + KT - 1) / KT;
  if (BR == kSlc) {
    subtiles = (g.ls + KT - 1) / KT;
    tiles = g.NB * subtiles;
  }
  if (tiles == 0) return;
  constexpr std::size_t smem = key_smem_bytes<DP>();
  CUDA_CHECK(cudaFuncSetAttribute(key_kernel<T, DP, BR>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int nsplit = BR == kCmp ? cmp_key_splits(g) : 1;
  const dim3 grid(unsigned(tiles), unsigned(nsplit), unsigned(g.B * g.G));
  key_kernel<T, DP, BR><<<grid, KEY_THREADS, smem, s>>>(g, a, subtiles);
  check_launch("key_kernel");
  if (nsplit > 1) {
    const std::int64_t n = std::int64_t(g.B) * g.N * g.G * g.D;
    split_sum_kernel<<<grid1(n, 256), 256, 0, s>>>(a.split_dk, a.split_dv,
                                                   static_cast<float*>(a.dk),
                                                   static_cast<float*>(a.dv), n, nsplit);
    check_launch("split_sum_kernel");
  }
}

template <class T, int DP>
void row_dispatch_br(const Geo& g, int branch, bool bwd, const RowArgs& a, cudaStream_t s) {
  switch (branch) {
    case kCmp: bwd ? row_impl<T, DP, kCmp, true>(g, a, s) : row_impl<T, DP, kCmp, false>(g, a, s); break;
    case kSlc: bwd ? row_impl<T, DP, kSlc, true>(g, a, s) : row_impl<T, DP, kSlc, false>(g, a, s); break;
    default: bwd ? row_impl<T, DP, kWin, true>(g, a, s) : row_impl<T, DP, kWin, false>(g, a, s); break;
  }
}

template <class T, int DP>
void keys_dispatch_br(const Geo& g, int branch, const KeyArgs& a, cudaStream_t s) {
  switch (branch) {
    case kCmp: keys_impl<T, DP, kCmp>(g, a, s); break;
    case kSlc: keys_impl<T, DP, kSlc>(g, a, s); break;
    default: keys_impl<T, DP, kWin>(g, a, s); break;
  }
}

}  // namespace

template <class T>
void launch_row(const Geo& g, int branch, bool backward, const RowArgs& a, cudaStream_t s) {
  check_grid_z(g);
  switch (padded_dim(g.D)) {
    case 32: row_dispatch_br<T, 32>(g, branch, backward, a, s); break;
    case 64: row_dispatch_br<T, 64>(g, branch, backward, a, s); break;
    default: row_dispatch_br<T, 128>(g, branch, backward, a, s); break;
  }
}

template <class T>
void launch_keys(const Geo& g, int branch, const KeyArgs& a, cudaStream_t s) {
  check_grid_z(g);
  switch (padded_dim(g.D)) {
    case 32: keys_dispatch_br<T, 32>(g, branch, a, s); break;
    case 64: keys_dispatch_br<T, 64>(g, branch, a, s); break;
    default: keys_dispatch_br<T, 128>(g, branch, a, s); break;
  }
}

void launch_inverse_index(const Geo& g, const std::int32_t* sel, std::uint32_t* mask, int* cnt,
                          int* off, int* pos, cudaStream_t s) {
  const std::int64_t U = std::int64_t(g.B) * g.G * g.NB;
  const int W = (g.T + 31) / 32;
  if (U == 0) return;
  CUDA_CHECK(cudaMemsetAsync(mask, 0, std::size_t(U) * W * 4, s));
  CUDA_CHECK(cudaMemsetAsync(cnt, 0, std::size_t(U) * 4, s));
  const std::int64_t entries = std::int64_t(g.B) * g.T * g.G * g.n;
  if (entries > 0) {
    tc::inv_mark_kernel<<<grid1(entries, 256), 256, 0, s>>>(g, sel, mask, cnt, W);
    check_launch("tc::inv_mark_kernel");
  }
  tc::inv_scan_kernel<<<1, 1024, 0, s>>>(cnt, off, int(U));
  check_launch("tc::inv_scan_kernel");
  tc::inv_fill_kernel<<<unsigned((U * 32 + 255) / 256), 256, 0, s>>>(g, mask, off, pos, W, U);
  check_launch("tc::inv_fill_kernel");
}

bool slc_inverted_fits(const Geo& g) {
  const int nsub = (g.ls + tc::kInvKT - 1) / tc::kInvKT;
  if (nsub > tc::kInvMaxSub || std::int64_t(g.T) * g.h + tc::kInvRows * tc::kInvChunks >= (std::int64_t(1) << 31))
    return false;
  std::size_t bytes = 0;
  switch (padded_dim(g.D)) {
    case 32: bytes = tc::inv_smem_bytes<32, true>(nsub); break;
    case 64: bytes = tc::inv_smem_bytes<64, true>(nsub); break;
    default: bytes = tc::inv_smem_bytes<128, true>(nsub); break;
  }
  return bytes <= std::size_t(smem_optin());
}

void launch_slc_inverted(const Geo& g, bool backward, const RowArgs& a, const SlcInvIndex& ix, cudaStream_t s) {
  check_grid_z(g);
  if (!slc_inverted_fits(g)) throw std::logic_error("launch_slc_inverted: the shape does not fit (slc_inverted_fits)");
  switch (padded_dim(g.D)) {
    case 32: backward ? tc::slc_inv_launch<32, true>(g, a, ix, s) : tc::slc_inv_launch<32, false>(g, a, ix, s); break;
    case 64: backward ? tc::slc_inv_launch<64, true>(g, a, ix, s) : tc::slc_inv_launch<64, false>(g, a, ix, s); break;
    default: backward ? tc::slc_inv_launch<128, true>(g, a, ix, s) : tc::slc_inv_launch<128, false>(g, a, ix, s); break;
  }
}

namespace {
template <int DP>
std::size_t cmp_select_tc_bytes_dp(const Geo& g) {
  return tc::cmp_select_bytes<DP>(g, smem_optin());
}
template <int DP>
void cmp_select_tc_launch_dp(const Geo& g, const tc::CmpSelArgs& a, std::size_t smem, cudaStream_t s) {
  tc::cmp_select_launch<DP>(g, a, tc::cmp_select_layout<DP>(g, smem_optin()), smem, s);
}
}  // namespace

std::size_t cmp_select_tc_smem(const Geo& g) {
  switch (padded_dim(g.D)) {
    case 32: return cmp_select_tc_bytes_dp<32>(g);
    case 64: return cmp_select_tc_bytes_dp<64>(g);
    default: return cmp_select_tc_bytes_dp<128>(g);
  }
}

void launch_cmp_select_tc(const Geo& g, const bf16* q, const float2* rope, const float* kc,
                          const float* vc, CmpSelectScratch scratch, float* o, float* lse,
                          std::int32_t* sel, cudaStream_t s) {
  const std::size_t smem = cmp_select_tc_smem(g);
  if (smem == 0) throw std::logic_error("launch_cmp_select_tc: the fused kernel does not fit");
  const std::int64_t rows = std::int64_t(g.B) * g.N * g.G;
  const int DP = padded_dim(g.D);
  if (rows > 0) {
    tc::pad_f16_parts_kernel<<<grid1(rows * 32, 256), 256, 0, s>>>(kc, scratch.kparts,
                                                                   scratch.kinv, rows, g.D, DP);
    check_launch("tc::pad_f16_parts_kernel");
    launch_tc_pad<float>(g, vc, scratch.vparts, nullptr, g.N, s, cmp_kv_parts(DP));
  }
  tc::CmpSelArgs a{q, rope, scratch.kparts, scratch.kinv, scratch.vparts, o, lse, sel};
  switch (DP) {
    case 32: cmp_select_tc_launch_dp<32>(g, a, smem, s); break;
    case 64: cmp_select_tc_launch_dp<64>(g, a, smem, s); break;
    default: cmp_select_tc_launch_dp<128>(g, a, smem, s); break;
  }
}

template <class S>
void launch_tc_pad(const Geo& g, const S* src, bf16* dst, const float2* rope, int NK,
                   cudaStream_t s, int parts, std::int64_t pitch) {
  const std::int64_t rows = std::int64_t(g.B) * NK * g.G;
  if (rows == 0) return;
  const int DP = padded_dim(g.D);
  tc::pad_kernel<S><<<grid1(rows * (DP / 8), 256), 256, 0, s>>>(src, dst, parts, rope, rows, NK, FastDiv(g.G),
                                                                g.D, DP, pitch ? pitch : std::int64_t(g.G) * g.D);
  check_launch("tc::pad_kernel");
}
template void launch_tc_pad<float>(const Geo&, const float*, bf16*, const float2*, int,
                                   cudaStream_t, int, std::int64_t);
template void launch_tc_pad<bf16>(const Geo&, const bf16*, bf16*, const float2*, int,
                                  cudaStream_t, int, std::int64_t);

template void launch_row<float>(const Geo&, int, bool, const RowArgs&, cudaStream_t);
template void launch_row<bf16>(const Geo&, int, bool, const RowArgs&, cudaStream_t);
template void launch_keys<float>(const Geo&, int, const KeyArgs&, cudaStream_t);
template void launch_keys<bf16>(const Geo&, int, const KeyArgs&, cudaStream_t);

}  // namespace nsatron::nsa::cuda::detail
