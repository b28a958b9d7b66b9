// The state of one training run: what each phase of the driver (phases.h) sets up and the
// later phases read. One object, filled in phase order; each group of members names the
// phase that sets it. The loop itself is run_training in launch/trainer.cpp.
#pragma once
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <memory>

#include "core/config/config.h"
#include "core/model/model.h"
#include "core/tensor/dtype.h"
#include "data/pipeline.h"
#include "launch/trainer.h"
#include "launch/world.h"
#include "parallel/data_parallel.h"
#include "parallel/process_groups.h"

namespace nsatron::train {

using Clock = std::chrono::steady_clock;

// The progress bar on stderr (rank 0, when stderr is a terminal): drawn after each step,
// cleared before any line is logged.
class ProgressBar {
 public:
  ProgressBar(std::int64_t total, bool on);
  void draw(std::int64_t done, double eta_s);
  void clear();  // erases a drawn bar (nothing when none is shown)

 private:
  std::int64_t total_;
  bool enabled_;
  bool shown_ = false;
};

// The log's running figures (log.cpp): the JSONL file, the averages over the steps since the
// last log line, the speed reference of MFU.
struct LogState {
  std::ofstream metrics;             // log.metrics on rank 0 (closed: none)
  double flops_per_token = 0;        // of training (forward + backward), for MFU
  double peak_flops = 0;             // the job's bf16 peak (0: unknown, MFU not reported)
  std::int64_t tokens_per_step = 0;  // global_batch * seq_len
  Clock::time_point loop_start;      // when the first step of this process began (for the ETA)
  double window_time = 0, window_loss = 0;  // sums since the last log line
  std::int64_t window_steps = 0;
  double eta_s = 0;                  // the estimate after the last step
};

struct Run {
  Run(const RunConfig& cfg, std::ostream& out, World& world, const TrainOptions& options);

  // Given.
  const RunConfig& cfg;
  std::ostream& out;  // the run log (rank 0's stdout; a silent stream on the others)
  World& world;
  const TrainOptions options;
  const Device device;  // train.device
  const DType dtype;    // train.dtype: the compute dtype
  const bool root;      // rank 0: writes the log, the metrics and the checkpoints' metadata
  const Clock::time_point started;
  const ModelDims dims;  // the whole model's

  // setup_world: process groups and devices.
  parallel::ProcessGroups groups;         // control values (MPI groups; single ones in one process)
  parallel::ProcessGroups tensor_groups;  // tensors: NCCL groups with several GPUs, else `groups`
  bool multi_gpu = false;                 // several ranks on CUDA: one GPU each
  int gpu_index = 0;                      // this rank's GPU (multi_gpu)
  std::string pp_transport;               // multi_gpu, pp > 1: the run log's words for it
  std::string tp_transport;               // multi_gpu, tp > 1: the run log's words for it

  // open_data: this DP rank's slice of the training data, the validation reader.
  data::RunData data;

  // build_model_and_optimizer.
  std::unique_ptr<NsaTransformer> model;
  std::unique_ptr<parallel::DataParallelOptimizer> optimizer;  // DP reduction, ZeRO-1, AdamW
  bool separate_compute_copy = false;  // compute weights (bf16) beside the fp32 master weights
  bool sharded_state = false;          // ZeRO-1 over several DP ranks: this rank owns a range

  // resume (optimizer_step counts on from there).
  std::int64_t start_step = 0;      // the first step this process runs (0-based)
  std::int64_t optimizer_step = 0;  // AdamW's t: steps that updated (skipped ones do not)

  // optimizer_step.
  std::int64_t bad_in_row = 0;  // non-finite steps in a row

  // save_checkpoint.
  std::int64_t saved_step = 0;  // the step of the last checkpoint saved or loaded

  // The log (log.cpp) and what the caller gets back.
  LogState log;
  ProgressBar bar;
  TrainSummary summary;

  int dp() const { return groups.layout.dp; }
  int tp() const { return groups.layout.tp; }
  int pp() const { return groups.layout.pp; }
  // Micro-batches per step on this DP rank.
  std::int64_t micro_batches() const { return data.layout.micro_batches(); }
};

// What one optimizer step did (optimizer_step -> the log, evaluation, checkpoints, stop).
struct StepResult {
  std::int64_t step = 0;      // its number, from 1 (the log's numbering: steps done)
  bool last = false;          // step == train.steps
  double lr = 0;
  double loss = 0;            // the mean over the global batch (every rank has it)
  double grad_norm = 0;       // before clipping (every rank has it)
  bool skipped = false;       // loss or norm not finite: no update
  double seconds = 0;         // wall time of the step
  // pp = 1: when the host had queued the step's forwards and backwards, and when their losses
  // were read (the device done with them), in ms from the step's start (the profile's host line).
  double queued_ms = 0, losses_read_ms = 0;
  std::size_t activation_peak_bytes = 0;
};

}  // namespace nsatron::train
