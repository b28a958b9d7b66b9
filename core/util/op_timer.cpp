#include "core/util/op_timer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>

#include "core/device/device.h"

namespace nsatron::op_timer {

namespace {

struct Record {
  const char* family;
  Device device;
  std::chrono::steady_clock::time_point cpu_start, cpu_stop;
  void* start = nullptr;  // CUDA events
  void* stop = nullptr;
};

struct BusyRecord {
  std::string group;
  void* start = nullptr;  // CUDA events on the communication's stream
  void* stop = nullptr;
};

struct State {
  bool on = false;
  std::mutex mutex;
  std::vector<Record> records;
  std::vector<BusyRecord> busy;
  std::vector<void*> spare_events;  // CUDA events made earlier, for the scopes to take
};

State& state() {
  static State s;
  return s;
}

// A CUDA event for a scope: a spare one, else a new one (caller holds s.mutex).
void* take_event(State& s) {
  if (s.spare_events.empty()) return create_event();
  void* e = s.spare_events.back();
  s.spare_events.pop_back();
  return e;
}

}  // namespace

void enable(bool on) { state().on = on; }
bool enabled() { return state().on; }

void reset() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& r : s.records) {
    if (r.start) s.spare_events.push_back(r.start);
    if (r.stop) s.spare_events.push_back(r.stop);
  }
  s.records.clear();
  for (auto& r : s.busy) {
    s.spare_events.push_back(r.start);
    s.spare_events.push_back(r.stop);
  }
  s.busy.clear();
}

void reserve_events(std::size_t n) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  while (s.spare_events.size() < n) s.spare_events.push_back(create_event());
}

std::size_t spare_events() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.spare_events.size();
}

void release_events() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (void* e : s.spare_events) destroy_event(e);
  s.spare_events.clear();
}

std::vector<std::pair<std::string, double>> busy_totals_ms() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::map<std::string, double> sum;
  for (const auto& r : s.busy) sum[r.group] += event_elapsed_ms(r.start, r.stop);
  return {sum.begin(), sum.end()};
}

std::vector<std::string> hidden_lines(const std::vector<std::pair<std::string, double>>& busy,
                                      const std::vector<std::pair<std::string, double>>& totals) {
  std::vector<std::string> lines;
  for (const auto& [group, busy_ms] : busy) {
    double waited = 0;
    std::string families;
    for (const auto& [family, ms] : totals)
      if (family.rfind(group + " ", 0) == 0) {
        waited += ms;
        families += (families.empty() ? "" : ", ") + family;
      }
    char line[256];
    std::snprintf(line, sizeof line, "%s communication: %.1f ms busy on the GPU, %.1f ms waited for by the compute stream (%s): %.0f%% hidden",
                  group.c_str(), busy_ms, waited, families.empty() ? "no scope" : families.c_str(),
                  busy_ms > 0 ? 100 * std::max(0.0, 1 - waited / busy_ms) : 0.0);
    lines.emplace_back(line);
  }
  return lines;
}

const std::vector<std::string>& step_families() {
  static const std::vector<std::string> families = {
      "matmul", "nsa core forward", "nsa core backward", "dense attention forward", "dense attention backward",
      "rmsnorm", "swiglu", "cross entropy", "embedding", "split/gather projection", "residual add", "adamw",
      "gradient norm", "tp all-reduce", "dp all-reduce", "dp all-gather", "pp transfer", "embedding all-reduce",
      "other"};
  return families;
}

std::size_t step_family_index(const std::string& family) {
  const std::vector<std::string>& families = step_families();
  return std::size_t(std::find(families.begin(), families.end() - 1, family) - families.begin());
}

std::vector<double> by_step_family(const std::vector<std::pair<std::string, double>>& totals) {
  const std::vector<std::string>& families = step_families();
  std::vector<double> laid(families.size(), 0.0);
  for (const auto& [family, ms] : totals) laid[step_family_index(family)] += ms;
  return laid;
}

namespace {
bool communication_family(const std::string& family) {
  for (const char* group : {"tp ", "dp ", "pp ", "embedding "})
    if (family.rfind(group, 0) == 0) return true;
  return false;
}
}  // namespace

