// The plan of a sweep (plan.h).
#include "launch/sweep/plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>

#include "core/util/format.h"
#include "launch/sweep/report.h"

namespace nsatron::sweep {

namespace fs = std::filesystem;

namespace {

double machine_memory_bytes() {
  return double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
}

// Earlier runs' speeds (a results.csv of `sweep report`): by run name, and the FLOP/s they
// reached per device and layout.
struct SpeedTable {
  std::map<std::string, double> tokens_per_s;        // run -> tokens/s
  std::map<std::string, std::vector<double>> flops;  // "device layout" -> achieved FLOP/s of each run
};

SpeedTable read_speed_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError("--throughput: cannot open '" + path + "'");
  std::string line;
  if (!std::getline(in, line)) throw UserError("--throughput: '" + path + "' is empty");
  const std::vector<std::string> header = split_csv_line(line);
  auto column = [&](const char* name) -> std::size_t {
    const auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end())
      throw UserError("--throughput: '" + path + "' has no column '" + name + "' (expected a results.csv of `nsatron sweep report`)");
    return std::size_t(it - header.begin());
  };
  const std::size_t c_run = column("run"), c_tok = column("tokens_per_s"), c_fpt = column("flops_per_token"),
                    c_dev = column("device"), c_layout = column("layout");
  SpeedTable t;
  while (std::getline(in, line)) {
    const auto cells = split_csv_line(line);
    if (cells.size() != header.size()) continue;
    const double tok = std::atof(cells[c_tok].c_str()), fpt = std::atof(cells[c_fpt].c_str());
    if (!(tok > 0) || !(fpt > 0)) continue;  // a run that did not finish
    t.tokens_per_s[cells[c_run]] = tok;
    t.flops[cells[c_dev] + " " + cells[c_layout]].push_back(tok * fpt);
  }
  return t;
}

// Trains a copy of the run for `steps` steps in a scratch folder; its median tokens/s.
double calibrate(const PlannedRun& run, std::int64_t steps, const fs::path& scratch, const RunnerOptions& runner) {
  PlannedRun probe = run;
  probe.dir = (scratch / run.name).string();
  fs::remove_all(probe.dir);
  fs::create_directories(probe.dir);
  RunConfig& c = probe.config;
  c.train.steps = steps;
  c.train.stop_at = 0;
  c.train.eval_every = 0;
  c.checkpoint.dir = probe.dir + "/checkpoints";
  c.checkpoint.every = 0;
  c.checkpoint.resume = "never";
  c.log.metrics = probe.dir + "/metrics.jsonl";
  {
    std::ofstream f(fs::path(probe.dir) / "config.toml");
    f << to_toml(c);
  }
  bool stopped = false;
  const int rc = train_and_wait(train_command(probe, runner), probe.dir + "/run.log", &stopped);
  if (stopped) throw UserError("calibration stopped by a signal");
  const RunMetrics m = read_metrics(probe.dir + "/metrics.jsonl");
  if (rc != 0 || m.tokens_per_s <= 0)
    throw EnvironmentError("calibration of run " + run.name + " failed (exit " + std::to_string(rc) + "); its log: " +
                           probe.dir + "/run.log");
  fs::remove_all(probe.dir);
  return m.tokens_per_s;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / double(1ull << 30));
  return buf;
}

}  // namespace

std::vector<PlanRow> make_plan(const Sweep& sweep, const std::vector<PlannedRun>& runs, const PlanOptions& options,
                               const RunnerOptions& runner) {
  std::vector<PlanRow> rows;
  SpeedTable table;
  if (!options.throughput_csv.empty()) table = read_speed_table(options.throughput_csv);
  const fs::path scratch = fs::path(sweep.out) / ".calibrate";
  std::map<std::string, double> calibrated;  // runs that differ only in their steps share a speed
  for (const auto& run : runs) {
    PlanRow row;
    row.run = &run;
    row.state = run_state(run.dir);
    row.memory = estimate_memory(run.config);
    const bool cuda = run.config.train.device == "cuda";
    row.capacity = cuda ? options.gpu_memory_bytes
                        : (options.cpu_memory_bytes > 0 ? options.cpu_memory_bytes : machine_memory_bytes()) /
                              double(run.ranks);
    if (double(row.memory.total()) > row.capacity) {
      row.fits = false;
      row.why_not = "needs " + gib(double(row.memory.total())) + " GiB per " + (cuda ? "GPU" : "rank") +
                    " (pp stage " + std::to_string(row.memory.pp_stage) + "), " + gib(row.capacity) + " GiB available" +
                    (cuda ? " (--gpu-memory)" : " (this machine's memory / ranks)");
    }
    if (options.calibrate_steps > 0 && row.fits) {
      RunConfig same = run.config;
      same.train.steps = 1;
      same.checkpoint.dir = same.log.metrics = "";
      double& speed = calibrated[to_toml(same)];
      if (speed == 0) speed = calibrate(run, options.calibrate_steps, scratch, runner);
      row.tokens_per_s = speed;
      row.speed_source = "calibrated here (" + std::to_string(options.calibrate_steps) + " steps)";
    } else if (const auto it = table.tokens_per_s.find(run.name); it != table.tokens_per_s.end()) {
      row.tokens_per_s = it->second;
      row.speed_source = "the same run in " + options.throughput_csv;
    } else if (const auto f = table.flops.find(run.config.train.device + " " + layout_name(run.config));
               f != table.flops.end()) {
      row.tokens_per_s = median(f->second) / run.flops_per_token;
      row.speed_source = "the FLOP/s of " + std::to_string(f->second.size()) + " earlier run(s) in " +
                         options.throughput_csv;
    }
    if (row.tokens_per_s > 0) row.wall_s = double(run.tokens) / row.tokens_per_s;
    rows.push_back(row);
  }
  if (options.calibrate_steps > 0) fs::remove_all(scratch);
  return rows;
}

