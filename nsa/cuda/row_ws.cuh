// The row kernels' forward at padded D = 128, warp-specialised (sm_90a): the selection and
// window branches' o and lse (and the window's gated sum), the same function as
// tc::row_kernel<128, BR, false> (attention_tc.cuh), for 128 rows per block instead of 64.
//
// Why: the 64-row kernel streams each key and value tile (32 KB at D = 128) from the L2 for
// 64 rows, ~4-5 TB/s at the paper's shape, and its 4 warps wait at a block barrier per tile;
// 128 rows in one block of 8 warps in lockstep (docs/performance.md, change 44) halved the
// bytes but lost more to the lockstep. Here the block is three warpgroups:
//   - warpgroup 0, the producer (its registers cut to kWsProducerRegs by setmaxnreg): copies
//     tile k into stage k % kWsStages (cp.async, each thread the chunks the 64-row kernel's
//     thread copies) once both consumers released the tile kWsStages earlier (mbarrier
//     `empty`), writes the selection's key masks of its positions (one thread per position),
//     and kWsLag tiles later, its copies of tile k complete (cp.async.wait_group), fences them
//     for the tensor cores' async proxy and arrives on `full` of tile k's stage;
//   - warpgroups 1 and 2, the consumers (registers raised to kWsConsumerRegs), 64 rows each
//     (rows rho0 + 64 c ..): each waits on `full` alone, runs the 64-row kernel's step (S by
//     warpgroup products, the previous tile's P V left running under the softmax) and releases
//     a stage once its last product with it is done. A consumer skips the tiles none of its
//     rows sees (the selection: its positions' union; the window: its positions' window),
//     after waiting for them (an mbarrier's phase parity cannot be skipped), finishing first
//     the P V product it had deferred.
// A consumer walks the tiles its own rows see in the order the 64-row kernel does, with the
// same products and softmax, so for the selection (tiles at multiples of 64) its bits are the
// 64-row kernel's; the window's tiles start at the block's first visible key, so they are the
// same where the window reaches position 0 for every row (w >= T) and may differ in rounding
// elsewhere. NsaCuda.WarpSpecialisedForwardGivesTheSameBits compares the two.
// The window branch can take tiles of 128 keys (KT = 128, RowForward::kWideWindow; three
// stages): half the steps, each with twice the products, each 64-key half of a tile masked as a
// 64-key tile, the queries read from shared memory and each tile's P V waited for at once (see
// kDeferPV); its sums then differ from the 64-key kernels' in rounding
// (NsaCuda.WarpSpecialisedForwardMatchesCpu, DenseCuda.WideWindowForwardMatchesCpu).
//
// Deadlock freedom: a consumer waiting for tile k holds at most the stage of its previous seen
// tile k - 1 (a skipped tile releases everything); the producer arrives tile k - kWsLag before
// it waits for the stage of tile k, which needs tile k - kWsStages released: with kWsLag <
// kWsStages every tile a consumer waits for is arrived or can be.
// Included inside namespace nsatron::nsa::cuda::detail::{anonymous} of attention.cu, after
// attention_tc.cuh.
#pragma once

