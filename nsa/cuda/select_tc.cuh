// Tensor-core compression forward fused with the block selection (bf16 storage only; included
// by attention.cu after attention_tc.cuh, inside namespace nsatron::nsa::cuda::detail::
// {anonymous}).
//
// Why it is built this way. The selection ranks blocks by scores summed from the compression
// branch's probabilities, and must rank them as the fp32 reference does (the tests accept a
// different choice only at a verified near-tie, 1e-5 of the row's largest score). One bf16
// rounding of the rotated query moves a score by ~2^-9 of |q||k|, far more than that, so the
// scores here are products of fp16 PARTS: every rotated query row and every compressed key is
// scaled by a power of two (its largest element below 2^14: no overflow, and scaling by 2^e
// is exact) and split as x = hi + lo with hi = fp16(x), lo = fp16(x - hi), 22 significant
// bits; q.k = hi.hi + hi.lo + lo.hi (three m16n8k16 f16 products, fp32 accumulate; the
// dropped lo.lo is ~2^-22 of the terms), then multiplied back by the two scales.
//
// A block of kCmpSelWarps = 8 warps owns P = 128 / h whole positions (all h heads of each: the
// selection sums over them) of one (batch, group), one row per (position, head), 16 per warp,
// rows past P h idle. The compressed keys visible to its last position stream through shared
// memory in 64-key tiles (cp.async, double buffered) twice, each tile serving all 8 warps:
//   pass 0  the compression branch's forward: online softmax of the scores (exp2 domain), O +=
//           P V with P rounded to bf16 and V as cmp_kv_parts(DP) bf16 parts (hi + lo up to
//           padded D = 64, the bf16 rounding at 128, as the compression backward); o_cmp and
//           lse written as the other row kernels do;
//   pass 1  p = exp(scale s - lse) per row and key (fp32), summed over the position's heads
//           (P_i: at h = 16 and 8, padded D = 128, by shuffles of the warp's registers, which
//           hold whole positions; else one thread per (pos, i)) and spread onto the selection
//           blocks it overlaps,
//           S[pos][j] += (overlap(i, j) / d) P_i, in a shared array [P][NB] (each (pos, j)
//           owned by one thread per tile: fixed order).
// Eight warps (not four, as the row kernels): at D = 128 the shared memory allows one block
// per SM, and 8 warps give each scheduler two (docs/performance.md, 2026-11-26). The q, key and
// value parts are tiles laid out as wgmma.cuh says; on sm_90a the scores are warpgroup
// products (each of the block's two warpgroups its 64 rows; fp16 q and key parts both read
// from shared memory) and so is O += P V (as in the row kernels); elsewhere mma.sync
// (measured: docs/performance.md, 2026-11-26, second session, change 17). At h = 16 and 8
// (padded D = 128) pass 1 is pipelined there: the next tile's score products run on the tensor
// cores under this tile's CUDA-core work (cmp_select_kernel's PIPE).
// Then one warp per position applies the selection rule of selection.cu (forced 0, b_t - 1,
// b_t; the rest by score descending, index ascending, NaN as -inf) and writes the row: by rank
// where the candidates fit one per lane, else by rounds of a warp-wide argmax.
// Streamed top-n: where the [P][NB] scores would leave room for few positions (long T at
// small h), the scores live in a ring of a few dozen blocks per position instead: a block's
// score is final once the key tiles have passed every compressed block that overlaps it, so
// after each pass-1 tile every position's warp merges its newly final candidates into a list
// of its take best (stream_topn) and frees their slots; the list is the row.
// The launcher falls back to the fp32 kernels (compression row forward + select_kernel) where
// this one does not fit: h > 128, or P NB scores beyond the shared memory left.
namespace tc {

constexpr int kCmpSelWarps = 8;  // warps per block of cmp_select_kernel

__device__ __forceinline__ void mma_f16(float* c, const std::uint32_t* a, std::uint32_t b0,
                                        std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Power-of-two scale of a row whose largest magnitude is mx: mx * scale < 2^14, inv = 1/scale
// (exact). A zero or non-finite row keeps scale 1 (a NaN or inf then reaches the scores, as
// in the fp32 kernels). The exponent stops at 2^114 (rows below 2^-100 are scaled less than
// fully, their scores ~0 either way): 2^(14 - e) overflowed to inf for rows below 2^-114 and
// made their scores NaN, and inv stays a normal number, so that the fused kernel's factor
// scale log2(e) inv is one (a second reader's finding, tenth session).
__device__ __forceinline__ void pow2_scale(float mx, float& scale, float& inv) {
  scale = inv = 1.f;
  if (mx > 0.f && mx <= 3.0e38f) {
    int e = 0;
    frexpf(mx, &e);  // mx = m 2^e, m in [0.5, 1)
    e = max(e, -100);
    scale = ldexpf(1.f, 14 - e);
    inv = ldexpf(1.f, e - 14);
  }
}

// x (already scaled) as fp16 hi + lo, two elements packed per word.
__device__ __forceinline__ void split2_f16(float x0, float x1, std::uint32_t& hi, std::uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const std::uint32_t*>(&h);
  lo = *reinterpret_cast<const std::uint32_t*>(&l);
}

// Compressed keys src [rows][D] fp32 (RoPE applied) -> dst parts [2][rows][DP] fp16 (scaled,
// zeros past D) and inv[rows] (the factor that undoes the scale). One warp per row.
__global__ void pad_f16_parts_kernel(const float* __restrict__ src, __half* __restrict__ dst,
                                     float* __restrict__ inv, std::int64_t rows, int D, int DP) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (row >= rows) return;
  const float* x = src + row * D;
  float mx = 0.f;
  for (int dd = lane; dd < D; dd += 32) mx = fmaxf(mx, fabsf(x[dd]));
  mx = warp_max(mx);
  float sc, iv;
  pow2_scale(mx, sc, iv);
  if (lane == 0) inv[row] = iv;
  for (int dd = lane * 2; dd < DP; dd += 64) {
    const float v0 = dd < D ? x[dd] * sc : 0.f, v1 = dd + 1 < D ? x[dd + 1] * sc : 0.f;
    std::uint32_t hi, lo;
    split2_f16(v0, v1, hi, lo);
    *reinterpret_cast<std::uint32_t*>(dst + row * DP + dd) = hi;
    *reinterpret_cast<std::uint32_t*>(dst + (rows + row) * DP + dd) = lo;
  }
}

struct CmpSelArgs {
  const bf16* q;          // [B, T, H, D], position rows Geo::qp apart
  const float2* rope;     // [T, D/2]
  const __half* kparts;   // [2][B N G][DP] (pad_f16_parts_kernel)
  const float* kinv;      // [B N G]
  const bf16* vparts;     // [2][B N G][DP] bf16 hi + lo (pad_kernel, 2 parts)
  float* o;               // [B, T, H, D] compression branch output (fp32, kept for the backward)
  float* lse;             // [B, T, H]
  std::int32_t* sel;      // [B, T, G, n]
};

struct CmpSelSmem {  // byte offsets of the dynamic shared memory of cmp_select_kernel
  std::size_t q, qinv, k, kinv, v, ps, s, lv, lj, pos, chosen, total;
};

// Streaming top-n (see cmp_select_kernel): the block scores of a 64-key tile touch at most
// ((KT - 1) d + l - 1) / l' + 2 consecutive selection blocks, so a ring of W (a power of two
// at least that) scores per position holds every block whose score is not final yet. Used
// where the ring and the per-position lists (n scores and indices) take less than the full
// [NB] scores, and n <= 24 (a merge of a list and its new candidates fits a warp's lanes
// with at least 8 candidates at a time); 0: the full scores. (cmp_select_layout decides.)
__host__ __device__ inline int cmp_select_ring(const Geo& g) {
  constexpr int KT = 64;
  const int span = ((KT - 1) * g.d + g.l - 1) / g.ls + 2;
  int w = 1;
  while (w < span) w *= 2;
  return g.n <= 24 && w + 2 * g.n + 1 < g.NB ? w : 0;
}
// The q, key and value parts are tiles laid out as wgmma.cuh says (rows of DP, 128-byte
// swizzle at DP = 64, 128; each 1024-byte aligned).
template <int DP>
__host__ __device__ inline CmpSelSmem cmp_select_smem(int P, int NB, int n, int h, int ring) {
  constexpr int KT = 64, ROWS = 16 * kCmpSelWarps, VP = cmp_kv_parts(DP);
  auto up = [](std::size_t x) { return (x + 1023) / 1024 * 1024; };
  CmpSelSmem L;
  L.q = 0;                                             // [2 parts] tiles of ROWS x DP fp16
  L.qinv = L.q + std::size_t(2) * ROWS * DP * 2;       // [ROWS] fp32
  L.k = up(L.qinv + ROWS * 4);                         // [2 stages][2 parts] tiles KT x DP fp16
  L.kinv = L.k + std::size_t(2) * 2 * KT * DP * 2;     // [2 stages][KT] fp32
  L.v = up(L.kinv + 2 * KT * 4);                       // [2 stages][VP parts] tiles KT x DP bf16
  const std::size_t vbytes = std::size_t(2) * VP * KT * DP * 2;
  // pass 1 reuses the value tiles' space for p [ROWS][KT + 1] and the head sums [P][KT], fp32
  // (none at h = 1, where p is its position's sum: 32 KB that let the StreamPos in, and the
  // full [128][128] scores at T = 8192, D = 128)
  const bool head_sums = h != 1;
  const std::size_t psbytes = (std::size_t(ROWS) * (KT + 1) + (head_sums ? std::size_t(P) * KT : 0)) * 4;
  L.ps = L.v;
  L.s = L.v + (vbytes > psbytes ? vbytes : psbytes);   // [P][NB] fp32 block scores, or
  // with a ring: [P][ring] fp32 scores, then per position the list's scores [P][n] fp32, its
  // blocks [P][n] int and its StreamPos [P] (16-byte aligned)
  const int width = ring > 0 ? ring : (NB > 0 ? NB : 1);
  L.lv = L.s + std::size_t(P) * width * 4;
  L.lj = L.lv + (ring > 0 ? std::size_t(P) * n * 4 : 0);
  L.pos = ring > 0 ? (L.lj + std::size_t(P) * n * 4 + 15) / 16 * 16 : L.lj;
  L.total = L.pos + (ring > 0 ? std::size_t(P) * 32 : 0);  // sizeof(StreamPos)
  // [2][kCmpSelWarps][n] int (two positions per warp), used after the key loop: in pass 1's
  // space (at least 16 KB)
  L.chosen = L.ps;
  const std::size_t chosen_bytes = std::size_t(2) * kCmpSelWarps * n * 4;
  if (chosen_bytes > psbytes) L.chosen = L.total, L.total += chosen_bytes;
  return L;
}

// A streamed position's constants and its list's length and last entry (two 16-byte loads):
// computed once per block, as each merge recomputed them with integer divisions (a tenth of the
// kernel at h = 1).
struct alignas(16) StreamPos {
  int cnt;    // entries in its list
  int take;   // the top-n's size where it merges (0 < take < its candidates), else 0
  int c_end;  // its candidates are the blocks [1, c_end) (c_end = b_t - 1)
  int vis;    // compressed blocks it sees
  float wv;   // the list's last entry (where cnt > 0): the score and block a candidate
  int wj;     // must rank before once the list is full
  int pad[2];
};
static_assert(sizeof(StreamPos) == 32, "cmp_select_smem counts 32 bytes per position");
__device__ inline StreamPos stream_pos(const Geo& g, int t) {
  const int bt = t / g.ls;
  int ncand = 0;
  const int take = selection_take(g, bt, ncand);
  return StreamPos{0, take > 0 && take < ncand ? take : 0, bt - 1, visible_blocks(g, t), 0.f, INT_MAX, {0, 0}};
}

// A score's order key: a > b as floats (NaN excluded, -0 as +0) iff key(a) > key(b) as
// unsigned, and every key is above 0 (so 0 can mark "no candidate"): the sign bit flipped for
// non-negative floats, every bit for negative ones.
__device__ __forceinline__ unsigned score_order_key(float v) {
  const unsigned bits = __float_as_uint(v + 0.f);  // (-0 + 0 = +0)
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
// A candidate's order key, 64 bits: the score's order key, then the block (a smaller block a
// larger key); key(a) > key(b) iff a ranks before b (ranks_before); 0: no candidate. The score
// and block come back exactly (a -0 score as +0, which ranks the same).
__device__ __forceinline__ unsigned long long candidate_key(float v, int j) {
  return (static_cast<unsigned long long>(score_order_key(v)) << 32) | (0xffffffffu - static_cast<unsigned>(j));
}
__device__ __forceinline__ float key_score(unsigned long long k) {
  const unsigned u = static_cast<unsigned>(k >> 32);
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
__device__ __forceinline__ int key_block(unsigned long long k) {
  return static_cast<int>(0xffffffffu - static_cast<unsigned>(k));
}
// One compare-exchange step of a warp's bitonic network: the lane keeps the larger of its key
// and the key of the lane x apart where keep_max, else the smaller.
__device__ __forceinline__ unsigned long long compare_exchange(unsigned long long k, int x, bool keep_max) {
  const unsigned long long o = __shfl_xor_sync(0xffffffffu, k, x);
  return keep_max == (o > k) ? o : k;
}

// One warp, one position: merges the survivors m of a chunk of candidates (lane x holds block
// c0 + x with final score v, NaN already -inf; a survivor ranks before a full list's last entry,
// or the list is not full) into its list (lv, lj: the cnt best so far under ranks_before, best
// first, at most take of them). Few survivors (kInsertMax or fewer: the usual case once the list
// is full, as a candidate joins the best take of k seen with probability ~take / k) are inserted
// one by one with the list held in lanes: a survivor's place is the number of entries that rank
// before it (one ballot), the entries from there on move up one lane, and a full list drops its
// last. More (the first tiles, whose candidates all survive) go through a bitonic merge on the
// candidates' 64-bit order keys: the survivors sorted across the lanes (15 compare-exchange
// steps, best first), then the best 32 of them and the list together as max(list[x],
// sorted[31 - x]) (a bitonic sequence: the list descends, the reversed survivors ascend), sorted
// by 5 more steps; its first take are the new list. (Rank rounds before: up to two loops of 32
// shuffles and compares per merge, ~13% of the kernel at 64k, h = 1; insertion alone: 64k h = 1
// forward 223 -> 195 ms, but the short sequences, whose tiles are mostly first tiles, slowed:
// 8192 h = 1 11.6 -> 13.3 ms.) The order is strict (ties go to the smaller block), so the list
// is the top-n of all candidates at once, whatever the order of the merges.
constexpr int kInsertMax = 4;
__device__ inline void merge_survivors(unsigned m, float v, int c0, float* lv, int* lj, int& cnt, int take,
                                       int lane) {
  if (__popc(m) <= kInsertMax) {  // insertion, the list in lanes
    float wv = cnt > 0 ? lv[cnt - 1] : 0.f;  // the list's last entry
    int wj = cnt > 0 ? lj[cnt - 1] : INT_MAX;
    float iv = lane < cnt ? lv[lane] : -INFINITY;
    int ij = lane < cnt ? lj[lane] : INT_MAX;
    while (m) {  // warp-uniform
      const int src = __ffs(m) - 1;
      m &= m - 1u;
      const float cv = __shfl_sync(0xffffffffu, v, src);
      const int cj = c0 + src;
      if (cnt == take && !ranks_before(cv, cj, wv, wj)) continue;  // the list got better
      const int place = __popc(__ballot_sync(0xffffffffu, lane < cnt && ranks_before(iv, ij, cv, cj)));
      const float uv = __shfl_up_sync(0xffffffffu, iv, 1);
      const int uj = __shfl_up_sync(0xffffffffu, ij, 1);
      if (lane > place) {
        iv = uv;
        ij = uj;
      } else if (lane == place) {
        iv = cv;
        ij = cj;
      }
      cnt = min(cnt + 1, take);
      wv = __shfl_sync(0xffffffffu, iv, cnt - 1);
      wj = __shfl_sync(0xffffffffu, ij, cnt - 1);
    }
    __syncwarp();  // every lane has read the list
    if (lane < cnt) {
      lv[lane] = iv;
      lj[lane] = ij;
    }
    __syncwarp();
    return;
  }
  // The bitonic merge: the survivors sorted, best first (for the steps of size 32 every lane's
  // sequence descends).
  unsigned long long b = (m >> lane) & 1u ? candidate_key(v, c0 + lane) : 0ull;
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
    for (int x = size >> 1; x > 0; x >>= 1) b = compare_exchange(b, x, ((lane & x) == 0) == ((lane & size) == 0));
  const unsigned long long a = lane < cnt ? candidate_key(lv[lane], lj[lane]) : 0ull;
  const unsigned long long br = __shfl_sync(0xffffffffu, b, 31 - lane);
  unsigned long long c = a > br ? a : br;  // the best 32 of both, bitonic
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) c = compare_exchange(c, x, (lane & x) == 0);
  const int items = min(take, cnt + __popc(m));
  __syncwarp();  // every lane has read the list
  if (lane < items) {
    lv[lane] = key_score(c);
    lj[lane] = key_block(c);
  }
  cnt = items;
  __syncwarp();
}

// One warp, one position (sp): its chunk's blocks c0 + lane that are final (fin) have their
// scores v taken from the ring (NaN as -inf) and their slots cleared; returns the candidates
// among them that survive (rank before a full list's last entry).
__device__ __forceinline__ unsigned take_final(const StreamPos& sp, float* ring, int mask, int c0, bool fin,
                                               int lane, float& v) {
  const int j = c0 + lane;
  v = -INFINITY;
  if (fin) {
    v = ring[j & mask];
    ring[j & mask] = 0.f;
    if (v != v) v = -INFINITY;
  }
  return __ballot_sync(0xffffffffu, sp.take > 0 && fin && j >= 1 && j < sp.c_end &&
                                        (sp.cnt < sp.take || ranks_before(v, j, sp.wv, sp.wj)));
}
// Merges the survivors m of take_final into the position's list and records its new length
// and last entry (in sp and, by lane 0, in *spp).
__device__ __forceinline__ void merge_final(unsigned m, float v, int c0, StreamPos& sp, StreamPos* spp, float* lv,
                                            int* lj, int lane) {
  merge_survivors(m, v, c0, lv, lj, sp.cnt, sp.take, lane);
  sp.wv = lv[sp.cnt - 1];
  sp.wj = lj[sp.cnt - 1];
  if (lane == 0) *spp = sp;
}
// One warp, one position (its StreamPos *spp): the final blocks [ja, jb) in its ring (slot
// j & mask), 32 at a time.
__device__ inline void stream_topn(int ja, int jb, float* ring, int mask, float* lv, int* lj, StreamPos* spp,
                                   int lane) {
  StreamPos sp = *spp;
  for (int c0 = ja; c0 < jb; c0 += 32) {
    float v;
    const unsigned m = take_final(sp, ring, mask, c0, c0 + lane < jb, lane, v);
    if (m != 0u) merge_final(m, v, c0, sp, spp, lv, lj, lane);
  }
}

// The head sums of one warp's p (an m16n8 accumulator layout: rows gr and gr + 8, keys
// n * 8 + 2 gc + (e & 1), NT = 8 tiles of 8 keys) where its 16 rows are the 16 heads of one
// position (WHOLE: out[key]) or the 8 heads of each of two (rows gr: out[key], rows gr + 8:
// out[KT + key]); room: the positions out has space for from there (those past the block's
// P, rows left idle, are not written). A reduce-scatter over the 8 lanes of each gc: lanes 16,
// 8, 4 apart swap half their tiles and add (own part first), so that lane gr ends with tile
// gr's sums and writes them (7 shuffles per value pair instead of 24). WHOLE adds rows gr and
// gr + 8 first. A fixed order: deterministic.
template <int NT, bool WHOLE>
__device__ __forceinline__ void warp_head_sums(const float (&p)[NT][4], float* out, int room, int lane) {
  static_assert(NT == 8, "one tile of 8 keys per gr");
  constexpr int KT = NT * 8, NE = WHOLE ? 2 : 4;
  float v[NT][NE];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < NE; ++e) v[n][e] = WHOLE ? p[n][e] + p[n][e + 2] : p[n][e];
#pragma unroll
  for (int level = 0; level < 3; ++level) {
    const int x = 16 >> level, half = 4 >> level;  // lanes x apart: gr bits 2, 1, 0
    const bool upper = (lane & x) != 0;           // keeps the upper half of its tiles
#pragma unroll
    for (int t = 0; t < half; ++t)
#pragma unroll
      for (int e = 0; e < NE; ++e) {
        const float send = upper ? v[t][e] : v[t + half][e];
        const float keep = upper ? v[t + half][e] : v[t][e];
        v[t][e] = keep + __shfl_xor_sync(0xffffffffu, send, x);
      }
  }
  const int gr = lane >> 2, gc = lane & 3;
  if (room > 0) *reinterpret_cast<float2*>(out + gr * 8 + gc * 2) = make_float2(v[0][0], v[0][1]);
  if constexpr (!WHOLE)
    if (room > 1) *reinterpret_cast<float2*>(out + KT + gr * 8 + gc * 2) = make_float2(v[0][2], v[0][3]);
}

// The take best candidates j = 1..last of S (ranks_before; NaN as -inf) into chosen[0, take),
// best first, by one warp: the same set (and order) as take rounds of a warp-wide argmax over
// all of them, as a merge of the lanes' streams. Lane l's candidates are 1 + l + 32 i; one scan
// keeps its kTopCache best in order (a sorted list in registers), each round takes the best of
// the lanes' heads, and the winning lane pops its head, rescanning for the best that rank after
// its last taken candidate only when its list ran out. (Rounds of scans over every candidate
// were ~15% of the fused kernel's stall samples at the paper's T = 64k, docs/performance.md,
// eighth session.) K positions at once (S[q], last[q], take[q], chosen[q], q < K), their rounds
// interleaved: a round waits on its two warp reductions (at h = 1, D = 64, T = 8192 the rounds
// were ~34% of the kernel's stall samples, on the reductions and their uses: docs/performance.md,
// 2026-11-29, twenty-fourth session), which a second position's reductions fill. Each
// position's rounds are the one-position rounds, so the same choices.
constexpr int kTopCache = 4;
template <int K>
__device__ __forceinline__ void warp_take_best(const float* const (&S)[K], const int (&last)[K], const int (&take)[K],
                                               int* const (&chosen)[K], int lane) {
  float cv[K][kTopCache];
  int cj[K][kTopCache];
  // Inserts (v, j) into position q's sorted list where it ranks before an entry (the last falls off).
  auto insert = [&](int q, float v, int j) {
#pragma unroll
    for (int e = 0; e < kTopCache; ++e)
      if (ranks_before(v, j, cv[q][e], cj[q][e])) {
        const float tv = cv[q][e];
        const int tj = cj[q][e];
        cv[q][e] = v;
        cj[q][e] = j;
        v = tv;
        j = tj;
      }
  };
  // Fills position q's list with the lane's best candidates that rank after (av, aj) (aj < 0: all).
  auto fill = [&](int q, float av, int aj) {
#pragma unroll
    for (int e = 0; e < kTopCache; ++e) {
      cv[q][e] = -INFINITY;
      cj[q][e] = INT_MAX;
    }
    for (int j = 1 + lane; j <= last[q]; j += 32) {
      float v = S[q][j];
      if (v != v) v = -INFINITY;
      if (aj < 0 || ranks_before(av, aj, v, j)) insert(q, v, j);
    }
  };
  int mine[K], rounds = 0;  // mine: the lane's candidates not yet taken
#pragma unroll
  for (int q = 0; q < K; ++q) {
    fill(q, 0.f, -1);
    mine[q] = lane < last[q] ? (last[q] - lane - 1) / 32 + 1 : 0;
    rounds = max(rounds, take[q]);
  }
  for (int round = 0; round < rounds; ++round) {
    float bv[K];  // (the winning lane's own head: the taken score, for its refill)
    int bj[K];
#if __CUDA_ARCH__ >= 800
    // The best head in two warp reductions (redux.sync) instead of 5 levels of shuffles and
    // compares (warp_best_candidate, ~35% of the fused kernel at h = 1, T = 8192: docs/
    // performance.md, nineteenth session): the largest order key, then the smallest block
    // among the heads that hold it; the same winner as ranks_before. (Past a position's take
    // rounds its reductions still run, uniform across the warp, and their result is unused.)
    unsigned key[K], top[K];
#pragma unroll
    for (int q = 0; q < K; ++q) {
      bv[q] = cv[q][0];
      key[q] = cj[q][0] == INT_MAX ? 0u : score_order_key(cv[q][0]);
    }
#pragma unroll
    for (int q = 0; q < K; ++q) top[q] = __reduce_max_sync(0xffffffffu, key[q]);
#pragma unroll
    for (int q = 0; q < K; ++q)
      bj[q] = int(__reduce_min_sync(0xffffffffu, key[q] == top[q] ? unsigned(cj[q][0]) : 0xffffffffu));
#else
#pragma unroll
    for (int q = 0; q < K; ++q) {
      bv[q] = cv[q][0];
      bj[q] = cj[q][0];
      float wv = bv[q];
      warp_best_candidate(wv, bj[q]);
    }
#endif
#pragma unroll
    for (int q = 0; q < K; ++q) {
      if (round >= take[q]) continue;  // (warp-uniform)
      if (lane == 0) chosen[q][round] = bj[q];
      if (cj[q][0] == bj[q]) {  // this lane's head was taken: pop it
        --mine[q];
#pragma unroll
        for (int e = 0; e + 1 < kTopCache; ++e) {
          cv[q][e] = cv[q][e + 1];
          cj[q][e] = cj[q][e + 1];
        }
        cv[q][kTopCache - 1] = -INFINITY;
        cj[q][kTopCache - 1] = INT_MAX;
        if (cj[q][0] == INT_MAX && mine[q] > 0) fill(q, bv[q], bj[q]);
      }
    }
  }
  __syncwarp();
}

// At D <= 64 two blocks fit an SM (shared memory), which needs <= 128 registers.
// STREAMED: the ring and the per-position lists (ring > 0); else the full [P][NB] scores, with
// none of the streamed top-n's code in the kernel (its runtime checks alone cost the full
// path 4-8% at h = 16: docs/performance.md, 2026-11-26, third session).
// PIPE (padded D = 128, h = 16 or 8: cmp_select_pipelined): pass 1 pipelined on sm_90a, the
// next tile's score products on the tensor cores under this tile's CUDA-core work (the key
// loop's phase 1); the same products and sums in the same order: the same bits as without.
template <int DP, bool STREAMED, bool PIPE = false>
__global__ void __launch_bounds__(kCmpSelWarps * 32, DP <= 64 ? 2 : 1)
    cmp_select_kernel(Geo g, CmpSelArgs a, int P, int ring_arg) {
  const int ring = STREAMED ? ring_arg : 0;
  constexpr int KT = 64, NT = KT / 8, DT = DP / 8, CH = DP / 8;
  constexpr int ROWS = 16 * kCmpSelWarps, VP = cmp_kv_parts(DP);
  // The pipeline needs asynchronous products (wgmma); with mma.sync the kernel is the plain one.
  constexpr bool kPipe = PIPE && NSATRON_WGMMA;
  static_assert(!PIPE || DP == 128, "the pipelined pass 1: padded D = 128 (h = 16 or 8)");
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(1024) float4 smem4[];  // 1024: swizzled wgmma tiles (wgmma.cuh)
  char* sm = reinterpret_cast<char*>(smem4);
  const CmpSelSmem L = cmp_select_smem<DP>(P, g.NB, g.n, g.h, ring);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __half* Qs = reinterpret_cast<__half*>(sm + L.q);      // [2 parts] tiles ROWS x DP
  float* qinv = reinterpret_cast<float*>(sm + L.qinv);   // [ROWS]
  __half* Ks = reinterpret_cast<__half*>(sm + L.k);      // [2 stages][2 parts] tiles KT x DP
  float* kinv = reinterpret_cast<float*>(sm + L.kinv);   // [2][KT]
  bf16* Vs = reinterpret_cast<bf16*>(sm + L.v);          // [2 stages][VP parts] tiles KT x DP
  float* Ps = reinterpret_cast<float*>(sm + L.ps);       // [ROWS][KT + 1] (pass 1)
  float* Pi = Ps + ROWS * (KT + 1);                       // [P][KT] head sums (pass 1)
  float* Sb = reinterpret_cast<float*>(sm + L.s);        // [P][NB], or [P][ring]
  float* Lv = reinterpret_cast<float*>(sm + L.lv);       // ring: [P][n] the lists' scores,
  int* Lj = reinterpret_cast<int*>(sm + L.lj);           // blocks (best first)
  StreamPos* Lp = reinterpret_cast<StreamPos*>(sm + L.pos);  // and StreamPos [P]
  const int l_units = g.l / g.d, ls_units = g.ls / g.d;  // the overlap weights' bounds
  const int sb_stride = ring > 0 ? ring : g.NB;
  const int sb_mask = ring > 0 ? ring - 1 : -1;          // slot of block j: j & sb_mask
  int* chosen = reinterpret_cast<int*>(sm + L.chosen) + warp * g.n;
  const int b = blockIdx.y / g.G, gi = blockIdx.y % g.G;
  const int t_first = blockIdx.x * P;
  const int npos = min(P, g.T - t_first);
  const int t_last = t_first + npos - 1;
  auto row_of = [&](int i, int& t, int& head) -> bool {
    int pi;
    g.hdiv.divmod(i, pi, head);
    t = t_first + pi;
    return i < P * g.h && t < g.T;
  };
  for (int idx = tid; idx < P * sb_stride; idx += blockDim.x) Sb[idx] = 0.f;
  if constexpr (STREAMED)
    for (int idx = tid; idx < npos; idx += blockDim.x) Lp[idx] = stream_pos(g, t_first + idx);

  const int key_end = visible_blocks(g, t_last);
  const int ntiles = (key_end + KT - 1) / KT;
  const int nsteps = 2 * ntiles;
  const std::int64_t rows_kv = std::int64_t(g.B) * g.N * g.G;
  const std::int64_t base = std::int64_t(b) * g.N * g.G + gi;
  // Step k's tile in stage k & 1 (keys, values, kinv), but its kinv in stage (k - (ntiles &
  // ~1)) mod 3 in the pipelined pass 1 (kPipe), whose step k writes tile k + 2's while tile k's
  // is still being read (three stages counted as if from step ntiles & ~1: step ntiles keeps
  // the stage ntiles & 1 that pass 0's last step wrote). The third is Ps's first KT floats:
  // the p rows' space, unused at h = 16 and 8 (Pi lies past the rows), and pass 0's values'.
  auto kinv_tile = [&](int k) -> float* {
    if constexpr (kPipe) {
      if (k >= ntiles) {
        const int st = (k - (ntiles & ~1)) % 3;
        return st < 2 ? kinv + st * KT : reinterpret_cast<float*>(sm + L.ps);
      }
    }
    return kinv + (k & 1) * KT;
  };
  // Step k's tile: k of pass 0 or k - ntiles of pass 1 (a compare, not k % ntiles: an integer
  // division, at every step of both passes, and in the issue too).
  auto tile_of = [&](int k) { return k < ntiles ? k : k - ntiles; };
  auto issue = [&](int k) {  // step k into stage k & 1 (kinv: kinv_tile)
    if (k < nsteps) {
      const int s0 = tile_of(k) * KT;
      const int cnt = min(KT, key_end - s0);
      __half* kd = Ks + (k & 1) * 2 * KT * DP;
      float* kvd = kinv_tile(k);
      bf16* vd = Vs + (k & 1) * VP * KT * DP;
      const bool values = k < ntiles;
      // Chunk ch of keys kk0 + it * kKeysPerIt for this thread (its chunk is the same in every
      // iteration). A whole tile (all but the last) walks its sources by a constant, with no
      // bounds (the row kernels' change 63, docs/performance.md, tenth session).
      constexpr int kKeysPerIt = kCmpSelWarps * 32 / CH;
      static_assert((kCmpSelWarps * 32) % CH == 0 && KT % kKeysPerIt == 0, "whole iterations over the tile's chunks");
      const int kk0 = tid / CH, ch = tid % CH;
      if (cnt == KT) {
        const std::int64_t off0 = (base + std::int64_t(s0 + kk0) * g.G) * DP + ch * 8;
        const std::int64_t step = std::int64_t(kKeysPerIt) * g.G * DP;
        const __half* ksrc = a.kparts + off0;
        const bf16* vsrc = a.vparts + off0;
#pragma unroll
        for (int it = 0; it < KT / kKeysPerIt; ++it, ksrc += step, vsrc += step) {
          const int to = wg::tile_offset<DP, KT>(kk0 + it * kKeysPerIt, ch);
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            cp16(reinterpret_cast<char*>(kd + p * KT * DP) + to, ksrc + p * rows_kv * DP, true);
            if (values && p < VP) cp16(reinterpret_cast<char*>(vd + p * KT * DP) + to, vsrc + p * rows_kv * DP, true);
          }
        }
      } else {
#pragma unroll
        for (int it = 0; it < KT / kKeysPerIt; ++it) {
          const int kk = kk0 + it * kKeysPerIt;
          const bool ok = kk < cnt;
          const std::int64_t off = ok ? (base + std::int64_t(s0 + kk) * g.G) * DP + ch * 8 : 0;
          const int to = wg::tile_offset<DP, KT>(kk, ch);
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const std::int64_t po = ok ? p * rows_kv * DP + off : 0;
            cp16(reinterpret_cast<char*>(kd + p * KT * DP) + to, a.kparts + po, ok);
            if (values && p < VP) cp16(reinterpret_cast<char*>(vd + p * KT * DP) + to, a.vparts + po, ok);
          }
        }
      }
      // (asynchronous too: loaded and stored by the thread, each step's first two warps waited
      // for an L2 latency before their warpgroup's products; docs/performance.md, eighth session)
      for (int kk = tid; kk < KT; kk += kCmpSelWarps * 32)
        cp4(kvd + kk, a.kinv + (kk < cnt ? base + std::int64_t(s0 + kk) * g.G : 0), kk < cnt);
    }
    cp_commit();
  };
  issue(0);  // the first key tile's copies run under the query staging

  // Stage the warp's 16 rotated query rows, scaled, as fp16 hi + lo: the global loads of 8 rows
  // are issued before the first row's reduction (one memory latency per 8 rows, not per row).
  constexpr int kQC = (DP + 63) / 64, kQRows = 8;
  // Element pairs by two-element loads where they are aligned (rope_pair_load): with a two-byte
  // load per element and per partner, and eight bytes per table entry, this prologue was ~23%
  // of the kernel at the paper's T = 8192 (docs/performance.md, 2026-11-27, fifth session).
  const bool pairs = g.half % 2 == 0 && g.qp % 2 == 0 && (reinterpret_cast<std::uintptr_t>(a.q) & 3u) == 0;
  for (int r0 = 0; r0 < 16; r0 += kQRows) {
    float v[kQRows][kQC][2];
    if (pairs) {
      // Every load of the 8 rows first, unconditionally (an invalid row or element reads row
      // 0's first pair and is zeroed after), then the rotations: with a load and its use in
      // one branch per row and element, each row waited for its own loads (~12% of the
      // kernel's stall samples at the paper's 8192; docs/performance.md, eighth session).
      RopePairLoad ld[kQRows][kQC];
      bool valid[kQRows][kQC];
#pragma unroll
      for (int r = 0; r < kQRows; ++r) {
        int t, hd;
        const bool ok = row_of(warp * 16 + r0 + r, t, hd);
        // (the query row's offset: position rows Geo::qp apart)
        const std::int64_t qo = (std::int64_t(b) * g.T + (ok ? t : 0)) * g.qp + (gi * g.h + hd) * g.D;
#pragma unroll
        for (int c = 0; c < kQC; ++c) {
          const int dd = c * 64 + lane * 2;
          valid[r][c] = ok && dd + 1 < g.D;
          const bool use = valid[r][c];  // (addresses selected, one load path)
          ld[r][c] = rope_pair_load(a.q + (use ? qo : 0), use ? dd : 0, g.half,
                                    a.rope + (use ? std::int64_t(t) * g.half : 0));
        }
      }
#pragma unroll
      for (int r = 0; r < kQRows; ++r)
#pragma unroll
        for (int c = 0; c < kQC; ++c) {
          rope_pair_apply(ld[r][c], c * 64 + lane * 2 < g.half, v[r][c][0], v[r][c][1]);
          if (!valid[r][c]) v[r][c][0] = v[r][c][1] = 0.f;
        }
    } else {
#pragma unroll
      for (int r = 0; r < kQRows; ++r) {
        int t, hd;
        const bool ok = row_of(warp * 16 + r0 + r, t, hd);
        const std::int64_t qo = (std::int64_t(b) * g.T + (ok ? t : 0)) * g.qp + (gi * g.h + hd) * g.D;
        const float2* cs = a.rope + std::int64_t(ok ? t : 0) * g.half;
#pragma unroll
        for (int c = 0; c < kQC; ++c) {
          const int dd = c * 64 + lane * 2;
          v[r][c][0] = ok && dd < g.D ? rope_elem(a.q + qo, dd, g.half, cs) : 0.f;
          v[r][c][1] = ok && dd + 1 < g.D ? rope_elem(a.q + qo, dd + 1, g.half, cs) : 0.f;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kQRows; ++r) {
      const int i = warp * 16 + r0 + r;
      float mx = 0.f;
#pragma unroll
      for (int c = 0; c < kQC; ++c) mx = fmaxf(mx, fmaxf(fabsf(v[r][c][0]), fabsf(v[r][c][1])));
      mx = warp_max(mx);
      float sc, iv;
      pow2_scale(mx, sc, iv);
      if (lane == 0) qinv[i] = iv;
#pragma unroll
      for (int c = 0; c < kQC; ++c) {
        const int dd = c * 64 + lane * 2;
        if (dd < DP) {
          std::uint32_t hi, lo;
          split2_f16(v[r][c][0] * sc, v[r][c][1] * sc, hi, lo);
          const int to = wg::tile_offset<DP, ROWS>(i, dd / 8) + (dd % 8) * 2;
          *reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(Qs) + to) = hi;
          *reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(Qs + ROWS * DP) + to) = lo;
        }
      }
    }
  }
