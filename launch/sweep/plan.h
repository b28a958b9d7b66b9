// `nsatron sweep plan`: one row per run of a sweep, before anything runs: parameters, tokens,
// training FLOPs, the memory per GPU (or CPU rank) its layout and recompute policy need, and
// the wall time from a measured throughput (docs/sweeps.md, "Plan").
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "core/model/plan.h"
#include "launch/sweep/run_state.h"
#include "launch/sweep/runner.h"
#include "launch/sweep/sweep_file.h"

namespace nsatron::sweep {

struct PlanOptions {
  double gpu_memory_bytes = 80.0 * (1ull << 30);  // --gpu-memory GiB (an H100 80GB by default)
  double cpu_memory_bytes = 0;                    // 0: this machine's memory
  std::string throughput_csv;                     // --throughput: a results.csv of earlier runs
  std::int64_t calibrate_steps = 0;               // --calibrate N: train each run N steps here
};

struct PlanRow {
  const PlannedRun* run = nullptr;
  MemoryEstimate memory;      // per rank (GPU), the rank that needs most
  double capacity = 0;        // bytes the run may use per rank (GPU memory, or this machine's memory / ranks)
  bool fits = true;
  std::string why_not;        // when it does not fit
  double tokens_per_s = 0;    // 0: unknown
  std::string speed_source;   // where tokens_per_s came from
  double wall_s = 0;          // tokens / tokens_per_s (0: unknown)
  RunState state = RunState::NotStarted;
};

// The rows: memory and fit for every run; throughput from --throughput or --calibrate (which
// trains each run `calibrate_steps` steps in a scratch folder, with the run's own command).
std::vector<PlanRow> make_plan(const Sweep& sweep, const std::vector<PlannedRun>& runs, const PlanOptions& options,
                               const RunnerOptions& runner);

void print_plan_table(std::ostream& out, const Sweep& sweep, const std::vector<PlanRow>& rows);
void print_plan_json(std::ostream& out, const Sweep& sweep, const std::vector<PlanRow>& rows);

}  // namespace nsatron::sweep