namespace tc {

constexpr int kWsConsumers = 2;                     // consumer warpgroups, 64 rows each
constexpr int kWsRows = 64 * kWsConsumers;          // rows per block
constexpr int kWsThreads = 128 * (1 + kWsConsumers);
constexpr int kWsLag = 2;                           // tiles between a copy's issue and its arrive
constexpr int kWsProducerRegs = 40, kWsConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 64K
// Keys per tile: 64 (the 64-row kernel's tiles, the selection's blocks), or 128 for the window
// branch (ws_wide_tiles: half the steps, each with twice the products, for the same per-step
// waits, barriers and row reductions; FlashAttention-3's forward takes 128-key tiles at D = 128).
// Key + value tiles in shared memory: 4 stages of 64 keys (128 KB), 3 of 128 (192 KB; with the
// block's 128 query rows 226 KB, within an H100's 227).
template <int KT>
constexpr int ws_stages() {
  return KT == 64 ? 4 : 3;
}
static_assert(kWsLag < ws_stages<64>() && kWsLag < ws_stages<128>(), "see the deadlock note above");

struct WsSmem {  // byte offsets of row_fwd_ws_kernel's dynamic shared memory
  std::size_t k, v, q, kmask, selp, tbits, bar, total;
};
template <int BR, int KT>
__host__ __device__ inline WsSmem ws_smem(int n, int ntw) {
  using C = RowCfg<128>;
  constexpr int S = ws_stages<KT>();
  const std::size_t tile = std::size_t(KT) * 128 * 2;  // wgmma.cuh layout, 1024-aligned
  const bool slc = BR == kSlc;
  WsSmem L;
  L.k = 0;
  L.v = L.k + S * tile;
  L.q = L.v + S * tile;
  L.kmask = L.q + std::size_t(kWsRows) * C::STR * 2;
  L.selp = L.kmask + (slc ? std::size_t(S) * kWsRows * 8 : 0);  // [stage][position]
  L.tbits = L.selp + (slc ? std::size_t(kWsRows) * n * 4 : 0);  // [position][n]
  L.bar = (L.tbits + (slc ? std::size_t(1 + kWsConsumers) * ntw * 4 : 0) + 7) / 8 * 8;
  L.total = L.bar + 2 * S * 8;  // full[stages], empty[stages]
  return L;
}

#if NSATRON_WGMMA
__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Arrives (release: this thread's earlier writes are visible to whoever waits for the phase).
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}
// Waits (acquire) until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
  std::uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// The 128 threads of consumer c (0 or 1) at named barrier 1 + c (0 is __syncthreads', which
// the producer, gone by then, would never reach).
__device__ __forceinline__ void consumer_bar_sync(int c) {
  if (c == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else asm volatile("bar.sync 2, 128;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_wait_n() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

template <int BR, int KT>
__global__ void __launch_bounds__(kWsThreads, 1) row_fwd_ws_kernel(Geo g, RowArgs a, int ntw) {
#if NSATRON_WGMMA
  static_assert(KT == 64 || (KT == 128 && BR == kWin), "128-key tiles for the window branch only");
  constexpr int DP = 128;
  using C = RowCfg<DP>;
  constexpr int STR = C::STR, NT = KT / 8, DT = DP / 8, CH = DP / 8;
  constexpr int kWsStages = ws_stages<KT>();
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(1024) float4 smem4[];
  char* sm = reinterpret_cast<char*>(smem4);
  const WsSmem L = ws_smem<BR, KT>(g.n, ntw);
  bf16* Ks = reinterpret_cast<bf16*>(sm + L.k);  // [stage] tiles of KT x DP
  bf16* Vs = reinterpret_cast<bf16*>(sm + L.v);
  auto* kmask = reinterpret_cast<unsigned long long*>(sm + L.kmask);  // slc: [stage][kWsRows]
  int* selp = reinterpret_cast<int*>(sm + L.selp);                    // slc: [kWsRows][n]
  auto* tbits = reinterpret_cast<std::uint32_t*>(sm + L.tbits);       // slc: [union, wg 0, wg 1][ntw]
  auto* full = reinterpret_cast<std::uint64_t*>(sm + L.bar);
  std::uint64_t* empty = full + kWsStages;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wgi = warp >> 2;
  const bf16* kp = static_cast<const bf16*>(a.tck);
  const bf16* vp = static_cast<const bf16*>(a.tcv);
  const RowBlock rb = row_block(g, kWsRows, row_heaviest_first<BR>(g, kWsRows));
  const int b = rb.b, gi = rb.gi, rho0 = rb.rho0, t_first = rb.t_first, t_last = rb.t_last, npos = rb.npos;
  const int key_end = t_last + 1;
  // The positions of consumer c's rows: [wg_first(c), wg_last(c)] (a position may straddle).
  auto wg_first = [&](int c) { return g.hdiv.div(rho0 + 64 * c); };
  auto wg_last = [&](int c) { return min(g.T - 1, g.hdiv.div(rho0 + 64 * c + 63)); };

  if (tid < kWsStages) {
    mbar_init(&full[tid], 128);                    // the producer's threads
    mbar_init(&empty[tid], 4 * kWsConsumers);      // one arrive per consumer warp
  }
  int ntiles = 0, beg = 0;
  if constexpr (BR == kSlc) {
    for (int idx = tid; idx < (1 + kWsConsumers) * ntw; idx += blockDim.x) tbits[idx] = 0u;
    load_selected_blocks(selp, g, a, rb, kWsRows);
    __syncthreads();
    mark_selected_tiles<KT>(selp, g, t_first, npos, tbits, [&](int t, int tt) {  // and each consumer's own
#pragma unroll
      for (int c = 0; c < kWsConsumers; ++c)
        if (t >= wg_first(c) && t <= wg_last(c)) atomicOr(&tbits[(1 + c) * ntw + (tt >> 5)], 1u << (tt & 31));
    });
    __syncthreads();
    for (int w2 = 0; w2 < ntw; ++w2) ntiles += __popc(tbits[w2]);
  } else {
    beg = max(0, t_first - g.w + 1);
    ntiles = (key_end - beg + KT - 1) / KT;
    __syncthreads();  // the barriers' initialisation
  }

  if (wgi == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsProducerRegs));
    constexpr int kKeyStep = 128 / CH, kKeyIt = KT / kKeyStep;
    const int kk0 = tid / CH, kch = tid % CH;
    const int to0 = wg::tile_offset<DP, KT>(kk0, kch);
    const std::int64_t step = std::int64_t(kKeyStep) * g.G * DP;
    int tile = -1;
    const int p = tid;  // the position whose key masks this thread writes (selection)
    const int t = t_first + p;
    const int* row = selp + p * g.n;
    SelectedTileCursor<KT, 1> mcur;
    if constexpr (BR == kSlc) mcur.start(row, g.n, 0);
    const bool whole_tiles = g.ls % KT == 0;
    for (int k = 0; k < ntiles + kWsLag; ++k) {
      if (k >= kWsLag) {  // tile k - kWsLag: this thread's copies are in; make them the tiles'
        cp_wait_n<kWsLag - 1>();
        wg::fence_proxy_async();
        mbar_arrive(&full[(k - kWsLag) % kWsStages]);
      }
      if (k < ntiles) {
        const int stage = k % kWsStages;
        mbar_wait(&empty[stage], ((k / kWsStages) & 1) ^ 1);  // round 0 passes at once
        int s0;
        if constexpr (BR == kSlc) {
          tile = next_set_bit(tbits, ntw, tile);
          s0 = tile * KT;
        } else {
          s0 = beg + k * KT;
        }
        const int cnt = min(KT, key_end - s0);
        char* kd = reinterpret_cast<char*>(Ks + stage * KT * DP);
        char* vd = reinterpret_cast<char*>(Vs + stage * KT * DP);
        const std::int64_t off0 = ((std::int64_t(b) * g.T + s0 + kk0) * g.G + gi) * DP + kch * 8;
        // (At KT = 128, 16 passes, unrolled 4 at a time so that their addresses stay within the
        // producer's 40 registers; not measured against unrolling all 16.)
#pragma unroll(KT == 64 ? kKeyIt : 4)
        for (int it = 0; it < kKeyIt; ++it) {
          const bool ok = kk0 + it * kKeyStep < cnt;
          const int to = to0 + wg::row_group_offset<DP>(it * kKeyStep);
          const std::int64_t po = ok ? off0 + it * step : 0;
          cp16(kd + to, kp + po, ok);
          cp16(vd + to, vp + po, ok);
        }
        if constexpr (BR == kSlc) {  // position p's keys of the tile (as the 64-row kernel's)
          unsigned long long m = 0ull;
          if (p < npos && t >= s0) m = mcur.keys(row, g, t, s0, whole_tiles);
          kmask[stage * kWsRows + p] = m;
        }
      }
      cp_commit();  // (empty past the last tile: the waits above count groups)
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWsConsumerRegs));
  const int c = wgi - 1, cw = warp & 3;
  const int r0 = 64 * c + 16 * cw;  // the warp's first row in the block
  // The rotated queries, staged once: at KT = 64 the warp's rows (rows of STR elements), kept
  // as A fragments in registers; at KT = 128 the consumer's 64 rows as a wgmma.cuh tile, the
  // scores' A read from shared memory (their 32 registers are what the 128-key tile's scores
  // and probabilities need: with them in registers the kernel spilled).
  constexpr bool kQShared = KT == 128;
  // At KT = 64 a tile's P V product is left running under the next tile's scores and softmax
  // (FlashAttention-3's overlap within a warpgroup; the previous tile's probabilities stay in
  // registers meanwhile); at KT = 128 it is waited for at once: with the probabilities of two
  // tiles live the consumers spilled (248 bytes within 232 registers), and the two consumers
  // still overlap each other.
  constexpr bool kDeferPV = KT == 64;
  static_assert(kDeferPV != kQShared, "the two forms: 64 keys, deferred, queries in registers; 128, neither");
  bf16* Qs = reinterpret_cast<bf16*>(sm + L.q) + (kQShared ? c * 64 * DP : r0 * STR);
  auto row_of = [&](int i, int& t, int& head) -> bool {
    g.hdiv.divmod(rho0 + i, t, head);
    return t < g.T;
  };
  {
    const bf16* qsrc = static_cast<const bf16*>(a.tcq);
#pragma unroll
    for (int idx = lane; idx < 16 * CH; idx += 32) {
      const int i = idx / CH, ch = idx % CH;
      int t, hd;
      const bool ok = row_of(r0 + i, t, hd);
      const std::int64_t off = ok ? ((std::int64_t(b) * g.T + t) * g.H + gi * g.h + hd) * DP + ch * 8 : 0;
      if constexpr (kQShared)
        cp16(reinterpret_cast<char*>(Qs) + wg::tile_offset<DP, 64>(16 * cw + i, ch), qsrc + off, ok);
      else
        cp16(Qs + i * STR + ch * 8, qsrc + off, ok);
    }
    cp_commit();
    cp_wait0();
    if constexpr (kQShared) {
      wg::fence_proxy_async();  // read by the tensor cores' async proxy
      consumer_bar_sync(c);     // every warp's rows in before the consumer's first product
    } else {
      __syncwarp();
    }
  }
  std::uint32_t qf[kQShared ? 1 : DP / 16][4];
  if constexpr (!kQShared)
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) frag_a<STR>(qf[kk], Qs, kk * 16, lane);
  wg::SharedRowsA<DP> qs{Qs};
  const int gr = lane >> 2, gc = lane & 3;
  int rt[2], rp[2];
  bool rv[2];
  std::int64_t rowg[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    int t, hd;
    rv[h2] = row_of(r0 + gr + 8 * h2, t, hd);
    rt[h2] = rv[h2] ? t : t_first;
    rp[h2] = rt[h2] - t_first;
    rowg[h2] = (std::int64_t(b) * g.T + rt[h2]) * g.H + gi * g.h + (rv[h2] ? hd : 0);
  }
  // The window keys this consumer's rows see: [win_lo, win_hi].
  const int win_lo = max(0, wg_first(c) - g.w + 1), win_hi = wg_last(c);
  const std::uint32_t* my_tbits = tbits + (1 + c) * ntw;

  const float sl2 = g.scale * kLog2e;
  float m2[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f}, corr[2] = {1.f, 1.f};
  float acc[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  std::uint32_t pa[NT / 2][4] = {};
  const bf16* v_prev = nullptr;
  int prev_stage = 0;
  bool pv_pending = false;
  float dp_unused[1][4];
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[stage]);
  };
  int tile = -1;
  for (int k = 0; k < ntiles; ++k) {
    const int stage = k % kWsStages;
    int s0;
    bool wg_sees;
    if constexpr (BR == kSlc) {
      tile = next_set_bit(tbits, ntw, tile);
      s0 = tile * KT;
      wg_sees = (my_tbits[tile >> 5] >> (tile & 31)) & 1u;
    } else {
      s0 = beg + k * KT;
      wg_sees = s0 <= win_hi && s0 + KT - 1 >= win_lo;
    }
    mbar_wait(&full[stage], (k / kWsStages) & 1);
    if (!wg_sees) {  // the product deferred from the last seen tile, then both stages go
      if (pv_pending) {
        acc_add_packed<NT, DT, KT, 1>(acc, pa, v_prev, lane);
        release(prev_stage);
        pv_pending = false;
#pragma unroll
        for (int k2 = 0; k2 < NT / 2; ++k2)
#pragma unroll
          for (int e = 0; e < 4; ++e) pa[k2][e] = 0u;  // the next seen tile's product adds +0
      }
      release(stage);
      continue;
    }
    const bf16* Kt = Ks + stage * KT * DP;
    const bf16* Vt = Vs + stage * KT * DP;
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
    if constexpr (kDeferPV) {
      tile_scores<DP, KT, 1, false, false, false>(s, dp_unused, qf, qf, Kt, Vt, lane);
      if (!pv_pending) v_prev = Vt;  // the first seen tile's: P = 0, a product that adds +0
      acc_add_packed<NT, DT, KT, 1, false>(acc, pa, v_prev, lane);
      wg::wait_all_but_newest(s);  // the scores alone
    } else {
      tile_scores<DP, KT, 1, false, false, true>(s, dp_unused, qs, qs, Kt, Vt, lane);  // waited for
    }
    // The rows' key masks per 64-key part of the tile (one part at KT = 64), each applied as the
    // 64-row kernel applies a tile's.
    constexpr int kParts = KT / 64;
    unsigned long long vis[2][kParts];
    bool sees = false;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
      for (int q = 0; q < kParts; ++q) {
        if constexpr (BR == kSlc) {
          vis[h2][q] = rv[h2] ? kmask[stage * kWsRows + rp[h2]] : 0ull;
        } else {
          const int b0 = s0 + 64 * q;
          vis[h2][q] = rv[h2] ? key_bits(max(0, rt[h2] - g.w + 1 - b0), min(64, rt[h2] + 1 - b0)) : 0ull;
        }
        sees = sees || vis[h2][q] != 0ull;
      }
    // A warp none of whose rows sees the tile skips the softmax (row_kernel says why the bits
    // are the same).
    const bool warp_sees = __any_sync(0xffffffffu, sees);
    if (!warp_sees) {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
    } else {
      const std::uint32_t mb0[2] = {thread_key_bits(vis[0][0], gc), thread_key_bits(vis[1][0], gc)};
      mask_scores<0>(s, mb0);
      if constexpr (kParts == 2) {
        const std::uint32_t mb1[2] = {thread_key_bits(vis[0][1], gc), thread_key_bits(vis[1][1], gc)};
        mask_scores<1>(s, mb1);
      }
      online_softmax_tile<NT, DT>(s, sl2, m2, ls, kDeferPV ? nullptr : acc, corr);  // (128: rescaled here)
    }
    if constexpr (kDeferPV) {
      wg::wait(acc);  // the previous seen tile's P V: its stage is free
      if (pv_pending) release(prev_stage);
      rescale_and_pack<NT, DT>(acc, corr, warp_sees, pa, s);
      v_prev = Vt;
      prev_stage = stage;
      pv_pending = true;
    } else {  // this tile's P V now (every warp: the product is the warpgroup's; p = 0 where unseen)
      rescale_and_pack<NT, DT>(acc, corr, false, pa, s);
      acc_add_packed<NT, DT, KT, 1, true>(acc, pa, Vt, lane);
      release(stage);
    }
  }
  if (pv_pending) acc_add_packed<NT, DT, KT, 1>(acc, pa, v_prev, lane);
  quad_row_sums(ls);
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2)
    if (rv[h2]) row_forward_store<DT>(g, a, acc, h2, ls[h2], m2[h2], rowg[h2], gc);