#if NSATRON_WGMMA
  wg::fence_proxy_async();  // the q tiles are read by the tensor cores' async proxy
#endif
  __syncthreads();
  // This thread's two rows: r = lane/4 and lane/4 + 8 of the warp.
  const int gr = lane >> 2, gc = lane & 3;
  int rt[2];
  bool rv[2];
  float rinv[2];
  std::int64_t rowg[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    int t, hd;
    const int i = warp * 16 + gr + 8 * h2;
    rv[h2] = row_of(i, t, hd);
    rt[h2] = rv[h2] ? t : t_first;
    rowg[h2] = (std::int64_t(b) * g.T + rt[h2]) * g.H + gi * g.h + (rv[h2] ? hd : 0);
    rinv[h2] = qinv[i];
  }
  int rvis[2];  // the compressed blocks each row sees (an integer division: once, not per step)
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) rvis[h2] = rv[h2] ? visible_blocks(g, rt[h2]) : 0;
  const float sl2 = g.scale * kLog2e;
  // Per row: the softmax's factor with the row's inverse scale folded in, so that a score
  // takes one product with its key's (s kv, then s kv sl2r in the exponent's fma). Both
  // scales are powers of two, so the exponent is the one rounding of s rinv kv sl2 that
  // scaling s by rinv kv first gave.
  float sl2r[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) sl2r[h2] = sl2 * rinv[h2];
  float m2[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f}, lrow2[2] = {0.f, 0.f};
  float acc[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  // The compression branch's output and lse (acc, ls and m2 are final once pass 0 ends).
  auto store_cmp_output = [&]() {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      if (!rv[h2]) continue;
      store_row_output<DT>(acc, h2, ls[h2], m2[h2], a.o + rowg[h2] * g.D, a.lse + rowg[h2], g.D, gc);
    }
  };

  // The pipelined pass 1 (kPipe: padded D = 128, h = 16 or 8, sm_90a): the tensor cores
  // compute tile k + 1's scores while the CUDA cores run tile k's p, head sums, barrier and
  // block scores. Pass-1 step k, after its barrier, copies tile k's scores (s_next, waited for
  // at the end of step k - 1) into s, issues tile k + 1's products into s_next, runs the
  // unpipelined step's work on s (the same products in the same order, the same scaling, p,
  // head sums and block scores: the same bits) and waits for them at its end (the last step
  // issues none). What keeps ptxas from serialising every product of the kernel:
  //  - no ordinary instruction touches s_next while its products are in flight: the copy is
  //    taken before the issue, the scores are scaled in the copy, and a tile's first product
  //    overwrites s_next (scale-d 0: wg::mma_f16_overwrite), so no instructions zero it (C7515);
  //  - no product is in flight across the loop's back edge: left running into the next step
  //    (waited for after its barrier), the loop-carried value went through register copies
  //    that ptxas saw read it (C7514);
  //  - pass 1 has a loop of its own (phase 1): in one loop with pass 0, acc's 64 registers
  //    stay live through pass 1, and ptxas ran out of registers for the pipeline in the
  //    streamed layout (C7511).
  // Stages: tile k's products are done before step k's barrier, after which tile k + 2's keys
  // go into its stage (two key stages, as without); its kinv is read in step k, so pass 1 has
  // three kinv stages (kinv_tile).
