#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/ops/grad_norm.h"
#include "core/util/error.h"
#include "core/util/op_timer.h"

namespace nsatron::parallel {

std::vector<std::int64_t> partition_segments(const std::vector<ParamSegment>& segments, int dp) {
  NSA_CHECK(dp >= 1, "partition_segments: dp = ", dp);
  cpu::check_segments(segments, segments.empty() ? 0 : segments.back().offset + segments.back().numel);
  const std::int64_t n = segments.empty() ? 0 : segments.back().offset + segments.back().numel;
  std::vector<std::int64_t> bounds{0};  // every segment boundary
  for (const auto& s : segments) bounds.push_back(s.offset + s.numel);
  std::vector<std::int64_t> begin(std::size_t(dp) + 1, n);
  begin[0] = 0;
  for (int r = 1; r < dp; ++r) {
    // The boundary nearest to the ideal split r * n / dp (in exact integer arithmetic),
    // never before the previous rank's start.
    const std::int64_t lo = begin[std::size_t(r) - 1];
    std::int64_t best = n;
    long double best_dist = -1;
    for (std::int64_t b : bounds) {
      if (b < lo) continue;
      const long double dist = std::fabs((long double)(b) * dp - (long double)(n) * r);
      if (best_dist < 0 || dist < best_dist) best = b, best_dist = dist;
    }
    begin[std::size_t(r)] = best;
  }
  return begin;
}

DataParallelOptimizer::DataParallelOptimizer(std::shared_ptr<Communicator> dp, Tensor weights, Tensor grads,
                                             std::vector<ParamSegment> segments, bool zero1,
                                             std::int64_t bucket_bytes)
    : dp_(std::move(dp)),
      weights_(std::move(weights)),
      grads_(std::move(grads)),
      segments_(std::move(segments)),
      zero1_(zero1) {
  NSA_CHECK(weights_.numel() == grads_.numel() && weights_.ndim() == 1 && grads_.ndim() == 1,
            "DataParallelOptimizer: flat buffers of one length, got ", weights_.describe(), " and ", grads_.describe());
  NSA_CHECK(weights_.dtype() == DType::F32 && grads_.dtype() == DType::F32, "DataParallelOptimizer: fp32 buffers");
  NSA_CHECK(bucket_bytes >= 4, "DataParallelOptimizer: bucket_bytes = ", bucket_bytes);
  cpu::check_segments(segments_, weights_.numel());
  bucket_elems_ = bucket_bytes / std::int64_t(dtype_size(grads_.dtype()));
  const Device device = weights_.device();
  const std::int64_t n = weights_.numel();
  if (!zero1_ || dp_->size() == 1) {
    begin_ = 0;
    end_ = n;
    owned_ = segments_;
  } else {
    ranges_ = partition_segments(segments_, dp_->size());
    begin_ = ranges_[std::size_t(dp_->rank())];
    end_ = ranges_[std::size_t(dp_->rank()) + 1];
    for (int r = 0; r < dp_->size(); ++r)
      block_ = std::max(block_, ranges_[std::size_t(r) + 1] - ranges_[std::size_t(r)]);
    for (const auto& s : segments_)
      if (s.offset >= begin_ && s.offset < end_) owned_.push_back(s);
    padded_ = Tensor::zeros({block_ * dp_->size()}, DType::F32, device);
    mine_ = Tensor::zeros({block_}, DType::F32, device);
  }
  m_ = Tensor::zeros({end_ - begin_}, DType::F32, device);
  v_ = Tensor::zeros({end_ - begin_}, DType::F32, device);
}

std::int64_t DataParallelOptimizer::buckets() const {
  if (dp_->size() == 1) return 0;
  if (zero1_) return 1;
  return (grads_.numel() + bucket_elems_ - 1) / bucket_elems_;
}

void DataParallelOptimizer::start_bucket(std::int64_t k) {
  const std::int64_t at = k * bucket_elems_;
  Tensor bucket = grads_.slice0(at, std::min(grads_.numel(), at + bucket_elems_));
  dp_->start_all_reduce(bucket, ReduceOp::Sum);
  started_[std::size_t(k)] = true;
}

void DataParallelOptimizer::arm_overlap() {
  NSA_CHECK(!zero1_ || dp_->size() == 1,
            "DataParallelOptimizer: overlap of the reduction with the backward is not built for zero1");
  if (dp_->size() == 1) return;
  NSA_CHECK(!armed_, "DataParallelOptimizer::arm_overlap: already armed (reduce_gradients was not called)");
  const std::int64_t n = grads_.numel(), count = buckets();
  missing_.assign(std::size_t(count), 0);
  for (std::int64_t k = 0; k < count; ++k)
    missing_[std::size_t(k)] = std::min(n, (k + 1) * bucket_elems_) - k * bucket_elems_;
  started_.assign(std::size_t(count), false);
  armed_ = true;
}

void DataParallelOptimizer::grads_ready(std::int64_t begin, std::int64_t end) {
  if (dp_->size() == 1) return;
  NSA_CHECK(armed_, "DataParallelOptimizer::grads_ready before arm_overlap");
  NSA_CHECK(0 <= begin && begin <= end && end <= grads_.numel(), "DataParallelOptimizer::grads_ready: range [",
            begin, ", ", end, ") of a buffer of ", grads_.numel());
  if (begin == end) return;
  for (std::int64_t k = begin / bucket_elems_; k * bucket_elems_ < end; ++k) {
    const std::int64_t b = std::max(begin, k * bucket_elems_), e = std::min(end, (k + 1) * bucket_elems_);
    std::int64_t& missing = missing_[std::size_t(k)];
    NSA_CHECK(e - b <= missing, "DataParallelOptimizer::grads_ready: [", begin, ", ", end,
              ") reports elements of bucket ", k, " twice");
    missing -= e - b;
    if (missing == 0) start_bucket(k);
  }
}

void DataParallelOptimizer::reduce_gradients() {
  if (dp_->size() == 1) return;
  // The compute stream's time here (log.profile_step): the DP communication not hidden.
  const op_timer::Scope timed("dp all-reduce", grads_.device());
  if (!zero1_) {
    if (!armed_) started_.assign(std::size_t(buckets()), false);
    last_overlapped_ = std::int64_t(std::count(started_.begin(), started_.end(), true));
    for (std::int64_t k = 0; k < buckets(); ++k)
      if (!started_[std::size_t(k)]) start_bucket(k);
    dp_->wait_all();
    armed_ = false;
    return;
  }
  for (int r = 0; r < dp_->size(); ++r) {
    const std::int64_t b = ranges_[std::size_t(r)], e = ranges_[std::size_t(r) + 1];
    if (e > b) padded_.slice0(r * block_, r * block_ + (e - b)).copy_from(grads_.slice0(b, e));
  }
  dp_->reduce_scatter(padded_, mine_, ReduceOp::Sum);
  if (end_ > begin_) grads_.slice0(begin_, end_).copy_from(mine_.slice0(0, end_ - begin_));
}

void DataParallelOptimizer::set_norm_scope(std::vector<std::shared_ptr<Communicator>> groups, std::vector<bool> counted) {
  NSA_CHECK(counted.size() == segments_.size(), "set_norm_scope: ", counted.size(), " flags for ", segments_.size(),
            " segments");
  norm_groups_ = std::move(groups);
  counted_ = std::move(counted);
}

double DataParallelOptimizer::grad_norm() {
  bool model_parallel = false;
  for (const auto& g : norm_groups_) model_parallel |= g->size() > 1;
  if (model_parallel) {
    // Sum of squares of the counted segments this rank updates (runs of adjacent segments
    // as one buffer), added over DP (ZeRO-1: each rank holds its range) and over the
    // model-parallel groups, then the root.
    std::vector<Tensor> bufs;
    std::int64_t run_begin = -1, run_end = -1;
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      const ParamSegment& s = segments_[i];
      if (!counted_[i] || s.offset < begin_ || s.offset >= end_) continue;
      if (s.offset != run_end) {
        if (run_end > run_begin) bufs.push_back(grads_.slice0(run_begin, run_end));
        run_begin = s.offset;
      }
      run_end = s.offset + s.numel;
    }
    if (run_end > run_begin) bufs.push_back(grads_.slice0(run_begin, run_end));
    double sumsq = 0;
    if (!bufs.empty()) {
      Tensor part = Tensor::empty({1}, DType::F64, grads_.device());
      sum_squares(bufs, part);
      sumsq = part.to_vector()[0];
    }
    if (zero1_ && dp_->size() > 1) sumsq = all_reduce_value(*dp_, sumsq, ReduceOp::Sum);
    for (const auto& g : norm_groups_) sumsq = all_reduce_value(*g, sumsq, ReduceOp::Sum);
    return double(float(std::sqrt(sumsq)));
  }
  if (!zero1_ || dp_->size() == 1) {
    // The single-process computation: every rank holds the full reduced buffer.
    std::vector<Tensor> bufs{grads_};
    Tensor norm = Tensor::empty({1}, DType::F32, grads_.device());
    global_norm(bufs, norm);
    return norm.to_vector()[0];
  }
  double sumsq = 0;
  if (end_ > begin_) {
    std::vector<Tensor> bufs{grads_.slice0(begin_, end_)};
    Tensor part = Tensor::empty({1}, DType::F64, grads_.device());
    sum_squares(bufs, part);
    sumsq = part.to_vector()[0];
  }
  sumsq = all_reduce_value(*dp_, sumsq, ReduceOp::Sum);
  return double(float(std::sqrt(sumsq)));  // as global_norm's fp32 result
}

