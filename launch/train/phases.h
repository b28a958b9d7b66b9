// The phases of a training run, in the order run_training (launch/trainer.cpp) calls them,
// each over the one state object Run (run.h). A phase that every rank must pass together
// (start-up, data, resume) runs through World::together: an error on any rank stops every
// rank there (world.h).
//
// A new feature goes into the phase that owns its concern (a check before a save: in
// save_checkpoint; a new log field: in log_step), or becomes a phase of its own here.
#pragma once
#include <cstdint>
#include <string>

#include "launch/train/run.h"

namespace nsatron::train {

// The root attribute extra.<this> of a checkpoint: which attention its model has
// (model.attention, "nsa" or "dense"); a run refuses to resume a checkpoint of the other.
inline constexpr const char* kAttentionAttribute = "attention";

// ---- setup.cpp: before the first step ---------------------------------------------------
// The world's checks, the process groups, one GPU per rank and the NCCL groups.
void setup_world(Run& run);
// This DP rank's data (a bad shard stops the run before any work).
void open_data(Run& run);
// This rank's shard of the model, initialised from train.seed, and the optimizer over it.
void build_model_and_optimizer(Run& run);

// ---- resume.cpp: where to start ---------------------------------------------------------
// Chooses the checkpoint (checkpoint.resume), loads it on every rank, reports what changed.
void resume(Run& run);

// ---- describe.cpp: the log's header -----------------------------------------------------
// "nsatron VERSION train CONFIG" and the resolved config.
void log_config(Run& run);
// The "# run" and "# implementations" sections (collective: counts the parameters).
void describe_run(Run& run);

// ---- step.cpp: one optimizer step -------------------------------------------------------
// Micro-batches (or the 1F1B schedule), gradient reduction over DP, the norm, the skip of a
// non-finite step, clipping and AdamW. `step`: 0-based.
StepResult optimizer_step(Run& run, std::int64_t step);

// ---- evaluate.cpp: validation -----------------------------------------------------------
// Whether validation runs after this step (train.eval_every, and the last step).
bool evaluation_due(const Run& run, const StepResult& result);
// The validation loss after `step_done` steps, into the summary and the log.
void evaluate_and_log(Run& run, std::int64_t step_done);

// ---- log.cpp: the run log and the metrics file ------------------------------------------
// Opens log.metrics (rank 0; appended to when resuming).
void open_metrics(Run& run);
// The step's JSONL record, and the log line every log.every steps (averaged over them).
void log_step(Run& run, const StepResult& result);
// The validation loss after `step_done` steps: its log line and JSONL record.
void log_eval(Run& run, std::int64_t step_done, double val_loss);
// The progress bar after step `step_done` (stderr, a terminal only).
void show_progress(Run& run, std::int64_t step_done);
// The closing line: steps, time, losses, skipped steps.
void log_done(Run& run);
// log.trace: every rank's timeline of the profiled step (op_timer::spans(), taken before the
// records are reset), gathered over the world and written by rank 0 as a Chrome trace-event
// JSON file. Collective over the world. Returns the run log's line on rank 0 (else empty).
std::string write_trace(Run& run, std::int64_t step_done);

// ---- checkpointing.cpp: saving ----------------------------------------------------------
// Whether checkpoint.every asks for a checkpoint after this step.
bool checkpoint_due(const Run& run, const StepResult& result);
// Saves the state after `step_done` steps (every rank: collective with several).
void save_checkpoint(Run& run, std::int64_t step_done);
// The checkpoint at the end, unless the last step's is saved already.
void save_final_checkpoint(Run& run);

// ---- stop.cpp: stopping early -----------------------------------------------------------
// A stop signal on any rank, or train.stop_at: saves and returns true (every rank alike).
bool stop_requested(Run& run, const StepResult& result);

}  // namespace nsatron::train
