// The L2's rate for fp32 tile adds: the measurement that decides whether the own dense kernel's
// backward can add dq in its key side (five products per tile instead of seven) without losing
// the products it saves to the adds' traffic (docs/performance.md, 2026-11-29, "The dense
// kernel at 64k"; that form was built, measured slower than the row side's dq with and without
// clusters, and removed in the twenty-third session: git history, 6d286c7..d9127e3). There,
// each key block adds a dq tile of 64 rows x 128 fp32 (32 KB) per batch of rows it sees, 1.1 TB
// at the paper's 64k with 64-key blocks, in a fixed order per row batch (key block j after
// j - 1: deterministic sums, no float atomics in a free order).
//
//   bench_l2_add_gpu [--blocks-per-sm 2] [--threads 128] [--iters 2000] [--tile-kb 32]
//                    [--tiles N (default: one per block)] [--spread S (default 1)]
//
// nb = SMs x blocks-per-sm blocks of `threads` threads (2 x 128: the key kernel's occupancy at
// D = 128); tiles is a multiple of nb (default nb: nb x 32 KB = 8.4 MB on an H100/H200, the dq
// rows the key side's resident blocks add to at a time); block b at iteration i works on tile
// (S b + i) mod tiles, so at each iteration every block has its own tile, and with tiles = nb
// (S = 1) tile t's i-th visitor is block (t - i) mod nb: each block follows the one after it by
// one iteration, the order a key block follows the previous key block over the same row
// batches. Variants, each over the same tiles (ms, GB moved, TB/s of tile bytes):
//   read         ld.global.cg of every float4 (the rate at which the row kernels stream K, V)
//   write        st.global.cg
//   red.v4       red.global.add.v4.f32 (sm_90; scalar red elsewhere): unordered adds, done in
//                the L2 (what a non-deterministic dq accumulation would cost)
//   red          red.global.add.f32, four per float4
//   rmw          ld.cg, add, st.cg (no atomicity: the ordered variants' inner step)
//   ordered.rmw  rmw after waiting for the tile's turn counter to reach i (set by the tile's
//                previous visitor after its adds, release / acquire at gpu scope): the
//                deterministic order, with its waits (tiles = nb, S = 1 only)
//   ordered.red  the same with red.v4 adds
// Every block must be resident at once for the ordered variants (their waits form a chain
// around the grid); the program checks the occupancy and says so where they cannot run.
// Prints a markdown table, and what the 64k dense case's 1.1 TB would take at each rate.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

enum Variant { kRead, kWrite, kRedV4, kRed, kRmw, kOrderedRmw, kOrderedRed, kVariants };
const char* const kNames[kVariants] = {"read", "write", "red.v4", "red", "rmw", "ordered.rmw", "ordered.red"};

__device__ __forceinline__ void red_scalar(float4* p, float4 v) {
  float* q = reinterpret_cast<float*>(p);
  atomicAdd(q, v.x);  // (the result unused: compiled as a reduction)
  atomicAdd(q + 1, v.y);
  atomicAdd(q + 2, v.z);
  atomicAdd(q + 3, v.w);
}
// *p += v as one reduction performed in the L2 (no value returned); four floats in one
// instruction on sm_90.
__device__ __forceinline__ void red_v4(float4* p, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#else
  red_scalar(p, v);
#endif
}
// A turn counter's value, ordered before this thread's later memory operations (gpu scope).
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Sets a turn counter after this thread's earlier memory operations (gpu scope).
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <int V>
__global__ void tile_kernel(float4* __restrict__ buf, int* __restrict__ turns, float4* __restrict__ sink, int tiles,
                            int tile_f4, int iters, int spread) {
  const int b = blockIdx.x, tid = threadIdx.x;
  const float4 add = make_float4(1.f, 2.f, 3.f, 4.f);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i = 0; i < iters; ++i) {
    const int t = int((std::int64_t(spread) * b + i) % tiles);
    float4* tile = buf + std::int64_t(t) * tile_f4;
    if constexpr (V == kOrderedRmw || V == kOrderedRed) {
      if (tid == 0)
        while (load_acquire(turns + t) != i) {
        }
      __syncthreads();
    }
    for (int k = tid; k < tile_f4; k += blockDim.x) {
      if constexpr (V == kRead) {
        const float4 x = __ldcg(tile + k);
        acc.x += x.x;
        acc.y += x.y;
        acc.z += x.z;
        acc.w += x.w;
      } else if constexpr (V == kWrite) {
        __stcg(tile + k, add);
      } else if constexpr (V == kRedV4 || V == kOrderedRed) {
        red_v4(tile + k, add);
      } else if constexpr (V == kRed) {
        red_scalar(tile + k, add);
      } else {  // rmw, ordered.rmw
        float4 x = __ldcg(tile + k);
        x.x += add.x;
        x.y += add.y;
        x.z += add.z;
        x.w += add.w;
        __stcg(tile + k, x);
      }
    }
    if constexpr (V == kOrderedRmw || V == kOrderedRed) {
      __threadfence();  // this thread's adds before the turn passes
      __syncthreads();
      if (tid == 0) store_release(turns + t, i + 1);
    }
  }
  if constexpr (V == kRead)
    if (acc.x == -1.f) sink[b] = acc;  // never true: keeps the loads
}

