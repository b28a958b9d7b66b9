// One optimizer step (launch/trainer.h has the whole computation): the micro-batches'
// forward and backward (one stage, or the 1F1B pipeline schedule over the stages), the
// reduction over data parallelism, the gradient norm, and the update (clipping and AdamW) or
// the skip of a non-finite step.
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/device/device.h"
#include "core/ops/adamw.h"
#include "core/ops/grad_norm.h"
#include "core/optim/schedule.h"
#include "core/util/op_timer.h"
#include "launch/train/phases.h"
#include "parallel/pipeline.h"

namespace nsatron::train {

namespace {

// Every rank scales its micro-batches by 1 / (A * dp): the sum over DP is the mean over the
// global batch (dp = 1: 1 / A, as a single process).
double micro_batch_scale(const Run& run) { return 1.0 / double(run.micro_batches() * run.dp()); }

// The micro-batches' losses (each one element on the model's device, left there by the
// model so that no micro-batch waits for the device) read once, after the last, and added in
// micro-batch order.
double read_losses(const Run& run, const std::vector<Tensor>& losses) {
  double sum = 0;
  for (const Tensor& l : losses) sum += l.to_vector()[0] / double(run.micro_batches() * run.dp());
  return sum;
}

// parallel.overlap_grad_reduce: for one call of the model on the step's last micro-batch (the
// backward that finishes the gradients), the model reports each finished gradient range to the
// DP optimizer, which starts that bucket's all-reduce (the optimizer is armed at the step's
// start). The earlier micro-batches' calls report nothing: their gradients are not final.
class LastMicroBatchHook {
 public:
  LastMicroBatchHook(Run& run, std::int64_t m) {
    if (!run.cfg.parallel.overlap_grad_reduce || m != run.micro_batches() - 1) return;
    model_ = run.model.get();
    parallel::DataParallelOptimizer* opt = run.optimizer.get();
    model_->set_grads_ready_hook([opt](std::int64_t begin, std::int64_t end) { opt->grads_ready(begin, end); });
  }
  ~LastMicroBatchHook() {
    if (model_) model_->set_grads_ready_hook({});
  }
  LastMicroBatchHook(const LastMicroBatchHook&) = delete;
  LastMicroBatchHook& operator=(const LastMicroBatchHook&) = delete;