#if NSATRON_WGMMA
  float s_next[NT][4];  // kPipe: the next tile's scores (unused otherwise)
  // Tile k's scores into s_next, issued and committed, not waited for: the key parts against
  // the warpgroup's 64 q rows, smallest products first (as the unpipelined step's).
  auto issue_scores = [&](int k) {
    const char* qh_t = reinterpret_cast<const char*>(Qs) + wg::row_group_offset<DP>(64 * (warp / 4));
    const char* ql_t = reinterpret_cast<const char*>(Qs + ROWS * DP) + wg::row_group_offset<DP>(64 * (warp / 4));
    const char* kh_t = reinterpret_cast<const char*>(Ks + (k & 1) * 2 * KT * DP);
    const char* kl_t = kh_t + KT * DP * 2;
    wg::fence();  // s_next was last read by ordinary instructions (the copy into s)
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      const std::uint64_t qh = wg::kmajor_desc<DP, ROWS>(qh_t, kk), ql = wg::kmajor_desc<DP, ROWS>(ql_t, kk);
      const std::uint64_t kh = wg::kmajor_desc<DP, KT>(kh_t, kk), kl = wg::kmajor_desc<DP, KT>(kl_t, kk);
      if (kk == 0)
        wg::mma_f16_overwrite<0>(s_next, ql, kh);  // the tile's first product: s_next = q_lo k_hi
      else
        wg::mma_f16<0>(s_next, ql, kh);
      wg::mma_f16<0>(s_next, qh, kl);
      wg::mma_f16<0>(s_next, qh, kh);
    }
    wg::commit();
  };
