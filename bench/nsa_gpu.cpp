// GPU benchmark of the NSA attention core (nsa/cuda/nsa_cuda.h): forward and backward time
// in bf16 with CUDA events after a warm-up. Per-kernel times: run it under
// `ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel`
// with `--reps 1` (docs/performance.md, "NSA CUDA kernels: optimisation log").
//
//   bench_nsa_gpu [--dtype bf16|fp32] [--reps R] [--shapes paper,125m,125m_tp2,groups]
//                 [--B 16] [--T 8192,32768,65536] [--D 128] [--h 1,2,4,6,8,16] [--no-dense]
//                 [--sel-loop auto|union|inverted|both] [--inputs random|local]
//                 [--row-fwd auto|plain|wide|both] [--layout split|projection|both]
//                 [--row-late auto|one|two|both|l2] [--key-streams 1,2,3]
//
// Shapes: "paper", the NSA paper's kernel study (B=1, H=64, G=4, D=128) at the --T lengths;
// "125m", configs/nsa_125m.toml's core (B=16, T=2048, H=12, G=2, D=64); "125m_tp2", a
// tensor-parallel rank's share of it at tp = 2 (H=6, G=1); both with B = --B; "groups", the GQA
// group sizes h = 1, 2, 4, 6, 8, 16 (or --h; each must divide 48) at 48 query heads (G = 48/h),
// B=1, at the --T lengths and --D head dims; all with
// l=32, d=16, l'=64, n=16, w=512. Each time is the median of R runs (default: as many as fit
// in about 10 s, at least 1, at most 10) after one untimed forward+backward. The inputs
// are pseudo-random on the device (unit scale; W scaled by 1/sqrt(l*D)). "pairs" counts the
// (query head, key) pairs the three branches attend (T/d + n*l' + w per query at most) and
// TFLOP/s counts 4*D flops per pair in the forward (QK and PV) and 10*D in the backward
// (QK, dO.V recomputed twice: query side and key side, plus dq, dk, dv), both over the
// forward time of that pass.
//
// --sel-loop: the selection row side's loop (nsa/cuda/selection_loop.h; bf16): auto (default)
// as the trainer runs it, union or inverted forced, or both (each shape twice, its name
// suffixed /u and /i).
//
// --row-fwd: the window's (and the own dense kernel's) forward at padded D = 128
// (nsa/cuda/selection_loop.h, RowForward): auto (default) as the trainer runs it, the 64-row
// kernel (plain, suffix /p), the warp-specialised one with 128-key tiles (wide, /W), or both.
//
// --row-late: the two-stage row kernels' schedule (nsa/cuda/attention_tc.cuh, row_late_issue):
// auto (default) as the trainer runs it (one block barrier per key tile everywhere since
// 2026-11-29), one barrier everywhere (suffix /1b), two everywhere (/2b), both, or l2 (/l2, the
// former default: one where the keys and values the resident blocks stream take at most half
// the L2, two above). The same bits either way.
//
// --key-streams: the backward's key sides on these numbers of streams (nsa/cuda/selection_loop.h,
// key_side_streams): 1 (the three in turn), 2 (the window's beside the others: the default, as
// the trainer runs it), 3 (the compression's on a third too); with more than one value each
// shape runs once per value, its name suffixed /k1, /k2, /k3. The same bits at every count.
//
// --inputs: random (default): every input independent, so neighbouring positions choose
// unrelated blocks (the selection's union loop at its worst: a block of positions streams the
// union of their choices). local: the queries drift slowly along the positions (per (batch,
// head, dim) an AR(1) sequence q_t = rho q_{t-1} + sqrt(1 - rho^2) e_t, rho = 0.995: unit
// variance, correlation ~0.73 over 64 positions), so neighbouring positions choose mostly the
// same blocks, as trained models' queries tend to; the shape's name is suffixed /L.
//
// --layout: split (default): the eight per-token inputs (and their gradients) as separate
// contiguous tensors; projection: as the model's CUDA layers pass them, column ranges of one
// row per position of the fused projection (q | k_cmp | v_cmp | k_slc | v_slc | k_win | v_win |
// gate, padded to a multiple of 64 elements: nsa::cuda::TokenPitches, core/model/model.h),
// the shape's name suffixed /P; both: each shape twice. (The dense baseline always runs on
// the split layout.)
//
// Dense baseline (unless --no-dense): dense causal attention (RoPE, GQA; nsa/cuda/dense.h,
// the engine's model.attention = "dense"), which is the NSA window branch with w = T and no
// gate, through the same flash-style bf16 tensor-core kernels: forward = padded K/V copies + row kernel; backward = row side
// (dq) + dq rotation + padded q/d_out copies + key side (dk, dv). Timed the same way
// (median of up to 5 runs after one warm-up, fewer when a run takes over 1 s). "x" columns:
// dense time / NSA time; dTF/s counts 4*D (forward) and 10*D (backward) flops per causal
// pair, B*H*T*(T+1)/2 pairs, over the dense forward and backward times.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/device/cuda_check.h"
#include "core/device/device.h"
#include "nsa/cuda/selection_loop.h"
#include "nsa/cuda/nsa_cuda.h"
#include "nsa/cuda/dense.h"

