// Stop conditions before train.steps: a stop signal (SIGTERM/SIGUSR1, launch/signals.h) on
// any rank, or train.stop_at. Either saves a checkpoint (unless this step's is saved) and
// ends the run on every rank after the same step.
#include "launch/signals.h"
#include "launch/train/phases.h"

namespace nsatron::train {

namespace {

// The highest signal number received by any rank (0: none). Collective: every rank asks
// after every step.
int stop_signal_of_any_rank(Run& run) {
  return run.world.size() > 1
             ? int(parallel::all_reduce_value(run.world.comm(), stop_signal(), parallel::ReduceOp::Max))
             : stop_signal();
}

}  // namespace

bool stop_requested(Run& run, const StepResult& result) {
  const std::int64_t step = result.step;
  const int stop = stop_signal_of_any_rank(run);
  if (stop != 0 && !result.last) {
    run.bar.clear();
    run.out << "signal " << stop << " received" << (stop_signal() == 0 ? " by another rank" : "")
            << ": stopping after step " << step << "\n";
    if (run.saved_step != step) save_checkpoint(run, step);
    run.summary.stopped_by_signal = true;
    return true;
  }
  if (run.cfg.train.stop_at > 0 && step == run.cfg.train.stop_at && !result.last) {
    run.bar.clear();
    if (run.saved_step != step) save_checkpoint(run, step);
    run.out << "stopped at step " << step << " (train.stop_at); run again to resume\n";
    return true;
  }
  return false;
}

}  // namespace nsatron::train