 private:
  NsaTransformer* model_ = nullptr;
};

// The whole model on this rank (pp = 1): forward and backward of each micro-batch in turn,
// the gradients accumulating. Sets the loss (this rank's share) and the activation peak: from
// the step's start, so the earlier micro-batches' losses, held until read, count.
// With parallel.tp_micro_batch_pairs (tp > 1) two micro-batches at a time
// (NsaTransformer::forward_backward_pair_queued: the same bits), an odd last one alone; the
// gradient hook armed for each part of the step's last micro-batch. A tied embedding's lookups
// (deferred with tp > 1: NsaTransformer::defer_lookup_grads) are added at the end.
void forward_backward(Run& run, StepResult& r, Clock::time_point t0) {
  const std::int64_t A = run.micro_batches();
  const double scale = micro_batch_scale(run);
  const bool pairs = run.cfg.parallel.tp_micro_batch_pairs && run.cfg.parallel.tp > 1;
  data::TokenBatch batch, second;
  std::vector<Tensor> losses;
  const std::size_t base = memory_stats(run.device).current;
  for (std::int64_t m = 0; m < A; ++m) {
    run.data.sampler->next(run.data.layout, m, batch);
    // (the model resets the peak at the call's start, when the earlier losses are live)
    if (pairs && m + 1 < A) {
      const std::int64_t first = m++;  // this pair: micro-batches first and m
      run.data.sampler->next(run.data.layout, m, second);
      std::optional<LastMicroBatchHook> hook;
      const auto before_backward = [&](int i) { hook.emplace(run, first + i); };
      const std::array<Tensor, 2> pair = run.model->forward_backward_pair_queued(
          {{{batch.inputs, batch.targets}, {second.inputs, second.targets}}}, batch.rows, batch.seq_len, scale,
          before_backward);
      losses.insert(losses.end(), pair.begin(), pair.end());
    } else {
      const LastMicroBatchHook hook(run, m);
      losses.push_back(run.model->forward_backward_queued(batch.inputs, batch.targets, batch.rows, batch.seq_len, scale));
    }
    r.activation_peak_bytes = std::max(r.activation_peak_bytes, memory_stats(run.device).peak - base);
  }
  if (run.model->lookup_grads_deferred()) {  // a tied embedding's lookups, after every head
    const LastMicroBatchHook hook(run, A - 1);
    run.model->add_lookup_grads();
  }
  const auto since_start = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };
  r.queued_ms = since_start();
  r.loss = read_losses(run, losses);
  r.losses_read_ms = since_start();
}

// This rank's pipeline stage (pp > 1): 1F1B over the stages, interleaved with virtual stages
// (parallel/pipeline.h), the micro-batches in flight on each of this rank's model chunks
// waiting in order for their backward. Then the loss (the last stage's) goes to every stage,
// and a tied embedding's gradient becomes the sum of the first stage's (lookup) and the last
// stage's (head) parts.
void forward_backward_pipeline(Run& run, StepResult& r) {
  const std::int64_t A = run.micro_batches();
  const double scale = micro_batch_scale(run);
  NsaTransformer& model = *run.model;
  data::TokenBatch batch;
  std::vector<Tensor> losses;  // the last stage's
  std::vector<std::deque<StageState>> in_flight(static_cast<std::size_t>(model.chunks()));  // per chunk
  parallel::PipelineStage stage;
  stage.chunks = model.chunks();
  stage.activation_shape = {run.cfg.train.micro_batch * run.cfg.train.seq_len, run.dims.C};
  stage.dtype = run.dtype;
  stage.device = run.device;
  stage.forward = [&](int chunk, std::int64_t m, const Tensor* input) {
    run.data.sampler->next(run.data.layout, m, batch);
    auto& queue = in_flight[std::size_t(chunk)];
    const LastMicroBatchHook hook(run, m);  // the last chunk runs the head's backward here
    queue.push_back(model.stage_forward(chunk, batch.inputs, batch.targets, input, batch.rows, batch.seq_len, scale));
    queue.back().micro_batch = m;
    if (model.chunk_last(chunk)) losses.push_back(queue.back().loss);
    return std::move(queue.back().output);  // the stage keeps no copy of what it sends
  };
  stage.backward = [&](int chunk, std::int64_t m, const Tensor* d_output) {
    auto& queue = in_flight[std::size_t(chunk)];
    if (queue.empty() || queue.front().micro_batch != m)
      throw std::logic_error("pipeline: backward of micro-batch " + std::to_string(m) + " of chunk " +
                             std::to_string(chunk) + " out of order");
    StageState st = std::move(queue.front());
    queue.pop_front();
    const LastMicroBatchHook hook(run, m);
    return model.stage_backward(st, d_output);
  };
  const std::size_t base = memory_stats(run.device).current;
  reset_peak_memory(run.device);
  parallel::run_1f1b(*run.tensor_groups.pp, A, stage);
  r.activation_peak_bytes = memory_stats(run.device).peak - base;  // every micro-batch in flight at once
  r.loss = read_losses(run, losses);
  r.loss = parallel::all_reduce_value(*run.groups.pp, model.last_stage() ? r.loss : 0.0, parallel::ReduceOp::Sum);
  if (run.dims.tie_embeddings && (model.first_stage() || model.last_stage())) {
    Tensor g = model.params().grad("model/embedding");
    const op_timer::Scope timed("embedding all-reduce", run.device);  // (log.profile_step: not hidden)
    run.tensor_groups.embedding->all_reduce(g);
  }
}

// The gradients and the loss summed over DP, the global gradient norm (the same on every
// rank), and whether the step is bad (loss or norm not finite).
void reduce(Run& run, StepResult& r) {
  run.optimizer->reduce_gradients();
  if (run.dp() > 1) r.loss = parallel::all_reduce_value(*run.groups.dp, r.loss, parallel::ReduceOp::Sum);
  r.grad_norm = run.optimizer->grad_norm();
  r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
}

// A bad step: no update, counted and logged; train.max_bad_steps in a row stop the run (the
// loss and the norm are the same on every rank: every rank stops here).
void skip(Run& run, const StepResult& r) {
  ++run.summary.skipped_steps;
  ++run.bad_in_row;
  run.bar.clear();
  run.out << "step " << r.step << ": skipped (loss " << r.loss << ", grad norm " << r.grad_norm << " not finite); "
          << run.bad_in_row << " in a row, " << run.summary.skipped_steps << " in all\n";
  if (run.bad_in_row >= run.cfg.train.max_bad_steps)
    throw JobError(1,
                   "nsatron train: " + std::to_string(run.bad_in_row) +
                       " steps in a row had a non-finite loss or gradient norm (train.max_bad_steps = " +
                       std::to_string(run.cfg.train.max_bad_steps) + "); stopping at step " + std::to_string(r.step) +
                       "; the last checkpoint is kept",
                   run.root);
}

// Clipping to optim.grad_clip and AdamW (the same bits on every rank).
void update(Run& run, const StepResult& r) {
  const OptimConfig& o = run.cfg.optim;
  run.bad_in_row = 0;
  const double clip = o.grad_clip > 0 ? clip_coefficient(r.grad_norm, o.grad_clip) : 1.0;
  AdamWHyper hp{r.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  AdamWExtra extra;
  // AdamW writes the bf16 compute copy as it goes; with ZeRO-1 over several ranks the
  // weights arrive by all-gather, so the copy is refreshed afterwards.
  if (run.separate_compute_copy && !run.sharded_state) extra.compute_copy = &run.model->compute_weights();
  run.optimizer->step(hp, ++run.optimizer_step, clip, extra);
  if (run.separate_compute_copy && run.sharded_state) run.model->sync_compute_weights();
}

// log.profile_step: the op families of the step on this rank (waits for its device), printed
// by rank 0 with the time outside the scopes, then the ranks' compute times (fastest, slowest,
// the slowest's excess by family).
constexpr std::size_t kProfileEvents = 32768;

void print_profile(Run& run, const StepResult& r, Clock::time_point t0) {
  const std::int64_t step_done = r.step;
  const std::vector<std::pair<std::string, double>> totals = op_timer::totals_ms();
  const std::vector<std::pair<std::string, double>> busy = op_timer::busy_totals_ms();
  op_timer::enable(false);
  const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const std::string trace = run.cfg.log.trace.empty() ? "" : write_trace(run, step_done);
  op_timer::reset();
  // Every rank's families (a collective over the world, on every rank alike).
  const std::vector<double> mine = op_timer::by_step_family(totals);
  const std::vector<double> all = all_gather_values(*run.groups.world, mine);
  std::vector<std::vector<double>> per_rank;
  for (std::size_t k = 0; k < all.size() / mine.size(); ++k)
    per_rank.emplace_back(all.begin() + std::ptrdiff_t(k * mine.size()), all.begin() + std::ptrdiff_t((k + 1) * mine.size()));
  if (!run.root) return;
  run.bar.clear();
  char head[120];
  std::snprintf(head, sizeof head, "# step %lld: time per op family on rank 0 (log.profile_step), %.1f ms\n",
                static_cast<long long>(step_done), step_ms);
  run.out << head;
  for (const std::string& line : op_timer::split_lines(totals, step_ms)) run.out << "#   " << line << "\n";
  // GPUs: each group's collectives and transfers, and how much of them the compute stream did
  // not wait for.
  for (const std::string& line : op_timer::hidden_lines(busy, totals)) run.out << "#   " << line << "\n";
  // Several ranks: the spread of their compute, which each collective makes the others wait
  // for, and where the slowest rank spends it.
  if (per_rank.size() > 1) run.out << "#   " << op_timer::ranks_line(per_rank) << "\n";
  // pp = 1, GPUs: whether the host keeps ahead of the device. The host queues the micro-batches'
  // work without waiting for it (up to the losses' read), as far ahead as CUDA's launch queue
  // lets it (about a thousand pending operations); a lead near zero means the device waited for
  // the host's launches inside and between the scopes above.
  if (run.device == Device::CUDA && r.queued_ms > 0) {
    char line[200];
    std::snprintf(line, sizeof line,
                  "host: the forwards and backwards queued at %.1f ms, the device done with them at %.1f ms "
                  "(%.1f ms ahead)\n",
                  r.queued_ms, r.losses_read_ms, r.losses_read_ms - r.queued_ms);
    run.out << "#   " << line;
  }
  if (!trace.empty()) run.out << "#   " << trace << "\n";
}

}  // namespace

StepResult optimizer_step(Run& run, std::int64_t step) {
  const auto t0 = Clock::now();
  const bool profile = run.cfg.log.profile_step == step + 1;
  if (profile) {
    op_timer::reset();
    op_timer::enable(true);
  }
  StepResult r;
  r.step = step + 1;
  r.last = r.step == run.cfg.train.steps;
  r.lr = learning_rate(run.cfg.optim, run.cfg.train.steps, step);
  run.model->params().zero_grads();
  if (run.cfg.parallel.overlap_grad_reduce) run.optimizer->arm_overlap();
  if (run.pp() == 1) forward_backward(run, r, t0);
  else forward_backward_pipeline(run, r);
  run.data.sampler->advance(run.data.layout);
  reduce(run, r);
  if (run.cfg.parallel.overlap_grad_reduce && run.dp() > 1 && step == run.start_step) {
    run.bar.clear();  // once per run: the hook's effect, on this rank's (rank 0's) buffer
    run.out << "step " << r.step << ": " << run.optimizer->last_overlapped_buckets() << " of "
            << run.optimizer->buckets() << " DP gradient bucket(s) started during the backward (overlap_grad_reduce)\n";
  }
  if (r.skipped) skip(run, r);
  else update(run, r);
  if (profile) {
    print_profile(run, r, t0);
    op_timer::release_events();
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // GPUs: the next step is timed; its scopes' CUDA events made now, outside it (a 125M step of
  // 16 micro-batches takes ~14k, whose cudaEventCreate calls in the step would be host work the
  // other steps do not have).
  if (run.device == Device::CUDA && run.cfg.log.profile_step == step + 2 && step + 2 <= run.cfg.train.steps)
    op_timer::reserve_events(kProfileEvents);
  run.summary.steps_done = r.step;
  run.summary.last_loss = r.loss;
  return r;
}

}  // namespace nsatron::train
