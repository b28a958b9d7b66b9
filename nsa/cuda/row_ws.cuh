// The window branch's forward at padded D = 128 with tiles of 128 keys, warp-specialised
// (sm_90a): the window's o, lse and gated sum, the function of tc::row_kernel<128, kWin, false>
// (attention_tc.cuh) for 128 rows per block instead of 64, which RowForward's kAuto takes where
// one (batch, group)'s window keys and values exceed half the L2 (selection_loop.h; the own dense
// kernel at the paper's 64k).
//
// Why: the 64-row kernel streams each key and value tile (32 KB at D = 128) from the L2 for
// 64 rows, and its 4 warps wait at a block barrier per tile; 128 rows in one block of 8 warps
// in lockstep (docs/performance.md, change 44) halved the bytes but lost more to the lockstep.
// Here the block is three warpgroups:
//   - warpgroup 0, the producer (its registers cut to kWsProducerRegs by setmaxnreg): copies
//     tile k into stage k % kWsStages (cp.async, 16-byte chunks) once both consumers released
//     the tile kWsStages earlier (mbarrier `empty`), and kWsLag tiles later, its copies of tile
//     k complete (cp.async.wait_group), fences them for the tensor cores' async proxy and
//     arrives on `full` of tile k's stage;
//   - warpgroups 1 and 2, the consumers (registers raised to kWsConsumerRegs), 64 rows each
//     (rows rho0 + 64 c ..): each waits on `full` alone, computes the tile's scores by
//     warpgroup products (the queries read from shared memory), masks each 64-key half of the
//     tile as the 64-row kernel masks a 64-key tile, runs the online softmax, adds the tile's
//     P V at once and releases the stage. A consumer skips the tiles none of its rows sees
//     (outside its positions' window), after waiting for them (an mbarrier's phase parity
//     cannot be skipped).
// The tiles start at the block's first visible key and hold 128 keys, so the sums differ from
// the 64-row kernel's in rounding (NsaCuda.WideWindowForwardMatchesCpu,
// DenseCuda.WideWindowForwardMatchesCpu check it against the CPU). Tiles of 128 keys halve the
// steps, each with twice the products, for the same per-step waits and row reductions
// (FlashAttention-3's forward takes 128-key tiles at D = 128). Leaving each tile's P V running
// under the next tile's scores (the 64-row kernel's overlap) spilled here with the masks' code
// in the same step, and without masks on the tiles that need none it measured slower (a
// stage released a step later with three stages; docs/performance.md, 2026-11-29).
// The same kernel also ran the selection and 64-key tiles until the twenty-fourth session; the
// 64-row kernel was faster at every h (docs/performance.md, 2026-11-29, twenty-first session),
// so that form is gone (git history: row_ws.cuh before 2026-11-29's removal).
//
// Deadlock freedom: a consumer waiting for tile k holds at most the stage of tile k - 1 (a
// skipped tile releases its stage); the producer arrives tile k - kWsLag before it waits for the
// stage of tile k, which needs tile k - kWsStages released: with kWsLag < kWsStages every tile a
// consumer waits for is arrived or can be.
// Included inside namespace nsatron::nsa::cuda::detail::{anonymous} of attention.cu, after
// attention_tc.cuh.
#pragma once

