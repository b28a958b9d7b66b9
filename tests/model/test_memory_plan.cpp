// The memory plan (core/model/plan.h) against what the code allocates: parameter counts
// against the model; the activation estimate against the model's own peak (forward_backward,
// a tensor-parallel rank, pipeline stages under the real 1F1B schedule); the static part
// against the model and optimizer the trainer builds; and the whole estimate against the
// trainer's own peak_mem_bytes and activation_peak_bytes (run_training on the CPU).
//
// Tolerance on the CPU: none. Every byte memory_stats counts is a Tensor's exact size or the
// NSA core's noted saved state, and the plan replays those allocations in the code's order,
// so the estimates must equal the measurements to the byte. Scratch outside Tensor
// (std::vector in the CPU kernels, MPI buffers) is counted by neither. A change to what the
// model allocates shows up here as a difference of a few tensors, which the failure message
// prints in bytes and in units of one [N, C] activation. The CUDA accounting, which no GPU
// checks here, is held to the GPU peaks docs/performance.md records, to their printed digits.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/comm/single_communicator.h"
#include "core/device/device.h"
#include "core/model/model.h"
#include "core/model/plan.h"
#include "data/shard.h"
#include "launch/trainer.h"
#include "launch/world.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "tests/model/model_test_util.h"

namespace nsatron {
namespace {

namespace fs = std::filesystem;
using test::Batch;
using test::FakeGroup;
using test::dense;
using test::mid_dims;
using test::random_batch;

// ---- parameter counts ----------------------------------------------------------------------

ModelDims untied(ModelDims d) {
  d.tie_embeddings = false;
  return d;
}

void expect_counts(const ModelDims& d, const char* what) {
  const ParameterCount c = count_parameters(d);
  NsaTransformer model(d, DType::F32);
  EXPECT_EQ(c.total, model.num_params()) << what;
  EXPECT_EQ(c.embedding, d.V * d.C * (d.tie_embeddings ? 1 : 2)) << what;
  std::int64_t matrices = 0;  // everything but the embedding, the head and the norm gains
  for (const ParamInfo& p : model.params().infos())
    if (p.shape.size() > 1 && p.name != "model/embedding" && p.name != "model/lm_head") matrices += p.numel;
  const std::int64_t gains = (2 * d.L + 1) * d.C;
  EXPECT_EQ(c.non_embedding(), matrices + gains) << what;
}

TEST(MemoryPlan, ParameterCounts) {
  expect_counts(mid_dims(), "nsa, tied");
  expect_counts(untied(mid_dims()), "nsa, untied");
  expect_counts(dense(mid_dims()), "dense, tied");
  expect_counts(untied(dense(mid_dims())), "dense, untied");
}

// ---- the activation estimate against the model ---------------------------------------------

// One [N, C] fp32 activation, the unit of the failure messages.
std::string in_activations(std::int64_t diff, const ModelDims& d, std::int64_t N) {
  char buf[96];
  std::snprintf(buf, sizeof buf, " (difference %lld bytes = %.3f x [N, C])", (long long)diff,
                double(diff) / double(N * d.C * 4));
  return buf;
}

struct Case {
  ModelDims dims;
  RecomputePolicy policy = RecomputePolicy::None;
  std::int64_t layers = 0;
  std::int64_t B = 2, T = 128;
  std::int64_t chunk = NsaTransformer::kDefaultHeadChunk;
  std::string what;
};

ActivationPlan plan_of(const Case& c) {
  ActivationPlan p;
  p.micro_batch = c.B;
  p.seq_len = c.T;
  p.policy = c.policy;
  p.recompute_layers = c.layers;
  p.head_chunk = c.chunk;
  return p;
}

// forward_backward on the whole model: its last_activation_peak_bytes.
void expect_model_peak(const Case& c, int tp = 1, int tp_rank = 0, bool tp_overlap = false) {
  ModelShard shard;
  shard.tp = tp;
  shard.tp_rank = tp_rank;
  if (tp > 1) shard.tp_group = std::make_shared<FakeGroup>(tp_rank, tp);
  NsaTransformer model(c.dims, DType::F32, Device::CPU, shard);
  model.params().initialize(7);
  model.set_recompute(c.policy, c.layers);
  model.set_head_chunk(c.chunk);
  model.set_tp_overlap(tp_overlap);
  const Batch b = random_batch(c.dims.V, c.B, c.T, 11);
  model.forward_backward(b.tokens, b.targets, b.B, b.T);
  const std::int64_t measured = std::int64_t(model.last_activation_peak_bytes());
  ActivationPlan p = plan_of(c);
  p.tp = tp;
  p.tp_rank = tp_rank;
  p.tp_overlap = tp_overlap;
  const std::int64_t estimated = estimate_activation_bytes(c.dims, p);
  EXPECT_EQ(estimated, measured) << c.what << ", tp rank " << tp_rank << " of " << tp
                                 << in_activations(estimated - measured, c.dims, c.B * c.T);
}

std::vector<Case> policy_cases(const ModelDims& d, const std::string& attention) {
  const std::int64_t chunk = NsaTransformer::kDefaultHeadChunk;
  return {Case{d, RecomputePolicy::None, 0, 2, 128, chunk, attention + ", none"},
          Case{d, RecomputePolicy::Selective, 0, 2, 128, chunk, attention + ", selective"},
          Case{d, RecomputePolicy::Full, d.L, 2, 128, chunk, attention + ", full, all layers"},
          Case{d, RecomputePolicy::Full, d.L / 2, 2, 128, chunk, attention + ", full, half the layers"},
          // a small head chunk: the logits are no longer the peak's transient
          Case{d, RecomputePolicy::None, 0, 2, 128, 100, attention + ", none, head chunk 100"},
          Case{d, RecomputePolicy::Full, d.L, 2, 128, 100, attention + ", full, head chunk 100"}};
}

TEST(MemoryPlan, ActivationsMatchTheModelNsa) {
  for (const Case& c : policy_cases(mid_dims(), "nsa")) expect_model_peak(c);
}

TEST(MemoryPlan, ActivationsMatchTheModelDense) {
  for (const Case& c : policy_cases(dense(mid_dims()), "dense")) expect_model_peak(c);
}

// A vocabulary large enough that the LM head's chunk of logits makes the peak (N = 256 rows
// of 4096 logits), then a chunk small enough that it does not.
TEST(MemoryPlan, ActivationsMatchTheModelLargeVocabulary) {
  ModelDims d = mid_dims();
  d.V = 4096;
  const std::int64_t chunk = NsaTransformer::kDefaultHeadChunk;
  for (const Case& c : {Case{d, RecomputePolicy::None, 0, 2, 128, chunk, "nsa, none"},
                        Case{d, RecomputePolicy::Full, d.L, 2, 128, chunk, "nsa, full"},
                        Case{d, RecomputePolicy::Full, d.L, 2, 128, 16, "nsa, full, head chunk 16"},
                        Case{untied(dense(d)), RecomputePolicy::Selective, 0, 2, 128, chunk, "dense, selective"}})
    expect_model_peak(c);
}

// A tensor-parallel rank: its heads, groups, hidden units and vocabulary rows (an odd
// vocabulary: the two ranks hold 127 and 128 rows), the vocab-parallel loss's scratch.
TEST(MemoryPlan, ActivationsMatchATensorParallelRank) {
  ModelDims d = mid_dims();
  d.V = 255;
  for (const Case& c : {Case{d, RecomputePolicy::None, 0, 2, 128, 100, "nsa, none"},
                        Case{d, RecomputePolicy::Selective, 0, 2, 128, 1024, "nsa, selective"},
                        Case{dense(d), RecomputePolicy::Full, 2, 2, 128, 1024, "dense, full 2"}})
    for (int r = 0; r < 2; ++r) expect_model_peak(c, 2, r);
}

// The same with parallel.tp_overlap: each layer's ops around the core in two row parts (B = 2:
// one sequence each; B = 3: one and two), whose tensors live longer than one part's would.
TEST(MemoryPlan, ActivationsMatchATensorParallelRankInRowParts) {
  ModelDims d = mid_dims();
  d.V = 255;
  for (std::int64_t B : {2, 3})
    for (const Case& c : {Case{d, RecomputePolicy::None, 0, B, 128, 100, "nsa, none"},
                          Case{d, RecomputePolicy::Selective, 0, B, 128, 1024, "nsa, selective"},
                          Case{d, RecomputePolicy::Full, 2, B, 128, 1024, "nsa, full 2"},
                          Case{dense(d), RecomputePolicy::None, 0, B, 128, 100, "dense, none"},
                          Case{dense(d), RecomputePolicy::Selective, 0, B, 128, 1024, "dense, selective"},
                          Case{dense(d), RecomputePolicy::Full, 2, B, 128, 1024, "dense, full 2"}}) {
      SCOPED_TRACE("B = " + std::to_string(B));
      for (int r = 0; r < 2; ++r) expect_model_peak(c, 2, r, true);
    }
}

// parallel.tp_micro_batch_pairs: a step of A micro-batches on a tensor-parallel rank, two at
// a time (forward_backward_pair_queued, both forwards' activations held at once; an odd last
// one alone), every loss held to the step's end as the trainer holds them. The plan's peak is
// the step's, and above one micro-batch's at a time.
TEST(MemoryPlan, ActivationsMatchATensorParallelRankInMicroBatchPairs) {
  ModelDims d = mid_dims();
  d.V = 255;
  for (std::int64_t A : {2, 3, 4})
    for (const Case& c : {Case{d, RecomputePolicy::None, 0, 2, 128, 100, "nsa, none"},
                          Case{d, RecomputePolicy::Selective, 0, 1, 128, 1024, "nsa, selective"},
                          Case{d, RecomputePolicy::Full, 2, 2, 128, 1024, "nsa, full 2"},
                          Case{dense(d), RecomputePolicy::Full, 1, 2, 128, 100, "dense, full 1"}})
      for (int r = 0; r < 2; ++r) {
        SCOPED_TRACE(c.what + ", " + std::to_string(A) + " micro-batches, tp rank " + std::to_string(r));
        ModelShard shard;
        shard.tp = 2;
        shard.tp_rank = r;
        shard.tp_group = std::make_shared<FakeGroup>(r, 2);
        NsaTransformer model(c.dims, DType::F32, Device::CPU, shard);
        model.params().initialize(7);
        model.set_recompute(c.policy, c.layers);
        model.set_head_chunk(c.chunk);
        if (c.dims.tie_embeddings) model.defer_lookup_grads(true);  // as the trainer (pairs need it)
        const Batch b = random_batch(c.dims.V, c.B, c.T, 11);
        std::vector<Tensor> losses;
        const std::size_t base = memory_stats(Device::CPU).current;
        reset_peak_memory(Device::CPU);
        std::size_t peak = 0;
        for (std::int64_t m = 0; m < A; ++m) {
          if (m + 1 < A) {
            const std::array<Tensor, 2> two =
                model.forward_backward_pair_queued({{{b.tokens, b.targets}, {b.tokens, b.targets}}}, c.B, c.T);
            losses.insert(losses.end(), two.begin(), two.end());
            ++m;
          } else {
            losses.push_back(model.forward_backward_queued(b.tokens, b.targets, c.B, c.T));
          }
          peak = std::max(peak, memory_stats(Device::CPU).peak);  // (each call resets the peak)
        }
        const std::int64_t measured = std::int64_t(peak - base);
        ActivationPlan p = plan_of(c);
        p.micro_batches = A;
        p.tp = 2;
        p.tp_rank = r;
        p.micro_batch_pairs = true;
        const std::int64_t estimated = estimate_activation_bytes(c.dims, p);
        EXPECT_EQ(estimated, measured) << in_activations(estimated - measured, c.dims, c.B * c.T);
        p.micro_batch_pairs = false;
        EXPECT_GT(estimated, estimate_activation_bytes(c.dims, p));
      }
}

// Runs one optimizer step's micro-batches of pipeline stage s of pp under the trainer's 1F1B
// (parallel::run_1f1b, the stage callbacks as launch/train/step.cpp has them; interleaved when
// the model holds several chunks), the other stages played by a FakeGroup that posts ahead
// (`ahead`: as MPI between CPU ranks) or not (as NCCL). Returns the peak bytes above those
// live at the start.
std::int64_t measure_1f1b(NsaTransformer& model, int pp, int s, std::int64_t A, std::int64_t B, std::int64_t T,
                          bool ahead = true) {
  const Batch b = random_batch(model.dims().V, B, T, 5);
  std::vector<Tensor> losses;  // the last stage's, held (as the trainer does) until the step's end
  std::vector<std::deque<StageState>> in_flight(static_cast<std::size_t>(model.chunks()));
  parallel::PipelineStage stage;
  stage.chunks = model.chunks();
  stage.activation_shape = {B * T, model.dims().C};
  stage.forward = [&](int chunk, std::int64_t m, const Tensor* input) {
    auto& queue = in_flight[std::size_t(chunk)];
    queue.push_back(model.stage_forward(chunk, b.tokens, b.targets, input, B, T, 1.0 / double(A)));
    queue.back().micro_batch = m;
    if (model.chunk_last(chunk)) losses.push_back(queue.back().loss);
    return std::move(queue.back().output);
  };
  stage.backward = [&](int chunk, std::int64_t m, const Tensor* d_output) {
    auto& queue = in_flight[std::size_t(chunk)];
    EXPECT_EQ(queue.front().micro_batch, m);
    StageState st = std::move(queue.front());
    queue.pop_front();
    return model.stage_backward(st, d_output);
  };
  FakeGroup group(s, pp, ahead);
  const std::size_t base = memory_stats(Device::CPU).current;
  reset_peak_memory(Device::CPU);
  parallel::run_1f1b(group, A, stage);
  return std::int64_t(memory_stats(Device::CPU).peak - base);
}

// Stage s of pp alone, holding `chunks` (one layer range: the 1F1B schedule; several: the
// interleaved one): the (chunk-)micro-batches in flight (1F1B: min(pp - s, A)), the messages
// received ahead of their use, the embedding on the first chunk of stage 0, the head (and a
// tied embedding's copy) on the last chunk of the last stage. With the transfers posted ahead
// (the returned estimate: CPU ranks) and blocking (GPU ranks).
std::int64_t expect_chunks_peak(const ModelDims& d, int pp, int s, const std::vector<LayerRange>& chunks,
                                std::int64_t A, RecomputePolicy policy, std::int64_t layers) {
  const std::int64_t B = 1, T = 128;
  ModelShard shard;
  shard.chunks = chunks;
  NsaTransformer model(d, DType::F32, Device::CPU, shard);
  model.params().initialize(3);
  model.set_recompute(policy, layers);
  ActivationPlan p;
  p.micro_batch = B;
  p.seq_len = T;
  p.micro_batches = A;
  p.policy = policy;
  p.recompute_layers = layers;
  p.pp = pp;
  p.pp_stage = s;
  p.chunk_layers = chunks;
  std::int64_t estimated = 0;
  for (const bool ahead : {false, true}) {
    const std::int64_t measured = measure_1f1b(model, pp, s, A, B, T, ahead);
    p.pipeline_posts_ahead = ahead;
    estimated = estimate_activation_bytes(d, p);
    EXPECT_EQ(estimated, measured) << "stage " << s << " of " << pp << " with " << chunks.size() << " chunk(s), "
                                   << A << " micro-batches, posted ahead " << ahead
                                   << in_activations(estimated - measured, d, B * T);
  }
  return estimated;
}

// The 1F1B schedule: stage s holds the layers [L s / pp, L (s + 1) / pp).
void expect_stage_peak(const ModelDims& d, int pp, int s, std::int64_t A, RecomputePolicy policy,
                       std::int64_t layers) {
  const std::int64_t estimated =
      expect_chunks_peak(d, pp, s, {{d.L * s / pp, d.L * (s + 1) / pp}}, A, policy, layers);
  if (s == 0 && A >= pp) {  // the first stage holds pp micro-batches: more than one alone
    ActivationPlan one;
    one.seq_len = 128;
    one.policy = policy;
    one.recompute_layers = layers;
    one.pp = pp;
    one.layer_end = d.L / pp;
    EXPECT_GT(estimated, estimate_activation_bytes(d, one));
  }
}

TEST(MemoryPlan, ActivationsMatchPipelineStages) {
  ModelDims d = mid_dims();
  d.L = 3;
  for (int s = 0; s < 3; ++s) {
    expect_stage_peak(d, 3, s, 4, RecomputePolicy::None, 0);
    expect_stage_peak(d, 3, s, 2, RecomputePolicy::Full, 2);  // fewer micro-batches than stages
  }
  expect_stage_peak(dense(untied(d)), 3, 1, 5, RecomputePolicy::Selective, 0);
}

// The interleaved schedule: pp stages of V chunks of L / (pp V) layers, chunk c on stage c % pp.
void expect_interleaved_stage_peak(const ModelDims& d, int pp, int V, int s, std::int64_t A, RecomputePolicy policy,
                                   std::int64_t layers) {
  const std::int64_t per = d.L / (pp * V);
  std::vector<LayerRange> chunks;
  for (int v = 0; v < V; ++v) chunks.push_back({(v * pp + s) * per, (v * pp + s + 1) * per});
  expect_chunks_peak(d, pp, s, chunks, A, policy, layers);
}

TEST(MemoryPlan, ActivationsMatchInterleavedPipelineStages) {
  ModelDims d = mid_dims();
  d.L = 4;
  for (int s = 0; s < 2; ++s) {
    expect_interleaved_stage_peak(d, 2, 2, s, 4, RecomputePolicy::None, 0);
    expect_interleaved_stage_peak(d, 2, 2, s, 2, RecomputePolicy::Full, 3);  // as many micro-batches as stages
  }
  expect_interleaved_stage_peak(dense(untied(d)), 2, 2, 1, 6, RecomputePolicy::Selective, 0);
  d.L = 6;
  for (int s = 0; s < 3; ++s) expect_interleaved_stage_peak(d, 3, 2, s, 6, RecomputePolicy::None, 0);
  // Chunks need a multiple of pp micro-batches, and ranges in increasing order.
  ActivationPlan p;
  p.seq_len = 128;
  p.micro_batches = 4;
  p.pp = 3;
  p.chunk_layers = {{0, 1}, {3, 4}};
  EXPECT_THROW(estimate_activation_bytes(d, p), std::invalid_argument);
  p.micro_batches = 6;
  EXPECT_GT(estimate_activation_bytes(d, p), 0);
  p.chunk_layers = {{3, 4}, {0, 1}};
  EXPECT_THROW(estimate_activation_bytes(d, p), std::invalid_argument);
}

// ---- the static part -------------------------------------------------------------------------

const char* kDemoToml = R"([model]
vocab_size = 256
d_model = 128
n_layers = 4
n_heads = 4
n_kv_heads = 2
head_dim = 32
ffn_hidden = 384
[nsa]
cmp_block = 16
cmp_stride = 8
sel_block = 32
sel_count = 4
window = 64
[train]
seq_len = 256
micro_batch = 1
global_batch = 1
steps = 3
eval_every = 0
[optim]
warmup_steps = 1
[checkpoint]
every = 0
[log]
every = 1
)";

// The model and optimizer as build_model_and_optimizer makes them (launch/train/setup.cpp)
// hold exactly weights + gradients + optimizer. ZeRO-1 over 4 DP ranks: each rank's share
// (a FakeGroup for the DP group), the estimate being the largest.
TEST(MemoryPlan, StaticPartIsWhatModelAndOptimizerHold) {
  for (const bool zero1 : {false, true}) {
    const std::int64_t world = zero1 ? 4 : 1;
    const RunConfig cfg =
        parse_config(kDemoToml, "demo.toml",
                     {"parallel.zero1=" + std::string(zero1 ? "true" : "false"), "train.global_batch=" + std::to_string(world)},
                     world);
    const MemoryEstimate e = estimate_memory(cfg);
    std::int64_t most = 0;
    for (int r = 0; r < world; ++r) {
      const std::size_t before = memory_stats(Device::CPU).current;
      NsaTransformer model(ModelDims::from_config(cfg), DType::F32);
      const std::int64_t held_by_model = std::int64_t(memory_stats(Device::CPU).current - before);
      std::vector<ParamSegment> segments;
      for (const auto& p : model.params().infos()) segments.push_back({p.offset, p.numel, p.decay});
      std::shared_ptr<parallel::Communicator> dp;
      if (world == 1) dp = std::make_shared<parallel::SingleCommunicator>("dp");
      else dp = std::make_shared<FakeGroup>(r, int(world));
      parallel::DataParallelOptimizer opt(dp, model.params().flat_weights(), model.params().flat_grads(), segments,
                                          zero1);
      const std::int64_t held = std::int64_t(memory_stats(Device::CPU).current - before);
      EXPECT_EQ(held_by_model, e.weights + e.gradients) << "zero1 " << zero1;
      most = std::max(most, held);
    }
    EXPECT_EQ(most, e.weights + e.gradients + e.optimizer) << "zero1 " << zero1;
    EXPECT_EQ(e.weights, 4 * count_parameters(ModelDims::from_config(cfg)).total);
  }
}

// estimate_memory picks the rank that needs most: every rank of a pp = 2, tp = 2 layout
// built as the trainer builds it (model, optimizer) and run through one step's 1F1B, the
// other ranks played by FakeGroups; the estimate is the largest total, on its rank.
void expect_estimate_is_the_rank_that_needs_most(const std::vector<std::string>& overrides) {
  SCOPED_TRACE(::testing::PrintToString(overrides));
  const RunConfig cfg = parse_config(kDemoToml, "demo.toml", overrides, 4);
  const ModelDims d = ModelDims::from_config(cfg);
  std::int64_t most = -1;
  int most_stage = -1, most_rank = -1;
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < 2; ++r) {
      const std::size_t before = memory_stats(Device::CPU).current;
      ModelShard shard;
      shard.tp = 2;
      shard.tp_rank = r;
      shard.tp_group = std::make_shared<FakeGroup>(r, 2);
      shard.chunks = cfg.stage_chunks(s);
      NsaTransformer model(d, DType::F32, Device::CPU, shard);
      model.params().initialize(1);
      model.set_recompute(parse_recompute_policy(cfg.recompute.policy), cfg.recompute.layers);
      std::vector<ParamSegment> segments;
      for (const auto& p : model.params().infos()) segments.push_back({p.offset, p.numel, p.decay});
      parallel::DataParallelOptimizer opt(std::make_shared<parallel::SingleCommunicator>("dp"),
                                          model.params().flat_weights(), model.params().flat_grads(), segments, false);
      const std::int64_t held = std::int64_t(memory_stats(Device::CPU).current - before);
      const std::int64_t total =
          held + measure_1f1b(model, 2, s, cfg.grad_accum_steps(), cfg.train.micro_batch, cfg.train.seq_len);
      std::printf("  stage %d, tp rank %d: %lld bytes\n", s, r, (long long)total);
      if (total > most) most = total, most_stage = s, most_rank = r;
    }
  const MemoryEstimate e = estimate_memory(cfg);
  EXPECT_EQ(e.total(), most);
  EXPECT_EQ(e.pp_stage, most_stage);
  EXPECT_EQ(e.tp_rank, most_rank);
}