using namespace nsatron::nsa;

// Pseudo-random values on the host: xorshift, uniform in [-sqrt(3), sqrt(3)) (unit variance).
struct Xorshift {
  std::uint64_t x;
  explicit Xorshift(std::uint64_t seed) : x(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float unit() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return (float((x >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f) * 1.7320508f;
  }
};

// Uniform values of unit variance times `scale`, made on the host and copied in chunks.
template <class T>
static void fill(T* dev, std::size_t n, std::uint64_t seed, float scale) {
  const std::size_t chunk = std::size_t(1) << 24;
  std::vector<T> host(std::min(n, chunk));
  Xorshift rng(seed);
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t m = std::min(chunk, n - off);
    for (std::size_t i = 0; i < m; ++i) host[i] = T(rng.unit() * scale);
    CUDA_CHECK(cudaMemcpy(dev + off, host.data(), m * sizeof(T), cudaMemcpyHostToDevice));
  }
}

// The queries of --inputs local: per (batch, head, dim), along the positions, an AR(1)
// sequence of unit variance (see the header), from Xorshift; [B, T, H*D].
template <class T>
static void fill_drifting(T* dev, std::int64_t B, std::int64_t Tn, std::int64_t HD, std::uint64_t seed,
                          float rho) {
  std::vector<float> cur(static_cast<std::size_t>(HD));
  std::vector<T> row(static_cast<std::size_t>(HD));
  Xorshift rng(seed);
  const float fresh = std::sqrt(1.f - rho * rho);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < Tn; ++t) {
      for (std::int64_t i = 0; i < HD; ++i) {
        float& c = cur[std::size_t(i)];
        c = t == 0 ? rng.unit() : rho * c + fresh * rng.unit();
        row[std::size_t(i)] = T(c);
      }
      CUDA_CHECK(cudaMemcpy(dev + (b * Tn + t) * HD, row.data(), std::size_t(HD) * sizeof(T), cudaMemcpyHostToDevice));
    }
}

struct Shape {
  std::string name;
  NsaDims dims;
};

