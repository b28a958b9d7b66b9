// The selection branch's row side as the inverted loop (bf16 tensor cores; included by
// attention.cu after attention_tc.cuh; nsa/cuda/selection_loop.h says when it runs).
//
// A unit is (b, g, j): selected block j of group g, and the rows (position, head) whose
// selection row holds j, in the order of the inverse index (ascending positions, then heads:
// launch_inverse_index). A block of 4 warps (one warpgroup) takes up to kInvChunks batches of
// 64 of a unit's rows; the block's keys and values [j l', min(T, (j + 1) l')) are staged once
// in shared memory (tiles of 64 keys, wgmma.cuh layout) and serve all its batches. Per batch:
//   forward   S = Q K^T, the softmax over the block's keys s <= t (online over its tiles, as
//             the row kernel), O = P V; the batch writes each row's partial state
//             o_e = O / l (bf16: half the bytes written and merged) and lse_e = ln 2 m2 +
//             ln l (fp32) at the row's slot e, the index of j in its selection row
//             (sel[b, t, g, e] == j);
//   backward  S = Q K^T, dP = dO V^T, p = exp(scale s - lse) with the merged lse of the
//             forward, dS / scale = p (dP - do . o_c) (do . o_c from branch_dot_kernel), and
//             the partial A_e = sum_s dS/scale k_s at the row's slot.
// A merge kernel then makes each row's result from its valid slots (0 <= j < NB, j l' <= t) in
// slot order: forward M = max lse_e, w_e = exp(lse_e - M), o = sum w_e o_e / sum w_e, lse =
// M + ln sum w_e; backward dq (+)= scale sigmoid(gate_slc) sum_e A_e. Every sum has a fixed
// order: deterministic.
// The partials are B T H n (D + 1) floats; launch_slc_inverted runs the (b, g) units in passes
// of slc_inv_bg_per_pass(g) (b, g) pairs: as many as fit inverted_pass_bytes(), at least one.
// Included inside namespace nsatron::nsa::cuda::detail::{anonymous} of attention.cu.
#pragma once

namespace tc {

constexpr int kInvRows = 64;    // rows per product batch (one warpgroup's M)
constexpr int kInvChunks = 4;   // batches per block (its key and value tiles serve them all)
constexpr int kInvKT = 64;      // keys per shared tile
constexpr int kInvMaxSub = int(kInvertedMaxSelBlock / kInvKT);

template <int DP, bool BWD>
__host__ __device__ inline std::size_t inv_smem_bytes(int nsub) {
  const std::size_t tiles = std::size_t(2) * nsub * kInvKT * DP * 2;  // K and V
  const std::size_t rows = std::size_t(kInvRows) * (DP + 8) * 2 * (BWD ? 2 : 1);
  return tiles + rows + std::size_t(3 * kInvRows) * 4;
}

struct InvArgs {
  const bf16* tcq;    // padded rotated queries [B, T, H, DP]
  const bf16* tcdo;   // backward: padded d_out [B, T, H, DP]
  const bf16* tck;    // padded rotated selection keys [B, T, G, DP]
  const bf16* tcv;    // padded selection values [B, T, G, DP]
  const std::int32_t* sel;  // [B, T, G, n]
  const int* off;     // inverse index: unit u's positions at pos[off[u] .. off[u + 1])
  const int* pos;
  const int* choff;   // exclusive prefix of the blocks per unit ([U + 1])
  int u0, u1;         // this pass's units [u0, u1) = (b, g) pairs [bg0, bg0 + nbg) x NB
  int bg0;
  float* part;        // [pass rows][n][D]: o_e (forward, bf16: the first half of the space,
                      // which stays sized for the backward's fp32) or A_e (backward, fp32)
  float* part_lse;    // forward: [pass rows][n]
  const float* lse_in;  // backward: the selection branch's lse [B, T, H]
  const float* dot_in;  // backward: do . o_slc [B, T, H]
};

// Blocks per unit: ceil(rows / (kInvRows kInvChunks)), rows = positions x h.
__global__ void inv_blocks_kernel(const int* __restrict__ off, int* __restrict__ nblk, int U, int h) {
  const int u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= U) return;
  const std::int64_t rows = std::int64_t(off[u + 1] - off[u]) * h;
  nblk[u] = int((rows + kInvRows * kInvChunks - 1) / (kInvRows * kInvChunks));
}

