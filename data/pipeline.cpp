#include "data/pipeline.h"

namespace nsatron::data {

BatchLayout batch_layout(const RunConfig& cfg, int dp_rank) {
  BatchLayout l;
  l.global_batch = cfg.train.global_batch;
  l.micro_batch = cfg.train.micro_batch;
  l.dp = int(cfg.dp());
  l.dp_rank = dp_rank;
  l.validate();
  return l;
}

RunData open_run_data(const RunConfig& cfg, int dp_rank) {
  RunData d;
  d.layout = batch_layout(cfg, dp_rank);
  DatasetOptions opt;
  opt.format = parse_shard_format(cfg.data.format, "data.format");
  opt.vocab_size = cfg.model.vocab_size;
  d.train_set = TokenDataset::open(cfg.data.train, opt, "data.train");
  d.sampler = std::make_unique<TrainSampler>(d.train_set, cfg.train.seq_len,
                                             std::uint64_t(cfg.train.seed), /*shuffle=*/true);
  if (!cfg.data.val.empty()) {
    d.val_set = TokenDataset::open(cfg.data.val, opt, "data.val");
    d.val = std::make_unique<ValidationReader>(d.val_set, cfg.train.seq_len);
  }
  return d;
}

}  // namespace nsatron::data
