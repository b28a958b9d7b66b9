// A sweep run's folder: state, metrics, failure marker (run_state.h).
#include "launch/sweep/run_state.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/util/format.h"

namespace nsatron::sweep {

namespace fs = std::filesystem;

const char* state_name(RunState s) {
  switch (s) {
    case RunState::NotStarted: return "not started";
    case RunState::Interrupted: return "interrupted";
    case RunState::Failed: return "failed";
    case RunState::Done: return "done";
  }
  return "?";
}

RunState run_state(const std::string& run_dir) {
  const fs::path d(run_dir);
  if (fs::exists(d / "done.json")) return RunState::Done;
  if (fs::exists(d / "failed.json")) return RunState::Failed;
  if (fs::exists(d / "metrics.jsonl") || fs::exists(d / "checkpoints")) return RunState::Interrupted;
  return RunState::NotStarted;
}

namespace {

// The number after "\"key\": " in a one-line JSON record; false when absent or malformed.
bool json_number(const std::string& line, const char* key, double& out) {
  const std::string k = std::string("\"") + key + "\": ";
  const auto at = line.find(k);
  if (at == std::string::npos) return false;
  const char* begin = line.c_str() + at + k.size();
  char* end = nullptr;
  out = std::strtod(begin, &end);
  return end != begin;
}

}  // namespace

RunMetrics read_metrics(const std::string& path) {
  RunMetrics m;
  std::ifstream in(path);
  if (!in) return m;
  m.found = true;
  struct Step { double loss, tok_s, mfu, ms; bool first_of_start; };
  std::map<std::int64_t, Step> steps;  // the last record of each step
  std::int64_t previous = -1;
  std::string line;
  while (std::getline(in, line)) {
    double step = 0, v = 0;
    const bool whole = !line.empty() && line.front() == '{' && line.back() == '}';
    if (!whole || !json_number(line, "step", step)) {
      ++m.bad_lines;
      continue;
    }
    if (json_number(line, "val_loss", v)) {
      m.final_val_loss = v;
      continue;
    }
    Step s{};
    if (!json_number(line, "loss", s.loss) || !json_number(line, "tokens_per_s", s.tok_s)) {
      ++m.bad_lines;
      continue;
    }
    json_number(line, "mfu", s.mfu);
    json_number(line, "ms_per_step", s.ms);
    // A process's first step carries its start-up (allocations, caches): left out of the speed.
    s.first_of_start = std::int64_t(step) != previous + 1;
    previous = std::int64_t(step);
    steps[std::int64_t(step)] = s;
  }
  std::vector<double> tok_s, mfu;
  for (const auto& [step, s] : steps) {
    m.last_step = step;
    m.final_train_loss = s.loss;
    m.train_seconds += s.ms / 1e3;
    if (!s.first_of_start) tok_s.push_back(s.tok_s), mfu.push_back(s.mfu);
  }
  if (tok_s.empty())
    for (const auto& [step, s] : steps) tok_s.push_back(s.tok_s), mfu.push_back(s.mfu);
  m.tokens_per_s = median(tok_s);
  m.mfu = median(mfu);
  return m;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void write_failed_marker(const std::string& run_dir, int exit_code, const std::string& why) {
  std::ofstream f(fs::path(run_dir) / "failed.json", std::ios::trunc);
  f << "{\"exit_code\": " << exit_code << ", \"why\": \"" << json_escaped(why) << "\"}\n";
}

std::string failed_reason(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "failed.json");
  if (!in) return "";
  std::string line;
  std::getline(in, line);
  double code = 0;
  std::string why;
  if (const auto at = line.find("\"why\": \""); at != std::string::npos) {
    why = line.substr(at + 8);
    if (why.size() >= 2) why.resize(why.size() - 2);  // the closing quote and brace
  }
  json_number(line, "exit_code", code);
  return "exit " + std::to_string(int(code)) + (why.empty() ? "" : ": " + why);
}

}  // namespace nsatron::sweep