namespace tc {

constexpr int kWsConsumers = 2;                     // consumer warpgroups, 64 rows each
constexpr int kWsRows = 64 * kWsConsumers;          // rows per block
constexpr int kWsThreads = 128 * (1 + kWsConsumers);
constexpr int kWsKeys = 128;                        // keys per tile
// Key + value tiles in shared memory: 3 stages of 128 keys (192 KB; with the block's 128 query
// rows 226 KB, within an H100's 227).
constexpr int kWsStages = 3;
constexpr int kWsLag = 2;                           // tiles between a copy's issue and its arrive
constexpr int kWsProducerRegs = 40, kWsConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 64K
static_assert(kWsLag < kWsStages, "see the deadlock note above");

struct WsSmem {  // byte offsets of row_fwd_ws_kernel's dynamic shared memory
  std::size_t k, v, q, bar, total;
};
__host__ __device__ inline WsSmem ws_smem() {
  using C = RowCfg<128>;
  const std::size_t tile = std::size_t(kWsKeys) * 128 * 2;  // wgmma.cuh layout, 1024-aligned
  WsSmem L;
  L.k = 0;
  L.v = L.k + kWsStages * tile;
  L.q = L.v + kWsStages * tile;
  L.bar = (L.q + std::size_t(kWsRows) * C::STR * 2 + 7) / 8 * 8;
  L.total = L.bar + 2 * kWsStages * 8;  // full[stages], empty[stages]
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

__global__ void __launch_bounds__(kWsThreads, 1) row_fwd_ws_kernel(Geo g, RowArgs a) {
#if NSATRON_WGMMA
  constexpr int DP = 128, KT = kWsKeys;
  constexpr int NT = KT / 8, DT = DP / 8, CH = DP / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(1024) float4 smem4[];
  char* sm = reinterpret_cast<char*>(smem4);
  const WsSmem L = ws_smem();
  bf16* Ks = reinterpret_cast<bf16*>(sm + L.k);  // [stage] tiles of KT x DP
  bf16* Vs = reinterpret_cast<bf16*>(sm + L.v);
  auto* full = reinterpret_cast<std::uint64_t*>(sm + L.bar);
  std::uint64_t* empty = full + kWsStages;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wgi = warp >> 2;
  const bf16* kp = static_cast<const bf16*>(a.tck);
  const bf16* vp = static_cast<const bf16*>(a.tcv);
  const RowBlock rb = row_block(g, kWsRows, row_heaviest_first<kWin>(g, kWsRows));
  const int b = rb.b, gi = rb.gi, rho0 = rb.rho0, t_first = rb.t_first, t_last = rb.t_last;
  const int key_end = t_last + 1;
  // The positions of consumer c's rows: [wg_first(c), wg_last(c)] (a position may straddle).
  auto wg_first = [&](int c) { return g.hdiv.div(rho0 + 64 * c); };
  auto wg_last = [&](int c) { return min(g.T - 1, g.hdiv.div(rho0 + 64 * c + 63)); };

  if (tid < kWsStages) {
    mbar_init(&full[tid], 128);                    // the producer's threads
    mbar_init(&empty[tid], 4 * kWsConsumers);      // one arrive per consumer warp
  }
  const int beg = max(0, t_first - g.w + 1);
  const int ntiles = (key_end - beg + KT - 1) / KT;
  __syncthreads();  // the barriers' initialisation

  if (wgi == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsProducerRegs));
    constexpr int kKeyStep = 128 / CH, kKeyIt = KT / kKeyStep;
    const int kk0 = tid / CH, kch = tid % CH;
    const int to0 = wg::tile_offset<DP, KT>(kk0, kch);
    const std::int64_t step = std::int64_t(kKeyStep) * g.G * DP;
    for (int k = 0; k < ntiles + kWsLag; ++k) {
      if (k >= kWsLag) {  // tile k - kWsLag: this thread's copies are in; make them the tiles'
        cp_wait_n<kWsLag - 1>();
        wg::fence_proxy_async();
        mbar_arrive(&full[(k - kWsLag) % kWsStages]);
      }
      if (k < ntiles) {
        const int stage = k % kWsStages;
        mbar_wait(&empty[stage], ((k / kWsStages) & 1) ^ 1);  // round 0 passes at once
        const int s0 = beg + k * KT;
        const int cnt = min(KT, key_end - s0);
        char* kd = reinterpret_cast<char*>(Ks + stage * KT * DP);
        char* vd = reinterpret_cast<char*>(Vs + stage * KT * DP);
        const std::int64_t off0 = ((std::int64_t(b) * g.T + s0 + kk0) * g.G + gi) * DP + kch * 8;
        // (16 passes, unrolled 4 at a time so that their addresses stay within the producer's
        // 40 registers; not measured against unrolling all 16.)
#pragma unroll 4
        for (int it = 0; it < kKeyIt; ++it) {
          const bool ok = kk0 + it * kKeyStep < cnt;
          const int to = to0 + wg::row_group_offset<DP>(it * kKeyStep);
          const std::int64_t po = ok ? off0 + it * step : 0;
          cp16(kd + to, kp + po, ok);
          cp16(vd + to, vp + po, ok);
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
  // The rotated queries, staged once as the consumer's 64 rows in a wgmma.cuh tile, the scores'
  // A read from shared memory (their 32 registers are what the 128-key tile's scores and
  // probabilities need: with them in registers the kernel spilled).
  bf16* Qs = reinterpret_cast<bf16*>(sm + L.q) + c * 64 * DP;
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
      cp16(reinterpret_cast<char*>(Qs) + wg::tile_offset<DP, 64>(16 * cw + i, ch), qsrc + off, ok);
    }
    cp_commit();
    cp_wait0();
    wg::fence_proxy_async();  // read by the tensor cores' async proxy
    consumer_bar_sync(c);     // every warp's rows in before the consumer's first product
  }
  wg::SharedRowsA<DP> qs{Qs};
  const int gr = lane >> 2, gc = lane & 3;
  int rt[2];
  bool rv[2];
  std::int64_t rowg[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    int t, hd;
    rv[h2] = row_of(r0 + gr + 8 * h2, t, hd);
    rt[h2] = rv[h2] ? t : t_first;
    rowg[h2] = (std::int64_t(b) * g.T + rt[h2]) * g.H + gi * g.h + (rv[h2] ? hd : 0);
  }
  // The window keys this consumer's rows see: [win_lo, win_hi].
  const int win_lo = max(0, wg_first(c) - g.w + 1), win_hi = wg_last(c);

  const float sl2 = g.scale * kLog2e;
  float m2[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f}, corr[2] = {1.f, 1.f};
  float acc[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  std::uint32_t pa[NT / 2][4] = {};
  float dp_unused[1][4];
  auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[stage]);
  };
  for (int k = 0; k < ntiles; ++k) {
    const int stage = k % kWsStages;
    const int s0 = beg + k * KT;
    mbar_wait(&full[stage], (k / kWsStages) & 1);
    if (s0 > win_hi || s0 + KT - 1 < win_lo) {  // none of the consumer's rows sees the tile
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
    tile_scores<DP, KT, 1, false, false, true>(s, dp_unused, qs, qs, Kt, Vt, lane);  // waited for
    // The rows' key masks per 64-key half of the tile, each applied as the 64-row kernel
    // applies a tile's.
    constexpr int kParts = KT / 64;
    unsigned long long vis[2][kParts];
    bool sees = false;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
      for (int q = 0; q < kParts; ++q) {
        const int b0 = s0 + 64 * q;
        vis[h2][q] = rv[h2] ? key_bits(max(0, rt[h2] - g.w + 1 - b0), min(64, rt[h2] + 1 - b0)) : 0ull;
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
      const std::uint32_t mb1[2] = {thread_key_bits(vis[0][1], gc), thread_key_bits(vis[1][1], gc)};
      mask_scores<1>(s, mb1);
      online_softmax_tile<NT, DT>(s, sl2, m2, ls, acc, corr);  // acc rescaled here
    }
    // This tile's P V now (every warp: the product is the warpgroup's; p = 0 where unseen).
    rescale_and_pack<NT, DT>(acc, corr, false, pa, s);
    acc_add_packed<NT, DT, KT, 1, true>(acc, pa, Vt, lane);
    release(stage);
  }
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
// consumers' setmaxnreg.inc would wait for ever. Checked once (window_forward_wide_applies).
inline bool row_fwd_ws_registers_fit() {
  static const bool fit = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, row_fwd_ws_kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.numRegs * kWsThreads >= 128 * kWsProducerRegs + 128 * kWsConsumers * kWsConsumerRegs;
  }();
  return fit;
}

// Launches row_fwd_ws_kernel (the window branch, bf16 tiles at padded D = 128; the caller
// checks window_forward_wide_applies).
inline void row_fwd_ws_launch(const Geo& g, const RowArgs& a, cudaStream_t s) {
  const std::int64_t nblocks = (std::int64_t(g.T) * g.h + kWsRows - 1) / kWsRows;
  if (nblocks == 0) return;
  if (std::int64_t(g.T) * g.h + kWsRows >= (std::int64_t(1) << 31))
    throw std::runtime_error("tc::row_fwd_ws_kernel: T * heads per group = " + std::to_string(std::int64_t(g.T) * g.h) +
                             " rows of one (batch, group); at most 2^31 - 129 are supported");
  const std::size_t smem = ws_smem().total;
  CUDA_CHECK(cudaFuncSetAttribute(row_fwd_ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  row_fwd_ws_kernel<<<row_launch_grid<kWin>(g, kWsRows, nblocks), kWsThreads, smem, s>>>(g, a);
  check_launch("tc::row_fwd_ws_kernel");
}

}  // namespace tc
