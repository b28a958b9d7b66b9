// Vocab-parallel cross entropy: the LM head's logits are split by vocabulary over the
// tensor-parallel ranks, and the loss and its gradient are computed without ever gathering
// them (Megatron's scheme). Rank r holds the columns [vocab_start, vocab_start + V_r) of the
// logits of every row.
//
// Per row n, with z the logits across all ranks, t_n the target, and each rank r's own
// statistics over its columns (m_rn its row max, s_rn = sum exp(z_nv - m_rn), zt_rn the target's
// logit if it holds it, else 0):
//   m_n   = max_v z_nv                 = max_r m_rn
//   s_n   = sum_v exp(z_nv - m_n)      = sum_r s_rn exp(m_rn - m_n)
//   zt_n  = z_{n, t_n}                 = sum_r zt_rn   (one rank holds it)
//   loss  = (1/D) sum_n (log s_n + m_n - zt_n)        over rows whose target is not ignored
//   dz_nv = (dloss/D) (exp(z_nv - m_n)/s_n - [v == t_n])   on this rank's columns (0 on ignored rows)
// Built from the vocabulary-slice ops of core/ops/cross_entropy.h, on the logits' device:
//   cross_entropy_slice_stats -> every rank's 3N statistics gathered over tp in rank order ->
//   cross_entropy_slice_combine (every rank the same arithmetic in rank order) ->
//   cross_entropy_slice_grad (scale = dloss / D) -> cross_entropy_slice_loss (the row losses
//   summed, / D, added to a running fp64 total on the device: no host read; the CPU sums the
//   rows in order, CUDA by a fixed-order block sum).
// Two reads of the rank's logits and one collective per call, whatever the vocabulary size: the
// statistics are gathered as a sum over `tp` of [P x 3N] blocks, each rank's own block filled
// and the others zero (x + 0 = x: exactly the gather), so that the exchange can be started
// and waited for later as any started all-reduce (Communicator::start_all_reduce / wait_all). The tensors are fp64 on the logits' device, so `tp` must take fp64 there:
// an MpiCommunicator for CPU logits, an NcclCommunicator for CUDA logits (or a
// SingleCommunicator for a group of one). Equal, to rounding, to cross_entropy_fused on the
// gathered logits (tested under mpirun, CPU and CUDA).
// The loss is the same bits on every rank (each gets the same reduced values).
// It sits with the op families (it only needs the Communicator interface) so that the model
// can use it without depending on parallel/; it keeps the namespace of tensor parallelism.
#pragma once
#include <cstdint>
#include <span>

#include "core/comm/communicator.h"
#include "core/tensor/tensor.h"

namespace nsatron::parallel {

struct VocabParallelCE {
  std::int64_t vocab_start = 0;      // first global vocabulary id of this rank's columns
  std::int32_t ignore_index = -100;
  double denominator = 0;            // D; 0: the number of non-ignored targets (CPU only: on
                                     // CUDA it must be given, as counting needs the host)
  std::int64_t vocab_size = 0;       // the whole vocabulary; > 0: targets >= it are errors
                                     // (without it such a target is owned by no rank and
                                     // goes unnoticed; negative ones are errors either way)
};

// logits [N, V_r] (CPU fp32/fp64, or CUDA fp32/bf16) are replaced by dlogits; targets [N] are
// global ids in the logits' device memory (host memory on the CPU). Adds this call's loss
// (the same on every rank of `tp`) to `loss`, one fp64 element on the logits' device, without
// reading anything on the host (the LM head's row chunks add up there; the step reads the
// total once). A bad target: the CPU throws std::invalid_argument on every rank alike; CUDA
// makes the loss NaN and records it for cuda::check_id_errors() (see cross_entropy.h).
// Collective over `tp`; every argument error is thrown before the first collective.
void vocab_parallel_cross_entropy(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                  double dloss, const VocabParallelCE& opt, Tensor& loss);
// The same, returning this call's loss (read on the host: on CUDA that waits for the device).
double vocab_parallel_cross_entropy(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                    double dloss, const VocabParallelCE& opt);

// The same in two halves, so that the exchange of one chunk's statistics runs beside other
// work (the LM head's next chunk: its product and statistics; the previous chunk's gradient
// and backward products):
//   VocabParallelCEChunk c = vocab_parallel_ce_start(tp, logits, targets, opt);
//   ... (no other collective on tp; a later vocab_parallel_ce_start or tp.wait_all() ends it)
//   vocab_parallel_ce_finish(c, dloss, loss);
// start checks the arguments (every error before any collective), computes this rank's
// statistics, waits for every all-reduce started on `tp` before it (tp.wait_all(): the previous
// chunk's exchange, so that its finish may follow this start), then starts this chunk's. finish runs after
// that exchange has ended (the caller's tp.wait_all() or next start): the combination, the
// gradient in place of the logits, the loss added. The chunk holds the logits (a view) and its
// fp64 scratch until finish. vocab_parallel_cross_entropy is start, tp.wait_all(), finish.
struct VocabParallelCEChunk {
  Tensor logits;                              // the caller's, replaced by dlogits in finish
  std::span<const std::int32_t> targets;
  VocabParallelCE opt;
  double denominator = 0;                     // D as resolved by start
  Tensor gathered, row_max, sums, row_loss;   // views of one fp64 scratch
};
VocabParallelCEChunk vocab_parallel_ce_start(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                             const VocabParallelCE& opt);
void vocab_parallel_ce_finish(VocabParallelCEChunk& chunk, double dloss, Tensor& loss);

}  // namespace nsatron::parallel
