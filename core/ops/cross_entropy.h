// Softmax cross entropy over a vocabulary, averaged over tokens, with an ignore index.
//   this header            - the math, the Tensor-level entry points
//   cross_entropy.cpp      - the entry points
//   cpu/cross_entropy.cpp  - the CPU implementation (rows in parallel, fp64 reductions)
//   cuda/cross_entropy.cu  - the CUDA kernels, same contract: they work through the
//                            vocabulary in chunks and never hold fp32 logits for a batch;
//                            logits fp32 or bf16, lse and loss fp32 (the slice ops: fp64
//                            row results)
//
// Math: logits z [N, V] (any leading shape, V last), targets t [N] (int32):
//   lse_n  = log sum_v exp(z_nv)                                   saved, [N]
//   loss   = (1 / D) * sum over rows with t_n != ignore_index of (lse_n - z_{n,t_n})
// D, the denominator, is by default the number of non-ignored rows of this call; a caller
// that splits a batch (row chunks of the LM head, micro-batches) passes the count for the
// whole batch instead, so that the pieces add up to the batch mean. With no counted rows
// (D = 0) the loss and the gradient are 0 (PyTorch would give NaN).
//
// Backward, for upstream gradient dloss (ASSIGNED: dlogits is an activation gradient):
//   dz_nv = dloss / D * (softmax(z_n)_v - [v == t_n])        on counted rows
//   dz_nv = 0                                                on ignored rows
// dlogits may be logits itself: each row is read before it is overwritten, so no second
// [N, V] buffer is needed. cross_entropy_fused does forward and backward in one pass over
// each row, leaving dlogits in the logits buffer: the LM head runs it on row chunks
// (logits for a chunk, loss and dlogits, then the head's backward for that chunk), so the
// only [rows, V] buffer is the chunk's.
//
// Targets: an int32 array in the memory of the tensors' device. Each is ignore_index or in
// [0, V); any other value is an error that names its position.
// Deterministic: rows are independent and the loss is summed over rows in order.
//
// Vocabulary slices (the vocab-parallel cross entropy,
// core/ops/vocab_parallel_cross_entropy.h): logits z [N, V_r] hold the columns
// [vocab_start, vocab_start + V_r) of every row of a vocabulary of V split over ranks;
// targets t [N] are global ids. Four ops; between the first two the caller lays every rank's
// statistics end to end (an all-gather, in rank order):
//   cross_entropy_slice_stats:   this slice's own row statistics, stats [3N]
//                                stats[n]      = m_rn = max_{v in slice} z_nv
//                                stats[N + n]  = s_rn = sum_{v in slice} exp(z_nv - m_rn)
//                                stats[2N + n] = z_{n, t_n - vocab_start}  if the slice holds t_n,
//                                                else 0 (and 0 on ignored rows)
//   cross_entropy_slice_combine: the P slices' stats laid end to end, [P x 3N], into the global
//                                row_max[n]  = m_n = max_r m_rn
//                                sums[n]     = s_n = sum_r s_rn exp(m_rn - m_n)   (r in order; a
//                                              slice with m_rn = -inf adds nothing)
//                                sums[N + n] = zt_n = sum_r zt_rn   (exactly one slice holds t_n)
//                                the same arithmetic in the same order on every rank, so every
//                                rank gets the same bits
//   cross_entropy_slice_grad:    with the global m_n, s_n = sums[n], zt_n = sums[N + n]
//                                row_loss[n] = log s_n + m_n - zt_n           (= lse_n - z_{n,t_n})
//                                z_nv       <- scale (exp(z_nv - m_n) / s_n - [v == t_n - vocab_start])
//                                both 0 on ignored rows; the gradient replaces the logits.
//   cross_entropy_slice_loss:    loss += (sum_n row_loss[n]) / D (0 when D = 0), on the device:
//                                the chunk's loss added to a running fp64 total without a host
//                                read (CPU: rows in order; CUDA: ce's fixed-order block sum)
// So each slice's logits are read twice (the statistics, the gradient), with one collective of
// 3N numbers per rank between the reads, whatever the vocabulary size.
// With scale = dloss / D, the loss is sum_n row_loss[n] / D and the slices' gradients are
// the columns of cross_entropy_fused's, to rounding. stats, row_max, sums and row_loss are fp64
// tensors on the logits' device (so that the communicator gathers them in fp64). Logits: fp32
// or fp64 on the CPU (fp64 arithmetic), fp32 or bf16 on CUDA (a slice's (m_rn, s_rn) by the
// fused kernel's online softmax by pieces in fp32, the combination and the row results in
// fp64; one block per row, fixed-order reductions, the same bits run to run). Deterministic
// on both devices.
// Targets of a slice op: ignore_index or >= 0, and < vocab_size when the caller gives it
// (vocab_size > 0; without it a target beyond the whole vocabulary is owned by no slice and
// cannot be told from one owned by another rank). Any other value is an error, as above: the
// CPU throws std::invalid_argument naming its position; CUDA records it for check_id_errors()
// and makes the row NaN (its sums, hence on every rank its loss and gradient).
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor/tensor.h"