#endif

  // End of pass 0: the rows' full sums and lse (exp2 domain).
  auto finish_pass0 = [&]() {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      ls[h2] += __shfl_xor_sync(0xffffffffu, ls[h2], 1);
      ls[h2] += __shfl_xor_sync(0xffffffffu, ls[h2], 2);
      lrow2[h2] = ls[h2] > 0.f ? m2[h2] + log2f(ls[h2]) : 0.f;
    }
  };

  // The key loop, step k on tile tile_of(k): one loop for both passes; or, pipelined (kPipe),
  // one for pass 0 (phase 0) and one for pass 1 (phase 1), so that each knows its pass (pass 0's
  // code and acc, whose 64 registers the pipeline needs, drop out of pass 1's loop), and the
  // pipeline's start between them.
#pragma unroll
  for (int phase = 0; phase < (kPipe ? 2 : 1); ++phase) {
#if NSATRON_WGMMA
    if (kPipe && phase == 1) {  // the pipeline's start: tile ntiles' scores into s_next
      if (ntiles > 0) {
        finish_pass0();
        cp_wait0();  // tile ntiles' copies (issued by pass 0's last step)
        wg::fence_proxy_async();
        __syncthreads();  // they are in for all, and every warp has finished pass 0
        issue(ntiles + 1);  // into the stage pass 0's last step read (waited for at step ntiles)
        issue_scores(ntiles);
      }
      store_cmp_output();  // here, not after the loop: acc is dead in pass 1 (under the products)
      wg::wait(s_next);
    }
#endif
    for (int k = kPipe && phase == 1 ? ntiles : 0; k < (kPipe && phase == 0 ? ntiles : nsteps); ++k) {
      const bool pass1 = kPipe ? phase == 1 : k >= ntiles;
      if (!kPipe && k == ntiles) finish_pass0();
      const int s0 = tile_of(k) * KT;
      // Keys [0, nvis[h2]) of this tile are visible to this thread's rows.
      int nvis[2];
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
        nvis[h2] = max(0, min(KT, rvis[h2] - s0));
      const bool warp_any = __any_sync(0xffffffffu, nvis[0] > 0 || nvis[1] > 0);
      cp_wait0();  // this thread's copies of tile k (pipelined: of tile k + 1; the only group in flight)
      // The step's one block barrier: tile k's copies (pipelined: tile k + 1's) are visible to
      // all, and every warp has finished step k - 1 (its tiles, Ps, Pi and block scores;
      // pipelined: its wait for tile k's products), so the next tile goes into the stage step
      // k - 1 read (pipelined: tile k + 2 into tile k's), under this step's work.
#if NSATRON_WGMMA
      wg::fence_proxy_async();  // the cp.async tiles are read by the tensor cores' async proxy
      const bool any = __syncthreads_or(warp_any);  // the products are block-wide
#else
      __syncthreads();
      const bool any = warp_any;
#endif
      issue(kPipe && pass1 ? k + 2 : k + 1);
      const __half* Kt = Ks + (k & 1) * 2 * KT * DP;
      // This thread's keys' inverse scales, read before the products are issued (read after
      // their wait, each step waited for these shared loads: ~8% of the stall samples at 64k).
      const float* kiv = kinv_tile(k);
      float kv[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) kv[n][c] = kiv[n * 8 + gc * 2 + c];
      float s[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
      if (kPipe && pass1) {  // (no tile is skipped: the block's last position sees them all)
#if NSATRON_WGMMA
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = s_next[n][e];  // tile k's scores, done
        if (k + 1 < nsteps) issue_scores(k + 1);  // under the work below, waited for at its end
#endif
      } else if (any) {
#if NSATRON_WGMMA
        // One warpgroup product per 16 dims and part pair, the warpgroup's 64 rows of the q
        // tiles as A and the key parts as B, both from shared memory (smallest products first).
        const char* qh_t = reinterpret_cast<const char*>(Qs) + wg::row_group_offset<DP>(64 * (warp / 4));
        const char* ql_t = reinterpret_cast<const char*>(Qs + ROWS * DP) + wg::row_group_offset<DP>(64 * (warp / 4));
        const char* kh_t = reinterpret_cast<const char*>(Kt);
        const char* kl_t = reinterpret_cast<const char*>(Kt + KT * DP);
        wg::pin(s);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk) {
          wg::mma_f16<0>(s, wg::kmajor_desc<DP, ROWS>(ql_t, kk), wg::kmajor_desc<DP, KT>(kh_t, kk));
          wg::mma_f16<0>(s, wg::kmajor_desc<DP, ROWS>(qh_t, kk), wg::kmajor_desc<DP, KT>(kl_t, kk));
          wg::mma_f16<0>(s, wg::kmajor_desc<DP, ROWS>(qh_t, kk), wg::kmajor_desc<DP, KT>(kh_t, kk));
        }
        wg::commit();
        wg::wait(s);
#else
#pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk) {
          std::uint32_t qh[4], ql[4];
          tile_frag_a<DP, ROWS>(qh, reinterpret_cast<const bf16*>(Qs), warp * 16, kk * 16, lane);
          tile_frag_a<DP, ROWS>(ql, reinterpret_cast<const bf16*>(Qs + ROWS * DP), warp * 16, kk * 16, lane);
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            std::uint32_t kh[4], kl[4];
            tile_frag_bt<DP, KT>(kh, reinterpret_cast<const bf16*>(Kt), np * 16, kk * 16, lane);
            tile_frag_bt<DP, KT>(kl, reinterpret_cast<const bf16*>(Kt + KT * DP), np * 16, kk * 16, lane);
            // smallest products first
            mma_f16(s[2 * np], ql, kh[0], kh[1]);
            mma_f16(s[2 * np + 1], ql, kh[2], kh[3]);
            mma_f16(s[2 * np], qh, kl[0], kl[1]);
            mma_f16(s[2 * np + 1], qh, kl[2], kl[3]);
            mma_f16(s[2 * np], qh, kh[0], kh[1]);
            mma_f16(s[2 * np + 1], qh, kh[2], kh[3]);
          }
        }
#endif
      }
      bool ok[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kk = n * 8 + gc * 2 + (e & 1), h2 = e >> 1;
          ok[n][e] = kk < nvis[h2];
          s[n][e] *= kv[n][e & 1];  // undo the key's scale (the row's is in sl2r)
        }
      if (!pass1) {
        if (any) {
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = ok[n][e] ? s[n][e] : -INFINITY;
          online_softmax_tile<NT, DT>(s, sl2r, m2, ls, acc);
          acc_add_product<NT, DT, DP, KT, VP, true>(acc, s, Vs + (k & 1) * VP * KT * DP, lane);
        }
      } else {
        // p per row and key (zeros where not visible), then P_i per (position, key), the sum
        // over the position's heads, then the block scores. At h = 16 (8) a warp's 16 rows are
        // the heads of one position (two: rows gr and gr + 8), so P_i are sums of the warp's
        // registers (warp_head_sums; padded D = 128); otherwise p goes through Ps and a thread per
        // (position, key) sums its heads, ascending (at h = 1: the row's p itself, read from
        // Ps).
        const int cnt = min(KT, key_end - s0);
        const bool p_is_row = g.h == 1;
        if (DP > 64 && (g.h == 16 || g.h == 8)) {  // (at padded D <= 64 its registers spilled)
          float p[NT][4];
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) p[n][e] = ok[n][e] ? ex2(fmaf(s[n][e], sl2r[e >> 1], -lrow2[e >> 1])) : 0.f;
          if (g.h == 16)
            warp_head_sums<NT, true>(p, Pi + warp * KT, P - warp, lane);
          else
            warp_head_sums<NT, false>(p, Pi + 2 * warp * KT, P - 2 * warp, lane);
          __syncthreads();
        } else {
          float* pw = Ps + (warp * 16) * (KT + 1);
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int kk = n * 8 + gc * 2 + (e & 1), h2 = e >> 1;
              pw[(gr + 8 * h2) * (KT + 1) + kk] = ok[n][e] ? ex2(fmaf(s[n][e], sl2r[h2], -lrow2[h2])) : 0.f;
            }
          __syncthreads();
          if (!p_is_row) {
            for (int idx = tid; idx < npos * KT; idx += kCmpSelWarps * 32) {
              const int pl = idx / KT, kk = idx % KT;
              float pi = 0.f;
              for (int hd = 0; hd < g.h; ++hd) pi += Ps[(pl * g.h + hd) * (KT + 1) + kk];
              Pi[idx] = pi;
            }
            __syncthreads();
          }
        }
        const float* Pr = p_is_row ? Ps : Pi;
        const int prs = p_is_row ? KT + 1 : KT;
        const int j_lo = (s0 * g.d) / g.ls;
        const int j_hi = min(g.NB - 1, ((s0 + cnt - 1) * g.d + g.l - 1) / g.ls);
        const int nj = j_hi - j_lo + 1;
        // The block scores S[pos][j] += sum_i w(i, j) P_i over the tile's compressed blocks i
        // overlapping j that the position sees, i ascending: one thread per (position, block);
        // or, in the streamed instantiation (blocks of many positions), where the tile's blocks
        // fit the lanes and overlap at most kMaxOverlap compressed blocks each, lane jj of every
        // warp takes block j_lo + jj (its range and weights computed once per tile, where each
        // thread recomputed them with four integer divisions) and the warps take the positions
        // in turn. The same products summed in the same order either way. By lane in the full
        // instantiation too where a block holds kByLaneMinP or more positions (h <= 4 at D =
        // 128; 2-5% slower at the paper shapes' 8 positions per block: docs/performance.md,
        // change 26). Streamed, the blocks no later tile touches are final:
        // [j_lo, the next tile's j_lo) (the last tile: through j_hi); their ring slots are cleared
        // and each position's candidates among them merged into its list (stream_topn) after
        // the sums (by lane: by the warp that summed the position, with no block barrier).
        constexpr int kMaxOverlap = 8, kByLaneMinP = 32;
        const int jl = j_lo + lane;
        int i0 = 0, ic = 0;
        bool by_lane = false;
        if (STREAMED || P >= kByLaneMinP) {
          if (lane < nj) {
            int a, b;
            overlapping_cmp_blocks_units(jl, l_units, ls_units, a, b);
            i0 = max(a, s0);
            ic = min(b, s0 + cnt - 1) - i0 + 1;
          }
          by_lane = nj <= 32 && __all_sync(0xffffffffu, ic <= kMaxOverlap);
        }
        const int j_end = k == nsteps - 1 ? j_hi + 1 : min(g.NB, ((s0 + KT) * g.d) / g.ls);
        if (by_lane) {
          float w[kMaxOverlap];
#pragma unroll
          for (int m = 0; m < kMaxOverlap; ++m) w[m] = m < ic ? overlap_weight_units(i0 + m, jl, l_units, ls_units) : 0.f;
          if (lane < nj)
            for (int pl = warp; pl < npos; pl += kCmpSelWarps) {
              const int vis = STREAMED ? Lp[pl].vis : visible_blocks(g, t_first + pl);
              const int ie = min(ic, vis - i0);
              const float* pr = Pr + pl * prs + (i0 - s0);
              float sum = 0.f;
#pragma unroll
              for (int m = 0; m < kMaxOverlap; ++m)
                if (m < ie) sum += w[m] * pr[m];
              Sb[pl * sb_stride + (jl & sb_mask)] += sum;
            }
        } else {
          for (int idx = tid; idx < npos * nj; idx += kCmpSelWarps * 32) {
            const int pl = idx / nj, j = j_lo + (idx - pl * nj);
            int i_lo, i_hi;  // the compressed blocks overlapping j that the position sees
            overlapping_cmp_blocks_units(j, l_units, ls_units, i_lo, i_hi);
            i_lo = max(i_lo, s0);
            i_hi = min(i_hi, min(s0 + cnt, visible_blocks(g, t_first + pl)) - 1);
            float sum = 0.f;
            for (int i = i_lo; i <= i_hi; ++i) sum += overlap_weight_units(i, j, l_units, ls_units) * Pr[pl * prs + (i - s0)];
            Sb[pl * sb_stride + (j & sb_mask)] += sum;
          }
        }
        if (STREAMED && by_lane) {  // each position's merges by the warp that summed it; the
          __syncwarp();              // final blocks fit the lanes: two positions' survivors are
          const bool fin = jl < j_end;  // found before either merges (their loads overlap)
          for (int pl = warp; pl < npos; pl += 2 * kCmpSelWarps) {
            const int pl2 = pl + kCmpSelWarps;
            StreamPos sp0 = Lp[pl], sp1 = pl2 < npos ? Lp[pl2] : StreamPos{};
            float v0, v1;
            const unsigned m0 = take_final(sp0, Sb + pl * ring, ring - 1, j_lo, fin, lane, v0);
            const unsigned m1 = take_final(sp1, Sb + (pl2 < npos ? pl2 : pl) * ring, ring - 1, j_lo,
                                           fin && pl2 < npos, lane, v1);
            if (m0 != 0u) merge_final(m0, v0, j_lo, sp0, Lp + pl, Lv + pl * g.n, Lj + pl * g.n, lane);
            if (m1 != 0u) merge_final(m1, v1, j_lo, sp1, Lp + pl2, Lv + pl2 * g.n, Lj + pl2 * g.n, lane);
          }
        } else if (STREAMED) {  // after every thread's sums
          __syncthreads();
          for (int pl = warp; pl < npos; pl += kCmpSelWarps)
            stream_topn(j_lo, j_end, Sb + pl * ring, ring - 1, Lv + pl * g.n, Lj + pl * g.n, Lp + pl, lane);
        }
      }
