// Planning a run without running it: the parameter count of a model and the memory one rank
// needs to train it, in the accounting the trainer reports (docs/performance.md, "Memory per
// rank: what the plan counts").
//
// The trainer's figures (launch/train/step.cpp, log.cpp) come from memory_stats(device):
// every live Tensor's storage (its exact size) plus the attention core's saved state, which
// the model notes there while it holds it (core/model/model.cpp: hold_saved,
// nsa_core_cuda.cpp). Scratch that bypasses Tensor (std::vector on the CPU; cuBLAS, NSA and
// cross-entropy workspaces taken with cudaMalloc on CUDA) is not counted there, nor here.
//   peak_mem_bytes         = the static memory below + the step's activation peak
//   activation_peak_bytes  = the peak of the step above the memory live at its start
// The estimate replays, tensor by tensor and in the code's order, what the model allocates
// and frees over one optimizer step (the micro-batches of a stage, in the order of the
// pipeline schedule's steps under pipeline parallelism: core/comm/pipeline_schedule.h, 1F1B or
// interleaved, the very steps parallel/pipeline.cpp executes), and keeps the running peak: a
// formula from the dims, evaluated by walking the step, not a fit.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config/config.h"
#include "core/model/model.h"
#include "core/tensor/dtype.h"

namespace nsatron {

struct ParameterCount {
  std::int64_t total = 0;      // the whole model, each tensor once (a tied embedding once)
  std::int64_t embedding = 0;  // the token embedding plus an untied lm_head
  std::int64_t non_embedding() const { return total - embedding; }
};
// Equals NsaTransformer(dims, ...).num_params() of a single-rank model.
ParameterCount count_parameters(const ModelDims& dims);

// One rank's part of a step, for estimate_activation_bytes.
struct ActivationPlan {
  std::int64_t micro_batch = 1, seq_len = 1;  // B and T of a micro-batch
  std::int64_t micro_batches = 1;             // A: this rank's micro-batches per optimizer step
  RecomputePolicy policy = RecomputePolicy::None;
  std::int64_t recompute_layers = 0;          // policy Full: the layers with a global index below this recompute
  DType dtype = DType::F32;                   // the compute dtype
  Device device = Device::CPU;
  int tp = 1, tp_rank = 0;
  int pp = 1, pp_stage = 0;
  std::int64_t layer_begin = 0, layer_end = -1;  // this stage's layers; -1: to the last
  // Interleaved pipeline (parallel.virtual_stages): the layers of each of this stage's model
  // chunks, in increasing order (RunConfig::stage_chunks); empty: one chunk, [layer_begin,
  // layer_end). Needs micro_batches a multiple of pp when it holds several.
  std::vector<LayerRange> chunk_layers;
  std::int64_t head_chunk = NsaTransformer::kDefaultHeadChunk;
  // CUDA, bf16: NsaSavedCuda keeps the selection and window branch outputs (fp32) for the
  // one-pass row backward, as the kernels do since 2026-11-25 (docs/performance.md, change
  // 9), and where D > 64 the compression branch's (nsa::cuda_saved_branch_outputs, since
  // 2026-11-28). false: the saved state before that, which the GPU peaks recorded earlier
  // measured.
  bool nsa_saved_outputs = true;
  // CUDA, NSA: the core reads the projection p in place (NsaTransformer::projection_in_place:
  // a layer keeps p, no split parts, and its backward no gradient parts), as since 2026-11-28.
  // false: the split of before, which the GPU peaks recorded earlier measured.
  bool projection_in_place = true;
  // Tensor parallelism's row parts (parallel.tp_overlap, NsaTransformer::set_tp_overlap): with
  // tp > 1 and micro_batch >= 2 the ops around each layer's core run in two parts
  // (NsaTransformer::row_parts).
  bool tp_overlap = false;
  // Tensor parallelism's micro-batch pairs (parallel.tp_micro_batch_pairs,
  // NsaTransformer::forward_backward_pair_queued): with tp > 1, pp = 1 and micro_batches >= 2
  // the micro-batches two at a time, both forwards' activations held at once.
  bool micro_batch_pairs = false;
  // With the pairs on CUDA (NSA, in place): each layer's two cores as one call
  // (parallel.tp_pair_core = "joint", NsaTransformer::pair_core_joint), its projection, output,
  // saved state and gradients in [2N, ...] buffers, on the layers that keep the core's state.
  bool pair_core_joint = false;
  // pp > 1: whether the PP communicator posts receives ahead and completes sends late
  // (parallel::pipeline_events; the MPI backend, CPU ranks) or runs each transfer blocking at
  // its step (NCCL, GPU ranks). estimate_memory sets it from the device.
  bool pipeline_posts_ahead = true;
};
// The peak bytes one optimizer step allocates above the memory live at its start (the
// trainer's activation_peak_bytes; with pp = 1 also NsaTransformer::last_activation_peak_bytes
// of one forward_backward): the activations of the micro-batches in flight (under 1F1B, stage
// s keeps up to min(pp - s, A) of them; interleaved, up to min(W + 1, A V) chunk-micro-batches),
// what the recompute policy keeps and recomputes, the pipeline's messages (those received
// ahead of their use included), and the largest transient (the LM head's chunk of logits, the
// backward's gradient temporaries).
std::int64_t estimate_activation_bytes(const ModelDims& dims, const ActivationPlan& plan);

struct MemoryEstimate {        // bytes on one rank: the rank (pp stage, tp rank) that needs the most
  std::int64_t weights = 0;      // fp32 master weights + a separate compute copy (bf16 on CUDA) when the dtypes differ
  std::int64_t gradients = 0;    // fp32 flat gradients (and with tp > 1, pp = 1 and tied embeddings the
                                 // lookups' part of the embedding's: NsaTransformer::defer_lookup_grads)
  std::int64_t optimizer = 0;    // AdamW moments (ZeRO-1: this rank's owned share) and any other optimizer buffers
  std::int64_t activations = 0;  // peak of one optimizer step above the above (micro-batches in flight under 1F1B,
                                 // recompute policy, head chunk, transient buffers; the copy-engine
                                 // pipeline's receive slots)
  int pp_stage = 0, tp_rank = 0; // which rank this is
  std::int64_t total() const { return weights + gradients + optimizer + activations; }
};
// For a validated RunConfig (world_size set, so dp() is known): what the trainer allocates on
// the rank that needs most. Device and dtype from cfg.train. With ZeRO-1 the optimizer share
// is that of the DP rank that owns the most.
MemoryEstimate estimate_memory(const RunConfig& cfg);
// The same for the NSA saved state of the CUDA kernels before 2026-11-25 when
// nsa_saved_outputs is false (ActivationPlan::nsa_saved_outputs; the recorded GPU peaks of
// tests/model/test_memory_plan.cpp measured that layout), and the LM head's row chunk
// head_chunk (the GPU peaks recorded before 2026-11-26 (fourth session) ran at 1024 rows),
// and the split projection of before 2026-11-28 when projection_in_place is false
// (ActivationPlan::projection_in_place), and without the deferred lookups' gradient buffer
// of a tied embedding under tensor parallelism (before 2026-11-29, twenty-eighth session) when
// lookup_grads_apart is false.
MemoryEstimate estimate_memory(const RunConfig& cfg, bool nsa_saved_outputs,
                               std::int64_t head_chunk = NsaTransformer::kDefaultHeadChunk,
                               bool projection_in_place = true, bool lookup_grads_apart = true);

}  // namespace nsatron
