// The training driver: data, model, optimizer, schedule, logging, evaluation.
//
// One optimizer step, on each data-parallel rank: zero the gradients; for each of its
// A = global_batch / (micro_batch*dp) micro-batches (its slice of the global batch,
// data::BatchLayout), forward and backward with the loss scaled by 1/(A*dp) (the gradients of
// all ranks' micro-batches add up to the gradient of the mean over the global batch); the
// gradients summed over DP (parallel::DataParallelOptimizer: bucketed all-reduce, each bucket
// started during the last micro-batch's backward with parallel.overlap_grad_reduce, or
// reduce-scatter with parallel.zero1) and the loss likewise; the global gradient norm (the
// same on every rank); a step whose loss or norm is not finite is skipped (no update, counted,
// logged; train.max_bad_steps in a row stop the run); clipping to optim.grad_clip; AdamW (the
// same bits on every rank). With dp = 1 this is the single-process computation, bit for bit.
// Rank 0 writes the log, the metrics file and the checkpoints (ZeRO-1: every DP rank writes
// its tensors); a stop signal on any rank stops every rank after the same step.
//
// The code: run_training (trainer.cpp) is the loop over the phases of train/phases.h, which
// share one state object (train/run.h); each phase lives in the file named after it.
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
  bool finished = false;           // every step of train.steps is done (not stopped early)
  double wall_s = 0;               // this process's time, start-up included
};

struct TrainOptions {
  bool overwrite = false;  // checkpoint.resume = "never" may replace an existing run's checkpoints
};

class World;

// Runs the config to completion on this rank of `world` (cfg validated for world.size()).
// Progress goes to `out` (rank 0 passes the real stream, the others a silent one; a progress
// bar goes to stderr on rank 0 when it is a terminal). Errors every rank meets together
// (start-up, too many non-finite steps in a row) throw JobError on every rank (world.h);
// others throw UserError / std::runtime_error on the rank that met them.
// Resumes per checkpoint.resume, saves per checkpoint.every and at the end, and on SIGTERM /
// SIGUSR1 finishes the step, saves, and returns with stopped_by_signal set.
TrainSummary run_training(const RunConfig& cfg, std::ostream& out, World& world, const TrainOptions& options = {});

}  // namespace nsatron
