// The report of a sweep (report.h).
#include "launch/sweep/report.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>

#include "launch/sweep/run_state.h"

#ifndef NSATRON_SOURCE_DIR
#error "NSATRON_SOURCE_DIR must name the source tree (launch/CMakeLists.txt)"
#endif
#ifndef NSATRON_REPORT_PYTHON
#define NSATRON_REPORT_PYTHON "/usr/bin/python3"
#endif

namespace nsatron::sweep {

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kPlanColumns = {"attention", "layout", "device", "params", "params_nonembed",
                                               "tokens", "steps", "tokens_per_step", "flops_per_token", "flops"};

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

}  // namespace

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"') {
      if (quoted && i + 1 < line.size() && line[i + 1] == '"') cells.back() += '"', ++i;
      else quoted = !quoted;
    } else if (c == ',' && !quoted) {
      cells.emplace_back();
    } else if (c != '\r') {
      cells.back() += c;
    }
  }
  return cells;
}

std::string layout_name(const RunConfig& c) {
  return "tp" + std::to_string(c.parallel.tp) + ".pp" + std::to_string(c.parallel.pp) + ".dp" + std::to_string(c.dp());
}

void write_runs_csv(const Sweep& sweep, const std::vector<PlannedRun>& runs) {
  fs::create_directories(sweep.out);
  const fs::path p = fs::path(sweep.out) / "runs.csv", tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "run";
    for (const auto& a : sweep.axes) f << "," << a.name;
    for (const auto& c : kPlanColumns) f << "," << c;
    f << "\n";
    for (const auto& r : runs) {
      const RunConfig& c = r.config;
      f << r.name;
      for (const auto& l : r.axis_labels) f << "," << l;
      f << "," << c.model.attention << "," << layout_name(c) << ","
        << c.train.device << "," << r.params << "," << r.params_nonembed << "," << r.tokens << "," << c.train.steps << ","
        << r.tokens_per_step << "," << number(r.flops_per_token) << "," << number(r.flops) << "\n";
    }
    if (!f.flush()) throw EnvironmentError("cannot write '" + tmp.string() + "'");
  }
  fs::rename(tmp, p);
}

int report(const std::string& dir, std::ostream& out, bool fit) {
  const fs::path d(dir);
  std::ifstream in(d / "runs.csv");
  if (!in) {
    throw UserError("'" + dir + "' is not a sweep's folder: it has no runs.csv (written by `nsatron sweep run`; the " +
                    "folder is [sweep].out, by default runs/<sweep name>)");
  }
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split_csv_line(line);
  const std::size_t plan_cols = kPlanColumns.size();
  if (header.size() < 1 + plan_cols || header.front() != "run")
    throw UserError((d / "runs.csv").string() + ": not a runs.csv of `nsatron sweep run` (header: " + line + ")");
  const std::size_t n_axes = header.size() - 1 - plan_cols;
  const std::size_t c_steps =
      1 + n_axes + std::size_t(std::find(kPlanColumns.begin(), kPlanColumns.end(), "steps") - kPlanColumns.begin());

  const fs::path results = d / "results.csv", tmp = results.string() + ".tmp";
  std::ofstream f(tmp, std::ios::trunc);
  f << "run,status";
  for (std::size_t i = 0; i < n_axes; ++i) f << "," << header[1 + i];
  for (const auto& c : kPlanColumns) f << "," << c;
  f << ",final_train_loss,final_val_loss,tokens_per_s,mfu,wall_s\n";
  std::map<std::string, int> counts;
  std::vector<std::string> not_done;
  std::size_t rows = 0;
  while (std::getline(in, line)) {
    const auto cells = split_csv_line(line);
    if (cells.size() != header.size()) continue;
    ++rows;
    const std::string& name = cells[0];
    const fs::path run_dir = d / name;
    const RunState state = run_state(run_dir.string());
    const RunMetrics m = read_metrics((run_dir / "metrics.jsonl").string());
    std::string status = state_name(state);
    std::string detail;
    const long long steps = std::atoll(cells[c_steps].c_str());
    if (state == RunState::Done && (!m.found || m.last_step != steps)) {
      status = "corrupt";
      detail = !m.found ? "done.json but no metrics.jsonl"
                        : "done.json but metrics.jsonl ends at step " + std::to_string(m.last_step) + " of " +
                              std::to_string(steps);
    } else if (state == RunState::Failed) {
      detail = failed_reason(run_dir.string());
    } else if (state == RunState::Interrupted) {
      status = "running";  // or interrupted: nothing here tells the two apart
      detail = "at step " + std::to_string(m.last_step) + " of " + std::to_string(steps) +
               " (running, or interrupted: `sweep run` resumes it)";
    }
    if (m.bad_lines > 0) detail += (detail.empty() ? "" : "; ") + std::to_string(m.bad_lines) + " unreadable line(s) in metrics.jsonl";
    counts[status]++;
    if (status != "done") not_done.push_back(name + ": " + status + (detail.empty() ? "" : " (" + detail + ")"));
    f << name << "," << status;
    for (std::size_t i = 1; i < cells.size(); ++i) f << "," << cells[i];
    const bool done = status == "done";
    auto known = [&](double v, bool ok) { return ok ? number(v) : std::string(); };
    f << "," << known(m.final_train_loss, done && m.final_train_loss >= 0) << ","
      << known(m.final_val_loss, done && m.final_val_loss >= 0) << "," << known(m.tokens_per_s, done && m.tokens_per_s > 0)
      << "," << known(m.mfu, done) << "," << known(m.train_seconds, done) << "\n";
  }
  f.close();
  fs::rename(tmp, results);
  out << "sweep report " << dir << ": " << rows << " runs (";
  bool first = true;
  for (const auto& [s, n] : counts) out << (first ? "" : ", ") << n << " " << s, first = false;
  out << ")\nwrote " << results.string() << "\n";
  for (const auto& nd : not_done) out << "  not in the fits: " << nd << "\n";
  if (!fit) return 0;
  const std::string script = std::string(NSATRON_SOURCE_DIR) + "/launch/sweep/report_fit.py";
  const std::string cmd = std::string("'") + NSATRON_REPORT_PYTHON + "' '" + script + "' --dir '" + d.string() + "'";
  out << std::flush;
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (rc != 0) out << "the fit and plots failed (" << cmd << ": exit " << rc << "); results.csv is complete\n";
  return rc == 0 ? 0 : 1;
}

}  // namespace nsatron::sweep
