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

struct State {
  bool on = false;
  std::mutex mutex;
  std::vector<Record> records;
};

State& state() {
  static State s;
  return s;
}

}  // namespace

void enable(bool on) { state().on = on; }
bool enabled() { return state().on; }

void reset() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& r : s.records) {
    if (r.start) destroy_event(r.start);
    if (r.stop) destroy_event(r.stop);
  }
  s.records.clear();
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
  Record r{family, device, {}, {}, nullptr, nullptr};
  if (device == Device::CUDA) {
    r.start = create_event();
    r.stop = create_event();
    record_event(r.start);
  } else {
    r.cpu_start = std::chrono::steady_clock::now();
  }
  std::lock_guard<std::mutex> lock(s.mutex);
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
