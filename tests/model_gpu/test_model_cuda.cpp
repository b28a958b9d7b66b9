// The NSA transformer on CUDA (fp32 and bf16 compute) against the CPU fp32 model on the same
// weights and tokens: loss and every parameter gradient; with NSA and with dense attention.
//
// Bounds: fp32 on CUDA, 1e-4 relative (|a - b| <= 1e-4 * (|b| + rms(b)) per element: the
// matrix products and reductions sum in other orders); bf16 compute, the loss within 1e-2
// relative and each gradient tensor within 5e-2 relative L2 error (bf16 keeps 8 bits of
// mantissa in every activation).
// And a micro-batch queued without a host synchronisation; a tensor-parallel rank's micro-batch
// pairs with the NSA cores joint against a call each, and the memory plan of both.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "core/device/device.h"
#include "core/model/model.h"
#include "core/model/plan.h"
#include "core/util/op_timer.h"
#include "tests/model/model_test_util.h"

using namespace nsatron;

namespace {

using test::Batch;
using test::dense;
using test::mid_dims;
using test::random_batch;

std::uint64_t fresh_seed() {
  std::uint64_t s = std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu\n", (unsigned long long)s);
  return s;
}

// The CPU fp32 model and a CUDA model of `dtype` on the same weights and batch (T = 75: not a
// multiple of any block); returns both losses and leaves the gradients in the models.
struct Pair {
  NsaTransformer cpu, gpu;
  double cpu_loss = 0, gpu_loss = 0, cpu_eval = 0, gpu_eval = 0;
  Pair(const ModelDims& d, DType dtype, std::uint64_t seed) : cpu(d, DType::F32), gpu(d, dtype, Device::CUDA) {
    cpu.params().initialize(seed);
    gpu.params().flat_weights().copy_from(cpu.params().flat_weights());
    gpu.sync_compute_weights();
    Batch b = random_batch(d.V, 2, 75, seed + 1);
    cpu_loss = cpu.forward_backward(b.tokens, b.targets, b.B, b.T);
    gpu_loss = gpu.forward_backward(b.tokens, b.targets, b.B, b.T);
    cpu_eval = cpu.evaluate(b.tokens, b.targets, b.B, b.T);
    gpu_eval = gpu.evaluate(b.tokens, b.targets, b.B, b.T);
  }
};

}  // namespace

static void expect_fp32_matches_cpu(const ModelDims& d) {
  Pair m(d, DType::F32, fresh_seed());
  EXPECT_NEAR(m.gpu_loss, m.cpu_loss, 1e-5 * std::abs(m.cpu_loss));
  EXPECT_NEAR(m.gpu_eval, m.cpu_eval, 1e-5 * std::abs(m.cpu_eval));
  for (const auto& p : m.cpu.params().infos()) {
    const auto gc = m.cpu.params().grad(p).to_vector(), gg = m.gpu.params().grad(p).to_vector();
    double rms = 0;
    for (double v : gc) rms += v * v;
    rms = std::sqrt(rms / double(gc.size()));
    for (std::size_t i = 0; i < gc.size(); ++i)
      ASSERT_LE(std::abs(gg[i] - gc[i]), 1e-4 * (std::abs(gc[i]) + rms)) << p.name << "[" << i << "]";
  }
}

TEST(ModelCuda, Fp32MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_fp32_matches_cpu(mid_dims());
}

TEST(ModelCuda, DenseFp32MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_fp32_matches_cpu(dense(mid_dims()));
}

static void expect_bf16_tracks_cpu(const ModelDims& d) {
  Pair m(d, DType::BF16, fresh_seed());
  EXPECT_NEAR(m.gpu_loss, m.cpu_loss, 1e-2 * std::abs(m.cpu_loss));
  EXPECT_NEAR(m.gpu_eval, m.cpu_eval, 1e-2 * std::abs(m.cpu_eval));
  for (const auto& p : m.cpu.params().infos()) {
    const auto gc = m.cpu.params().grad(p).to_vector(), gg = m.gpu.params().grad(p).to_vector();
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < gc.size(); ++i) err += (gg[i] - gc[i]) * (gg[i] - gc[i]), ref += gc[i] * gc[i];
    EXPECT_LE(std::sqrt(err), 5e-2 * std::sqrt(ref)) << p.name;
  }
}

