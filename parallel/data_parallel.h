// Data parallelism over one flat parameter buffer: gradient reduction over the DP group, the
// global gradient norm, and AdamW, either replicated on every DP rank or with its state
// sharded over them (ZeRO stage 1, parallel.zero1).
//
// Each DP rank runs its own micro-batches with the loss scaled by 1 / (A * dp) (A: its
// micro-batches), so that the SUM over the DP ranks of the accumulated gradients is the
// gradient of the mean loss over the global batch; the reduction below is a plain sum.
//
// Replicated (zero1 = false):
//   reduce:  the flat gradient buffer is all-reduced (sum) in buckets of bucket_bytes, each
//            bucket one non-blocking call (Communicator::start_all_reduce; bounded message
//            size), all waited for before the norm. By default every bucket starts after the
//            backward, in buffer order. With overlap (parallel.overlap_grad_reduce, below) a
//            bucket starts during the step's last backward, as soon as all its gradients are
//            final: the same calls on the same buckets, only earlier, so the same bits.
//   norm:    global_norm of the full reduced buffer, the same bits on every rank
//   update:  AdamW over the full buffer with full moments m, v: the same bits on every rank
// Sharded (zero1 = true): the buffer is split into dp contiguous ranges of WHOLE tensors
// (segments), balanced by element count; DP rank r owns range r and holds only its moments.
//   reduce:  reduce-scatter of the gradients, laid out in blocks of the longest range
//            (padded), so rank r receives the summed gradient of its range
//   norm:    sum of squares of its range, all-reduced over DP, square root
//   update:  AdamW on its range only; then all-gather of the updated weights into every rank's
//            flat buffer (the same bits everywhere)
// Whole-tensor ranges keep every rank's moments a set of complete tensors, so each DP rank can
// write its own part of a checkpoint (owned_segments()).
//
// With dp = 1 both modes reduce nothing, and the norm and the update are those of a single
// process, bit for bit.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"
#include "core/ops/adamw.h"

namespace nsatron::parallel {

inline constexpr std::int64_t kDefaultBucketBytes = std::int64_t(25) << 20;  // 25 MiB

// dp contiguous ranges of whole segments: rank r owns elements [begin[r], begin[r+1]).
// Boundaries are the segment boundaries nearest to r * n / dp (ties: the earlier one); a
// rank may own nothing when there are fewer segments than ranks.
std::vector<std::int64_t> partition_segments(const std::vector<ParamSegment>& segments, int dp);

class DataParallelOptimizer {
 public:
  // weights, grads: flat fp32 buffers of one length on one device (the model's). segments
  // tile them (adamw.h). The DP communicator must take their dtype and device (a group of
  // one takes anything).
  DataParallelOptimizer(std::shared_ptr<Communicator> dp, Tensor weights, Tensor grads,
                        std::vector<ParamSegment> segments, bool zero1,
                        std::int64_t bucket_bytes = kDefaultBucketBytes);

  bool zero1() const { return zero1_; }
  int dp() const { return dp_->size(); }
  // Elements of the buffers this rank updates (all of them unless zero1).
  std::int64_t owned_begin() const { return begin_; }
  std::int64_t owned_end() const { return end_; }
  // The segments of [owned_begin, owned_end), offsets relative to the full buffer.
  const std::vector<ParamSegment>& owned_segments() const { return owned_; }
  // First and second moments of the owned range: owned_end - owned_begin elements.
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  std::int64_t buckets() const;
  std::int64_t bucket_bytes() const { return bucket_elems_ * std::int64_t(dtype_size(grads_.dtype())); }

  // Sums the gradients over DP (see above). After it, the gradients of the owned range are
  // the global ones (zero1: only those; the rest of the buffer is left as it was). Starts the
  // buckets that overlap has not started yet, in buffer order, and waits for every bucket.
  void reduce_gradients();

  // Overlap with the backward (replicated only; zero1 refuses it): after arm_overlap(), every
  // grads_ready(begin, end) says that the gradients of [begin, end) are final for this step
  // (each element reported at most once; they are not written again before
  // reduce_gradients()); a bucket's all-reduce starts as soon as its last element is
  // reported, so the buckets start in the order their gradients are finished (the backward's
  // order). Every DP rank reports the same ranges in the same order (the same model and
  // schedule), so they start the same collectives in the same order. reduce_gradients()
  // disarms. With dp = 1 both do nothing. Call arm_overlap before the last micro-batch's
  // backward (the earlier ones' gradients are not final) and feed grads_ready from the
  // model's hook (NsaTransformer::set_grads_ready_hook).
  void arm_overlap();
  void grads_ready(std::int64_t begin, std::int64_t end);
  // Buckets the last reduce_gradients() found started by grads_ready (for the tests).
  std::int64_t last_overlapped_buckets() const { return last_overlapped_; }
  // Tensor and pipeline parallelism: the model's gradient norm spans the ranks of `groups`
  // (the TP and PP groups), and the segments marked false in `counted` (replicas another
  // rank counts: TP-replicated norm gains, a tied embedding's copy on the last stage) are
  // left out of it. Without this call every segment counts and the norm is this DP group's.
  void set_norm_scope(std::vector<std::shared_ptr<Communicator>> groups, std::vector<bool> counted);
  // The global L2 norm of the reduced gradients; the same value on every rank.
  double grad_norm();
  // AdamW at step t with grad_scale (the clip factor), on the owned range; zero1 then
  // all-gathers the weights. extra.compute_copy: as adamw_step, for the full buffer (zero1:
  // refreshed from the gathered weights by the caller).
  void step(const AdamWHyper& hp, std::int64_t t, double grad_scale, const AdamWExtra& extra = {});

 private:
  std::shared_ptr<Communicator> dp_;
  Tensor weights_, grads_;
  std::vector<ParamSegment> segments_, owned_;
  bool zero1_;
  std::int64_t bucket_elems_;
  std::vector<std::int64_t> ranges_;  // zero1: partition_segments
  std::int64_t begin_ = 0, end_ = 0, block_ = 0;
  Tensor m_, v_;
  std::vector<std::shared_ptr<Communicator>> norm_groups_;
  std::vector<bool> counted_;  // per segment; empty: all
  Tensor padded_, mine_;  // zero1: [dp * block] staging for the collectives, [block] own slice
  // Overlap: armed for this step; per bucket, elements not reported final yet, and started.
  bool armed_ = false;
  std::vector<std::int64_t> missing_;
  std::vector<bool> started_;
  std::int64_t last_overlapped_ = 0;
  void start_bucket(std::int64_t k);
};

}  // namespace nsatron::parallel
