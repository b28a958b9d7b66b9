// `nsatron sweep report DIR`: every run's figures in DIR/results.csv, then the fits, plots and
// summary of launch/sweep/report_fit.py (Debian's python3 with numpy, scipy, matplotlib):
// DIR/fit.json, DIR/plots/*.png, DIR/summary.md (docs/sweeps.md, "Report").
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "launch/sweep/sweep_file.h"

namespace nsatron::sweep {

// The cells of one line of runs.csv or results.csv (commas; a cell in double quotes may hold
// commas, "" inside it a quote).
std::vector<std::string> split_csv_line(const std::string& line);

// A run's layout as results.csv and plan name it: "tp1.pp2.dp4".
std::string layout_name(const RunConfig& c);

// DIR/runs.csv: what the plan knows of each run (name, axis values, model, layout, tokens,
// FLOPs), written by `sweep run` so that `sweep report DIR` needs only the folder.
void write_runs_csv(const Sweep& sweep, const std::vector<PlannedRun>& runs);

// Writes DIR/results.csv and runs the fit script. Returns the exit code (0: report written,
// even with runs missing, which it lists; 2: DIR is not a sweep's folder).
int report(const std::string& dir, std::ostream& out, bool fit = true);

}  // namespace nsatron::sweep