static double attended_pairs(const NsaDims& d) {
  double pairs = 0;
  const std::int64_t N = d.num_cmp_blocks();
  for (std::int64_t t = 0; t < d.T; ++t) {
    const std::int64_t vis =
        t < d.cmp_block - 1 ? 0 : std::min(N, (t - d.cmp_block + 1) / d.cmp_stride + 1);
    const std::int64_t b_t = t / d.sel_block;
    const std::int64_t blocks = std::min(d.sel_count, b_t + 1);
    const std::int64_t slc = (blocks - 1) * d.sel_block + (t - b_t * d.sel_block + 1);
    pairs += double(vis + slc + std::min(d.window, t + 1));
  }
  return pairs * double(d.B * d.H);
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class T>
static void run(const Shape& sh, int reps_arg, bool dense, bool local_inputs, bool projection) {
  const NsaDims& dm = sh.dims;
  const std::size_t nq = std::size_t(dm.B * dm.T * dm.H * dm.D);
  const std::size_t nk = std::size_t(dm.B * dm.T * dm.G * dm.D);
  const std::size_t ng = std::size_t(dm.B * dm.T * dm.H * 3);
  const std::size_t nw = std::size_t(dm.G * dm.cmp_block * dm.D * dm.D);
  const std::size_t np = std::size_t(dm.G * dm.cmp_block * dm.D);
  const std::size_t sizes[12] = {nq, nk, nk, nk, nk, nk, nk, ng, nw, nw, np, np};
  std::vector<void*> owned;
  auto alloc = [&](std::size_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    owned.push_back(p);
    return p;
  };
  T* x[12];
  for (int k = 0; k < 12; ++k) {
    x[k] = static_cast<T*>(alloc(sizes[k] * sizeof(T)));
    const float sc = (k == 8 || k == 9) ? float(1.0 / std::sqrt(double(dm.cmp_block * dm.D))) : 1.f;
    if (k == 0 && local_inputs) fill_drifting(x[k], dm.B, dm.T, dm.H * dm.D, 100, 0.995f);
    else fill(x[k], sizes[k], 100 + k, sc);
  }
  // --layout projection: the same values copied into the columns of one row per position.
  const std::int64_t positions = dm.B * dm.T;
  std::int64_t offset[8] = {0}, used = 0;
  for (int k = 0; k < 8; ++k) {
    offset[k] = used;
    used += std::int64_t(sizes[k]) / positions;
  }
  const std::int64_t pitch = (used + 63) / 64 * 64;
  cuda::TokenPitches pitches;
  T* px[8] = {};
  if (projection) {
    pitches = {pitch, pitch, pitch};
    T* rows = static_cast<T*>(alloc(std::size_t(positions * pitch) * sizeof(T)));
    CUDA_CHECK(cudaMemset(rows, 0, std::size_t(positions * pitch) * sizeof(T)));
    for (int k = 0; k < 8; ++k) {
      const std::size_t w = sizes[k] / std::size_t(positions);
      px[k] = rows + offset[k];
      CUDA_CHECK(cudaMemcpy2D(px[k], std::size_t(pitch) * sizeof(T), x[k], w * sizeof(T), w * sizeof(T),
                              std::size_t(positions), cudaMemcpyDeviceToDevice));
    }
  }
  T* dout = static_cast<T*>(alloc(nq * sizeof(T)));
  fill(dout, nq, 99, 1.f);
  T* out = static_cast<T*>(alloc(nq * sizeof(T)));
  cuda::NsaGradsCuda<T> g, pg;  // pg: --layout projection's, columns of one gradient row buffer
  T** act[8] = {&g.q, &g.k_cmp, &g.v_cmp, &g.k_slc, &g.v_slc, &g.k_win, &g.v_win, &g.gate};
  for (int k = 0; k < 8; ++k) *act[k] = static_cast<T*>(alloc(sizes[k] * sizeof(T)));
  if (projection) {
    T* grows = static_cast<T*>(alloc(std::size_t(positions * pitch) * sizeof(T)));
    T** pact[8] = {&pg.q, &pg.k_cmp, &pg.v_cmp, &pg.k_slc, &pg.v_slc, &pg.k_win, &pg.v_win, &pg.gate};
    for (int k = 0; k < 8; ++k) *pact[k] = grows + offset[k];
  }
  g.cmp_wk = static_cast<float*>(alloc(nw * 4));
  g.cmp_wv = static_cast<float*>(alloc(nw * 4));
  g.cmp_pk = static_cast<float*>(alloc(np * 4));
  g.cmp_pv = static_cast<float*>(alloc(np * 4));
  const NsaInputs<T> in = projection ? NsaInputs<T>{px[0], px[1], px[2], px[3], px[4], px[5], px[6], px[7],
                                                     x[8], x[9], x[10], x[11]}
                                     : NsaInputs<T>{x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7],
                                                     x[8], x[9], x[10], x[11]};
  cuda::NsaSavedCuda saved;

  cudaEvent_t e0, e1, e2;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaEventCreate(&e2));
  auto once = [&](double* f_ms, double* b_ms) {
    CUDA_CHECK(cudaEventRecord(e0));
    cuda::nsa_forward<T>(dm, in, out, &saved, nullptr, pitches);
    CUDA_CHECK(cudaEventRecord(e1));
    if (projection) {
      pg.cmp_wk = g.cmp_wk;
      pg.cmp_wv = g.cmp_wv;
      pg.cmp_pk = g.cmp_pk;
      pg.cmp_pv = g.cmp_pv;
    }
    cuda::nsa_backward<T>(dm, in, saved, dout, projection ? pg : g, nullptr, pitches);
    CUDA_CHECK(cudaEventRecord(e2));
    CUDA_CHECK(cudaEventSynchronize(e2));
    float a = 0, b = 0;
    CUDA_CHECK(cudaEventElapsedTime(&a, e0, e1));
    CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
    *f_ms = a;
    *b_ms = b;
  };
  double f0, b0;
  once(&f0, &b0);  // warm-up (allocations, RoPE table)
  once(&f0, &b0);
  int reps = reps_arg > 0 ? reps_arg : int(std::clamp(10000.0 / (f0 + b0), 1.0, 10.0));
  std::vector<double> fs{f0}, bs{b0};
  for (int r = 1; r < reps; ++r) {
    double f, b;
    once(&f, &b);
    fs.push_back(f);
    bs.push_back(b);
  }
  const double fm = median(fs), bm = median(bs);
  const double pairs = attended_pairs(dm);
  const double tf_f = 4.0 * dm.D * pairs / (fm * 1e-3) / 1e12;
  const double tf_b = 10.0 * dm.D * pairs / (bm * 1e-3) / 1e12;
  std::printf("| %-6s | %2lld | %6lld | %2lld | %lld | %3lld | %5s | %10.3f | %10.3f | %10.3f | %5.1f | %5.1f | %3d |",
              sh.name.c_str(), (long long)dm.B, (long long)dm.T, (long long)dm.H, (long long)dm.G,
              (long long)dm.D, sizeof(T) == 2 ? "bf16" : "fp32", fm, bm, fm + bm, tf_f, tf_b,
              int(fs.size()));
  if (dense) {
    // Dense causal baseline (inputs: q, k_win, v_win, d_out of the NSA run; outputs into the
    // NSA output/gradient buffers).
    const DenseDims dd{dm.B, dm.T, dm.H, dm.G, dm.D, dm.rope_theta};
    float* lse = static_cast<float*>(alloc(std::size_t(dm.B * dm.T * dm.H) * 4));
    auto donce = [&](double* f_ms, double* b_ms) {
      CUDA_CHECK(cudaEventRecord(e0));
      cuda::dense_forward<T>(dd, x[0], x[5], x[6], out, lse);
      CUDA_CHECK(cudaEventRecord(e1));
      cuda::dense_backward<T>(dd, x[0], x[5], x[6], out, lse, dout, g.q, g.k_win, g.v_win);
      CUDA_CHECK(cudaEventRecord(e2));
      CUDA_CHECK(cudaEventSynchronize(e2));
      float a = 0, b = 0;
      CUDA_CHECK(cudaEventElapsedTime(&a, e0, e1));
      CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
      *f_ms = a;
      *b_ms = b;
    };
    double df0, db0;
    donce(&df0, &db0);  // warm-up
    donce(&df0, &db0);
    const int dreps =
        reps_arg > 0 ? std::min(reps_arg, 5) : int(std::clamp(1000.0 / (df0 + db0), 1.0, 5.0));
    std::vector<double> dfs{df0}, dbs{db0};
    for (int r = 1; r < dreps; ++r) {
      double f, b;
      donce(&f, &b);
      dfs.push_back(f);
      dbs.push_back(b);
    }
    const double dfm = median(dfs), dbm = median(dbs);
    const double dpairs = double(dm.B * dm.H) * double(dm.T) * double(dm.T + 1) / 2;
    std::printf(" %10.3f | %10.3f | %10.3f | %5.2f | %5.2f | %5.2f | %5.1f | %5.1f | %3d |",
                dfm, dbm, dfm + dbm, dfm / fm, dbm / bm, (dfm + dbm) / (fm + bm),
                4.0 * dm.D * dpairs / (dfm * 1e-3) / 1e12,
                10.0 * dm.D * dpairs / (dbm * 1e-3) / 1e12, int(dfs.size()));
  }
  std::printf("\n");
  std::fflush(stdout);
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  CUDA_CHECK(cudaEventDestroy(e2));
  for (void* p : owned) CUDA_CHECK(cudaFree(p));
}