#if NSATRON_WGMMA
      if (kPipe && pass1) wg::wait(s_next);  // tile k + 1's products (none after the last tile)
#endif
    }
  }
  __syncthreads();  // every warp's block scores and lists are in; Ps's space becomes chosen

  // Compression branch output and lse (the pipelined pass 1 stored them at its start).
  if (!kPipe) store_cmp_output();

  // The selection rule, one warp per position. A position that has a real choice among more
  // than 32 candidates takes the merge of the lanes' streams (warp_take_best); a warp takes two
  // of its positions at a time, and where both take the merge, their rounds run together.
  // rule_direct: the rule for position pl where it needs no merge (written out here; false
  // otherwise, with the position's take and block bt).
  auto rule_direct = [&](int pl, int& take, int& bt) -> bool {
    const int t = t_first + pl;
    std::int32_t* out = a.sel + ((std::int64_t(b) * g.T + t) * g.G + gi) * g.n;
    bt = t / g.ls;
    int ncand = 0;
    take = selection_take(g, bt, ncand);
    if (take == ncand) {  // every eligible block is chosen: 0..bt
      for (int e = lane; e < g.n; e += 32) out[e] = e <= bt ? e : -1;
      return true;
    }
    if constexpr (STREAMED) {  // the streamed list holds the take best (all candidates merged)
      warp_write_selection_row(out, lane < take ? Lj[pl * g.n + lane] : INT_MAX, take, bt, g.n, lane);
      return true;
    }
    const float* S = Sb + pl * g.NB;
    if (ncand <= 32) {  // one candidate per lane (j = 1 + lane): the take best by rank, the
      // set that take rounds of the argmax below would choose (a strict total order)
      const bool valid = lane < ncand;
      float v = valid ? S[1 + lane] : -INFINITY;
      if (v != v) v = -INFINITY;
      int rank = 0;
      for (int o = 0; o < ncand; ++o) {
        const float ov = __shfl_sync(0xffffffffu, v, o);
        rank += ranks_before(ov, 1 + o, v, 1 + lane) ? 1 : 0;
      }
      const unsigned best = __ballot_sync(0xffffffffu, valid && rank < take);
      warp_write_selection_row_at(out, (best >> lane) & 1u, 1 + lane, __popc(best & ((1u << lane) - 1u)), take, bt,
                                  g.n, lane);
      return true;
    }
    return false;
  };
  // The merge's chosen blocks of position pl (in ch) to its selection row.
  auto write_chosen = [&](int pl, int* ch, int take, int bt) {
    std::int32_t* out = a.sel + ((std::int64_t(b) * g.T + t_first + pl) * g.G + gi) * g.n;
    if (take <= 32) {  // chosen[] by lanes, each placed by rank (lane 0 sorted them: 2.5% of
      // the kernel at T = 8192, h = 16)
      warp_write_selection_row(out, lane < take ? ch[lane] : INT_MAX, take, bt, g.n, lane);
    } else if (lane == 0) {
      write_selection_row(out, ch, take, bt, g.n);
    }
    __syncwarp();
  };
  int* chosen1 = chosen + kCmpSelWarps * g.n;  // the second position's
  for (int pl = warp; pl < npos; pl += 2 * kCmpSelWarps) {
    const int pl1 = pl + kCmpSelWarps;
    int take0 = 0, bt0 = 0, take1 = 0, bt1 = 0;
    [[maybe_unused]] const bool merge0 = !rule_direct(pl, take0, bt0);
    [[maybe_unused]] const bool merge1 = pl1 < npos && !rule_direct(pl1, take1, bt1);
    if constexpr (!STREAMED) {
      if (merge0 && merge1) {
        warp_take_best<2>({Sb + pl * g.NB, Sb + pl1 * g.NB}, {bt0 - 2, bt1 - 2}, {take0, take1}, {chosen, chosen1},
                          lane);
      } else if (merge0 || merge1) {
        const int p1 = merge0 ? pl : pl1;
        warp_take_best<1>({Sb + p1 * g.NB}, {merge0 ? bt0 - 2 : bt1 - 2}, {merge0 ? take0 : take1},
                          {merge0 ? chosen : chosen1}, lane);
      }
      if (merge0) write_chosen(pl, chosen, take0, bt0);
      if (merge1) write_chosen(pl1, chosen1, take1, bt1);
    }
  }
}