TEST(ModelCuda, Bf16TracksCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_bf16_tracks_cpu(mid_dims());
}

TEST(ModelCuda, DenseBf16TracksCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_bf16_tracks_cpu(dense(mid_dims()));
}

static void expect_policies_give_the_same_bits(const ModelDims& d) {
  const std::uint64_t seed = fresh_seed();
  Batch b = random_batch(d.V, 2, 75, seed + 1);
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

TEST(ModelCuda, RecomputePoliciesGiveTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_policies_give_the_same_bits(mid_dims());
}

TEST(ModelCuda, DenseRecomputePoliciesGiveTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_policies_give_the_same_bits(dense(mid_dims()));
}

// A micro-batch is queued without waiting for the device (forward_backward_queued: no host
// synchronisation inside a step). The default stream is held by a host function until the
// call has returned: had the step waited for the device (a copy to or from pageable memory,
// a cudaFree, a loss read), the stream would have drained before the call returned (the gate
// gives up after 20 s, so a failure cannot hang). Four micro-batches first grow every cache:
// the allocator's blocks, the ops' and the NSA core's workspaces, cuBLASLt's plans, the NSA
// saved-state pool and the eight pinned staging buffers of the token ids.
static void expect_a_micro_batch_is_queued(ModelDims d, RecomputePolicy policy) {
  d.L = 2;  // few launches: they must all fit the launch queue while the stream is held
  NsaTransformer gpu(d, DType::BF16, Device::CUDA);
  gpu.params().initialize(7);
  gpu.sync_compute_weights();
  gpu.set_recompute(policy, d.L);
  Batch b = random_batch(d.V, 2, 75, 8);
  double warm = 0;
  for (int i = 0; i < 4; ++i) warm = gpu.forward_backward(b.tokens, b.targets, b.B, b.T);
  struct Gate {
    std::atomic<bool> open{false};
  } gate;
  ASSERT_EQ(cudaLaunchHostFunc(
                nullptr,
                [](void* p) {
                  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
                  while (!static_cast<Gate*>(p)->open.load() && std::chrono::steady_clock::now() < give_up)
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                },
                &gate),
            cudaSuccess);
  const Tensor loss = gpu.forward_backward_queued(b.tokens, b.targets, b.B, b.T);
  const bool held = cudaStreamQuery(nullptr) == cudaErrorNotReady;  // the gate still holds the stream
  gate.open = true;
  EXPECT_TRUE(held) << "the micro-batch waited for the device (policy " << int(policy) << ")";
  EXPECT_EQ(loss.to_vector()[0], warm);  // the same weights and batch: the same loss
  cuda_synchronize();
}

TEST(ModelCuda, AMicroBatchIsQueuedWithoutWaitingForTheDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (RecomputePolicy policy : {RecomputePolicy::None, RecomputePolicy::Full}) {
    expect_a_micro_batch_is_queued(mid_dims(), policy);
    expect_a_micro_batch_is_queued(dense(mid_dims()), policy);
  }
}

// op_timer on the GPU: the scopes take the spare CUDA events reserve_events made (two each),
// then new ones; reset makes every scope's events spares again; release_events destroys them.
// The families are timed as with new events.
TEST(ModelCuda, ProfileScopesTakeTheReservedEvents) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  op_timer::reset();
  op_timer::release_events();
  op_timer::reserve_events(6);
  EXPECT_EQ(op_timer::spare_events(), 6u);
  op_timer::enable(true);
  { const op_timer::Scope s("matmul", Device::CUDA); }
  EXPECT_EQ(op_timer::spare_events(), 4u);
  {
    const op_timer::Scope a("rmsnorm", Device::CUDA), b("swiglu", Device::CUDA), c("embedding", Device::CUDA);
  }  // six events: the four spares, then two new ones
  EXPECT_EQ(op_timer::spare_events(), 0u);
  op_timer::enable(false);
  const auto totals = op_timer::totals_ms();
  EXPECT_EQ(totals.size(), 4u);
  for (const auto& [family, ms] : totals) EXPECT_GE(ms, 0.0) << family;
  op_timer::reset();
  EXPECT_EQ(op_timer::spare_events(), 8u);
  EXPECT_TRUE(op_timer::totals_ms().empty());
  op_timer::release_events();
  EXPECT_EQ(op_timer::spare_events(), 0u);
}