template <int V>
float run(float4* buf, int* turns, float4* sink, int nb, int threads, int tiles, int tile_f4, int iters, int spread) {
  CHECK(cudaMemset(turns, 0, sizeof(int) * std::size_t(tiles)));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  tile_kernel<V><<<nb, threads>>>(buf, turns, sink, tiles, tile_f4, 1, spread);  // warm-up
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemset(turns, 0, sizeof(int) * std::size_t(tiles)));
  CHECK(cudaEventRecord(e0));
  tile_kernel<V><<<nb, threads>>>(buf, turns, sink, tiles, tile_f4, iters, spread);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaGetLastError());
  CHECK(cudaEventSynchronize(e1));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return ms;
}

template <int V>
int resident_blocks(int threads) {
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tile_kernel<V>, threads, 0));
  return per_sm;
}

}  // namespace

int main(int argc, char** argv) {
  int per_sm = 2, threads = 128, iters = 2000, tile_kb = 32, tiles = 0, spread = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (a == "--blocks-per-sm") per_sm = val();
    else if (a == "--threads") threads = val();
    else if (a == "--iters") iters = val();
    else if (a == "--tile-kb") tile_kb = val();
    else if (a == "--tiles") tiles = val();
    else if (a == "--spread") spread = val();
    else {
      std::fprintf(stderr,
                   "usage: bench_l2_add_gpu [--blocks-per-sm 2] [--threads 128] [--iters 2000] [--tile-kb 32] "
                   "[--tiles N] [--spread S]\n");
      return 2;
    }
  }
  int dev = 0, sms = 0, l2 = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, dev));
  const int nb = sms * per_sm;
  if (tiles <= 0) tiles = nb;
  if (per_sm <= 0 || threads <= 0 || threads % 32 || iters <= 0 || tile_kb <= 0 || tiles % nb || spread <= 0) {
    std::fprintf(stderr, "bench_l2_add_gpu: positive values, threads a multiple of 32, tiles a multiple of the %d blocks\n",
                 nb);
    return 2;
  }
  // Every block on its own tile at each iteration: b -> S b mod tiles one-to-one over the
  // blocks, i.e. tiles / gcd(S, tiles) >= nb.
  auto gcd = [](int x, int y) {
    while (y) {
      const int r = x % y;
      x = y;
      y = r;
    }
    return x;
  };
  if (tiles / gcd(spread, tiles) < nb) {
    std::fprintf(stderr, "bench_l2_add_gpu: --spread %d puts two of the %d blocks on one of the %d tiles at once\n",
                 spread, nb, tiles);
    return 2;
  }
  const int tile_f4 = tile_kb * 1024 / 16;
  const std::size_t bytes = std::size_t(tiles) * tile_f4 * 16;
  float4* buf = nullptr;
  float4* sink = nullptr;
  int* turns = nullptr;
  CHECK(cudaMalloc(&buf, bytes));
  CHECK(cudaMemset(buf, 0, bytes));
  CHECK(cudaMalloc(&sink, sizeof(float4) * std::size_t(nb)));
  CHECK(cudaMalloc(&turns, sizeof(int) * std::size_t(tiles)));
  std::printf("device %s, %d SMs, L2 %.1f MB; %d blocks x %d threads, %d tiles of %d KB (%.1f MB), %d iterations, "
              "tile of block b at iteration i: (%d b + i) mod %d\n\n",
              prop.name, sms, l2 / 1048576.0, nb, threads, tiles, tile_kb, bytes / 1048576.0, iters, spread, tiles);
  std::printf("| variant | ms | GB moved | TB/s | 1.1 TB at this rate (ms) |\n|---|---:|---:|---:|---:|\n");
  const double moved = double(nb) * iters * tile_f4 * 16;
  auto row = [&](int v, float ms) {
    const double tbs = moved / (ms * 1e-3) / 1e12;
    std::printf("| %s | %.3f | %.2f | %.2f | %.1f |\n", kNames[v], ms, moved / 1e9, tbs, 1.1e12 / (tbs * 1e12) * 1e3);
  };
  row(kRead, run<kRead>(buf, turns, sink, nb, threads, tiles, tile_f4, iters, spread));
  row(kWrite, run<kWrite>(buf, turns, sink, nb, threads, tiles, tile_f4, iters, spread));
  row(kRedV4, run<kRedV4>(buf, turns, sink, nb, threads, tiles, tile_f4, iters, spread));
  row(kRed, run<kRed>(buf, turns, sink, nb, threads, tiles, tile_f4, iters, spread));
  row(kRmw, run<kRmw>(buf, turns, sink, nb, threads, tiles, tile_f4, iters, spread));
  const bool chain = tiles == nb && spread == 1;
  const bool resident = resident_blocks<kOrderedRmw>(threads) * sms >= nb && resident_blocks<kOrderedRed>(threads) * sms >= nb;
  if (!chain) {
    std::printf("| ordered.* | (tiles = blocks and spread 1 only) | | | |\n");
  } else if (!resident) {
    std::printf("| ordered.* | (not every block resident at once: the turns would wait for ever) | | | |\n");
  } else {
    row(kOrderedRmw, run<kOrderedRmw>(buf, turns, sink, nb, threads, tiles, tile_f4, iters, spread));
    row(kOrderedRed, run<kOrderedRed>(buf, turns, sink, nb, threads, tiles, tile_f4, iters, spread));
  }
  CHECK(cudaFree(buf));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(turns));
  return 0;
}