// The fused kernel's layout for this shape: positions per block P (128 / h, halved until
// the block scores fit the device's opt-in shared memory) and the ring (0: the full [P][NB]
// scores). The ring (streamed top-n) is taken only where it lets a block hold more positions
// than the full scores do: at h = 1, T = 64k, l' = 64, D = 128, 128 positions instead of 16
// (the warps past P h rows idle otherwise); where the full scores already fit 128 / h
// positions, the ring's per-tile merges would only cost (measured: docs/performance.md,
// 2026-11-26, third session). P = 0 where the kernel cannot run (h > 128, or not even one
// position fits). The results do not depend on P or the ring: every row's softmax and every
// position's block scores are summed over the key tiles in the same order whatever the block
// holds, and the streamed top-n keeps the same blocks as the full one.
struct CmpSelLayout {
  int P = 0, ring = 0;
};
template <int DP>
CmpSelLayout cmp_select_layout(const Geo& g, int optin) {
  if (g.h > 16 * kCmpSelWarps) return {};
  auto positions = [&](int ring) {
    for (int P = (16 * kCmpSelWarps) / g.h; P >= 1; P /= 2)
      if (cmp_select_smem<DP>(P, g.NB, g.n, g.h, ring).total <= std::size_t(optin)) return P;
    return 0;
  };
  const int full = positions(0), ring = cmp_select_ring(g);
  const int streamed = ring > 0 ? positions(ring) : 0;
  return streamed > full ? CmpSelLayout{streamed, ring} : CmpSelLayout{full, 0};
}
// Its shared memory, or 0 where it cannot run.
template <int DP>
std::size_t cmp_select_bytes(const Geo& g, int optin) {
  const CmpSelLayout L = cmp_select_layout<DP>(g, optin);
  return L.P > 0 ? cmp_select_smem<DP>(L.P, g.NB, g.n, g.h, L.ring).total : 0;
}