#else
  __trap();  // sm_90a only: the host launches it only where the build made that code
#endif
}

// Whether the compiled kernel can take setmaxnreg's registers: the block's allocation (its
// register count, 168 under __launch_bounds__(384, 1) with nvcc 13, times 384 threads) must
// hold the producer's 128 x kWsProducerRegs and the consumers' 256 x kWsConsumerRegs, or the
// consumers' setmaxnreg.inc would wait for ever. Checked once per branch (row_forward_ws_applies).
template <int BR, int KT>
bool row_fwd_ws_registers_fit() {
  static const bool fit = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, row_fwd_ws_kernel<BR, KT>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.numRegs * kWsThreads >= 128 * kWsProducerRegs + 128 * kWsConsumers * kWsConsumerRegs;
  }();
  return fit;
}

// Launches row_fwd_ws_kernel (selection or window, bf16 tiles at padded D = 128; the caller
// checks row_forward_ws_applies).
template <int BR, int KT>
void row_fwd_ws_launch(const Geo& g, const RowArgs& a, cudaStream_t s) {
  const std::int64_t nblocks = (std::int64_t(g.T) * g.h + kWsRows - 1) / kWsRows;
  if (nblocks == 0) return;
  if (std::int64_t(g.T) * g.h + kWsRows >= (std::int64_t(1) << 31))
    throw std::runtime_error("tc::row_fwd_ws_kernel: T * heads per group = " + std::to_string(std::int64_t(g.T) * g.h) +
                             " rows of one (batch, group); at most 2^31 - 129 are supported");
  const int ntw = row_tile_words(g);
  const std::size_t smem = ws_smem<BR, KT>(g.n, ntw).total;
  CUDA_CHECK(cudaFuncSetAttribute(row_fwd_ws_kernel<BR, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  row_fwd_ws_kernel<BR, KT><<<row_launch_grid<BR>(g, kWsRows, nblocks), kWsThreads, smem, s>>>(g, a, ntw);
  check_launch("tc::row_fwd_ws_kernel");
}

}  // namespace tc
