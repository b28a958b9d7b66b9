// The data side of a training run, built from the run config: what the trainer calls.
//
//   auto data = nsatron::data::open_run_data(cfg, dp_rank);
//   for each step:
//     for m in 0 .. data.layout.micro_batches() - 1:
//       data.sampler->next(data.layout, m, batch);   // batch.inputs / batch.targets
//       ... forward / backward ...
//     data.sampler->advance(data.layout);
//   checkpoint: data.sampler->position().serialize()   resume: restore(deserialize(text))
//   eval: for b in 0 .. cfg.train.eval_batches - 1, m: data.val->fill(b, data.layout, m, batch)
#pragma once
#include <memory>

#include "core/config/config.h"
#include "data/sampler.h"

namespace nsatron::data {

struct RunData {
  std::shared_ptr<const TokenDataset> train_set, val_set;  // val_set null without data.val
  std::unique_ptr<TrainSampler> sampler;   // seeded by train.seed, shuffled
  std::unique_ptr<ValidationReader> val;   // null without data.val
  BatchLayout layout;                      // train.global_batch / micro_batch over dp ranks
};

// Opens data.train (and data.val when given) with data.format, checking every token id
// against model.vocab_size, for DP rank `dp_rank` of cfg.dp(). Errors name the config key
// ("data.train: the glob '...' matches no file", shard errors name the file).
RunData open_run_data(const RunConfig& cfg, int dp_rank);

// The batch layout of a config for one DP rank (validated).
BatchLayout batch_layout(const RunConfig& cfg, int dp_rank);

}  // namespace nsatron::data
