// The step's ops outside the NSA core, one at a time, at a config's shapes on one GPU: time per
// call (CUDA events over --reps calls after one warm-up), the bytes each call must move and
// the bandwidth that makes (against the device's peak), or for the matrix products the
// FLOP/s (against 989 TFLOP/s, H100/H200 dense bf16); and, times the calls in one micro-batch
// of the model's step (recompute "none"), the family's expected share of train_gpu --profile.
//
//   build/bench/ops_gpu [CONFIG] [--micro N] [--reps N] [--head-chunk ROWS] [--set section.key=value]...
//
// --head-chunk: the LM head's row chunk (default the model's, 1024): each chunk's dW reads and
// writes the whole fp32 gradient of the [V, C] head, so the chunk sets that product's
// arithmetic intensity.
//
// Bytes per call (e the compute dtype's size, X = N C e): rmsnorm 2X, add_rmsnorm 4X,
// rmsnorm backward 3X (4X with the residual gradient), swiglu forward 3 N F e and backward
// 5 N F e, the projection's split or join 2 N G group_width e (its padded rows as the model
// lays them out), the fused cross entropy 2 R V e
// per head chunk of R rows (read once into shared memory, the gradient written; the
// vocab-parallel slice ops, printed apart: R V e for the statistics, 2 R V e for the loss and
// gradient), and
// AdamW 30 bytes per parameter (p, grad, m, v read in fp32; p, m, v written; the bf16
// compute copy), once per step over the model's parameters (not per micro-batch).
// Random inputs; the random targets of the cross entropy make its loss meaningless and its
// time real.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/device/device.h"
#include "core/model/model.h"
#include "core/ops/adamw.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/linear.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/swiglu.h"

using namespace nsatron;

namespace {

// ms per call of f: one warm-up call, then reps calls between two events.
double time_ms(const std::function<void()>& f, int reps) {
  f();
  void* a = create_event();
  void* b = create_event();
  record_event(a);
  for (int i = 0; i < reps; ++i) f();
  record_event(b);
  const double ms = event_elapsed_ms(a, b) / reps;
  destroy_event(a);
  destroy_event(b);
  return ms;
}

double peak_bytes_per_s() {
  int dev = 0, khz = 0, bits = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  return 2.0 * double(khz) * 1e3 * double(bits) / 8.0;  // double data rate
}

struct Table {
  double peak_bw = peak_bytes_per_s();
  double total_ms = 0;
  void memory(const char* name, double calls, double ms, double bytes) {
    const double bw = bytes / (ms * 1e-3);
    std::printf("  %-34s %5.0f x %8.3f ms = %7.2f ms   %7.1f MB  %6.0f GB/s  %5.1f%% of peak\n", name, calls, ms,
                calls * ms, bytes / 1e6, bw / 1e9, 100 * bw / peak_bw);
    total_ms += calls * ms;
  }
  void flops(const char* name, double calls, double ms, double flop) {
    const double rate = flop / (ms * 1e-3);
    std::printf("  %-34s %5.0f x %8.3f ms = %7.2f ms   %7.1f GF  %6.0f TF/s  %5.1f%% of 989\n", name, calls, ms,
                calls * ms, flop / 1e9, rate / 1e12, 100 * rate / 989e12);
    total_ms += calls * ms;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string path = "configs/nsa_125m.toml";
  std::int64_t micro = 16;
  int reps = 20;
  std::int64_t head_chunk = NsaTransformer::kDefaultHeadChunk;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else if (a == "--micro" && i + 1 < argc) micro = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--head-chunk" && i + 1 < argc) head_chunk = std::atoll(argv[++i]);
    else path = a;
  }
  if (!cuda_available()) {
    std::printf("no CUDA device: %s\n", cuda_device_summary().c_str());
    return 0;
  }
  const RunConfig cfg = load_config(path, overrides);
  const ModelDims d = ModelDims::from_config(cfg);
  const DType dt = cfg.train.dtype == "bf16" ? DType::BF16 : DType::F32;
  const double e = double(dtype_size(dt));
  const std::int64_t N = micro * cfg.train.seq_len, C = d.C, F = d.F, V = d.V, L = d.L, G = d.G;
  const std::int64_t Pg = d.group_width(), R = std::min(N, head_chunk);
  const double X = double(N * C) * e, heads = double((N + R - 1) / R);
  std::printf("device %s (peak memory bandwidth %.0f GB/s)\nconfig %s, %lld x %lld tokens, %s\n",
              cuda_device_summary().c_str(), peak_bytes_per_s() / 1e9, path.c_str(), (long long)micro,
              (long long)cfg.train.seq_len, cfg.train.dtype.c_str());
  auto dev = [&](const Shape& s, DType t) { return Tensor::zeros(s, t, Device::CUDA); };
  // A uniform draw in [0, 1) from a 64-bit LCG state (its top 53 bits).
  auto uniform = [](std::uint64_t& z) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    return double(z >> 11) / double(1ull << 53);
  };
  auto rnd = [&](const Shape& s, DType type) {
    Tensor h = Tensor::empty(s, DType::F32);
    float* p = h.data<float>();
    std::uint64_t z = 12345;
    for (std::int64_t i = 0; i < h.numel(); ++i) p[i] = float(uniform(z) - 0.5);
    return h.to_dtype(type).to(Device::CUDA);
  };
  Table t;

