// Evaluation phase: the validation loss over train.eval_batches global batches.
#include <vector>

#include "launch/train/phases.h"
#include "parallel/pipeline.h"

namespace nsatron::train {

namespace {

// The mean validation loss over the global eval batches: each DP rank evaluates its slice
// (with pipeline parallelism, stage by stage; the last stage has the losses), the sums and
// counts are added over DP.
double evaluate(Run& run) {
  const RunConfig& cfg = run.cfg;
  const parallel::ProcessGroups& g = run.groups;  // control values
  NsaTransformer& model = *run.model;
  data::RunData& data = run.data;
  data::TokenBatch batch;
  double sum = 0;
  std::int64_t count = 0;
  const std::int64_t A = data.layout.micro_batches();
  // (Each micro-batch counts once: on chunk 0 of this rank, with virtual stages.)
  auto forward = [&](std::int64_t b, int chunk, std::int64_t m, const Tensor* input) {
    data.val->fill(b, data.layout, m, batch);
    double loss = 0;
    Tensor out = model.stage_evaluate(chunk, batch.inputs, batch.targets, input, batch.rows, batch.seq_len, &loss);
    if (model.chunk_last(chunk)) sum += loss;
    if (chunk == 0) ++count;
    return out;
  };
  for (std::int64_t b = 0; b < cfg.train.eval_batches; ++b) {
    if (g.pp->size() == 1) {
      for (std::int64_t m = 0; m < A; ++m) forward(b, 0, m, nullptr);
    } else {
      parallel::run_pipeline_forward(
          *run.tensor_groups.pp, A,
          [&](int chunk, std::int64_t m, const Tensor* input) { return forward(b, chunk, m, input); },
          Shape{cfg.train.micro_batch * cfg.train.seq_len, cfg.model.d_model}, model.dtype(), model.device(),
          model.chunks());
    }
  }
  if (g.pp->size() > 1) sum = parallel::all_reduce_value(*g.pp, model.last_stage() ? sum : 0.0, parallel::ReduceOp::Sum);
  if (g.dp->size() > 1) {
    const std::vector<double> both = parallel::all_gather_values(*g.dp, {sum, double(count)});
    sum = 0;
    double total = 0;
    for (int r = 0; r < g.dp->size(); ++r) sum += both[std::size_t(2 * r)], total += both[std::size_t(2 * r + 1)];
    return sum / total;
  }
  return sum / double(count);
}

}  // namespace

bool evaluation_due(const Run& run, const StepResult& result) {
  const std::int64_t every = run.cfg.train.eval_every;
  return run.data.val && ((every > 0 && result.step % every == 0) || result.last);
}

void evaluate_and_log(Run& run, std::int64_t step_done) {
  const double val = evaluate(run);
  if (run.summary.first_val_loss < 0) run.summary.first_val_loss = val;
  if (step_done > 0) run.summary.last_val_loss = val;  // step 0: the starting point only
  log_eval(run, step_done, val);
}

}  // namespace nsatron::train