namespace nsatron {

struct CrossEntropyOptions {
  std::int32_t ignore_index = -100;  // PyTorch's default
  double denominator = 0;            // D; 0: the number of non-ignored targets of this call
  bool accumulate_loss = false;      // loss += this call's part instead of loss =
};

// Non-ignored targets (host memory; the CUDA path counts device targets itself).
std::int64_t count_targets(std::span<const std::int32_t> targets, std::int32_t ignore_index);

// logits [.., V]; loss: one element; lse: one element per row. All of one dtype and device.
void cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets,
                           Tensor& loss, Tensor& lse, const CrossEntropyOptions& opt = {});
// dlogits [.., V] (may be logits) from the saved lse.
void cross_entropy_backward(const Tensor& logits, std::span<const std::int32_t> targets,
                            const Tensor& lse, double dloss, Tensor& dlogits,
                            const CrossEntropyOptions& opt = {});
// Forward and backward in one pass: writes loss and replaces logits by dlogits.
void cross_entropy_fused(Tensor& logits, std::span<const std::int32_t> targets, Tensor& loss,
                         double dloss, const CrossEntropyOptions& opt = {});

// Vocabulary slices (see above). logits [.., V_r] (rows N = the leading dimensions); stats:
// 3N fp64 elements; gathered: P x 3N (P >= 1); row_max and row_loss: N, sums: 2N; all fp64 on
// the logits' device.
void cross_entropy_slice_stats(const Tensor& logits, std::span<const std::int32_t> targets,
                               std::int64_t vocab_start, std::int32_t ignore_index, Tensor& stats,
                               std::int64_t vocab_size = 0);
void cross_entropy_slice_combine(const Tensor& gathered, Tensor& row_max, Tensor& sums);
void cross_entropy_slice_grad(Tensor& logits, std::span<const std::int32_t> targets,
                              std::int64_t vocab_start, std::int32_t ignore_index,
                              const Tensor& row_max, const Tensor& sums, double scale,
                              Tensor& row_loss);
// row_loss: N fp64 elements, loss: one fp64 element, on one device.
void cross_entropy_slice_loss(const Tensor& row_loss, double denominator, Tensor& loss);

namespace cpu {
// Throws std::invalid_argument for the first target neither ignore_index nor in [0, V).
void check_targets(const std::int32_t* targets, std::int64_t N, std::int64_t V,
                   std::int32_t ignore_index, const char* what);
// Writes lse [N] (every row, ignored ones too) and returns sum over counted rows of
// (lse_n - z_{n,t_n}) in fp64. Targets are checked.
template <class T>
double cross_entropy_forward(T* lse, const T* logits, const std::int32_t* targets, std::int64_t N,
                             std::int64_t V, std::int32_t ignore_index);
// dlogits = scale * (softmax - onehot) on counted rows, 0 on ignored ones; scale = dloss / D.
// dlogits may alias logits.
template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse,
                            const std::int32_t* targets, std::int64_t N, std::int64_t V,
                            std::int32_t ignore_index, double scale);