// Whether the kernel runs its pipelined pass 1 (PIPE): at padded D = 128 where a warp's 16 rows
// are whole positions' heads (h = 16 or 8: the head sums are shuffles, so the p rows' space
// holds pass 1's third kinv stage), the registers the pipeline needs being there. The layout
// (P, ring, shared memory) is the same either way.
template <int DP>
bool cmp_select_pipelined(const Geo& g) {
  return DP == 128 && (g.h == 16 || g.h == 8) && cmp_select_pipeline();
}

template <int DP>
void cmp_select_launch(const Geo& g, const CmpSelArgs& a, CmpSelLayout lay, std::size_t smem, cudaStream_t s) {
  const int P = lay.P;
  const unsigned nblocks = unsigned((g.T + P - 1) / P);
  if (nblocks == 0) return;
  const dim3 grid(nblocks, unsigned(g.B * g.G));
  auto launch = [&](auto kernel, int ring) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<grid, kCmpSelWarps * 32, smem, s>>>(g, a, P, ring);
  };
  if constexpr (DP == 128) {
    if (cmp_select_pipelined<DP>(g)) {
      if (lay.ring > 0) launch(cmp_select_kernel<DP, true, true>, lay.ring);
      else launch(cmp_select_kernel<DP, false, true>, 0);
      check_launch("tc::cmp_select_kernel");
      return;
    }
  }
  if (lay.ring > 0) launch(cmp_select_kernel<DP, true>, lay.ring);
  else launch(cmp_select_kernel<DP, false>, 0);
  check_launch("tc::cmp_select_kernel");
}

}  // namespace tc
