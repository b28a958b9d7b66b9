// NSA block selection on CUDA: one block per (position t, batch, group). When the rule
// leaves no choice (all eligible blocks fit in n) the row is written directly. Otherwise:
//   1. p_cmp[a, i] = exp(scale q_a.Kc_i - lse_a) for the h heads and the visible compressed
//      blocks, Kc streamed through shared memory 32 blocks at a time; P_i = sum_a p[a, i]
//      (heads ascending) kept in a shared array over the visible blocks;
//   2. S[j] = sum_i (overlap(i, j)/d) P_i (i ascending), a shared array over the eligible
//      selection blocks (no [T, blocks] matrix in global memory);
//   3. top-n: the forced blocks 0, b_t-1, b_t, then (n - forced) rounds of a block-wide
//      argmax over the candidates 1..b_t-2 (score descending, index ascending; NaN counts
//      as -inf), exactly the CPU's order; the row is written ascending, -1 padded.
#include <algorithm>
#include <climits>

#include "nsa/cuda/internal.cuh"

namespace nsatron::nsa::cuda::detail {

namespace {

constexpr int KT = kKeyTile;
constexpr int SEL_THREADS = 128;

template <class T, int DP>
__global__ void __launch_bounds__(SEL_THREADS)
    select_kernel(Geo g, const T* __restrict__ q, const float2* __restrict__ rope,
                  const float* __restrict__ kc, const float* __restrict__ lse,
                  std::int32_t* __restrict__ sel) {
  constexpr int STR = DP + 4, PS = KT + 1;
  const int t = blockIdx.x;
  const int b = blockIdx.y / g.G, gi = blockIdx.y % g.G;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NW = blockDim.x >> 5;
  std::int32_t* out = sel + ((std::int64_t(b) * g.T + t) * g.G + gi) * g.n;
  const int bt = t / g.ls;
  int ncand = 0;
  const int take = selection_take(g, bt, ncand);
  if (take == ncand) {  // every eligible block is chosen: 0..bt
    for (int k = threadIdx.x; k < g.n; k += blockDim.x) out[k] = k <= bt ? k : -1;
    return;
  }

  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [h][STR]
  float* Ks = Qs + g.h * STR;                   // [KT][STR]
  float* Pa = Ks + KT * STR;                    // [h][PS]
  float* lr = Pa + g.h * PS;                    // [h]
  float* P = lr + g.h;                          // [N]
  float* S = P + max(g.N, 1);                   // [bt+1]
  float* rv = S + g.NB;                         // [NW] reduction values
  int* rj = reinterpret_cast<int*>(rv + 32);          // [NW] reduction indices
  int* chosen = rj + 32;                              // [n]

  const std::int64_t head0 = (std::int64_t(b) * g.T + t) * g.H + gi * g.h;
  for (int idx = threadIdx.x; idx < g.h * DP; idx += blockDim.x) {
    const int a = idx / DP, dd = idx % DP;
    Qs[a * STR + dd] =
        dd < g.D ? rope_elem(q + q_offset(g, head0 + a), dd, g.half, rope + std::int64_t(t) * g.half)
                 : 0.f;
  }
  for (int a = threadIdx.x; a < g.h; a += blockDim.x) lr[a] = lse[head0 + a];

  const int nvis = visible_blocks(g, t);
  for (int i0 = 0; i0 < nvis; i0 += KT) {
    const int cnt = min(KT, nvis - i0);
    __syncthreads();
    for (int idx = threadIdx.x; idx < KT * DP; idx += blockDim.x) {
      const int kk = idx / DP, dd = idx % DP;
      Ks[kk * STR + dd] =
          (kk < cnt && dd < g.D) ? kc[((std::int64_t(b) * g.N + i0 + kk) * g.G + gi) * g.D + dd]
                                 : 0.f;
    }
    __syncthreads();
    for (int a = warp; a < g.h; a += NW) {
      float s = 0.f;
#pragma unroll 8
      for (int d4 = 0; d4 < DP; d4 += 4) {
        const float4 qv = *reinterpret_cast<const float4*>(Qs + a * STR + d4);
        const float4 kv = *reinterpret_cast<const float4*>(Ks + lane * STR + d4);
        s += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
      }
      Pa[a * PS + lane] = lane < cnt ? expf(s * g.scale - lr[a]) : 0.f;
    }
    __syncthreads();
    if (threadIdx.x < cnt) {
      float sum = 0.f;
      for (int a = 0; a < g.h; ++a) sum += Pa[a * PS + threadIdx.x];
      P[i0 + threadIdx.x] = sum;
    }
  }
  __syncthreads();
  const int l_units = g.l / g.d, ls_units = g.ls / g.d;  // the overlap weights' bounds
  for (int j = threadIdx.x; j <= bt; j += blockDim.x) {
    int i_lo, i_hi;
    overlapping_cmp_blocks_units(j, l_units, ls_units, i_lo, i_hi);
    i_hi = min(i_hi, nvis - 1);
    float sum = 0.f;
    for (int i = i_lo; i <= i_hi; ++i) sum += overlap_weight_units(i, j, l_units, ls_units) * P[i];
    S[j] = sum;
  }
  __syncthreads();
  for (int round = 0; round < take; ++round) {
    float bv = -INFINITY;
    int bj = INT_MAX;
    scan_candidates(S, 1 + threadIdx.x, bt - 2, blockDim.x, bv, bj);
    warp_best_candidate(bv, bj);
    if (lane == 0) {
      rv[warp] = bv;
      rj[warp] = bj;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = rv[0];
      int j = rj[0];
      for (int w2 = 1; w2 < NW; ++w2)
        if (rj[w2] != INT_MAX && ranks_before(rv[w2], rj[w2], v, j)) {
          v = rv[w2];
          j = rj[w2];
        }
      chosen[round] = j;
      S[j] = kTakenScore;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) write_selection_row(out, chosen, take, bt, g.n);
}

template <class T, int DP>
void select_impl(const Geo& g, const T* q, const float2* rope, const float* kc, const float* lse,
                 std::int32_t* sel, cudaStream_t s) {
  constexpr int STR = DP + 4;
  const std::size_t smem = std::size_t(g.h * STR + KT * STR + g.h * (KT + 1) + g.h +
                                       std::max(g.N, 1) + g.NB + 32 + 32 + g.n) * 4;
  const int optin = smem_optin();
  if (smem > std::size_t(optin))
    throw std::runtime_error("nsa cuda: the selection kernel needs " + std::to_string(smem) +
                             " bytes of shared memory (heads per group and T/d too large); "
                             "the device allows " + std::to_string(optin));
  CUDA_CHECK(cudaFuncSetAttribute(select_kernel<T, DP>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (std::int64_t(g.B) * g.G > 65535) throw std::runtime_error("nsa cuda: B * G > 65535");
  const dim3 grid(unsigned(g.T), unsigned(g.B * g.G));
  select_kernel<T, DP><<<grid, SEL_THREADS, smem, s>>>(g, q, rope, kc, lse, sel);
  check_launch("select_kernel");
}

}  // namespace

template <class T>
void launch_select(const Geo& g, const T* q, const float2* rope, const float* kc,
                   const float* lse_cmp, std::int32_t* sel, cudaStream_t s) {
  switch (padded_dim(g.D)) {
    case 32: select_impl<T, 32>(g, q, rope, kc, lse_cmp, sel, s); break;
    case 64: select_impl<T, 64>(g, q, rope, kc, lse_cmp, sel, s); break;
    default: select_impl<T, 128>(g, q, rope, kc, lse_cmp, sel, s); break;
  }
}

template void launch_select<float>(const Geo&, const float*, const float2*, const float*,
                                   const float*, std::int32_t*, cudaStream_t);
template void launch_select<bf16>(const Geo&, const bf16*, const float2*, const float*,
                                  const float*, std::int32_t*, cudaStream_t);

}  // namespace nsatron::nsa::cuda::detail