// Both at once, in place; returns the same sum as cross_entropy_forward.
template <class T>
double cross_entropy_fused(T* logits, const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int32_t ignore_index, double scale);
// Vocabulary slices: logits [N, V] (V = V_r), fp64 row results. Targets are checked
// (ignore_index, or in [0, vocab_size) when vocab_size > 0, else >= 0).
template <class T>
void cross_entropy_slice_stats(double* stats, const T* logits, const std::int32_t* targets,
                               std::int64_t N, std::int64_t V, std::int64_t vocab_start,
                               std::int32_t ignore_index, std::int64_t vocab_size);
void cross_entropy_slice_combine(double* row_max, double* sums, const double* gathered,
                                 std::int64_t N, std::int64_t parts);
template <class T>
void cross_entropy_slice_grad(T* logits, double* row_loss, const std::int32_t* targets,
                              std::int64_t N, std::int64_t V, std::int64_t vocab_start,
                              std::int32_t ignore_index, const double* row_max,
                              const double* sums, double scale);
void cross_entropy_slice_loss(double* loss, const double* row_loss, std::int64_t N, double denominator);
}  // namespace cpu

namespace cuda {
// Device pointers (targets too), default stream. logits/dlogits of dtype `dt` (fp32 or bf16;
// arithmetic in fp32), lse and loss fp32. denominator > 0: D as given; otherwise the
// non-ignored targets are counted on the device. A bad target cannot throw here without a
// host synchronisation: its row's loss (hence the loss) and gradient become NaN, and it is
// recorded for check_id_errors() (declared in embedding.h; the record is shared).
// Scratch: N doubles (the row losses) and one for D.
void cross_entropy_forward(DType dt, float* loss, float* lse, const void* logits,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int32_t ignore_index, double denominator, bool accumulate_loss);
void cross_entropy_backward(DType dt, void* dlogits, const void* logits, const float* lse,
                            const std::int32_t* targets, std::int64_t N, std::int64_t V,
                            std::int32_t ignore_index, double dloss, double denominator);
void cross_entropy_fused(DType dt, void* logits, float* loss, const std::int32_t* targets,
                         std::int64_t N, std::int64_t V, std::int32_t ignore_index, double dloss,
                         double denominator, bool accumulate_loss);
// Vocabulary slices: logits of dtype `dt` (fp32 or bf16), stats / row_max / sums / row_loss
// fp64, targets on the device; one block per row (combine: one thread per row). A bad target
// (see above) is recorded and makes the row NaN: its s_rn and zt_rn (slice_stats), hence the
// combined sums on every rank, the row's loss and gradient (slice_grad).
void cross_entropy_slice_stats(DType dt, double* stats, const void* logits,
                               const std::int32_t* targets, std::int64_t N, std::int64_t V,
                               std::int64_t vocab_start, std::int32_t ignore_index,
                               std::int64_t vocab_size);
void cross_entropy_slice_combine(double* row_max, double* sums, const double* gathered,
                                 std::int64_t N, std::int64_t parts);
void cross_entropy_slice_grad(DType dt, void* logits, double* row_loss,
                              const std::int32_t* targets, std::int64_t N, std::int64_t V,
                              std::int64_t vocab_start, std::int32_t ignore_index,
                              const double* row_max, const double* sums, double scale);
void cross_entropy_slice_loss(double* loss, const double* row_loss, std::int64_t N, double denominator);
void check_id_errors();  // see embedding.h
}  // namespace cuda

}  // namespace nsatron
