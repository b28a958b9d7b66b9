// Logging phases: the run log's step, eval and closing lines, the JSONL metrics file, the
// progress bar.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/device/device.h"
#include "core/util/error.h"
#include "core/util/format.h"
#include "core/util/op_timer.h"
#include "launch/train/phases.h"

namespace nsatron::train {

ProgressBar::ProgressBar(std::int64_t total, bool on) : total_(total), enabled_(on && isatty(STDERR_FILENO)) {}

void ProgressBar::draw(std::int64_t done, double eta_s) {
  if (!enabled_) return;
  const int width = 30;
  int filled = int(double(width) * double(done) / double(std::max<std::int64_t>(1, total_)));
  std::fprintf(stderr, "\r[%s%s] %lld/%lld eta %s ", std::string(std::size_t(filled), '#').c_str(),
               std::string(std::size_t(width - filled), '.').c_str(), (long long)done, (long long)total_,
               human_duration(eta_s).c_str());
  std::fflush(stderr);
  shown_ = true;
}

void ProgressBar::clear() {
  if (enabled_ && shown_) std::fprintf(stderr, "\r%60s\r", "");
  shown_ = false;
}

void open_metrics(Run& run) {
  const RunConfig& cfg = run.cfg;
  run.world.together([&] {
    if (!run.root || cfg.log.metrics.empty()) return;
    std::filesystem::path mp(cfg.log.metrics);
    if (mp.has_parent_path()) std::filesystem::create_directories(mp.parent_path());
    run.log.metrics.open(cfg.log.metrics, run.start_step > 0 ? std::ios::app : std::ios::trunc);
    if (!run.log.metrics) throw UserError(cfg.source + ": log.metrics: cannot write '" + cfg.log.metrics + "'");
  });
}

namespace {

// The step's JSONL record (a non-finite loss or norm is written as -1; host_lead_ms on GPUs
// with pp = 1 only).
void write_step_record(Run& run, const StepResult& r, std::size_t peak_memory) {
  LogState& log = run.log;
  const double tok_s = double(log.tokens_per_step) / r.seconds;
  const double mfu = log.peak_flops > 0 ? tok_s * log.flops_per_token / log.peak_flops : 0.0;
  log.metrics << std::setprecision(9) << "{\"step\": " << r.step
              << ", \"loss\": " << (std::isfinite(r.loss) ? r.loss : -1) << ", \"lr\": " << r.lr
              << ", \"grad_norm\": " << (std::isfinite(r.grad_norm) ? r.grad_norm : -1) << ", \"tokens_per_s\": " << tok_s
              << ", \"ms_per_step\": " << r.seconds * 1e3 << ", \"peak_mem_bytes\": " << peak_memory
              << ", \"activation_peak_bytes\": " << r.activation_peak_bytes << ", \"mfu\": " << mfu
              << ", \"tokens\": " << r.step * log.tokens_per_step << ", \"skipped\": " << (r.skipped ? "true" : "false");
  // GPUs, pp = 1: how far the host was ahead of the device when it had queued the step's
  // forwards and backwards (the profile's host line, in every step's record).
  if (run.device == Device::CUDA && r.queued_ms > 0)
    log.metrics << ", \"host_lead_ms\": " << r.losses_read_ms - r.queued_ms;
  log.metrics << "}\n"
              << std::flush;
}

// The log line: loss and speed averaged over the steps since the previous line.
void write_step_line(Run& run, const StepResult& r, std::size_t peak_memory) {
  LogState& log = run.log;
  run.bar.clear();
  char line[512];
  const double window_tok_s = double(log.tokens_per_step) * double(log.window_steps) / log.window_time;
  char mfu_text[32] = "";
  if (log.peak_flops > 0)
    std::snprintf(mfu_text, sizeof mfu_text, " | mfu %.1f%%", 100.0 * window_tok_s * log.flops_per_token / log.peak_flops);
  std::snprintf(line, sizeof line,
                "step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %s tok/s | %.0f ms/step | mem %s%s | eta %s\n",
                (long long)r.step, (long long)run.cfg.train.steps, log.window_loss / double(log.window_steps), r.lr,
                r.grad_norm, human_count(window_tok_s).c_str(), log.window_time / double(log.window_steps) * 1e3,
                human_bytes(double(peak_memory)).c_str(), mfu_text, human_duration(log.eta_s).c_str());
  run.out << line << std::flush;
  log.window_time = log.window_loss = 0;
  log.window_steps = 0;
}

}  // namespace

void log_step(Run& run, const StepResult& r) {
  LogState& log = run.log;
  log.window_time += r.seconds;
  log.window_loss += r.loss;
  ++log.window_steps;
  const std::size_t peak_memory = memory_stats(run.device).peak;
  if (log.metrics) write_step_record(run, r, peak_memory);
  const double elapsed = std::chrono::duration<double>(Clock::now() - log.loop_start).count();
  log.eta_s = elapsed / double(r.step - run.start_step) * double(run.cfg.train.steps - r.step);
  if (r.step % run.cfg.log.every == 0 || r.last || r.step - 1 == run.start_step) write_step_line(run, r, peak_memory);
}

void log_eval(Run& run, std::int64_t step_done, double val_loss) {
  run.bar.clear();
  char line[128];
  std::snprintf(line, sizeof line, "eval   %6lld | val loss %.4f\n", (long long)step_done, val_loss);
  run.out << line << std::flush;
  if (run.log.metrics)
    run.log.metrics << std::setprecision(9) << "{\"step\": " << step_done << ", \"val_loss\": " << val_loss << "}\n"
                    << std::flush;
}

void show_progress(Run& run, std::int64_t step_done) { run.bar.draw(step_done, run.log.eta_s); }

void log_done(Run& run) {
  run.bar.clear();
  const TrainSummary& s = run.summary;
  const double total = std::chrono::duration<double>(Clock::now() - run.started).count();
  run.summary.wall_s = total;
  run.out << "\ndone: " << s.steps_done << " steps in " << human_duration(total) << ", final train loss " << std::fixed
          << std::setprecision(4) << s.last_loss;
  if (s.last_val_loss >= 0) run.out << ", val loss " << s.first_val_loss << " -> " << s.last_val_loss;
  run.out << ", " << s.skipped_steps << " skipped steps\n" << std::defaultfloat;
}

namespace {

// A span travels as four values: its family (an index into op_timer::step_families(), whose
// last entry is "other"; -1: its lane's communication), its lane (an index into kTraceLanes),
// its start and its length in ms. Padding rows (ranks with fewer spans) have lane -1.
const std::vector<std::string> kTraceLanes = {"compute", "tp", "dp", "pp", "embedding", "other"};
constexpr std::size_t kSpanValues = 4;

}  // namespace

std::string write_trace(Run& run, std::int64_t step_done) {
  const std::vector<std::string>& families = op_timer::step_families();
  std::vector<double> mine;
  for (const op_timer::Span& span : op_timer::spans()) {
    const auto lane = std::find(kTraceLanes.begin(), kTraceLanes.end() - 1, span.lane) - kTraceLanes.begin();
    const double family = span.lane == "compute" ? double(op_timer::step_family_index(span.family)) : -1.0;
    mine.insert(mine.end(), {family, double(lane), span.start_ms, span.ms});
  }
  // Every rank's spans: the longest count first, then as many rows from each rank.
  parallel::Communicator& world = *run.groups.world;
  const double most = all_reduce_value(world, double(mine.size() / kSpanValues), parallel::ReduceOp::Max);
  mine.resize(std::size_t(most) * kSpanValues, -1.0);
  const std::vector<double> all = all_gather_values(world, mine);
  if (!run.root) return "";
  const std::filesystem::path path(run.cfg.log.trace);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path);
  if (!out) throw UserError(run.cfg.source + ": log.trace: cannot write '" + run.cfg.log.trace + "'");
  const std::size_t per_rank = mine.size(), ranks = per_rank > 0 ? all.size() / per_rank : 0;
  out << std::setprecision(12) << "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"step\": " << step_done
      << ", \"source\": \"" << json_escaped(run.cfg.source) << "\"},\n\"traceEvents\": [";
  const char* sep = "\n";
  for (std::size_t r = 0; r < ranks; ++r) {
    out << sep << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << r
        << ", \"args\": {\"name\": \"rank " << r << "\"}}";
    sep = ",\n";
    for (std::size_t l = 0; l < kTraceLanes.size(); ++l)
      out << sep << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << r << ", \"tid\": " << l
          << ", \"args\": {\"name\": \"" << kTraceLanes[l] << "\"}}";
    for (std::size_t k = 0; k < per_rank; k += kSpanValues) {
      const double* v = &all[r * per_rank + k];
      if (v[1] < 0) continue;  // padding
      const auto lane = std::size_t(v[1]);
      const std::string name = v[0] < 0 ? kTraceLanes[lane] + " communication" : families[std::size_t(v[0])];
      // Chrome's trace events count in microseconds.
      out << sep << "{\"name\": \"" << json_escaped(name) << "\", \"ph\": \"X\", \"pid\": " << r
          << ", \"tid\": " << lane << ", \"ts\": " << 1000 * v[2] << ", \"dur\": " << 1000 * v[3] << "}";
    }
  }
  out << "\n]}\n";
  if (!out) throw UserError(run.cfg.source + ": log.trace: cannot write '" + run.cfg.log.trace + "'");
  return "timeline of " + std::to_string(ranks) + " rank(s) written to " + run.cfg.log.trace + " (log.trace)";
}

}  // namespace nsatron::train