std::string ranks_line(const std::vector<std::vector<double>>& per_rank) {
  const std::vector<std::string>& families = step_families();
  if (per_rank.size() < 2) return "";
  std::vector<double> compute(per_rank.size(), 0.0);
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    for (std::size_t f = 0; f < families.size(); ++f)
      if (!communication_family(families[f])) compute[r] += per_rank[r][f];
  const auto fastest = std::size_t(std::min_element(compute.begin(), compute.end()) - compute.begin());
  const auto slowest = std::size_t(std::max_element(compute.begin(), compute.end()) - compute.begin());
  char line[512];
  int n = std::snprintf(line, sizeof line,
                        "ranks' compute (the families less communication): fastest rank %zu %.1f ms, slowest rank "
                        "%zu %.1f ms (+%.1f%%), which the others wait for at the collectives",
                        fastest, compute[fastest], slowest, compute[slowest],
                        compute[fastest] > 0 ? 100 * (compute[slowest] / compute[fastest] - 1) : 0.0);
  // The families where the slowest rank spent the most over the fastest.
  std::vector<std::pair<double, std::size_t>> excess;
  for (std::size_t f = 0; f < families.size(); ++f)
    if (!communication_family(families[f])) {
      const double d = per_rank[slowest][f] - per_rank[fastest][f];
      if (d > 0) excess.emplace_back(d, f);
    }
  std::sort(excess.begin(), excess.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);  // ties: the list's order
  });
  for (std::size_t i = 0; i < excess.size() && i < 3 && n > 0 && std::size_t(n) < sizeof line; ++i)
    n += std::snprintf(line + n, sizeof line - std::size_t(n), "%s %s +%.1f ms", i == 0 ? "; the slowest's excess:" : ",",
                       families[excess[i].second].c_str(), excess[i].first);
  return line;
}

BusyScope::BusyScope(const std::string& group, void* stream) : stream_(stream) {
  State& s = state();
  if (!s.on) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  BusyRecord r{group, take_event(s), take_event(s)};
  record_event(r.start, stream);
  slot_ = int(s.busy.size());
  s.busy.push_back(std::move(r));
}

BusyScope::~BusyScope() {
  if (slot_ < 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  record_event(s.busy[std::size_t(slot_)].stop, stream_);
}

std::vector<std::pair<std::string, double>> totals_ms() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::map<std::string, double> sum;
  for (const auto& r : s.records) {
    const double ms = r.device == Device::CUDA
                          ? event_elapsed_ms(r.start, r.stop)
                          : std::chrono::duration<double, std::milli>(r.cpu_stop - r.cpu_start).count();
    sum[r.family] += ms;
  }
  std::vector<std::pair<std::string, double>> out(sum.begin(), sum.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::vector<Span> spans() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  void* first_event = nullptr;  // the origin of the GPU's records
  std::chrono::steady_clock::time_point first_cpu{};
  bool any_cpu = false;
  for (const auto& r : s.records) {
    if (r.device == Device::CUDA && first_event == nullptr) first_event = r.start;
    if (r.device != Device::CUDA && !any_cpu) {
      first_cpu = r.cpu_start;
      any_cpu = true;
    }
  }
  if (first_event == nullptr && !s.busy.empty()) first_event = s.busy.front().start;
  std::vector<Span> out;
  for (const auto& r : s.records) {
    Span span{r.family, "compute"};
    if (r.device == Device::CUDA) {
      span.start_ms = event_elapsed_ms(first_event, r.start);
      span.ms = event_elapsed_ms(r.start, r.stop);
    } else {
      span.start_ms = std::chrono::duration<double, std::milli>(r.cpu_start - first_cpu).count();
      span.ms = std::chrono::duration<double, std::milli>(r.cpu_stop - r.cpu_start).count();
    }
    out.push_back(std::move(span));
  }
  for (const auto& r : s.busy)
    out.push_back({r.group + " communication", r.group, event_elapsed_ms(first_event, r.start),
                   event_elapsed_ms(r.start, r.stop)});
  return out;
}

std::vector<std::string> split_lines(const std::vector<std::pair<std::string, double>>& totals, double step_ms) {
  std::vector<std::string> lines;
  char line[160];
  auto add = [&](const std::string& family, double ms) {
    std::snprintf(line, sizeof line, "%-26s %9.1f ms %6.1f%%", family.c_str(), ms, 100 * ms / step_ms);
    lines.emplace_back(line);
  };
  double covered = 0;
  for (const auto& [family, ms] : totals) {
    covered += ms;
    add(family, ms);
  }
  add("(outside the scopes)", step_ms - covered);
  return lines;
}

Scope::Scope(const char* family, Device device) {
  State& s = state();
  if (!s.on) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  Record r{family, device, {}, {}, nullptr, nullptr};
  if (device == Device::CUDA) {
    r.start = take_event(s);
    r.stop = take_event(s);
    record_event(r.start);
  } else {
    r.cpu_start = std::chrono::steady_clock::now();
  }
  slot_ = int(s.records.size());
  s.records.push_back(r);
}

Scope::~Scope() {
  if (slot_ < 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Record& r = s.records[std::size_t(slot_)];
  if (r.device == Device::CUDA)
    record_event(r.stop);
  else
    r.cpu_stop = std::chrono::steady_clock::now();
}

}  // namespace nsatron::op_timer
