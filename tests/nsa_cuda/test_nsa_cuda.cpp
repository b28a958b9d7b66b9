// The NSA core on CUDA (nsa/cuda/nsa_cuda.h) against the CPU reference, on fresh random
// inputs (seed printed; NSA_CUDA_SEED=<n> reproduces) at awkward shapes. Skips without a GPU.
//
// Reference: the CPU core in float64 on exactly the values the GPU sees (for bf16, the
// inputs and d_out rounded to bf16 first). Metric per tensor: max|gpu - ref| / max|ref|.
// A gradient whose reference is exactly zero (structurally, e.g. the compression maps when
// T < l, or in exact arithmetic, e.g. dk_win when w = 1, where the CPU's two identical dot
// products cancel to 0 and the GPU's differently ordered ones leave ~1e-8) is measured as
// max|gpu| / (the largest reference gradient of the run), with the same bound.
// Bounds: fp32 kFp32Bound = 1e-5; bf16 kBf16Bound = 1e-2; for out and all twelve gradients.
// bf16 runs each case with both loops of the selection row side (nsa/cuda/selection_loop.h).
// Selected blocks must be identical. A row where they differ is accepted only if the CPU's
// float64 block scores of the blocks in question are within kTieTol = 1e-5 of the row's
// largest score (a near-tie the fp32 score arithmetic cannot resolve); such a case is
// reported and redrawn with a new seed (at most 3 times), never compared loosely.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/device/cuda_check.h"
#include "core/device/device.h"
#include "core/util/error.h"
#include "nsa/cpu/rope.h"
#include "nsa/cpu/selection.h"
#include "nsa/cuda/nsa_cuda.h"
#include "nsa/cuda/selection_loop.h"
#include "tests/nsa/nsa_test_util.h"
#include "tests/nsa_cuda/kernel_scopes.h"