  std::printf(" memory-bound ops (calls per micro-batch x ms per call = ms per micro-batch):\n");
  {  // The projection's split into the core's parts and the join of their gradients.
    const std::vector<std::int64_t> widths = d.attention == Attention::Dense
                                                 ? std::vector<std::int64_t>{d.heads_per_group() * d.D, d.D, d.D}
                                                 : std::vector<std::int64_t>{d.heads_per_group() * d.D, d.D, d.D, d.D, d.D,
                                                                             d.D, d.D, 3 * d.heads_per_group()};  // model.cpp's
    // As the model lays them out: p [N, pitch], G groups per row, part k [N, G w_k].
    const PackedColumns layout{.groups = G, .pitch = d.projection_pitch()};
    Tensor p = rnd({N, d.projection_pitch()}, dt);
    std::vector<Tensor> parts;
    for (std::int64_t w : widths) parts.push_back(dev({N, G * w}, dt));
    std::vector<Tensor*> pp;
    for (Tensor& q : parts) pp.push_back(&q);
    const std::vector<const Tensor*> cp(pp.begin(), pp.end());
    // The CUDA NSA model reads p in place (model.h): no split or join per step there, dp's pad
    // zeroed, wqkv's rows regrouped per product (forward and dX) and dW's back (fp32).
    const bool in_place = d.attention == Attention::Nsa;
    t.memory("split_columns (projection)", in_place ? 0.0 : double(L),
             time_ms([&] { split_columns(p, pp, layout); }, reps), 2.0 * double(N * G * Pg) * e);
    t.memory("join_columns (gradients)", in_place ? 0.0 : double(L), time_ms([&] { join_columns(cp, p, layout); }, reps),
             2.0 * double(N * G * Pg) * e);
    const std::int64_t used = G * Pg, pitch = d.projection_pitch();
    t.memory("zero_columns (dp's pad)", in_place ? double(L) : 0.0, time_ms([&] { zero_columns(p, used, pitch); }, reps),
             double(N * (pitch - used)) * e);
    Tensor w = rnd({used, C}, dt), wr = dev({pitch, C}, dt);
    Tensor gw = rnd({used, C}, DType::F32), gr = dev({used, C}, DType::F32);
    t.memory("regroup_rows (wqkv's copy)", in_place ? double(2 * L) : 0.0,
             time_ms([&] { regroup_rows(w, wr, widths, G, true); }, reps), 2.0 * double(used * C) * e);
    t.memory("regroup_rows (dW back, fp32)", in_place ? double(L) : 0.0,
             time_ms([&] { regroup_rows(gw, gr, widths, G, false); }, reps), 8.0 * double(used * C));
  }
  {
    Tensor a = rnd({N, C}, dt), b = rnd({N, C}, dt), w = rnd({C}, dt), h = dev({N, C}, dt), y = dev({N, C}, dt);
    Tensor rstd = dev({N}, DType::F32), dx = dev({N, C}, dt), dw = dev({C}, DType::F32);
    t.memory("rmsnorm forward", 1, time_ms([&] { rmsnorm_forward(a, w, y, rstd, 1e-5); }, reps), 2 * X);
    t.memory("add_rmsnorm forward", double(2 * L),
             time_ms([&] { add_rmsnorm_forward(a, b, w, h, y, rstd, 1e-5); }, reps), 4 * X);
    t.memory("rmsnorm backward + residual grad", double(2 * L),
             time_ms([&] { rmsnorm_backward(y, a, w, rstd, dx, dw, &b); }, reps), 4 * X);
    t.memory("rmsnorm backward", 1, time_ms([&] { rmsnorm_backward(y, a, w, rstd, dx, dw); }, reps), 3 * X);
  }
  {
    Tensor u = rnd({N, 2 * F}, dt), out = dev({N, F}, dt), du = dev({N, 2 * F}, dt);
    t.memory("swiglu forward", double(L), time_ms([&] { swiglu_forward(u, out); }, reps), 3.0 * double(N * F) * e);
    t.memory("swiglu backward", double(L), time_ms([&] { swiglu_backward(out, u, du); }, reps), 5.0 * double(N * F) * e);
  }
  {
    Tensor logits = rnd({R, V}, dt), loss = dev({1}, DType::F32);
    std::vector<std::int32_t> host(static_cast<std::size_t>(R));
    for (std::int64_t i = 0; i < R; ++i) host[std::size_t(i)] = std::int32_t((i * 7919) % V);
    void* ids = cuda_alloc(host.size() * sizeof(std::int32_t));
    memcpy_any(ids, host.data(), host.size() * sizeof(std::int32_t), CopyKind::HostToDevice);
    const std::span<const std::int32_t> targets(static_cast<const std::int32_t*>(ids), host.size());
    CrossEntropyOptions ce;
    ce.denominator = double(N);
    ce.accumulate_loss = true;
    t.memory("cross entropy (fused, a head chunk)", heads,
             time_ms([&] { cross_entropy_fused(logits, targets, loss, 1.0, ce); }, reps), 2.0 * double(R * V) * e);
    // The vocab-parallel cross entropy's two passes over a rank's slice (tp > 1 runs them
    // instead of the fused pass; a tp2 rank's slice: --set model.vocab_size=V/2), without the
    // all-gather and the per-row combination between them: left out of the total.
    Tensor stats = dev({3 * R}, DType::F64), row_max = dev({R}, DType::F64), sums = dev({2 * R}, DType::F64),
           row_loss = dev({R}, DType::F64);
    cross_entropy_slice_stats(logits, targets, 0, ce.ignore_index, stats, V);
    cross_entropy_slice_combine(stats, row_max, sums);
    const double slice = double(R * V) * e, saved = t.total_ms;
    t.memory("  vocab slice: statistics", heads,
             time_ms([&] { cross_entropy_slice_stats(logits, targets, 0, ce.ignore_index, stats, V); }, reps),
             slice);
    t.memory("  vocab slice: loss and gradient", heads, time_ms([&] {
               cross_entropy_slice_grad(logits, targets, 0, ce.ignore_index, row_max, sums, 1.0 / double(N), row_loss);
             }, reps), 2.0 * slice);
    t.total_ms = saved;
    cuda_free(ids);
  }
  {  // The embedding's backward (the forward is a row copy): the gradient rows of each token id
    // summed in position order, so a frequent id is a long serial sum. Uniform ids (train_gpu's
    // random tokens), and byte text: ids of a geometric law over 256 values, the most
    // frequent ~18% of the positions as ' ' in the KJV text of the demo.
    Tensor dout = rnd({N, C}, dt), dtable = dev({V, C}, DType::F32);
    for (const bool skewed : {false, true}) {
      std::vector<std::int32_t> host(static_cast<std::size_t>(N));
      std::uint64_t z = 777;
      for (std::int64_t i = 0; i < N; ++i) {
        const double u = uniform(z);
        host[std::size_t(i)] = skewed ? std::int32_t(std::min(255.0, -std::log1p(-u) / 0.2))
                                      : std::int32_t((z >> 20) % std::uint64_t(V));
      }
      void* ids = cuda_alloc(host.size() * sizeof(std::int32_t));
      memcpy_any(ids, host.data(), host.size() * sizeof(std::int32_t), CopyKind::HostToDevice);
      const std::span<const std::int32_t> tokens(static_cast<const std::int32_t*>(ids), host.size());
      t.memory(skewed ? "embedding backward (byte-text ids)" : "embedding backward (uniform ids)", skewed ? 0 : 1,
               time_ms([&] { embedding_backward(tokens, dout, dtable); }, reps), double(N * C) * e + 2.0 * double(N * C) * 4);
      cuda_free(ids);
    }
  }
  {  // AdamW over the model's flat fp32 buffers with the bf16 compute copy, the model's segments
    // (decay on and off). Once per optimiser step: shown, not counted per micro-batch.
    std::vector<ParamSegment> segs;
    std::int64_t P = 0;
    for (const ParamInfo& p : NsaTransformer::rank_parameters(d, 1, 0, 0, d.L)) {
      segs.push_back({p.offset, p.numel, p.decay});
      P = std::max(P, p.offset + p.numel);
    }
    Tensor p = rnd({P}, DType::F32), g = rnd({P}, DType::F32);
    Tensor m = dev({P}, DType::F32), v = dev({P}, DType::F32), copy = dev({P}, dt);
    const AdamWHyper hp{};
    std::int64_t step = 0;
    std::printf(" once per step (%lld parameters):\n", (long long)P);
    const double ms = time_ms([&] { adamw_step(p, g, m, v, segs, hp, ++step, 1.0, {.compute_copy = &copy}); }, reps);
    const double saved = t.total_ms;
    t.memory("adamw (bf16 compute copy)", 1, ms, double(P) * (28.0 + e));
    t.total_ms = saved;
  }
  const double memory_ms = t.total_ms;

