// The training driver's loop: the phases of launch/train/phases.h over one Run, in order.
#include "launch/trainer.h"

#include "core/comm/watchdog.h"
#include "launch/signals.h"
#include "launch/train/phases.h"

namespace nsatron {

TrainSummary run_training(const RunConfig& cfg, std::ostream& out, World& world, const TrainOptions& options) {
  train::Run run(cfg, out, world, options);
  train::setup_world(run);                // process groups, one GPU per rank
  train::log_config(run);                 // the log's first lines: version, resolved config
  train::open_data(run);                  // a bad shard stops the run before any work
  train::build_model_and_optimizer(run);  // initialised from train.seed
  train::resume(run);                     // a checkpoint per checkpoint.resume, or the above
  train::describe_run(run);               // "# run", "# implementations"
  train::open_metrics(run);
  install_stop_handlers();
  if (run.data.val && run.start_step == 0) train::evaluate_and_log(run, 0);  // the starting point
  run.log.loop_start = train::Clock::now();
  // Several ranks: a hung or dead peer ends this rank within parallel.comm_timeout_s
  // (core/comm/watchdog.h); stopped with the run.
  const parallel::Watchdog::Armed watched;
  struct StopWatchdog {
    ~StopWatchdog() { parallel::Watchdog::instance().stop(); }
  } stop_watchdog;
  for (std::int64_t step = run.start_step; step < cfg.train.steps; ++step) {
    const train::StepResult result = train::optimizer_step(run, step);
    train::log_step(run, result);
    if (train::evaluation_due(run, result)) train::evaluate_and_log(run, result.step);
    if (train::checkpoint_due(run, result)) train::save_checkpoint(run, result.step);
    if (train::stop_requested(run, result)) return run.summary;
    train::show_progress(run, result.step);
  }
  train::save_final_checkpoint(run);
  train::log_done(run);
  run.summary.finished = true;
  return run.summary;
}

}  // namespace nsatron
