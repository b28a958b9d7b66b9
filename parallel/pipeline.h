// Pipeline parallelism: the 1F1B schedule (Megatron's non-interleaved one-forward-one-backward)
// over the PP group, independent of the model. The model is cut into P contiguous stages; PP
// rank s (pp.rank() of P = pp.size()) runs stage s on each of the step's A micro-batches, and
// the stages pass activations forward (s -> s + 1) and their gradients back (s + 1 -> s), one
// tensor of a fixed shape, dtype and device per micro-batch and direction (CPU tensors over
// MPI, CUDA tensors over NCCL; sent through the Communicator).
//
// Stage s, with W = min(P - s - 1, A) warmup micro-batches:
//   warmup    W times:      recv input from s-1, forward, send output to s+1
//   steady    A - W times:  forward mb f, then backward mb b (f = W + i, b = i):
//                             the output of f goes to s+1 and the gradient of b comes back from
//                             s+1 in one send_recv; the input gradient of b goes to s-1 and the
//                             input of f + 1 comes from s-1 in one send_recv (the last
//                             iteration only sends)
//   cooldown  W times:      recv output gradient from s+1, backward, send input gradient to s-1
// The first stage has no s-1 (no input: forward gets nullptr, its input gradients are dropped),
// the last no s+1 (its output is dropped; backward gets nullptr: the loss is its own).
// Micro-batches are forwarded in order 0..A-1 and backwarded in order 0..A-1 on every stage,
// so each stage's parameters accumulate their micro-batches' gradients in the order one
// process would. (Model-level sums that span stages, such as a tied embedding's two parts or
// the gradient norm, are added in another order: equal to rounding, not bit for bit.)
//
// Order of the calls for P = 4, A = 6, F and B taking one slot each and messages free
// (the last stage alternates from the start; stage s starts with P - s - 1 forwards):
//   stage 0: F0 F1 F2 F3 .. .. .. B0 F4 B1 F5 B2 .. B3 .. B4 .. B5
//   stage 1: .. F0 F1 F2 .. .. B0 F3 B1 F4 B2 F5 B3 .. B4 .. B5 ..
//   stage 2: .. .. F0 F1 .. B0 F2 B1 F3 B2 F4 B3 F5 B4 .. B5 .. ..
//   stage 3: .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 .. .. ..
// (the bubble: P - 1 slots of each direction per step, so A >> P keeps the stages busy).
//
// Memory: stage s holds at most min(P - s, A) micro-batches in flight (forwarded and not yet
// backwarded): W + 1 at the end of the warmup, and each steady iteration adds one and
// retires one. The first stage holds the most; the last holds one.
//
// Deadlock: every transfer is a blocking send, recv or send_recv (MPI_Sendrecv), which MPI may
// complete only once the peer has posted the matching receive (large messages); NCCL enqueues
// them on the stream, where a send waits for its peer's receive the same way. The pairing
// above never waits in a cycle, for any P and A (A < P included: no steady phase, the warmup
// and cooldown are a chain); tests/parallel/test_pipeline.cpp replays every stage's steps
// with such blocking semantics for P <= 8, A <= 16, and runs the schedule under mpirun with
// messages past MPI's eager limit.
//
// With P == 1 it is: for each micro-batch, forward then backward, with no communication.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/comm/communicator.h"
#include "core/tensor/tensor.h"

namespace nsatron::parallel {

struct PipelineStage {
  // Forward of micro-batch mb. `input`: the previous stage's output for mb (nullptr on the first
  // stage), a fresh tensor the callback may keep. Returns this stage's output, of
  // activation_shape and dtype (anything, e.g. an undefined Tensor, on the last stage: it is
  // not sent).
  std::function<Tensor(std::int64_t mb, const Tensor* input)> forward;
  // Backward of micro-batch mb (called in order 0..A-1). `d_output`: the gradient of this
  // stage's output for mb from the next stage (nullptr on the last stage). Returns the gradient
  // of its input, of activation_shape and dtype (ignored on the first stage).
  std::function<Tensor(std::int64_t mb, const Tensor* d_output)> backward;
  // Shape, dtype and device of every message between stages (activations and their
  // gradients). CUDA messages need a communicator that takes device tensors (NCCL).
  Shape activation_shape;
  DType dtype = DType::F32;
  Device device = Device::CPU;
};

// One training step's forward and backward of `micro_batches` micro-batches on this stage
// (pp.rank()), by the 1F1B schedule above. Collective over pp: every stage calls it with the
// same micro_batches, activation_shape and dtype.
void run_1f1b(Communicator& pp, std::int64_t micro_batches, const PipelineStage& stage);

// Forward only (evaluation): each stage, for each micro-batch in order: receive its input from
// s-1 (not on the first stage), forward, send the output to s+1 (not on the last stage).
// Stages overlap as a chain: stage s works on mb while s+1 works on mb - 1.
void run_pipeline_forward(Communicator& pp, std::int64_t micro_batches,
                          const std::function<Tensor(std::int64_t mb, const Tensor* input)>& forward,
                          const Shape& activation_shape, DType dtype, Device device = Device::CPU);

// ---- the schedule as data (what run_1f1b executes; tests replay it) -----------------------------

enum class PipelineOp {
  RecvForward,              // recv the input of fwd_mb from s-1
  Forward,                  // forward of fwd_mb
  SendForward,              // send the output of fwd_mb to s+1
  SendForwardRecvBackward,  // send_recv with s+1: the output of fwd_mb out, the gradient of bwd_mb in
  Backward,                 // backward of bwd_mb
  SendBackward,             // send the input gradient of bwd_mb to s-1
  RecvBackward,             // recv the output gradient of bwd_mb from s+1
  SendBackwardRecvForward,  // send_recv with s-1: the input gradient of bwd_mb out, the input of fwd_mb in
};

struct PipelineStep {
  PipelineOp op;
  std::int64_t fwd_mb = -1;  // the micro-batch of the forward or activation (-1: none)
  std::int64_t bwd_mb = -1;  // the micro-batch of the backward or gradient (-1: none)
};

// The steps of stage `stage` of `stages` for `micro_batches`, in order, without the transfers
// to a stage that does not exist (none at all when stages == 1).
std::vector<PipelineStep> schedule_1f1b(int stage, int stages, std::int64_t micro_batches);

}  // namespace nsatron::parallel