void print_plan_table(std::ostream& out, const Sweep& sweep, const std::vector<PlanRow>& rows) {
  out << "sweep " << sweep.name << " (" << sweep.file << "): " << rows.size() << " runs, base " << sweep.base
      << ", out " << sweep.out << "\n\n";
  std::size_t w = 3;
  for (const auto& r : rows) w = std::max(w, r.run->name.size());
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %5s %9s %9s %9s %7s %9s %9s %8s %10s %10s  %s\n", int(w), "run", "ranks",
                "params", "nonembed", "tokens", "steps", "FLOPs", "mem/rank", "fits", "est. wall", "state", "");
  out << line;
  double total_flops = 0, total_wall = 0;
  bool wall_known = true;
  std::vector<std::string> notes;
  for (const auto& r : rows) {
    const PlannedRun& p = *r.run;
    total_flops += p.flops;
    total_wall += r.wall_s;
    wall_known = wall_known && r.wall_s > 0;
    std::snprintf(line, sizeof line, "%-*s %5lld %9s %9s %9s %7lld %9s %9s %8s %10s %10s\n", int(w), p.name.c_str(),
                  (long long)p.ranks, human_count(double(p.params)).c_str(),
                  human_count(double(p.params_nonembed)).c_str(), human_count(double(p.tokens)).c_str(),
                  (long long)p.config.train.steps, human_count(p.flops).c_str(),
                  human_bytes(double(r.memory.total())).c_str(), r.fits ? "yes" : "NO",
                  r.wall_s > 0 ? human_duration(r.wall_s).c_str() : "-", state_name(r.state));
    out << line;
    if (!r.fits) notes.push_back("run " + p.name + " cannot fit: " + r.why_not);
  }
  out << "\ntotal: " << human_count(total_flops) << " FLOPs";
  if (wall_known && !rows.empty()) out << ", about " << human_duration(total_wall) << " one run after another";
  out << "\n";
  if (!rows.empty()) {
    const MemoryEstimate& m = rows.front().memory;
    out << "memory per rank = weights + gradients + AdamW state + activations (first run: "
        << human_bytes(double(m.weights)) << " + " << human_bytes(double(m.gradients)) << " + "
        << human_bytes(double(m.optimizer)) << " + " << human_bytes(double(m.activations)) << ")\n";
  }
  std::map<std::string, int> sources;
  for (const auto& r : rows) sources[r.speed_source.empty() ? "" : r.speed_source]++;
  for (const auto& [s, n] : sources)
    out << "wall time: " << (s.empty() ? "unknown (give --calibrate N or --throughput results.csv)" : "from " + s)
        << (sources.size() > 1 ? " (" + std::to_string(n) + " runs)" : std::string()) << "\n";
  for (const auto& n : notes) out << n << "\n";
}

void print_plan_json(std::ostream& out, const Sweep& sweep, const std::vector<PlanRow>& rows) {
  auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return q + "\"";
  };
  out << "{\"sweep\": " << quote(sweep.name) << ", \"file\": " << quote(sweep.file) << ", \"out\": " << quote(sweep.out)
      << ", \"axes\": [";
  for (std::size_t i = 0; i < sweep.axes.size(); ++i) out << (i ? ", " : "") << quote(sweep.axes[i].name);
  out << "], \"runs\": [\n";
  out.precision(10);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const PlanRow& r = rows[i];
    const PlannedRun& p = *r.run;
    out << "  {\"run\": " << quote(p.name) << ", \"dir\": " << quote(p.dir) << ", \"axes\": {";
    for (std::size_t a = 0; a < sweep.axes.size(); ++a)
      out << (a ? ", " : "") << quote(sweep.axes[a].name) << ": " << quote(p.axis_labels[a]);
    out << "}, \"attention\": " << quote(p.config.model.attention) << ", \"layout\": " << quote(layout_name(p.config))
        << ", \"device\": " << quote(p.config.train.device) << ", \"ranks\": " << p.ranks
        << ", \"params\": " << p.params << ", \"params_nonembed\": " << p.params_nonembed << ", \"tokens\": " << p.tokens
        << ", \"steps\": " << p.config.train.steps << ", \"tokens_per_step\": " << p.tokens_per_step
        << ", \"flops_per_token\": " << p.flops_per_token << ", \"flops\": " << p.flops
        << ", \"memory\": {\"weights\": " << r.memory.weights << ", \"gradients\": " << r.memory.gradients
        << ", \"optimizer\": " << r.memory.optimizer << ", \"activations\": " << r.memory.activations
        << ", \"total\": " << r.memory.total() << ", \"capacity\": " << std::llround(r.capacity) << "}"
        << ", \"fits\": " << (r.fits ? "true" : "false") << ", \"why_not\": " << quote(r.why_not)
        << ", \"tokens_per_s\": " << r.tokens_per_s << ", \"speed_source\": " << quote(r.speed_source)
        << ", \"wall_s\": " << r.wall_s << ", \"state\": " << quote(state_name(r.state)) << "}"
        << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  out << "]}\n";
}

}  // namespace nsatron::sweep