template <int DP, bool BWD>
__global__ void __launch_bounds__(kRowWarps * 32, row_min_blocks(DP, BWD)) slc_inv_kernel(Geo g, InvArgs a) {
  constexpr int KT = kInvKT, STR = DP + 8, NT = KT / 8, DT = DP / 8, CH = DP / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(1024) float4 smem4[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nsub = (g.ls + KT - 1) / KT;
  bf16* Ks = reinterpret_cast<bf16*>(smem4);  // [nsub] tiles of KT x DP
  bf16* Vs = Ks + nsub * KT * DP;
  bf16* Qs = Vs + nsub * KT * DP;             // [64][STR]
  bf16* Os = Qs + kInvRows * STR;             // backward: d_out rows
  int* rinfo = reinterpret_cast<int*>(Os + (BWD ? kInvRows * STR : 0));  // [3][64]: t, head, slot

  // The unit: the largest u in [u0, u1) with choff[u] <= c (units without rows share their
  // choff with the next one).
  const int c = a.choff[a.u0] + int(blockIdx.x);
  if (c >= a.choff[a.u1]) return;  // block-uniform
  int lo = a.u0, hi = a.u1 - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (a.choff[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  const int u = lo;
  const int j = u % g.NB, bg = u / g.NB, b = bg / g.G, gi = bg % g.G;
  const int pbeg = a.off[u];
  const int nrows = (a.off[u + 1] - pbeg) * g.h;
  const int r_first = (c - a.choff[u]) * kInvRows * kInvChunks;
  const int s_beg = j * g.ls, s_end = min(g.T, s_beg + g.ls);
  const int nsub_used = (s_end - s_beg + KT - 1) / KT;

  // The block's keys and values, zeros past s_end (masked keys then meet zero values).
  for (int st = 0; st < nsub_used; ++st) {
    const int s0 = s_beg + st * KT, cnt = min(KT, s_end - s0);
    for (int idx = tid; idx < KT * CH; idx += blockDim.x) {
      const int kk = idx / CH, ch = idx % CH;
      const bool ok = kk < cnt;
      const std::int64_t off = ok ? ((std::int64_t(b) * g.T + s0 + kk) * g.G + gi) * DP + ch * 8 : 0;
      const int to = wg::tile_offset<DP, KT>(kk, ch);
      cp16(reinterpret_cast<char*>(Ks + st * KT * DP) + to, a.tck + off, ok);
      cp16(reinterpret_cast<char*>(Vs + st * KT * DP) + to, a.tcv + off, ok);
    }
  }
  cp_commit();

  const int gr = lane >> 2, gc = lane & 3;
  const float sl2 = g.scale * kLog2e;
  const bf16* Qw = Qs + warp * 16 * STR;
  const bf16* Ow = Os + warp * 16 * STR;
  for (int ci = 0; ci < kInvChunks; ++ci) {
    const int r0 = r_first + ci * kInvRows;
    if (r0 >= nrows) break;  // block-uniform
    __syncthreads();         // the previous batch is done with Qs, Os and rinfo
    if (tid < kInvRows) {
      int t = -1, hd = 0, slot = -1;
      if (r0 + tid < nrows) {
        int p;
        g.hdiv.divmod(r0 + tid, p, hd);
        t = a.pos[pbeg + p];
        const std::int32_t* row = a.sel + ((std::int64_t(b) * g.T + t) * g.G + gi) * g.n;
        for (int e = 0; e < g.n; ++e)
          if (row[e] == j) {
            slot = e;
            break;
          }
      }
      rinfo[tid] = t;
      rinfo[kInvRows + tid] = hd;
      rinfo[2 * kInvRows + tid] = slot;
    }
    __syncthreads();
    for (int idx = tid; idx < kInvRows * CH; idx += blockDim.x) {
      const int i = idx / CH, ch = idx % CH;
      const int t = rinfo[i];
      const bool ok = t >= 0;
      const std::int64_t off =
          ok ? ((std::int64_t(b) * g.T + t) * g.H + gi * g.h + rinfo[kInvRows + i]) * DP + ch * 8 : 0;
      cp16(Qs + i * STR + ch * 8, a.tcq + off, ok);
      if constexpr (BWD) cp16(Os + i * STR + ch * 8, a.tcdo + off, ok);
    }
    cp_commit();
    cp_wait0();
#if NSATRON_WGMMA
    wg::fence_proxy_async();  // the cp.async tiles are read by the tensor cores' async proxy
#endif
    __syncthreads();

    // This thread's two rows: warp * 16 + gr and + 8.
    int rt[2], slot[2];
    std::int64_t rowg[2];
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int i = warp * 16 + gr + 8 * h2;
      rt[h2] = rinfo[i];
      slot[h2] = rinfo[2 * kInvRows + i];
      rowg[h2] = (std::int64_t(b) * g.T + max(rt[h2], 0)) * g.H + gi * g.h + rinfo[kInvRows + i];
    }
    float lrow2[2] = {0.f, 0.f}, dot[2] = {0.f, 0.f};
    if constexpr (BWD) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
        if (rt[h2] >= 0) {
          lrow2[h2] = a.lse_in[rowg[h2]] * kLog2e;
          dot[h2] = a.dot_in[rowg[h2]];
        }
    }
    float m2[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f};
    float acc[DT][4];
#pragma unroll
    for (int jj = 0; jj < DT; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[jj][e] = 0.f;

    for (int st = 0; st < nsub_used; ++st) {
      const int s0 = s_beg + st * KT, cnt = min(KT, s_end - s0);
      const bf16* Kt = Ks + st * KT * DP;
      const bf16* Vt = Vs + st * KT * DP;
      unsigned long long vis[2];
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
        vis[h2] = rt[h2] >= s0 ? key_bits(0, min(cnt, rt[h2] - s0 + 1)) : 0ull;
      float s[NT][4], dp[BWD ? NT : 1][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] = 0.f;
          if constexpr (BWD) dp[n][e] = 0.f;
        }
      {
        std::uint32_t qa[DP / 16][4], oa[BWD ? DP / 16 : 1][4];
#pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk) {
          frag_a<STR>(qa[kk], Qw, kk * 16, lane);
          if constexpr (BWD) frag_a<STR>(oa[kk], Ow, kk * 16, lane);
        }
        // (at padded D = 64 the forward's S as two N = 32 products, as the row kernel's)
        tile_scores<DP, KT, 1, BWD, DP == 64 && !BWD>(s, dp, qa, oa, Kt, Vt, lane);
      }
      const std::uint32_t mbits[2] = {thread_key_bits(vis[0], gc), thread_key_bits(vis[1], gc)};
      mask_scores(s, mbits);
      if constexpr (BWD) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h2 = e >> 1;
            const float p = ex2(fmaf(s[n][e], sl2, -lrow2[h2]));
            dp[n][e] = p * (dp[n][e] - dot[h2]);  // dS / scale
          }
        acc_add_product<NT, DT, DP, KT, 1, true, row_ds_parts(DP)>(acc, dp, Kt, lane);  // acc += dS K
      } else {
        online_softmax_tile<NT, DT>(s, sl2, m2, ls, acc);
        acc_add_product<NT, DT, DP, KT, 1, true>(acc, s, Vt, lane);  // acc += P V
      }
    }

    // The partial states at the rows' slots.
    if constexpr (!BWD) quad_row_sums(ls);
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      if (rt[h2] < 0 || slot[h2] < 0) continue;
      const int i = warp * 16 + gr + 8 * h2;
      const std::int64_t pr =
          ((std::int64_t(bg - a.bg0) * g.T + rt[h2]) * g.h + rinfo[kInvRows + i]) * g.n + slot[h2];
      const float inv = BWD ? 1.f : (ls[h2] > 0.f ? 1.f / ls[h2] : 0.f);