// parallel.tp_pair_core = "joint": a tensor-parallel rank's pair of micro-batches
// (forward_backward_pair_queued) with each layer's two NSA cores in one call over both
// micro-batches' sequences, against a call per micro-batch, on one GPU, the TP group's sums
// faked (test::FakeGroup: the same, meaningless, sums in both runs; both ranks' shares). fp32:
// the losses and every gradient equal to the bound above (the core's sums over sequences and
// its kernels' splits follow the call's size); with full recompute of the first layer, that
// layer's cores run a call each. And the memory plan (core/model/plan.h) gives each run's
// measured peak.
struct PairRun {
  std::array<double, 2> losses{};
  std::vector<double> grads;
  std::int64_t measured = 0, estimated = 0;
};

static PairRun run_pair(const ModelDims& d, int tp_rank, RecomputePolicy policy, std::int64_t layers, bool joint,
                        std::uint64_t seed) {
  const std::int64_t B = 2, T = 75;
  const Batch b0 = random_batch(d.V, B, T, seed + 1), b1 = random_batch(d.V, B, T, seed + 2);
  ModelShard shard;
  shard.tp = 2;
  shard.tp_rank = tp_rank;
  shard.tp_group = std::make_shared<test::FakeGroup>(tp_rank, 2);
  NsaTransformer gpu(d, DType::F32, Device::CUDA, shard);
  gpu.params().initialize(seed);
  gpu.set_recompute(policy, layers);
  gpu.defer_lookup_grads(true);  // tied embeddings: as the trainer (pairs need it)
  gpu.set_pair_core_joint(joint);
  cuda_synchronize();
  const std::size_t base = memory_stats(Device::CUDA).current;
  reset_peak_memory(Device::CUDA);
  const std::array<Tensor, 2> losses =
      gpu.forward_backward_pair_queued({{{b0.tokens, b0.targets}, {b1.tokens, b1.targets}}}, B, T);
  PairRun r;
  r.measured = std::int64_t(memory_stats(Device::CUDA).peak - base);
  gpu.add_lookup_grads();
  for (int i = 0; i < 2; ++i) r.losses[std::size_t(i)] = losses[std::size_t(i)].to_vector()[0];
  r.grads = gpu.params().flat_grads().to_vector();
  ActivationPlan p;
  p.micro_batch = B;
  p.seq_len = T;
  p.micro_batches = 2;
  p.policy = policy;
  p.recompute_layers = layers;
  p.dtype = DType::F32;
  p.device = Device::CUDA;
  p.tp = 2;
  p.tp_rank = tp_rank;
  p.micro_batch_pairs = true;
  p.pair_core_joint = joint;
  r.estimated = estimate_activation_bytes(d, p);
  return r;
}

TEST(ModelCuda, JointPairCoresFollowSeparateCoresAndThePlan) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const ModelDims d = mid_dims();
  const std::uint64_t seed = fresh_seed();
  for (int tp_rank = 0; tp_rank < 2; ++tp_rank)
    for (const auto& [policy, layers] : {std::pair{RecomputePolicy::None, std::int64_t(0)},
                                         std::pair{RecomputePolicy::Full, std::int64_t(1)}}) {
      SCOPED_TRACE("tp rank " + std::to_string(tp_rank) + ", policy " + std::to_string(int(policy)));
      const PairRun separate = run_pair(d, tp_rank, policy, layers, false, seed);
      const PairRun joint = run_pair(d, tp_rank, policy, layers, true, seed);
      for (int i = 0; i < 2; ++i)
        EXPECT_NEAR(joint.losses[std::size_t(i)], separate.losses[std::size_t(i)],
                    1e-5 * std::abs(separate.losses[std::size_t(i)]));
      double rms = 0;
      for (double v : separate.grads) rms += v * v;
      rms = std::sqrt(rms / double(separate.grads.size()));
      ASSERT_EQ(joint.grads.size(), separate.grads.size());
      for (std::size_t i = 0; i < joint.grads.size(); ++i)
        ASSERT_LE(std::abs(joint.grads[i] - separate.grads[i]), 1e-4 * (std::abs(separate.grads[i]) + rms))
            << "flat gradient [" << i << "]";
      EXPECT_EQ(separate.estimated, separate.measured) << "a core call per micro-batch";
      EXPECT_EQ(joint.estimated, joint.measured) << "the pair's cores joint";
    }
}
