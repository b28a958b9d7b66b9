// Pipeline parallelism: the 1F1B schedule (Megatron's non-interleaved one-forward-one-backward)
// and its interleaved form (virtual stages: parallel.virtual_stages) over the PP group,
// independent of the model. The model is cut into P * V contiguous chunks; PP rank s (pp.rank()
// of P = pp.size()) runs its V chunks (global chunks s, s + P, ..., s + (V - 1) P) on each of
// the step's A micro-batches, and the chunks pass activations forward (chunk c -> c + 1: rank s
// -> (s + 1) % P) and their gradients back, one tensor of a fixed shape, dtype and device per
// micro-batch, chunk and direction (CPU tensors over MPI, CUDA tensors over NCCL; sent through
// the Communicator's start_send / start_recv / wait where it posts them ahead, else its send,
// recv and send_recv).
//
// The schedules themselves, their order tables, memory bounds and deadlock arguments are in
// core/comm/pipeline_schedule.h (data: the steps of each rank, which the memory plan replays
// too); run_1f1b executes this rank's steps. Each chunk's micro-batches are forwarded and
// backwarded in order 0..A-1, so every parameter accumulates its micro-batches' gradients in
// the order one process would. (Model-level sums that span ranks, such as a tied embedding's
// two parts or the gradient norm, are added in another order: equal to rounding, not bit for
// bit.) tests/parallel/test_pipeline.cpp replays every rank's steps with blocking semantics for
// P <= 8, V <= 4 and A <= 16, and runs the schedules under mpirun with messages past MPI's
// eager limit.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/comm/communicator.h"
#include "core/comm/pipeline_schedule.h"
#include "core/tensor/tensor.h"

namespace nsatron::parallel {

struct PipelineStage {
  // Forward of local model chunk `chunk` (0 <= chunk < chunks) on micro-batch mb. `input`: the
  // previous chunk's output for mb (nullptr on the model's first chunk: chunk 0 of rank 0), a
  // fresh tensor the callback may keep. Returns this chunk's output, of activation_shape and
  // dtype (anything, e.g. an undefined Tensor, on the model's last chunk, chunk V - 1 of rank
  // P - 1: it is not sent).
  std::function<Tensor(int chunk, std::int64_t mb, const Tensor* input)> forward;
  // Backward of chunk `chunk` on micro-batch mb (each chunk's called in order 0..A-1).
  // `d_output`: the gradient of this chunk's output for mb from the next chunk (nullptr on the
  // model's last chunk). Returns the gradient of its input, of activation_shape and dtype
  // (ignored on the model's first chunk).
  std::function<Tensor(int chunk, std::int64_t mb, const Tensor* d_output)> backward;
  // Model chunks per rank (V, parallel.virtual_stages): 1 runs 1F1B, more the interleaved
  // schedule (which needs at least 2 ranks and a multiple of P micro-batches).
  int chunks = 1;
  // Shape, dtype and device of every message between chunks (activations and their
  // gradients). CUDA messages need a communicator that takes device tensors (NCCL).
  Shape activation_shape;
  DType dtype = DType::F32;
  Device device = Device::CPU;
};

// One training step's forward and backward of `micro_batches` micro-batches on this rank
// (pp.rank()), by 1F1B (stage.chunks == 1) or the interleaved 1F1B (stage.chunks > 1): the
// steps of schedule_pipeline. Collective over pp: every rank calls it with the same
// micro_batches, chunks, activation_shape and dtype. Receives are posted ahead and sends
// completed late (pipeline_events in core/comm/pipeline_schedule.h) where the backend posts
// them (pp.posts_ahead(): MPI); elsewhere (NCCL) each transfer is the blocking call at its step.
// Returns the receives posted before the computation ahead of them (0 where not posted ahead).
std::int64_t run_1f1b(Communicator& pp, std::int64_t micro_batches, const PipelineStage& stage);

// Forward only (evaluation), the steps of schedule_forward: with one chunk per rank, each rank
// for each micro-batch in order receives its input from s-1 (not on the first rank), runs its
// forward and sends the output to s+1 (not on the last rank), the ranks overlapping as a
// chain; with `chunks` > 1, the interleaved order's forwards in lockstep slots.
void run_pipeline_forward(Communicator& pp, std::int64_t micro_batches,
                          const std::function<Tensor(int chunk, std::int64_t mb, const Tensor* input)>& forward,
                          const Shape& activation_shape, DType dtype, Device device = Device::CPU, int chunks = 1);

}  // namespace nsatron::parallel