static std::vector<std::int64_t> parse_list(const std::string& s) {
  std::vector<std::int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

// Whether `name` is one of the comma-separated names of `list`.
bool listed(const std::string& list, const std::string& name) {
  return ("," + list + ",").find("," + name + ",") != std::string::npos;
}

// The settings a flag's value names, each with its shape-name suffix: table maps every accepted
// value to its list; another value ends the program with the accepted ones.
template <class E>
using Variants = std::vector<std::pair<E, std::string>>;
template <class E>
Variants<E> variants(const char* flag, const std::string& value,
                     const std::vector<std::pair<std::string, Variants<E>>>& table) {
  std::string names;
  for (const auto& [name, list] : table) {
    if (name == value) return list;
    names += (names.empty() ? "" : ", ") + name;
  }
  std::fprintf(stderr, "%s: one of %s, not %s\n", flag, names.c_str(), value.c_str());
  std::exit(2);
}

int main(int argc, char** argv) {
  std::string dtype = "bf16", which = "paper,125m";
  std::vector<std::int64_t> Ts = {8192, 32768, 65536}, Ds = {128}, hs = {1, 2, 4, 6, 8, 16}, Bs = {16};
  int reps = 0;
  bool dense = true;
  std::string sel_loop = "auto", inputs = "random", row_fwd = "auto", layout = "split", row_late = "auto",
              key_streams = "";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dtype") dtype = val();
    else if (a == "--reps") reps = std::stoi(val());
    else if (a == "--shapes") which = val();
    else if (a == "--T") Ts = parse_list(val());
    else if (a == "--D") Ds = parse_list(val());
    else if (a == "--h") hs = parse_list(val());
    else if (a == "--B") Bs = parse_list(val());
    else if (a == "--no-dense") dense = false;
    else if (a == "--sel-loop") sel_loop = val();
    else if (a == "--inputs") inputs = val();
    else if (a == "--row-fwd") row_fwd = val();
    else if (a == "--layout") layout = val();
    else if (a == "--row-late") row_late = val();
    else if (a == "--key-streams") key_streams = val();
    else {
      std::fprintf(stderr,
                   "usage: bench_nsa_gpu [--dtype bf16|fp32] [--reps R] [--shapes paper,125m,125m_tp2,groups] "
                   "[--B 16] [--T 8192,32768,65536] [--D 128] [--h 1,2,4,6,8,16] [--no-dense] "
                   "[--sel-loop auto|union|inverted|both] [--inputs random|local] "
                   "[--row-fwd auto|plain|wide|both] [--layout split|projection|both] "
                   "[--row-late auto|one|two|both|l2] [--key-streams 1,2,3]\n");
      return 2;
    }
  }
  if (inputs != "random" && inputs != "local") {
    std::fprintf(stderr, "--inputs: random or local, not %s\n", inputs.c_str());
    return 2;
  }
  const bool local_inputs = inputs == "local";
  const auto layouts = variants<bool>("--layout", layout,
                                      {{"split", {{false, ""}}},
                                       {"projection", {{true, "/P"}}},
                                       {"both", {{false, ""}, {true, "/P"}}}});
  if (!nsatron::cuda_available()) {
    std::printf("bench_nsa_gpu: %s, nothing to do\n", nsatron::cuda_device_summary().c_str());
    return 0;
  }
  std::printf("NSA core on %s, l=32 d=16 l'=64 n=16 w=512, times in ms (median)\n",
              nsatron::cuda_device_summary().c_str());
  std::printf("| shape  |  B |      T |  H | G |   D | dtype |    fwd ms  |    bwd ms  |  total ms  | fTF/s | bTF/s | reps |");
  if (dense)
    std::printf(" dense fwd ms | dense bwd ms | dense tot ms | fwd x | bwd x | tot x | dfTF/s | dbTF/s | dreps |");
  std::printf("\n|--------|----|--------|----|---|-----|-------|------------|------------|------------|-------|-------|-----|");
  if (dense) std::printf("------------|------------|------------|-------|-------|-------|-------|-------|-----|");
  std::printf("\n");
  std::vector<Shape> shapes;
  auto dims = [](std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t G, std::int64_t D) {
    NsaDims d;
    d.B = B;
    d.T = T;
    d.H = H;
    d.G = G;
    d.D = D;
    d.cmp_block = 32;
    d.cmp_stride = 16;
    d.sel_block = 64;
    d.sel_count = 16;
    d.window = 512;
    d.rope_theta = 10000.0;
    return d;
  };
  // 125m: one layer of configs/nsa_125m.toml; 125m_tp2: one tensor-parallel rank's share of it
  // at tp = 2 (half the heads and groups); B sequences each (--B).
  for (auto B : Bs) {
    if (listed(which, "125m")) shapes.push_back({"125m", dims(B, 2048, 12, 2, 64)});
    if (listed(which, "125m_tp2")) shapes.push_back({"125m_tp2", dims(B, 2048, 6, 1, 64)});
  }
  if (listed(which, "paper"))
    for (auto T : Ts) shapes.push_back({"paper", dims(1, T, 64, 4, 128)});
  if (listed(which, "groups"))
    for (auto T : Ts)
      for (auto D : Ds)
        for (auto h : hs) {
          if (h < 1 || 48 % h != 0) {
            std::fprintf(stderr, "--h: %lld does not divide the 48 query heads\n", static_cast<long long>(h));
            return 2;
          }
          shapes.push_back({"groups", dims(1, T, 48, 48 / h, D)});
        }
  using Loop = cuda::SelectionRowLoop;
  const auto loops = variants<Loop>("--sel-loop", sel_loop,
                                    {{"auto", {{Loop::kAuto, ""}}},
                                     {"union", {{Loop::kUnion, "/u"}}},
                                     {"inverted", {{Loop::kInverted, "/i"}}},
                                     {"both", {{Loop::kUnion, "/u"}, {Loop::kInverted, "/i"}}}});
  using RowFwd = cuda::RowForward;
  const auto row_fwds = variants<RowFwd>(
      "--row-fwd", row_fwd,
      {{"auto", {{RowFwd::kAuto, ""}}},
       {"plain", {{RowFwd::kPlain, "/p"}}},
       {"wide", {{RowFwd::kWideWindow, "/W"}}},
       {"both", {{RowFwd::kPlain, "/p"}, {RowFwd::kWideWindow, "/W"}}}});
  // (row_late_issue's byte limit: the largest value one barrier, the default; 0 two; -1 half the L2)
  constexpr std::int64_t kOneBarrier = cuda::kRowLateAlways;
  const auto row_lates = variants<std::int64_t>("--row-late", row_late,
                                                {{"auto", {{cuda::row_late_issue_bytes(), ""}}},
                                                 {"one", {{kOneBarrier, "/1b"}}},
                                                 {"two", {{0, "/2b"}}},
                                                 {"both", {{kOneBarrier, "/1b"}, {0, "/2b"}}},
                                                 {"l2", {{-1, "/l2"}}}});
  std::vector<std::pair<int, std::string>> key_side_variants;  // (streams, suffix)
  if (key_streams.empty()) key_side_variants.push_back({cuda::key_side_streams(), ""});
  for (const std::int64_t n : key_streams.empty() ? std::vector<std::int64_t>{} : parse_list(key_streams)) {
    if (n < 1 || n > 3) {
      std::fprintf(stderr, "--key-streams: 1, 2 or 3, not %lld\n", static_cast<long long>(n));
      return 2;
    }
    key_side_variants.push_back({int(n), key_streams.find(',') == std::string::npos ? "" : "/k" + std::to_string(n)});
  }
  for (const auto& s : shapes)
    for (const auto& [loop, suffix] : loops)
      for (const auto& [rf, rsuffix] : row_fwds)
        for (const auto& [late_bytes, bsuffix] : row_lates)
          for (const auto& [streams, ksuffix] : key_side_variants)
            for (const auto& [projection, lsuffix] : layouts) {
              cuda::set_selection_row_loop(loop);
              cuda::set_row_forward(rf);
              cuda::set_row_late_issue_bytes(late_bytes);
              cuda::set_key_side_streams(streams);
              const Shape named{s.name + suffix + rsuffix + bsuffix + ksuffix + lsuffix + (local_inputs ? "/L" : ""),
                                s.dims};
              if (dtype == "fp32") run<float>(named, reps, dense, local_inputs, projection);
              else run<cuda::bf16>(named, reps, dense, local_inputs, projection);
            }
  return 0;
}
