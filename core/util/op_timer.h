// Time per op family inside a training step, for benchmarks: scopes placed around the
// model's calls record elapsed time (CUDA events on the GPU, a steady clock on the CPU) under
// a family name. Off by default and switched on only by a program's own call (never by an
// environment variable); when off, a scope costs one flag test. The model's scopes do not
// nest, so the families add up to the step's op time.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor/dtype.h"

namespace nsatron::op_timer {

void enable(bool on);
bool enabled();
// Forgets the records; their CUDA events become spares for the next scopes.
void reset();
// GPUs: makes spare CUDA events until there are n, so that the scopes of a timed step take
// them instead of creating their own (cudaEventCreate in the step is host time the device may
// wait for); release_events() destroys the spares. Each scope takes two.
void reserve_events(std::size_t n);
void release_events();
std::size_t spare_events();  // how many there are (tests)
// Milliseconds per family since the last reset, largest first (waits for the GPU).
std::vector<std::pair<std::string, double>> totals_ms();
// The split of a step of step_ms: one line per family of `totals` ("family  ms  share%"),
// then "(outside the scopes)" with the rest of the step; no prefix, no newline.
std::vector<std::string> split_lines(const std::vector<std::pair<std::string, double>>& totals, double step_ms);

// Communication's busy time on the GPU, for the fraction of it hidden behind computation: a
// BusyScope records CUDA events on `stream` (a cudaStream_t; nullptr: the compute stream)
// around one collective or transfer the communicators enqueue there, summed per group ("tp",
// "dp", "pp") by busy_totals_ms(). Kept apart from the scopes' families, which the work may
// overlap; only while enabled.
std::vector<std::pair<std::string, double>> busy_totals_ms();
// Per group of `busy`: its busy time, the time the compute stream spent in the families named
// "<group> ..." of `totals` (the collectives it ran in line and its waits for the others: the
// communication not hidden), and the fraction hidden, 1 - waited / busy. No prefix, no newline.
std::vector<std::string> hidden_lines(const std::vector<std::pair<std::string, double>>& busy,
                                      const std::vector<std::pair<std::string, double>>& totals);

// The families a training step can have (the model's, the pipeline's, the data-parallel
// optimizer's, the trainer's and the benchmarks' scopes) in a fixed order, then "other" for
// any family not listed: every rank lays its totals out on it, so that ranks can be compared.
const std::vector<std::string>& step_families();
// The index of `family` in step_families() (not listed: the last, "other").
std::size_t step_family_index(const std::string& family);
// totals laid out on step_families() (0 where a family is absent).
std::vector<double> by_step_family(const std::vector<std::pair<std::string, double>>& totals);
// Every rank's totals laid out by by_step_family (rank r's at [r]; two or more ranks): the
// fastest and the slowest rank by compute (every family but a communication group's, "tp ...",
// "dp ...", "pp ...", "embedding ...": those hold the waits for slower ranks), how much longer
// the slowest computed, which every collective makes the others wait for, and the (up to
// three) families where the slowest spent the most time over the fastest. No prefix, no newline.
std::string ranks_line(const std::vector<std::vector<double>>& per_rank);

// The records since the last reset as a timeline (log.trace): each scope on the "compute" lane,
// each BusyScope on its group's lane ("tp", "dp", "pp", ...), in the order recorded, with its
// start in ms from the first scope's (GPUs: the first CUDA event's; CPUs: the first steady-clock
// reading's) and its length (waits for the GPU).
struct Span {
  std::string family, lane;
  double start_ms = 0, ms = 0;
};
std::vector<Span> spans();

class BusyScope {
 public:
  BusyScope(const std::string& group, void* stream);
  ~BusyScope();
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  int slot_ = -1;
  void* stream_ = nullptr;
};

class Scope {
 public:
  Scope(const char* family, Device device);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int slot_ = -1;
};

}  // namespace nsatron::op_timer