TEST(MemoryPlan, EstimateIsTheRankThatNeedsMost) {
  expect_estimate_is_the_rank_that_needs_most({"parallel.pp=2", "parallel.tp=2", "parallel.pp_layers=[1, 3]",
                                               "train.seq_len=128", "train.global_batch=3", "model.vocab_size=255"});
  // Interleaved: each stage holds two chunks of one layer ({[0, 1), [2, 3)} and {[1, 2), [3, 4)}).
  expect_estimate_is_the_rank_that_needs_most({"parallel.pp=2", "parallel.tp=2", "parallel.virtual_stages=2",
                                               "train.seq_len=128", "train.global_batch=4", "model.vocab_size=255"});
}

// ---- the CUDA accounting against recorded GPU peaks -----------------------------------------

// The 125M model (configs/nsa_125m.toml, bf16 on CUDA) against the peaks docs/performance.md
// records from H100 and H200 runs: memory_stats(CUDA).peak of bench/train_gpu's whole steps
// (its model and AdamW moments are the trainer's) and peak_mem_bytes of `nsatron train` under
// bench/parallel_gpu.sh (rank 0: pipeline stage 0, tensor-parallel rank 0, the ranks that
// need most here). The estimate is arithmetic, so this runs without a GPU. Tolerance: half a
// unit of the last digit recorded (0.01 or 0.1 GiB). (What CUDA allocates outside Tensor, the
// cuBLAS and NSA workspaces, is in neither figure.) Each peak is compared with the estimate
// of the NSA saved state it was measured with: since 2026-11-25 (change 9) the bf16 kernels
// keep the selection and window outputs (`outputs`); the earlier peaks measured the state
// without them (estimate_memory(cfg, false)); the peaks before 2026-11-28 measured the split
// projection (parts beside p: in_place false).
TEST(MemoryPlan, CudaEstimateMatchesRecordedGpuPeaks) {
  struct Recorded {
    std::vector<std::string> overrides;
    std::int64_t world;
    double gib, unit;
    const char* where;
    bool outputs = false;  // measured with the saved branch outputs
    std::int64_t head_chunk = 1024;  // the LM head's row chunk it ran with (the default until 2026-11-26)
    bool in_place = false;  // measured with the NSA core reading the projection in place (2026-11-28)
    bool lookups_apart = false;  // tp > 1: with the tied embedding's lookups' gradient apart (2026-11-29)
  };
  auto batch = [](int mb, const char* policy, int seq) {
    return std::vector<std::string>{"train.micro_batch=" + std::to_string(mb), "train.global_batch=" + std::to_string(mb),
                                    std::string("recompute.policy=") + policy, "train.seq_len=" + std::to_string(seq)};
  };
  const std::vector<Recorded> recorded = {
      {batch(16, "none", 2048), 1, 13.43, 0.01, "outside-core section, head chunk 4096: 13.43 GiB", true, 4096},
      {batch(16, "none", 2048), 1, 13.45, 0.01, "thirteenth session, the projection read in place: 13.45 GiB", true, 4096,
       true},
      {batch(16, "none", 2048), 1, 13.33, 0.01, "change 9 section, training: 13.33 GiB", true},
      {batch(64, "none", 2048), 1, 47.11, 0.01, "change 9 section, training: 47.11 GiB", true},
      {batch(16, "none", 2048), 1, 11.08, 0.01, "2026-11-25 section, training: 11.08 GiB"},
      {batch(64, "none", 2048), 1, 38.11, 0.01, "2026-11-25 section, training: 38.11 GiB"},
      {batch(16, "full", 2048), 1, 3.72, 0.01, "100k+ section, re-measured at 64757c0: 3.72 GiB"},
      {batch(16, "selective", 2048), 1, 8.6, 0.1, "100k+ section, train_gpu table"},
      {batch(8, "none", 2048), 1, 6.6, 0.1, "first 125M section"},
      {batch(48, "none", 2048), 1, 29.1, 0.1, "first 125M section"},
      {batch(1, "full", 8192), 1, 2.5, 0.1, "first 125M section"},
      {batch(1, "full", 32768), 1, 3.7, 0.1, "100k+ section, train_gpu table"},
      {batch(112, "none", 2048), 1, 65.15, 0.01, "memory limits table"},
      {batch(128, "none", 2048), 1, 74.16, 0.01, "memory limits table"},
      {batch(1, "full", 65536), 1, 5.37, 0.01, "memory limits table"},
      {batch(1, "full", 131072), 1, 8.68, 0.01, "memory limits table"},
      {{"parallel.pp=2", "train.global_batch=256", "parallel.pp_transport=nccl"}, 4, 10.4, 0.1,
       "GPU ranks, pp2 x dp2 (NCCL pipeline messages, the default then)"},
      {{"parallel.tp=2", "train.global_batch=256"}, 4, 6.7, 0.1, "GPU ranks, tp2 x dp2"},
  };
  for (const Recorded& r : recorded) {
    const RunConfig cfg = load_config(std::string(NSATRON_SOURCE_DIR) + "/configs/nsa_125m.toml", r.overrides, r.world);
    const double estimated = double(estimate_memory(cfg, r.outputs, r.head_chunk, r.in_place, r.lookups_apart).total()) / double(1 << 30);
    EXPECT_NEAR(estimated, r.gib, r.unit / 2) << r.where << ": " << ::testing::PrintToString(r.overrides);
  }
}