  std::printf(" matrix products (cuBLASLt; dW accumulates into fp32):\n");
  // pitch > 0: y and dy rows of `pitch` elements (the fused projection's padded rows).
  auto product = [&](const char* name, double calls, std::int64_t rows, std::int64_t in, std::int64_t out,
                     std::int64_t pitch = 0) {
    Tensor x = rnd({rows, in}, dt), w = rnd({out, in}, dt), y = dev({rows, pitch > 0 ? pitch : out}, dt);
    Tensor dx = dev({rows, in}, dt), dw = dev({out, in}, DType::F32);
    const double flop = 2.0 * double(rows) * double(in) * double(out);
    const std::string n(name);
    t.flops((n + " forward").c_str(), calls, time_ms([&] { linear_forward(x, w, nullptr, y, pitch); }, reps), flop);
    t.flops((n + " dX").c_str(), calls,
            time_ms([&] { linear_backward(y, x, w, {.dx = &dx, .dy_pitch = pitch}); }, reps), flop);
    t.flops((n + " dW").c_str(), calls,
            time_ms([&] { linear_backward(y, x, w, {.dw = &dw, .dy_pitch = pitch}); }, reps), flop);
  };
  product("wqkv", double(L), N, C, G * Pg, d.projection_pitch());  // padded rows, as the model
  product("wqkv unpadded (compare)", 0, N, C, G * Pg);             // not in the step: 0 calls
  // The product over whole padded rows (weight rows past G * Pg zero in the model): is it the
  // extent (not a multiple of 8 or 64) that keeps cuBLASLt off its fast kernels?
  product("wqkv extent to a multiple of 8 (compare)", 0, N, C, (G * Pg + 7) / 8 * 8, d.projection_pitch());
  product("wqkv extent = pitch (compare)", 0, N, C, d.projection_pitch());
  product("wo", double(L), N, d.H * d.D, C);
  product("w_gate|w_up", double(L), N, C, 2 * F);
  product("w_out", double(L), N, F, C);
  product("lm head (a chunk)", heads, R, C, V);
  std::printf(" per micro-batch: memory-bound ops %.2f ms, matrix products %.2f ms\n", memory_ms, t.total_ms - memory_ms);
  return 0;
}