#pragma unroll
      for (int jj = 0; jj < DT; ++jj) {
        const int dd = jj * 8 + gc * 2;
        if (dd >= g.D) continue;
        const float x0 = acc[jj][2 * h2] * inv, x1 = acc[jj][2 * h2 + 1] * inv;
        if constexpr (BWD)
          *reinterpret_cast<float2*>(a.part + pr * g.D + dd) = make_float2(x0, x1);
        else  // a slot's output rounded once to bf16 (the merge sums n of them in fp32)
          *reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<bf16*>(a.part) + pr * g.D + dd) =
              __floats2bfloat162_rn(x0, x1);
      }
      if constexpr (!BWD)
        if (gc == 0)
          a.part_lse[pr] = ls[h2] > 0.f ? m2[h2] * 0.6931471805599453f + logf(ls[h2]) : -INFINITY;
    }
  }
  cp_wait0();
}

// One warp per row of the pass (its (b, g) pairs, positions, heads): the row's valid slots in
// slot order. Forward: o and lse of the selection branch. Backward: dq (+)= scale g sum_e A_e.
// The slots' validity and (forward) weights are loaded and computed by lane, 32 slots at a time
// (lane e: slot e0 + e), and read back by shuffles in slot order; VEC columns per lane and load
// (4 where D is a multiple of 4: one 8-byte load of a bf16 partial, 16 bytes of an fp32 one;
// else 1). Every sum in slot order, as one thread per column would take it.
template <bool BWD, int VEC>
__global__ void inv_merge_kernel(Geo g, InvArgs a, int nbg, float* __restrict__ o, float* __restrict__ lse,
                                 float* __restrict__ dq, const bf16* __restrict__ gate, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const std::int64_t rows = std::int64_t(nbg) * g.T * g.h;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  constexpr int kCols = 128 / (32 * VEC);  // column groups per lane (D <= 128)
  for (std::int64_t pr = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32; pr < rows; pr += warps) {
    const int hd = int(pr % g.h);
    const int t = int((pr / g.h) % g.T);
    const int bg = a.bg0 + int(pr / (std::int64_t(g.h) * g.T));
    const int b = bg / g.G, gi = bg % g.G;
    const std::int64_t row = (std::int64_t(b) * g.T + t) * g.H + gi * g.h + hd;
    const std::int32_t* selrow = a.sel + ((std::int64_t(b) * g.T + t) * g.G + gi) * g.n;
    const float* prow = a.part + pr * g.n * g.D;                              // backward
    const bf16* prow16 = reinterpret_cast<const bf16*>(a.part) + pr * g.n * g.D;  // forward
    auto valid = [&](int e) {  // as launch_inverse_index marks its entries
      const int jb = selrow[e];
      return jb >= 0 && jb < g.NB && jb * g.ls <= t;
    };
    float accv[kCols][VEC] = {};
    auto add_slot = [&](int e, float w) {  // accv += w x the slot's partial (backward: w = 1)
#pragma unroll
      for (int cc = 0; cc < kCols; ++cc) {
        const int dd = VEC * (lane + 32 * cc);
        if (dd >= g.D) continue;
        float x[VEC];
        if constexpr (BWD) {
          if constexpr (VEC == 4) {
            const float4 v = *reinterpret_cast<const float4*>(prow + std::int64_t(e) * g.D + dd);
            x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
          } else {
            x[0] = prow[std::int64_t(e) * g.D + dd];
          }
        } else {
          if constexpr (VEC == 4) {
            const uint2 u = *reinterpret_cast<const uint2*>(prow16 + std::int64_t(e) * g.D + dd);
            const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
            const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
            x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
          } else {
            x[0] = __bfloat162float(prow16[std::int64_t(e) * g.D + dd]);
          }
        }
#pragma unroll
        for (int c = 0; c < VEC; ++c) accv[cc][c] += BWD ? x[c] : w * x[c];
      }
    };
    // dst[dd] = accv f (forward: o), or (add ? dst[dd] : 0) + f accv (backward: dq), as the
    // one-column form wrote them.
    auto store = [&](float* dst, float f, bool add) {
#pragma unroll
      for (int cc = 0; cc < kCols; ++cc) {
        const int dd = VEC * (lane + 32 * cc);
        if (dd >= g.D) continue;
        float* p = dst + row * g.D + dd;
        float y[VEC];
        if constexpr (BWD) {
          float base[VEC];
          if constexpr (VEC == 4) {
            const float4 v = add ? *reinterpret_cast<const float4*>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
            base[0] = v.x, base[1] = v.y, base[2] = v.z, base[3] = v.w;
          } else {
            base[0] = add ? p[0] : 0.f;
          }
#pragma unroll
          for (int c = 0; c < VEC; ++c) y[c] = base[c] + f * accv[cc][c];
        } else {
#pragma unroll
          for (int c = 0; c < VEC; ++c) y[c] = accv[cc][c] * f;
        }
        if constexpr (VEC == 4) *reinterpret_cast<float4*>(p) = make_float4(y[0], y[1], y[2], y[3]);
        else p[0] = y[0];
      }
    };
    if constexpr (!BWD) {
      float M = -INFINITY;
      for (int e0 = 0; e0 < g.n; e0 += 32) {  // the largest valid lse
        const int e = e0 + lane;
        if (e < g.n && valid(e)) M = fmaxf(M, a.part_lse[pr * g.n + e]);
      }
      M = warp_max(M);
      float L = 0.f;
      for (int e0 = 0; e0 < g.n; e0 += 32) {
        const int e = e0 + lane;
        const bool ok = e < g.n && valid(e);
        const float wl = ok && M != -INFINITY ? expf(a.part_lse[pr * g.n + e] - M) : 0.f;
        unsigned m = __ballot_sync(0xffffffffu, ok);
        while (m) {  // the valid slots of the chunk in order (warp-uniform)
          const int src = __ffs(m) - 1;
          m &= m - 1u;
          const float w = __shfl_sync(0xffffffffu, wl, src);
          L += w;
          add_slot(e0 + src, w);
        }
      }
      const float inv = L > 0.f ? 1.f / L : 0.f;
      store(o, inv, false);
      if (lane == 0) lse[row] = L > 0.f ? M + logf(L) : -INFINITY;
    } else {
      for (int e0 = 0; e0 < g.n; e0 += 32) {
        const int e = e0 + lane;
        unsigned m = __ballot_sync(0xffffffffu, e < g.n && valid(e));
        while (m) {
          const int src = __ffs(m) - 1;
          m &= m - 1u;
          add_slot(e0 + src, 1.f);
        }
      }
      const float f = g.scale * (gate ? sigmoidf(ldf(gate[gate_offset(g, row) + kSlc])) : 1.f);
      store(dq, f, accumulate);
    }
  }
}