namespace nsatron::nsa {
namespace {

using test::make_dims;
using test::Problem;
using test::FusedPipelineScope;
using test::KeySideStreamsScope;
using test::LateIssueScope;
using test::LoopScope;
using test::RowForwardScope;
using bf16 = cuda::bf16;

constexpr double kFp32Bound = 1e-5;
constexpr double kBf16Bound = 1e-2;
constexpr double kTieTol = 1e-5;

std::uint64_t base_seed() {
  static const std::uint64_t seed = test::seed_from_env("NSA_CUDA_SEED", "NSA CUDA tests");
  return seed;
}

// Device array of T from host floats.
template <class T>
struct DevArray {
  T* p = nullptr;
  std::size_t n = 0;
  DevArray() = default;
  explicit DevArray(std::size_t count) : n(count) {
    CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  }
  explicit DevArray(const std::vector<float>& h) : DevArray(h.size()) { upload(h); }
  DevArray(const DevArray&) = delete;
  DevArray(DevArray&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  DevArray& operator=(DevArray&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~DevArray() {
    if (p) cudaFree(p);
  }
  void upload(const std::vector<float>& h) {
    std::vector<T> c(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) c[i] = T(h[i]);
    CUDA_CHECK(cudaMemcpy(p, c.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<float> download() const {
    std::vector<T> c(n);
    CUDA_CHECK(cudaMemcpy(c.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = float(c[i]);
    return h;
  }
};

struct GpuResult {
  std::vector<float> out;
  std::vector<std::int32_t> sel;
  std::array<std::vector<float>, 12> grad;
};

struct RunOptions {
  bool grads = true;                                // run the backward
  std::array<bool, 12> want{};                      // which gradients (default all)
  const std::array<std::vector<float>, 12>* init = nullptr;  // initial gradient buffers
  bool inference_forward = false;                   // forward with saved = null
  // >= 0: the eight per-token inputs and their gradients as column ranges of one row per
  // position (cuda::TokenPitches), [q | k_cmp | v_cmp | k_slc | v_slc | k_win | v_win | gate]
  // then row_pad pad columns, as the model's fused projection holds them (row_pad 8 keeps the
  // rows 16-byte aligned at even widths; odd pads take the kernels' element-wise paths).
  int row_pad = -1;
};

constexpr float kRowSentinel = 1024.f;  // the pad columns' value (exact in bf16)

// The per-token tensors' columns within a pitched row (RunOptions::row_pad).
struct RowColumns {
  std::array<std::int64_t, 8> offset{}, width{};
  std::int64_t used = 0, pitch = 0;
  RowColumns(const NsaDims& dm, int pad) {
    for (int k = 0; k < 8; ++k) {
      width[k] = k == 0 ? dm.H * dm.D : (k == 7 ? 3 * dm.H : dm.G * dm.D);
      offset[k] = used;
      used += width[k];
    }
    pitch = used + pad;
  }
  // Rows of kRowSentinel with parts[k] ([positions, width[k]]) in their columns.
  std::vector<float> pack(const std::array<std::vector<float>, 8>& parts, std::int64_t positions) const {
    std::vector<float> rows(std::size_t(positions * pitch), kRowSentinel);
    for (int k = 0; k < 8; ++k)
      for (std::int64_t p = 0; p < positions; ++p)
        std::copy_n(parts[k].begin() + p * width[k], width[k], rows.begin() + p * pitch + offset[k]);
    return rows;
  }
  std::vector<float> part(const std::vector<float>& rows, int k, std::int64_t positions) const {
    std::vector<float> out(std::size_t(positions * width[k]));
    for (std::int64_t p = 0; p < positions; ++p)
      std::copy_n(rows.begin() + p * pitch + offset[k], width[k], out.begin() + p * width[k]);
    return out;
  }
};

template <class T>
GpuResult run_gpu(const Problem<float>& p, RunOptions opt = {}) {
  if (opt.want == std::array<bool, 12>{}) opt.want.fill(true);
  const bool pitched = opt.row_pad >= 0;
  const RowColumns cols(p.dims, std::max(opt.row_pad, 0));
  const std::int64_t positions = p.dims.B * p.dims.T;
  cuda::TokenPitches pitches;
  if (pitched) pitches = {cols.pitch, cols.pitch, cols.pitch};
  std::array<DevArray<T>, 12> x;
  for (int k = pitched ? 8 : 0; k < 12; ++k) x[k] = DevArray<T>(p.x[k]);
  DevArray<T> rows;  // pitched: the eight per-token inputs
  if (pitched) {
    std::array<std::vector<float>, 8> parts;
    for (int k = 0; k < 8; ++k) parts[k] = p.x[k];
    rows = DevArray<T>(cols.pack(parts, positions));
  }
  auto input = [&](int k) -> const T* { return pitched && k < 8 ? rows.p + cols.offset[k] : x[k].p; };
  DevArray<T> dout(p.d_out), out(p.d_out.size());
  const NsaInputs<T> in{input(0), input(1), input(2), input(3), input(4),  input(5),
                        input(6), input(7), input(8), input(9), input(10), input(11)};
  GpuResult r;
  if (opt.inference_forward) {
    cuda::nsa_forward<T>(p.dims, in, out.p, nullptr, nullptr, pitches);
    CUDA_CHECK(cudaDeviceSynchronize());
    r.out = out.download();
    return r;
  }
  cuda::NsaSavedCuda saved;
  cuda::nsa_forward<T>(p.dims, in, out.p, &saved, nullptr, pitches);
  CUDA_CHECK(cudaDeviceSynchronize());
  r.out = out.download();
  r.sel = saved.sel_blocks_host();
  if (!opt.grads) return r;
  std::array<DevArray<T>, 8> ga;
  std::array<DevArray<float>, 4> gp;
  std::array<std::vector<float>, 8> ginit;
  for (int k = 0; k < 8; ++k) ginit[k] = opt.init ? (*opt.init)[k] : std::vector<float>(p.x[k].size(), 0.f);
  DevArray<T> grows;  // pitched: the eight per-token gradients
  if (pitched)
    grows = DevArray<T>(cols.pack(ginit, positions));
  else
    for (int k = 0; k < 8; ++k) ga[k] = DevArray<T>(ginit[k]);
  for (int k = 8; k < 12; ++k) {
    gp[k - 8] = DevArray<float>(p.x[k].size());
    gp[k - 8].upload(opt.init ? (*opt.init)[k] : std::vector<float>(p.x[k].size(), 0.f));
  }
  cuda::NsaGradsCuda<T> g;
  T** act[8] = {&g.q, &g.k_cmp, &g.v_cmp, &g.k_slc, &g.v_slc, &g.k_win, &g.v_win, &g.gate};
  float** par[4] = {&g.cmp_wk, &g.cmp_wv, &g.cmp_pk, &g.cmp_pv};
  for (int k = 0; k < 8; ++k) *act[k] = opt.want[k] ? (pitched ? grows.p + cols.offset[k] : ga[k].p) : nullptr;
  for (int k = 0; k < 4; ++k) *par[k] = opt.want[8 + k] ? gp[k].p : nullptr;
  cuda::nsa_backward<T>(p.dims, in, saved, dout.p, g, nullptr, pitches);
  CUDA_CHECK(cudaDeviceSynchronize());
  if (pitched) {
    const std::vector<float> all = grows.download();
    for (int k = 0; k < 8; ++k) r.grad[k] = cols.part(all, k, positions);
    std::int64_t touched = 0;  // pad columns the backward wrote
    for (std::int64_t q = 0; q < positions; ++q)
      for (std::int64_t c = cols.used; c < cols.pitch; ++c) touched += all[std::size_t(q * cols.pitch + c)] != kRowSentinel;
    EXPECT_EQ(touched, 0) << p.dims.str() << ": pad columns of the gradient rows written";
  } else {
    for (int k = 0; k < 8; ++k) r.grad[k] = ga[k].download();
  }
  for (int k = 8; k < 12; ++k) r.grad[k] = gp[k - 8].download();
  return r;
}

// Inputs rounded to bf16 (what the bf16 GPU run sees).
Problem<float> round_bf16(const Problem<float>& p) {
  Problem<float> r = p;
  for (auto& v : r.x)
    for (auto& e : v) e = float(bf16(e));
  for (auto& e : r.d_out) e = float(bf16(e));
  return r;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& ref, bool* exact_zero,
               double zero_scale = 0) {
  double mref = 0, mdiff = 0, mgot = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    mref = std::max(mref, std::fabs(ref[i]));
    mgot = std::max(mgot, std::fabs(double(got[i])));
    const double d = std::fabs(double(got[i]) - ref[i]);
    mdiff = std::isnan(d) ? INFINITY : std::max(mdiff, d);
  }
  *exact_zero = mref == 0;
  if (mref == 0) return mgot == 0 ? 0.0 : (zero_scale > 0 ? mgot / zero_scale : INFINITY);
  return mdiff / mref;
}

// float64 block scores S[0..b_t] of one (b, t, g), recomputed from the CPU's saved state.
std::vector<double> cpu_scores(const NsaDims& dm, const Problem<double>& p,
                               const NsaSaved<double>& saved, std::int64_t b, std::int64_t t,
                               std::int64_t g) {
  const std::int64_t h = dm.heads_per_group(), D = dm.D, N = dm.num_cmp_blocks();
  const cpu::RopeTable<double> rope(dm.T, D, dm.rope_theta);
  const double scale = 1.0 / std::sqrt(double(D));
  const std::int64_t nvis = t < dm.cmp_block - 1
                                ? 0
                                : std::min(N, (t - dm.cmp_block + 1) / dm.cmp_stride + 1);
  std::vector<double> psum(std::max<std::int64_t>(nvis, 1), 0.0), qr(D);
  for (std::int64_t a = 0; a < h; ++a) {
    const std::int64_t row = (b * dm.T + t) * dm.H + g * h + a;
    rope.rotate(p.x[0].data() + row * D, qr.data(), t);
    const double lse = saved.lse[std::size_t(kBranchCmp * dm.B * dm.T * dm.H + row)];
    for (std::int64_t i = 0; i < nvis; ++i) {
      const double* k = saved.k_cmp_blocks.data() + ((b * N + i) * dm.G + g) * D;
      double s = 0;
      for (std::int64_t e = 0; e < D; ++e) s += qr[e] * k[e];
      psum[i] += std::exp(scale * s - lse);
    }
  }
  const std::int64_t bt = t / dm.sel_block;
  std::vector<double> S(bt + 1);
  cpu::group_block_scores(dm, psum.data(), nvis, bt, S.data());
  return S;
}

// Compares the selections; returns the number of rows that differ at verified near-ties and
// fails the test on any other difference.
int compare_selection(const NsaDims& dm, const Problem<double>& p, const NsaSaved<double>& saved,
                      const std::vector<std::int32_t>& gpu, const std::string& what) {
  const std::int64_t n = dm.sel_count;
  int ties = 0, bad = 0;
  for (std::int64_t b = 0; b < dm.B; ++b)
    for (std::int64_t t = 0; t < dm.T; ++t)
      for (std::int64_t g = 0; g < dm.G; ++g) {
        const std::size_t off = std::size_t(((b * dm.T + t) * dm.G + g) * n);
        const std::vector<std::int32_t> c(saved.sel_blocks.begin() + off,
                                          saved.sel_blocks.begin() + off + n),
            x(gpu.begin() + off, gpu.begin() + off + n);
        if (c == x) continue;
        const auto S = cpu_scores(dm, p, saved, b, t, g);
        const double smax = *std::max_element(S.begin(), S.end());
        bool tie = true;
        for (auto gj : x) {
          if (gj < 0 || std::find(c.begin(), c.end(), gj) != c.end()) continue;
          for (auto cj : c) {
            if (cj < 0 || std::find(x.begin(), x.end(), cj) != x.end()) continue;
            if (gj >= std::int32_t(S.size()) || cj >= std::int32_t(S.size()) ||
                std::fabs(S[gj] - S[cj]) > kTieTol * smax)
              tie = false;
          }
        }
        if (tie) {
          ++ties;
        } else if (bad++ < 3) {
          std::string cs, xs;
          for (auto v : c) cs += std::to_string(v) + " ";
          for (auto v : x) xs += std::to_string(v) + " ";
          ADD_FAILURE() << what << ": selection differs at b=" << b << " t=" << t << " g=" << g
                        << ": cpu [" << cs << "] gpu [" << xs << "]";
        }
      }
  if (ties) std::printf("  %s: %d rows differ at verified near-ties\n", what.c_str(), ties);
  return bad ? -1 : ties;
}

struct Case {
  const char* name;
  NsaDims dims;
};

// Runs one case in dtype T against one CPU reference: fp32 once, bf16 with each of the
// selection row side's loops (the union and the inverted loop), every output and gradient
// within the bound.
template <class T>
void check_case(const Case& cs, std::uint64_t salt) {
  const bool is_bf16 = sizeof(T) == 2;
  const double bound = is_bf16 ? kBf16Bound : kFp32Bound;
  const std::string what = std::string(cs.name) + (is_bf16 ? " bf16" : " fp32");
  using Loop = cuda::SelectionRowLoop;
  const std::vector<std::pair<Loop, const char*>> loops =
      is_bf16 ? std::vector<std::pair<Loop, const char*>>{{Loop::kUnion, " union"}, {Loop::kInverted, " inverted"}}
              : std::vector<std::pair<Loop, const char*>>{{Loop::kAuto, ""}};
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::uint64_t seed = base_seed() * 1000003ull + salt * 31ull + std::uint64_t(attempt);
    Problem<float> p = test::random_problem<float>(cs.dims, seed);
    if (is_bf16) p = round_bf16(p);
    const Problem<double> pd = p.cast<double>();
    const test::Result<double> ref = test::run_both(pd);
    bool redraw = false;
    for (const auto& [loop, label] : loops) {
      const LoopScope scope(loop);
      const std::string wl = what + label;
      const GpuResult got = run_gpu<T>(p);
      const int ties = compare_selection(cs.dims, pd, ref.saved, got.sel, wl);
      if (ties < 0) return;  // failures recorded
      if (ties > 0) {
        std::printf("  %s: near-tie in the selection, redrawing (seed %llu)\n", wl.c_str(),
                    static_cast<unsigned long long>(seed));
        redraw = true;
        break;
      }
      double worst = 0;
      std::string worst_name;
      bool zero = false;
      const double e_out = rel_err(got.out, ref.out, &zero);
      EXPECT_LE(e_out, bound) << wl << ": out (seed " << seed << ")";
      worst = e_out;
      worst_name = "out";
      double gscale = 0;
      for (int k = 0; k < 12; ++k)
        for (double v : ref.grad[k]) gscale = std::max(gscale, std::fabs(v));
      for (int k = 0; k < 12; ++k) {
        const double e = rel_err(got.grad[k], ref.grad[k], &zero, gscale);
        EXPECT_LE(e, bound) << wl << ": grad_" << test::kNames[k] << (zero ? " (reference exactly 0)" : "")
                            << " (seed " << seed << ")";
        if (e > worst) {
          worst = e;
          worst_name = std::string("grad_") + test::kNames[k];
        }
      }
      std::printf("  %-37s %s worst %.2e (%s), bound %.0e\n", wl.c_str(), cs.dims.str().c_str(), worst,
                  worst_name.c_str(), bound);
    }
    if (!redraw) return;
  }
  ADD_FAILURE() << what << ": near-ties in 3 draws in a row";
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"T<l", make_dims(2, 20, 4, 2, 32, 32, 16, 64, 16, 512)},
      {"ragged T, real top-n", make_dims(2, 1000, 4, 2, 32, 16, 8, 32, 5, 64)},
      {"l=d=l'", make_dims(1, 333, 4, 2, 16, 16, 16, 16, 4, 50)},
      {"n>blocks, w>T, D=24", make_dims(1, 300, 6, 3, 24, 32, 16, 64, 16, 1000)},
      {"w=1, 8 heads/group", make_dims(1, 400, 16, 2, 64, 32, 16, 64, 4, 1)},
      {"1 head/group, D=48", make_dims(1, 700, 3, 3, 48, 32, 16, 64, 6, 128)},
      {"1 group, 40 heads", make_dims(1, 300, 40, 1, 32, 16, 8, 32, 4, 40)},
      {"D=6, n=3", make_dims(1, 257, 2, 1, 6, 8, 4, 16, 3, 20)},
      {"l=d=8, l'=64", make_dims(1, 500, 4, 1, 64, 8, 8, 64, 5, 100)},
      {"125M-like, B=3", make_dims(3, 130, 12, 2, 64, 32, 16, 64, 16, 512)},
      {"paper D=64 T=2048", make_dims(1, 2048, 16, 1, 64, 32, 16, 64, 16, 512)},
      {"paper D=128 T=3000", make_dims(1, 3000, 8, 2, 128, 32, 16, 64, 16, 512)},
      // 72 heads per group: the fused tensor-core kernel holds one position in 72 of its 128
      // rows (a position's heads across 5 warps).
      {"1 group, 72 heads", make_dims(1, 200, 72, 1, 16, 16, 8, 32, 4, 40)},
      // More than 128 heads per group: bf16 takes the fp32 compression forward and selection
      // (the fused kernel holds the heads of whole positions in its 128 rows).
      {"1 group, 136 heads", make_dims(1, 120, 136, 1, 16, 16, 8, 32, 4, 40)},
      // 750 selection blocks at one head per group: 128 positions' block scores (375 KB) do not
      // fit the fused kernel's shared memory with its tiles; its streamed top-n takes 128.
      {"h=1, 750 blocks", make_dims(1, 6000, 2, 2, 32, 8, 8, 8, 8, 64)},
      // The fused kernel's streamed top-n (select_tc.cuh: a ring of 128 block scores and a
      // list per position, where the full [NB] scores would leave room for fewer positions):
      // 750 selection blocks at 2 heads per group (64 positions per block instead of 32), and
      // 1375 at 4 heads per group with n = 4 (one real choice per position; 32 instead of 16).
      // (The case above, h = 1, takes the ring too: 128 positions instead of 32.)
      {"streamed top-n, h=2", make_dims(1, 6000, 2, 1, 32, 8, 8, 8, 12, 64)},
      {"streamed top-n, h=4, n=4", make_dims(1, 11000, 4, 1, 32, 8, 8, 8, 4, 64)},
      // The streamed top-n by lane, the form the paper's sizes take at long T and small h
      // (l' = 64, d = 16: a tile's 17 blocks fit the lanes; each lane sums one block and takes
      // it when final; the cases above, at l' = 8, take the per-thread form): 130 selection
      // blocks at h = 1, D = 128 (the full scores would leave room for 64 positions, the ring
      // for 128).
      {"streamed top-n by lane, h=1, D=128", make_dims(1, 8300, 2, 2, 128, 32, 16, 64, 4, 64)},
      // Selection blocks of 2 and 4 key tiles (the inverted loop holds up to 4 in shared memory;
      // the union loop's 64-aligned tiles then meet each block's middle).
      {"l'=128, h=1, D=64", make_dims(1, 1500, 2, 2, 64, 32, 16, 128, 6, 100)},
      {"l'=256, h=3, ragged T", make_dims(2, 1100, 6, 2, 32, 32, 16, 256, 3, 64)},
      // n = 35: the fused kernel's full layout takes 32 blocks where a position has more than 32
      // candidates (b_t >= 35 of 50 blocks; the argmax rounds, then the row written by 32 lanes
      // with the forced blocks after them) and fewer below (the rank path).
      {"n=35, take 32 by lanes", make_dims(1, 400, 4, 2, 32, 8, 8, 8, 35, 64)},
      // Padded D = 128 off the paper's shape: D = 100 (28 zero columns in every tile) with h =
      // 3 (positions straddle the 64-row blocks), and h = 1 (a row block's selection union
      // holds 64 positions' choices).
      {"D=100, h=3", make_dims(2, 1111, 6, 2, 100, 32, 16, 64, 7, 200)},
      {"D=128, h=1", make_dims(1, 1500, 2, 2, 128, 32, 16, 64, 8, 300)},
      // The fused kernel's head sums by warp shuffles (h = 16 and 8 at padded D = 128), with a
      // last block of fewer positions (ragged T).
      {"D=128, h=16, ragged T", make_dims(1, 1111, 32, 2, 128, 32, 16, 64, 16, 256)},
      {"D=96, h=8, ragged T", make_dims(2, 555, 16, 2, 96, 32, 16, 64, 8, 128)},
      // A window shorter than T at padded D = 128, h = 4 (WideWindowForwardMatchesCpu runs it
      // with the 128-key forward, whose tiles start where the 64-row kernel's do not).
      {"D=128, h=4, w<T", make_dims(1, 1300, 8, 2, 128, 32, 16, 64, 12, 200)},
      // 250 selection blocks and n = 64: 61 of up to 248 candidates (~8 per lane) taken by the
      // merge of the lanes' streams (warp_take_best), where a lane often gives more than the 4
      // it keeps in registers and rescans for the ones after its last taken.
      {"n=64, 250 blocks: lane lists refilled", make_dims(1, 2000, 8, 2, 32, 8, 8, 8, 64, 64)},
  };
  return c;
}

class NsaCudaParity : public ::testing::TestWithParam<int> {};

TEST_P(NsaCudaParity, Fp32MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  check_case<float>(cases()[GetParam()], std::uint64_t(GetParam()));
}

TEST_P(NsaCudaParity, Bf16MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  check_case<bf16>(cases()[GetParam()], std::uint64_t(100 + GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Shapes, NsaCudaParity, ::testing::Range(0, int(cases().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "case" + std::to_string(info.param);
                         });

bool bit_equal(const GpuResult& a, const GpuResult& b) {
  if (a.out != b.out || a.sel != b.sel) return false;
  for (int k = 0; k < 12; ++k)
    if (a.grad[k] != b.grad[k]) return false;
  return true;
}

// "" where a and b hold the same bits, else each tensor that differs, where and how.
std::string first_difference(const GpuResult& a, const GpuResult& b) {
  auto diff = [](const char* name, const auto& x, const auto& y) -> std::string {
    if (x.size() != y.size()) return std::string(name) + ": sizes " + std::to_string(x.size()) + " / " + std::to_string(y.size());
    std::size_t n = 0, first = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!(x[i] == y[i]) && n++ == 0) first = i;
    if (n == 0) return "";
    return std::string(name) + ": " + std::to_string(n) + " elements differ, first [" + std::to_string(first) + "] " +
           std::to_string(double(x[first])) + " / " + std::to_string(double(y[first]));
  };
  std::string all;
  auto add = [&](const std::string& d) {
    if (!d.empty()) all += (all.empty() ? "" : "; ") + d;
  };
  add(diff("out", a.out, b.out));
  add(diff("sel", a.sel, b.sel));
  for (int k = 0; k < 12; ++k) add(diff((std::string("grad_") + test::kNames[k]).c_str(), a.grad[k], b.grad[k]));
  return all;
}

// Two runs give the same bits (no order-dependent atomics), in fp32 and bf16.
TEST(NsaCuda, Deterministic) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  const NsaDims dm = make_dims(2, 777, 8, 2, 64, 32, 16, 64, 5, 100);
  const Problem<float> p = test::random_problem<float>(dm, base_seed() + 7);
  EXPECT_TRUE(bit_equal(run_gpu<float>(p), run_gpu<float>(p)));
  EXPECT_TRUE(bit_equal(run_gpu<bf16>(p), run_gpu<bf16>(p)));
}

// Pitched per-token rows (cuda::TokenPitches: the inputs and their gradients as column ranges
// of wider rows, as the model's fused projection holds them) give the same bits as contiguous
// tensors, and the backward writes nothing outside the gradients' columns: 8 pad columns (rows
// 16-byte aligned: the vector paths) and 3 (odd pitches: the element-wise ones), fp32 and bf16
// with both selection row loops, at D = 64 (125M-like), 48 (padded, one head per group) and
// 128 (a window shorter than T).
TEST(NsaCuda, PitchedRowsGiveTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  for (const NsaDims& dm : {make_dims(3, 130, 12, 2, 64, 32, 16, 64, 16, 512), make_dims(1, 700, 3, 3, 48, 32, 16, 64, 6, 128),
                            make_dims(1, 1300, 8, 2, 128, 32, 16, 64, 12, 200)}) {
    const Problem<float> p = test::random_problem<float>(dm, base_seed() + 31);
    for (int pad : {8, 3}) {
      const RunOptions pitched{.row_pad = pad};
      EXPECT_EQ(first_difference(run_gpu<float>(p), run_gpu<float>(p, pitched)), "") << dm.str() << " fp32, pad " << pad;
      for (auto loop : {cuda::SelectionRowLoop::kUnion, cuda::SelectionRowLoop::kInverted}) {
        const LoopScope scope(loop);
        EXPECT_EQ(first_difference(run_gpu<bf16>(p), run_gpu<bf16>(p, pitched)), "")
            << dm.str() << " bf16, pad " << pad << ", loop " << int(loop);
      }
    }
  }
}

// Query rows of tiny magnitude (largest element ~2^-116, every head of 40 positions) give
// finite outputs and gradients in bf16: the fused compression + selection kernel scales each
// row by a power of two, which overflowed to inf below 2^-114 (pow2_scale in
// nsa/cuda/select_tc.cuh) and made those rows' scores NaN. D = 64 and 128, h = 4 and 16.
TEST(NsaCuda, TinyQueryRowsStayFinite) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  for (const NsaDims& dm : {make_dims(1, 300, 8, 2, 64, 32, 16, 64, 4, 64), make_dims(1, 500, 32, 2, 128, 32, 16, 64, 8, 128)}) {
    Problem<float> p = test::random_problem<float>(dm, base_seed() + 29);
    const float tiny = std::ldexp(1.f, -118);
    for (std::int64_t t = 100; t < 140; ++t)
      for (std::int64_t e = 0; e < dm.H * dm.D; ++e) p.x[0][std::size_t(t * dm.H * dm.D + e)] *= tiny;
    const GpuResult got = run_gpu<bf16>(p);
    const auto finite = [](const std::vector<float>& v) {
      return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
    };
    EXPECT_TRUE(finite(got.out)) << dm.str() << ": out";
    for (int k = 0; k < 12; ++k) EXPECT_TRUE(finite(got.grad[k])) << dm.str() << ": grad_" << test::kNames[k];
  }
}

// The same with selection row lists long enough to be split over blocks on the bf16
// tensor-core key side (block 0 is chosen by all 2048 positions x 16 heads = 32768 rows: 32
// splits of key_rows_per_split = 1024 at this shape, whose partial sums the last block to
// finish adds in split order).
TEST(NsaCuda, DeterministicSplitLists) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  const NsaDims dm = make_dims(1, 2048, 16, 1, 64, 32, 16, 64, 16, 512);
  const Problem<float> p = test::random_problem<float>(dm, base_seed() + 11);
  EXPECT_TRUE(bit_equal(run_gpu<bf16>(p), run_gpu<bf16>(p)));
}

// The inverted selection loop: the same bits from run to run, and whether its (b, g) pairs
// run in one pass or one pass each (inverted_pass_bytes). Block 0, chosen by every position,
// has 1024 x 2 rows: 8 blocks of the kernel.
TEST(NsaCuda, DeterministicInvertedLoop) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  const NsaDims dm = make_dims(2, 1024, 4, 2, 64, 32, 16, 64, 8, 128);
  const Problem<float> p = test::random_problem<float>(dm, base_seed() + 13);
  const LoopScope scope(cuda::SelectionRowLoop::kInverted);
  const GpuResult one = run_gpu<bf16>(p);
  EXPECT_TRUE(bit_equal(one, run_gpu<bf16>(p)));
  cuda::set_inverted_pass_bytes(1);  // one (b, g) pair per pass
  const GpuResult passes = run_gpu<bf16>(p);
  cuda::set_inverted_pass_bytes(std::int64_t(1) << 30);
  EXPECT_TRUE(bit_equal(one, passes));
}

// The row kernels' two schedules (one barrier per key tile, or two with a longer prefetch:
// row_late_issue in nsa/cuda/attention_tc.cuh; one by default) give the same bits, at padded D = 32, 64 and 128 (the forward at 128 has one schedule; its backward two).
TEST(NsaCuda, RowScheduleGivesTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  const LoopScope loop(cuda::SelectionRowLoop::kUnion);
  for (const NsaDims& dm : {make_dims(2, 777, 8, 2, 32, 32, 16, 64, 5, 100), make_dims(1, 1111, 6, 2, 64, 32, 16, 64, 8, 200),
                            make_dims(1, 1500, 8, 1, 128, 32, 16, 64, 16, 300)}) {
    const Problem<float> p = test::random_problem<float>(dm, base_seed() + 17);
    GpuResult two, one;
    {
      const LateIssueScope scope(0);  // never: two barriers per tile
      two = run_gpu<bf16>(p);
    }
    {
      const LateIssueScope scope(std::numeric_limits<std::int64_t>::max());  // always: one
      one = run_gpu<bf16>(p);
    }
    EXPECT_TRUE(bit_equal(two, one)) << dm.str();
  }
}

// The window's forward by the warp-specialised kernel with 128-key tiles (nsa/cuda/row_ws.cuh,
// RowForward::kWideWindow: kAuto takes it only where a (batch, group)'s window keys and values
// exceed half the L2, which no test shape does) against the CPU: a window shorter than T (its
// tiles start at each block's first visible key) at h = 4 and h = 1 (64 positions per
// consumer), and w = T at h = 16 (a consumer = 4 whole positions), ragged T.
TEST(NsaCuda, WideWindowForwardMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  const RowForwardScope scope(cuda::RowForward::kWideWindow);
  check_case<bf16>({"wide window D=128, h=4, w<T", make_dims(1, 1300, 8, 2, 128, 32, 16, 64, 12, 200)}, 403);
  check_case<bf16>({"wide window D=128, h=1, w<T", make_dims(1, 1500, 2, 2, 128, 32, 16, 64, 8, 300)}, 402);
  check_case<bf16>({"wide window D=128, h=16, w=T", make_dims(1, 1111, 32, 2, 128, 32, 16, 64, 16, 1111)}, 404);
}

// The backward's key sides on 2 streams (the window's beside the selection's and the
// compression's: the default) and on 3 (the compression's and its products on a third) give
// the same bits as the three in turn on one stream (key_side_streams): fp32 and bf16, both
// selection row loops, at D = 64 (125M-like, split selection lists) and 128, ragged T.
TEST(NsaCuda, KeySidesOnSeveralStreamsGiveTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  auto on_streams = [](int n, auto run) {
    const KeySideStreamsScope scope(n);
    return run();
  };
  for (const NsaDims& dm : {make_dims(2, 1300, 12, 2, 64, 32, 16, 64, 16, 512), make_dims(1, 1500, 8, 1, 128, 32, 16, 64, 16, 300)}) {
    const Problem<float> p = test::random_problem<float>(dm, base_seed() + 37);
    const GpuResult in_turn = on_streams(1, [&] { return run_gpu<float>(p); });
    for (int n : {2, 3})
      EXPECT_EQ(first_difference(in_turn, on_streams(n, [&] { return run_gpu<float>(p); })), "")
          << dm.str() << " fp32, " << n << " streams";
    for (auto loop : {cuda::SelectionRowLoop::kUnion, cuda::SelectionRowLoop::kInverted}) {
      const LoopScope loop_scope(loop);
      const GpuResult one = on_streams(1, [&] { return run_gpu<bf16>(p); });
      for (int n : {2, 3})
        EXPECT_EQ(first_difference(one, on_streams(n, [&] { return run_gpu<bf16>(p); })), "")
            << dm.str() << " bf16, loop " << int(loop) << ", " << n << " streams";
    }
  }
}

// The fused compression + selection kernel's pipelined pass 1 (padded D = 128, h = 16 or 8)
// gives the bits of its one-tile-at-a-time schedule, in the full layout (D = 128, h = 16, ragged
// T) and the streamed one (1000 selection blocks at h = 8, D = 72: 16 positions per block with
// the ring, 8 with the full scores, on an H100's 227 KB). (That streamed shape is not a parity
// case: in bf16 its grad_q error against the CPU reached 1.04e-2 on one of five seeds, with
// 1000 compressed keys per late row; docs/performance.md, 2026-11-27, sixth session.)
TEST(NsaCuda, FusedPipelineGivesTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  for (const NsaDims& dm : {make_dims(1, 1111, 32, 2, 128, 32, 16, 64, 16, 256), make_dims(1, 8000, 8, 1, 72, 8, 8, 8, 8, 64)}) {
    const Problem<float> p = test::random_problem<float>(dm, base_seed() + 19);
    GpuResult plain, pipelined;
    {
      const FusedPipelineScope scope(false);
      plain = run_gpu<bf16>(p);
    }
    pipelined = run_gpu<bf16>(p);
    EXPECT_TRUE(bit_equal(plain, pipelined)) << dm.str();
  }
}

// Activation gradients are assigned (the initial contents do not matter), parameter
// gradients accumulated; null pointers skip outputs without changing the others. In T's
// storage: a bf16 buffer holds its initial contents rounded to bf16.
template <class T>
void check_gradient_convention() {
  const NsaDims dm = make_dims(1, 300, 4, 2, 32, 16, 8, 32, 4, 40);
  const Problem<float> p = test::random_problem<float>(dm, base_seed() + 11);
  const GpuResult base = run_gpu<T>(p);
  std::array<std::vector<float>, 12> init;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int k = 0; k < 12; ++k) {
    init[k].resize(p.x[k].size());
    for (auto& v : init[k]) v = nd(rng);
  }
  auto stored = [&](int k) {  // init[k] as its buffer holds it
    std::vector<float> v = init[k];
    if (k < 8)
      for (auto& e : v) e = float(T(e));
    return v;
  };
  RunOptions opt;
  opt.init = &init;
  const GpuResult acc = run_gpu<T>(p, opt);
  for (int k = 0; k < 12; ++k) {
    if (k < 8) {
      EXPECT_EQ(acc.grad[k], base.grad[k]) << "activation grad_" << test::kNames[k] << " assigned";
    } else {
      std::vector<float> want(init[k].size());
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = init[k][i] + base.grad[k][i];
      EXPECT_EQ(acc.grad[k], want) << "parameter grad_" << test::kNames[k] << " accumulated";
    }
  }
  // Only q, gate and cmp_pv requested: those match, the others keep their initial contents.
  RunOptions some;
  some.want.fill(false);
  some.want[0] = some.want[7] = some.want[11] = true;
  some.init = &init;
  const GpuResult part = run_gpu<T>(p, some);
  for (int k = 0; k < 12; ++k) {
    if (k == 0 || k == 7) EXPECT_EQ(part.grad[k], base.grad[k]) << test::kNames[k];
    else if (k == 11) EXPECT_EQ(part.grad[k], acc.grad[k]) << test::kNames[k];
    else EXPECT_EQ(part.grad[k], stored(k)) << test::kNames[k] << " untouched";
  }
  // Everything but q: the others as with q, q untouched.
  RunOptions no_q;
  no_q.want.fill(true);
  no_q.want[0] = false;
  no_q.init = &init;
  const GpuResult without_q = run_gpu<T>(p, no_q);
  for (int k = 0; k < 12; ++k) {
    if (k == 0) EXPECT_EQ(without_q.grad[k], stored(k)) << "q untouched";
    else EXPECT_EQ(without_q.grad[k], acc.grad[k]) << test::kNames[k];
  }
}

TEST(NsaCuda, GradientConvention) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  check_gradient_convention<float>();
}

// The same in bf16, with each loop of the selection row side (the inverted loop's backward
// computes only dq: without it, nothing).
TEST(NsaCuda, GradientConventionBf16) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  for (const auto loop : {cuda::SelectionRowLoop::kUnion, cuda::SelectionRowLoop::kInverted}) {
    const LoopScope scope(loop);
    SCOPED_TRACE(loop == cuda::SelectionRowLoop::kUnion ? "union" : "inverted");
    check_gradient_convention<bf16>();
  }
}

// The inference forward (no saved state) gives the same output bits.
TEST(NsaCuda, InferenceForward) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  const NsaDims dm = make_dims(2, 500, 6, 2, 64, 32, 16, 64, 4, 64);
  const Problem<float> p = test::random_problem<float>(dm, base_seed() + 13);
  RunOptions inf;
  inf.inference_forward = true;
  EXPECT_EQ(run_gpu<float>(p, inf).out, run_gpu<float>(p).out);
  EXPECT_EQ(run_gpu<bf16>(p, inf).out, run_gpu<bf16>(p).out);
}

TEST(NsaCuda, RejectsHeadDimAbove128) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  const NsaDims dm = make_dims(1, 64, 2, 1, 130, 32, 16, 64, 4, 64);
  NsaInputs<float> in;
  EXPECT_THROW(cuda::nsa_forward<float>(dm, in, nullptr, nullptr), UserError);
}

}  // namespace
}  // namespace nsatron::nsa
