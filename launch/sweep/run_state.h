// What a sweep's run folder says about the run (OUT/<run>/): its state and, from its
// metrics.jsonl, its figures. Read by `sweep plan` (state column), `sweep run` (what to skip
// or resume) and `sweep report` (results.csv).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nsatron::sweep {

// done: done.json exists (the trainer finished every step); failed: failed.json (the last
// attempt exited with an error); interrupted: work exists (checkpoints or metrics) but no
// marker; not started: nothing yet.
enum class RunState { NotStarted, Interrupted, Failed, Done };
const char* state_name(RunState s);  // "not started", "interrupted", "failed", "done"
RunState run_state(const std::string& run_dir);

// The figures of a run's metrics.jsonl. A resumed run appends: the last record of a step
// counts. Lines that do not parse (a run killed mid-write) are counted, not fatal.
struct RunMetrics {
  bool found = false;            // the file exists
  std::int64_t last_step = 0;    // the last step record's step
  double final_train_loss = -1;  // the last step record's loss (-1: none)
  double final_val_loss = -1;    // the last validation record's loss (-1: none)
  double tokens_per_s = 0;       // the median over step records after each start's first step
  double mfu = 0;                // the same median of mfu
  double train_seconds = 0;      // the sum of the steps' times (ms_per_step)
  std::int64_t bad_lines = 0;
};
RunMetrics read_metrics(const std::string& path);

// The median of a set of speeds (0 for none).
double median(std::vector<double> v);

// The failure marker `sweep run` writes: the exit code and the log's last lines.
void write_failed_marker(const std::string& run_dir, int exit_code, const std::string& why);
std::string failed_reason(const std::string& run_dir);  // "exit 2: ..." ("" when none)

}  // namespace nsatron::sweep
