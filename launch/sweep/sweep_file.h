// A scaling study ("sweep"): one TOML file naming a base run config and the axes to vary,
// crossed as a grid (docs/sweeps.md). This header reads the file and expands it into runs,
// each with its resolved, validated RunConfig; plan.h, runner.h and report.h use the runs.
//
//   [sweep]
//   base = "../demo_cpu.toml"          # the run config every run starts from (relative to this file)
//   name = "kjv_tiny"                  # optional: the file's stem
//   out = "runs/kjv_tiny"              # optional: runs/<name> (relative to the working directory)
//   ranks = 1                          # optional: processes per run; default tp * pp (dp = 1)
//   budget = { tokens = 200000 }       # optional: one budget for every run (or the axis below)
//   [set]                              # optional: keys set for every run
//   "train.eval_every" = 25
//   [axes]                             # crossed as a grid, the first axis outermost
//   "model.attention" = ["nsa", "dense"]               # a key axis: a value per run
//   size = [ { name = "s", "model.d_model" = 64, "model.n_layers" = 2 },  # a grouped axis:
//            { name = "m", "model.d_model" = 96, "model.n_layers" = 3 } ] # several keys at once
//   budget = [ { tokens = 1e5 }, { tokens_per_param = 20 }, { flops = 1e15 } ]  # the budget axis
//
// A budget gives the run's training tokens: `tokens`, `tokens_per_param` (times the model's
// parameter count, embeddings included) or `flops` (divided by the training FLOPs per token);
// train.steps = round(tokens / (global_batch * seq_len)), at least 1. Without a budget a run
// keeps the base config's train.steps.
//
// Each run's name says its values: "<key's last part>-<value>" for a key axis, "<axis>-<entry
// name>" for a grouped axis, "tok-100k" / "tpp-20" / "flops-1e15" for a budget, joined by "_".
// A run writes under OUT/<name>/: config.toml (resolved), metrics.jsonl, checkpoints/, run.log,
// done.json once finished.
//
// Every problem (an unknown key or section, an empty axis, a value of the wrong type, a budget
// of zero, a layout that does not divide the world) is reported before any run starts as
// "FILE:LINE:COL: key: what is wrong", all of them, by SweepError (exit code 2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/util/error.h"

namespace nsatron::sweep {

// Problems of a sweep file, one "FILE:LINE:COL: key: what is wrong" each (all found).
// (A ConfigError: the command line prints each message on a line of its own and exits 2.)
struct SweepError : ConfigError {
  explicit SweepError(std::vector<std::string> msgs) : ConfigError(std::move(msgs)) {}
};

// How a run's training tokens are given.
struct Budget {
  enum class Kind { None, Tokens, TokensPerParam, Flops };
  Kind kind = Kind::None;
  double value = 0;
  std::string label() const;  // "tok-100k", "tpp-20", "flops-1e+15"; "" for None
};

// One value of an axis: the overrides it applies and its label in run names.
struct AxisValue {
  std::string label;                          // "256", "s", "tok-100k"
  std::vector<LocatedOverride> overrides;     // "section.key=value" with its line in the file
  Budget budget;                              // the budget axis only
};

struct Axis {
  std::string name;      // "model.d_model", "size", "budget"
  std::string prefix;    // the run-name prefix: "d_model", "size", "" (budget labels carry their own)
  std::vector<AxisValue> values;
};

struct Sweep {
  std::string file;       // the sweep file as given
  std::string name;
  std::string base;       // the base run config's path (resolved against the sweep file's folder)
  std::string out;        // where the runs go
  std::int64_t ranks = 0; // 0: tp * pp of each run
  std::vector<LocatedOverride> set;  // [set], for every run
  Budget budget;          // [sweep].budget (when no budget axis)
  std::vector<Axis> axes; // in file order
};

// One run of the grid, resolved.
struct PlannedRun {
  std::string name;
  std::string dir;                      // out/<name>
  std::vector<std::string> axis_labels; // one per axis, in axis order
  RunConfig config;                     // validated for `ranks`, steps from the budget, paths under dir
  std::int64_t ranks = 1;
  Budget budget;
  std::int64_t params = 0, params_nonembed = 0;
  std::int64_t tokens_per_step = 0;
  std::int64_t tokens = 0;              // steps * tokens_per_step
  double flops_per_token = 0;           // training (forward + backward), NSA or dense attention included
  double flops = 0;                     // tokens * flops_per_token
};

// The whole of a file as text; false when it cannot be opened (the sweep's files are small).
bool read_whole_file(const std::string& path, std::string& text);

// Reads and checks a sweep file (not the runs: expand does). Throws SweepError.
Sweep read_sweep(const std::string& path);
Sweep parse_sweep(const std::string& text, const std::string& path);

// The grid's runs, each config validated; every problem of every run reported together
// (SweepError, each line prefixed by the run's name).
std::vector<PlannedRun> expand(const Sweep& sweep);

}  // namespace nsatron::sweep
