// `nsatron sweep run`: each run of a sweep trained to its end, here one after another or as a
// Slurm job array (docs/sweeps.md).
//
// Here: runs go in grid order; a run with done.json is skipped, an interrupted one resumes
// from its checkpoint (checkpoint.resume = "auto"), a failed one is retried once per
// invocation, and a run that fails is marked (failed.json) while the others go on. One
// `sweep run` at a time per study (a lock file in OUT). SIGINT or SIGTERM stop the run in
// progress with a checkpoint (the trainer's SIGTERM) and end the sweep; the same command
// continues it. When `sweep run` itself is killed, the run in progress gets SIGTERM from the
// kernel (PR_SET_PDEATHSIG) and checkpoints likewise.
//
// Slurm: one array job per rank count, each task one run, through launch/slurm/train.sbatch
// (checkpoint on SIGUSR1, requeue); runs already done are left out of the array.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "launch/sweep/sweep_file.h"

namespace nsatron::sweep {

struct RunnerOptions {
  std::string nsatron;        // the executable (default: this one, /proc/self/exe)
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;  // extra mpirun arguments (e.g. --oversubscribe)
  std::vector<std::string> sbatch_args;  // extra sbatch arguments (e.g. --partition=gpu --time=4:00:00)
  bool submit = true;                    // --slurm: submit (false: write the scripts only)
};

// The command line that trains `run` (mpirun when it needs several ranks).
std::vector<std::string> train_command(const PlannedRun& run, const RunnerOptions& options);

// Writes OUT/<run>/config.toml for every run, refusing (SweepError, naming the runs) when an
// existing one differs: the sweep changed since that run started.
void write_run_configs(const Sweep& sweep, const std::vector<PlannedRun>& runs);

// Runs every run that is not done, here. Returns the exit code: 0 all done, 1 some failed,
// 3 stopped by a signal (the same command continues).
int run_here(const Sweep& sweep, const std::vector<PlannedRun>& runs, const RunnerOptions& options, std::ostream& out);

// Writes OUT/slurm/ (runs.txt, one array script per rank count) and submits the arrays.
int run_on_slurm(const Sweep& sweep, const std::vector<PlannedRun>& runs, const RunnerOptions& options,
                 std::ostream& out);

// Trains a run (the command of train_command) with its output appended to `log_path`, and
// waits. Returns its exit code (128 + N when killed by signal N). SIGINT/SIGTERM received
// meanwhile are passed on to it as SIGTERM; *stopped tells whether that happened.
int train_and_wait(const std::vector<std::string>& argv, const std::string& log_path, bool* stopped);

}  // namespace nsatron::sweep