void DataParallelOptimizer::step(const AdamWHyper& hp, std::int64_t t, double grad_scale, const AdamWExtra& extra) {
  if (!zero1_ || dp_->size() == 1) {
    adamw_step(weights_, grads_, m_, v_, segments_, hp, t, grad_scale, extra);
    return;
  }
  NSA_CHECK(extra.compute_copy == nullptr && extra.clip_norm == nullptr,
            "DataParallelOptimizer: zero1 over several ranks takes no compute copy or device clip norm yet");
  if (end_ > begin_) {
    std::vector<ParamSegment> local = owned_;
    for (auto& s : local) s.offset -= begin_;
    Tensor w = weights_.slice0(begin_, end_), g = grads_.slice0(begin_, end_);
    adamw_step(w, g, m_, v_, local, hp, t, grad_scale);
  }
  const int me = dp_->rank();
  if (end_ > begin_) padded_.slice0(me * block_, me * block_ + (end_ - begin_)).copy_from(weights_.slice0(begin_, end_));
  Tensor own_block = padded_.slice0(me * block_, (me + 1) * block_);
  {
    const op_timer::Scope timed("dp all-gather", grads_.device());
    dp_->all_gather(own_block, padded_);
  }
  for (int r = 0; r < dp_->size(); ++r) {
    const std::int64_t b = ranges_[std::size_t(r)], e = ranges_[std::size_t(r) + 1];
    if (r != me && e > b) weights_.slice0(b, e).copy_from(padded_.slice0(r * block_, r * block_ + (e - b)));
  }
}

}  // namespace nsatron::parallel
