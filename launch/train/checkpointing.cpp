// Checkpointing phase: when to save, and saving the run's state (one process: one file;
// several ranks: each writer its blocks, launch/dist_checkpoint.h).
#include <filesystem>
#include <iomanip>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "launch/dist_checkpoint.h"
#include "launch/train/phases.h"

namespace nsatron::train {

namespace ckpt = checkpoint;

namespace {

// The training state of a checkpoint after `step_done` steps: step, tokens, AdamW's t, the
// sampler's position, the resolved config.
ckpt::TrainState train_state(const Run& run, std::int64_t step_done) {
  ckpt::TrainState state;
  state.step = step_done;
  state.consumed_tokens = run.data.sampler->consumed_samples() * run.cfg.train.seq_len;
  state.optimizer_step = run.optimizer_step;
  state.sampler_position = run.data.sampler->position().serialize();
  state.config_toml = to_toml(run.cfg);
  state.extra[kAttentionAttribute] = run.cfg.model.attention;  // checked on resume (resume.cpp)
  return state;
}

// Several ranks: each rank of DP group 0 writes the blocks it holds (one writer for pure DP:
// rank 0); ZeRO-1: each DP rank writes the blocks whose moments it owns. Replicas are written
// by their counting rank only. (Weights and moments are fp32; on a GPU, copied to the host.)
std::filesystem::path save_from_ranks(Run& run, const ckpt::TrainState& state) {
  const ParamStore& params = run.model->params();
  parallel::DataParallelOptimizer& opt = *run.optimizer;
  auto host = [](const Tensor& t) { return t.is_cpu() ? t : t.to(Device::CPU); };
  Tensor hw, hm, hv;  // the shards point into these until the file is written
  std::vector<ckpt::ShardSpec> shards;
  if (run.sharded_state || run.groups.layout.dp_rank == 0) {
    hw = host(params.flat_weights()), hm = host(opt.m()), hv = host(opt.v());
    shards = ckpt::param_shards(params, static_cast<const float*>(hw.raw()), static_cast<const float*>(hm.raw()),
                                static_cast<const float*>(hv.raw()), opt.owned_begin(), opt.owned_begin(),
                                opt.owned_end());
  }
  return save_checkpoint_from_ranks(run.world, run.cfg.checkpoint.dir, state, shards, !shards.empty(),
                                    run.groups.layout.describe() + (run.sharded_state ? " zero1" : ""),
                                    int(run.cfg.checkpoint.keep));
}

}  // namespace

bool checkpoint_due(const Run& run, const StepResult& result) {
  return run.cfg.checkpoint.every > 0 && result.step % run.cfg.checkpoint.every == 0;
}

void save_checkpoint(Run& run, std::int64_t step_done) {
  run.bar.clear();
  const auto t0 = Clock::now();
  const ckpt::TrainState state = train_state(run, step_done);
  const std::filesystem::path where =
      run.world.size() == 1 ? ckpt::save_checkpoint(run.cfg.checkpoint.dir, run.model->params(), run.optimizer->m(),
                                                    run.optimizer->v(), state, int(run.cfg.checkpoint.keep))
                            : save_from_ranks(run, state);
  run.saved_step = step_done;
  run.out << "checkpoint   step " << step_done << " saved to " << where.string() << " (" << std::fixed
          << std::setprecision(2) << std::chrono::duration<double>(Clock::now() - t0).count() << " s)\n"
          << std::defaultfloat << std::flush;
}

void save_final_checkpoint(Run& run) {
  if (run.summary.steps_done > 0 && run.saved_step != run.summary.steps_done) save_checkpoint(run, run.summary.steps_done);
}

}  // namespace nsatron::train