template <int DP, bool BWD>
void slc_inv_launch(const Geo& g, const RowArgs& ra, const SlcInvIndex& ix, cudaStream_t s) {
  const std::int64_t U = std::int64_t(g.B) * g.G * g.NB;
  if (U == 0 || g.T == 0) return;
  const int nsub = (g.ls + kInvKT - 1) / kInvKT;
  const std::size_t smem = inv_smem_bytes<DP, BWD>(nsub);
  CUDA_CHECK(cudaFuncSetAttribute(slc_inv_kernel<DP, BWD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  inv_blocks_kernel<<<unsigned((U + 255) / 256), 256, 0, s>>>(ix.off, ix.nblk, int(U), g.h);
  check_launch("tc::inv_blocks_kernel");
  inv_scan_kernel<<<1, 1024, 0, s>>>(ix.nblk, ix.choff, int(U));
  check_launch("tc::inv_scan_kernel");
  InvArgs a{};
  a.tcq = static_cast<const bf16*>(ra.tcq);
  a.tcdo = static_cast<const bf16*>(ra.tcdo);
  a.tck = static_cast<const bf16*>(ra.tck);
  a.tcv = static_cast<const bf16*>(ra.tcv);
  a.sel = ra.sel;
  a.off = ix.off;
  a.pos = ix.pos;
  a.choff = ix.choff;
  a.part = ix.part;
  a.part_lse = ix.part_lse;
  a.lse_in = ra.lse_in;
  a.dot_in = ra.dot_in;
  const int per_pass = slc_inv_bg_per_pass(g);
  const int BG = g.B * g.G;
  const std::int64_t per_bg_blocks =
      (std::int64_t(g.T) * g.n * g.h + kInvRows * kInvChunks - 1) / (kInvRows * kInvChunks) + g.NB;
  for (int bg0 = 0; bg0 < BG; bg0 += per_pass) {
    const int nbg = std::min(per_pass, BG - bg0);
    a.bg0 = bg0;
    a.u0 = bg0 * g.NB;
    a.u1 = (bg0 + nbg) * g.NB;
    const std::int64_t blocks = per_bg_blocks * nbg;
    if (blocks > INT_MAX) throw std::runtime_error("tc::slc_inv_kernel: too many blocks in a pass");
    slc_inv_kernel<DP, BWD><<<unsigned(blocks), kRowWarps * 32, smem, s>>>(g, a);
    check_launch("tc::slc_inv_kernel");
    const std::int64_t rows = std::int64_t(nbg) * g.T * g.h;
    const auto merge = g.D % 4 == 0 ? inv_merge_kernel<BWD, 4> : inv_merge_kernel<BWD, 1>;
    merge<<<grid1(rows * 32, 256), 256, 0, s>>>(g, a, nbg, static_cast<float*>(ra.o), ra.lse, ra.dq,
                                               static_cast<const bf16*>(ra.gate), ra.accumulate);
    check_launch("tc::inv_merge_kernel");
  }
}

}  // namespace tc
