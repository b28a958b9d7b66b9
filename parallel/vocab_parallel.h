// Vocab-parallel cross entropy: the LM head's logits are split by vocabulary over the
// tensor-parallel ranks, and the loss and its gradient are computed without ever gathering
// them (Megatron's scheme). Rank r holds the columns [vocab_start, vocab_start + V_r) of the
// logits of every row.
//
// Per row n, with z the logits across all ranks and t_n the target:
//   m_n   = max_v z_nv                       all-reduce max of the ranks' row maxima
//   s_n   = sum_v exp(z_nv - m_n)            all-reduce sum of the ranks' partial sums
//   zt_n  = z_{n, t_n}                       the owning rank contributes it, the others 0; all-reduce sum
//   loss  = (1/D) sum_n (log s_n + m_n - zt_n)        over rows whose target is not ignored
//   dz_nv = (dloss/D) (exp(z_nv - m_n)/s_n - [v == t_n])   on this rank's columns (0 on ignored rows)
// Three all-reduces of N numbers each, whatever the vocabulary size. Equal, to rounding, to
// cross_entropy_fused on the gathered logits (tested under mpirun).
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor/tensor.h"
#include "parallel/communicator.h"

namespace nsatron::parallel {

struct VocabParallelCE {
  std::int64_t vocab_start = 0;      // first global vocabulary id of this rank's columns
  std::int32_t ignore_index = -100;
  double denominator = 0;            // D; 0: the number of non-ignored targets
};

// logits [N, V_r] (CPU, fp32 or fp64) are replaced by dlogits; targets [N] are global ids.
// Returns this call's loss (the same on every rank of `tp`).
double vocab_parallel_cross_entropy(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                    double dloss, const VocabParallelCE& opt);

}  // namespace nsatron::parallel
