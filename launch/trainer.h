// The training driver: data, model, optimizer, schedule, logging, evaluation.
//
// One optimizer step: zero the gradients; for each of the A = global_batch / (micro_batch*dp)
// micro-batches, forward and backward with the loss scaled by 1/A (the gradients of the
// micro-batches add up to the gradient of the mean over the global batch); the global
// gradient norm; a step whose loss or norm is not finite is skipped (no update, counted,
// logged; train.max_bad_steps in a row stop the run); clipping to optim.grad_clip; AdamW.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>

#include "core/config/config.h"

namespace nsatron {

struct TrainSummary {
  std::int64_t steps_done = 0;
  std::int64_t skipped_steps = 0;
  double last_loss = 0;
  double last_val_loss = -1;  // -1: no validation ran
  double first_val_loss = -1;
  bool stopped_by_signal = false;  // SIGTERM/SIGUSR1: a checkpoint was saved, exit kExitStoppedBySignal
};

struct TrainOptions {
  bool overwrite = false;  // checkpoint.resume = "never" may replace an existing run's checkpoints
};

// Runs the config to completion. Progress goes to `out` (and a progress bar to stderr when
// it is a terminal). Throws UserError for bad input, std::runtime_error when training fails
// (e.g. too many non-finite steps in a row).
// Resumes per checkpoint.resume, saves per checkpoint.every and at the end, and on SIGTERM /
// SIGUSR1 finishes the step, saves, and returns with stopped_by_signal set.
TrainSummary run_training(const RunConfig& cfg, std::ostream& out, const TrainOptions& options = {});

}  // namespace nsatron