// ---- against the trainer ---------------------------------------------------------------------

std::vector<std::int64_t> field(const std::string& jsonl, const std::string& name) {
  std::vector<std::int64_t> out;
  const std::regex re("\"" + name + "\": ([0-9]+)");
  std::istringstream in(jsonl);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) out.push_back(std::stoll(m[1]));
  }
  return out;
}

// run_training in this process on a small shard of random bytes, in a directory of its own.
class TrainerMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "nsatron_memory_plan_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::mt19937 gen(1);
    std::vector<std::int32_t> tokens(20000);
    for (auto& t : tokens) t = std::int32_t(gen() % 256);
    data::write_llmc_shard((dir_ / "train_000.bin").string(), tokens);
  }
  void TearDown() override {
    std::error_code ec;
    if (!HasFailure()) fs::remove_all(dir_, ec);
  }

  // Trains 3 steps with `overrides`; checks the estimate against every step's record.
  void expect_estimate_matches(std::vector<std::string> overrides) {
    const std::string tag = ::testing::PrintToString(overrides);
    overrides.push_back("data.train=" + (dir_ / "train_000.bin").string());
    overrides.push_back("checkpoint.dir=" + (dir_ / ("ckpt" + std::to_string(runs_))).string());
    overrides.push_back("log.metrics=" + (dir_ / "metrics.jsonl").string());
    ++runs_;
    const RunConfig cfg = parse_config(kDemoToml, "demo.toml", overrides, 1);
    std::ostringstream out;
    World world;
    run_training(cfg, out, world);
    std::ifstream f(dir_ / "metrics.jsonl");
    const std::string jsonl((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::vector<std::int64_t> peak = field(jsonl, "peak_mem_bytes"), act = field(jsonl, "activation_peak_bytes");
    ASSERT_EQ(peak.size(), 3u) << jsonl;
    ASSERT_EQ(act.size(), 3u) << jsonl;
    const MemoryEstimate e = estimate_memory(cfg);
    const ModelDims d = ModelDims::from_config(cfg);
    const std::int64_t N = cfg.train.micro_batch * cfg.train.seq_len;
    std::printf("  %-62s peak %9lld / est %9lld   activations %8lld / est %8lld\n", tag.c_str(), (long long)peak[2],
                (long long)e.total(), (long long)act[2], (long long)e.activations);
    for (std::size_t s = 0; s < peak.size(); ++s) {
      EXPECT_EQ(e.total(), peak[s]) << tag << ", step " << s + 1 << in_activations(e.total() - peak[s], d, N);
      EXPECT_EQ(e.activations, act[s]) << tag << ", step " << s + 1 << in_activations(e.activations - act[s], d, N);
      // What was live when the step's micro-batches started: the model and the optimizer.
      EXPECT_EQ(e.weights + e.gradients + e.optimizer, peak[s] - act[s]) << tag << ", step " << s + 1;
    }
  }

  fs::path dir_;
  int runs_ = 0;
};

TEST_F(TrainerMemory, NsaRecomputeNone) { expect_estimate_matches({"recompute.policy=none"}); }
TEST_F(TrainerMemory, NsaRecomputeSelective) { expect_estimate_matches({"recompute.policy=selective"}); }
TEST_F(TrainerMemory, NsaRecomputeFull) { expect_estimate_matches({"recompute.policy=full"}); }
TEST_F(TrainerMemory, NsaRecomputeFullFirstLayers) {
  expect_estimate_matches({"recompute.policy=full", "recompute.layers=2"});
}
TEST_F(TrainerMemory, Dense) { expect_estimate_matches({"model.attention=dense"}); }
TEST_F(TrainerMemory, TwoAccumulatedMicroBatches) {
  expect_estimate_matches({"train.global_batch=2", "train.seq_len=128"});
}
TEST_F(TrainerMemory, LargeVocabulary) { expect_estimate_matches({"model.vocab_size=8192"}); }  // the logits peak
TEST_F(TrainerMemory, UntiedEmbeddings) { expect_estimate_matches({"model.tie_embeddings=false"}); }

}  // namespace
}  // namespace nsatron
