// The NSA transformer on CUDA (fp32 and bf16 compute) against the CPU fp32 model on the same
// weights and tokens: loss and every parameter gradient.
//
// Bounds: fp32 on CUDA, 1e-4 relative (|a - b| <= 1e-4 * (|b| + rms(b)) per element: the
// matrix products and reductions sum in other orders); bf16 compute, the loss within 1e-2
// relative and each gradient tensor within 5e-2 relative L2 error (bf16 keeps 8 bits of
// mantissa in every activation).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/device/device.h"
#include "core/model/model.h"
#include "core/model/rng.h"

using namespace nsatron;

namespace {

ModelDims small_dims() {
  ModelDims d{};
  d.V = 97;
  d.C = 64;
  d.L = 2;
  d.H = 4;
  d.G = 2;
  d.D = 16;
  d.F = 96;
  d.cmp_block = 8;
  d.cmp_stride = 4;
  d.sel_block = 16;
  d.sel_count = 3;
  d.window = 24;
  d.rope_theta = 10000;
  d.norm_eps = 1e-5;
  d.init_std = 0.1;
  d.tie_embeddings = true;
  return d;
}

struct Batch {
  std::int64_t B = 2, T = 75;  // T not a multiple of any block
  std::vector<std::int32_t> tokens, targets;
};

Batch random_batch(std::uint64_t seed, std::int64_t V) {
  Batch b;
  SplitMix64 rng(seed);
  for (std::int64_t i = 0; i < b.B * b.T; ++i) {
    b.tokens.push_back(std::int32_t(rng.next() % std::uint64_t(V)));
    b.targets.push_back(std::int32_t(rng.next() % std::uint64_t(V)));
  }
  return b;
}

std::uint64_t fresh_seed() {
  std::uint64_t s = std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu\n", (unsigned long long)s);
  return s;
}

void copy_weights(NsaTransformer& from, NsaTransformer& to) {
  to.params().flat_weights().copy_from(from.params().flat_weights());
  to.sync_compute_weights();
}

}  // namespace

TEST(ModelCuda, Fp32MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const ModelDims d = small_dims();
  const std::uint64_t seed = fresh_seed();
  NsaTransformer cpu(d, DType::F32), gpu(d, DType::F32, Device::CUDA);
  cpu.params().initialize(seed);
  copy_weights(cpu, gpu);
  Batch b = random_batch(seed + 1, d.V);
  const double lc = cpu.forward_backward(b.tokens, b.targets, b.B, b.T);
  const double lg = gpu.forward_backward(b.tokens, b.targets, b.B, b.T);
  EXPECT_NEAR(lg, lc, 1e-5 * std::abs(lc));
  for (const auto& p : cpu.params().infos()) {
    const auto gc = cpu.params().grad(p).to_vector(), gg = gpu.params().grad(p).to_vector();
    double rms = 0;
    for (double v : gc) rms += v * v;
    rms = std::sqrt(rms / double(gc.size()));
    for (std::size_t i = 0; i < gc.size(); ++i)
      ASSERT_LE(std::abs(gg[i] - gc[i]), 1e-4 * (std::abs(gc[i]) + rms)) << p.name << "[" << i << "]";
  }
  EXPECT_NEAR(gpu.evaluate(b.tokens, b.targets, b.B, b.T), cpu.evaluate(b.tokens, b.targets, b.B, b.T), 1e-5 * lc);
}

TEST(ModelCuda, Bf16TracksCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const ModelDims d = small_dims();
  const std::uint64_t seed = fresh_seed();
  NsaTransformer cpu(d, DType::F32), gpu(d, DType::BF16, Device::CUDA);
  cpu.params().initialize(seed);
  copy_weights(cpu, gpu);
  Batch b = random_batch(seed + 1, d.V);
  const double lc = cpu.forward_backward(b.tokens, b.targets, b.B, b.T);
  const double lg = gpu.forward_backward(b.tokens, b.targets, b.B, b.T);
  EXPECT_NEAR(lg, lc, 1e-2 * std::abs(lc));
  for (const auto& p : cpu.params().infos()) {
    const auto gc = cpu.params().grad(p).to_vector(), gg = gpu.params().grad(p).to_vector();
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < gc.size(); ++i) err += (gg[i] - gc[i]) * (gg[i] - gc[i]), ref += gc[i] * gc[i];
    EXPECT_LE(std::sqrt(err), 5e-2 * std::sqrt(ref)) << p.name;
  }
}

TEST(ModelCuda, RecomputePoliciesGiveTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const ModelDims d = small_dims();
  const std::uint64_t seed = fresh_seed();
  Batch b = random_batch(seed + 1, d.V);
  std::vector<double> reference;
  double reference_loss = 0;
  for (RecomputePolicy policy : {RecomputePolicy::None, RecomputePolicy::Selective, RecomputePolicy::Full}) {
    NsaTransformer gpu(d, DType::BF16, Device::CUDA);
    gpu.params().initialize(seed);
    gpu.sync_compute_weights();
    gpu.set_recompute(policy, d.L);
    const double loss = gpu.forward_backward(b.tokens, b.targets, b.B, b.T);
    const auto grads = gpu.params().flat_grads().to_vector();
    if (reference.empty()) {
      reference = grads;
      reference_loss = loss;
    } else {
      EXPECT_EQ(loss, reference_loss);
      EXPECT_TRUE(grads == reference) << "policy " << int(policy);
    }
  }
}
