// The run configuration: one TOML file, validated strictly before anything starts.
//
// Every key, its type, default, range and meaning is declared once, in the key table of
// config.cpp; docs/config.md is generated from that table (`nsatron config docs`) and a test
// keeps the two in step. Defaults are the member initialisers below. A value of 0 in
// model.head_dim, model.ffn_hidden and -1 in recompute.layers means "derive it"; the resolved
// config holds the derived value. An empty parallel.pp_layers (an even pipeline split) stays
// empty; stage_layers() gives each stage's layers either way (stage_chunks() with virtual stages).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/error.h"

namespace nsatron {

struct ModelConfig {
  std::string attention = "nsa";  // "nsa" or "dense" (the baseline: causal GQA attention)
  std::int64_t vocab_size = 256;
  std::int64_t d_model = 768;
  std::int64_t n_layers = 12;
  std::int64_t n_heads = 12;
  std::int64_t n_kv_heads = 2;
  std::int64_t head_dim = 0;    // 0: d_model / n_heads
  std::int64_t ffn_hidden = 0;  // 0: 8/3 d_model rounded up to a multiple of 64
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tie_embeddings = true;
  double init_std = 0.02;
};

struct NsaConfig {
  std::int64_t cmp_block = 32;
  std::int64_t cmp_stride = 16;
  std::int64_t sel_block = 64;
  std::int64_t sel_count = 16;
  std::int64_t window = 512;
};

struct TrainConfig {
  std::int64_t seq_len = 2048;
  std::int64_t micro_batch = 1;
  std::int64_t global_batch = 1;
  std::int64_t steps = 1000;
  std::int64_t seed = 1234;
  std::string device = "cpu";
  std::string dtype = "fp32";
  std::int64_t eval_every = 0;  // 0: never
  std::int64_t eval_batches = 8;
  std::int64_t max_bad_steps = 5;
  std::int64_t stop_at = 0;  // 0: run to train.steps
};

struct OptimConfig {
  double lr = 3e-4;
  double min_lr = 3e-5;
  std::int64_t warmup_steps = 100;
  std::string decay = "cosine";
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0: off
};

struct ParallelConfig {
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  // Layers of each pipeline stage, in order (one entry per stage, summing to n_layers); with
  // virtual_stages > 1, of each model chunk (pp * virtual_stages entries, model order).
  // Empty: an even split. RunConfig::stage_layers / stage_chunks resolve either.
  std::vector<std::int64_t> pp_layers;
  // Model chunks per pipeline rank (the interleaved 1F1B schedule): the layers are cut into
  // pp * virtual_stages chunks (equal, or pp_layers), chunk c on pipeline rank c % pp. 1: one
  // stage per rank.
  std::int64_t virtual_stages = 1;
  bool zero1 = false;  // shard the AdamW state over the data-parallel ranks
  // Start each DP gradient bucket's all-reduce during the step's last backward, as soon as its
  // gradients are final (without zero1; on GPUs on a communication stream).
  bool overlap_grad_reduce = false;
  // Tensor parallelism: the ops around each layer's attention core run the micro-batch in two
  // halves of its sequences, one half's TP all-reduces beside the other half's compute
  // (NsaTransformer::set_tp_overlap).
  bool tp_overlap = false;
  // Tensor parallelism: the micro-batches two at a time, their forwards and backwards layer by
  // layer in turn so that one's TP all-reduces run beside the other's compute
  // (NsaTransformer::forward_backward_pair_queued). The same bits as without.
  bool tp_micro_batch_pairs = false;
  // With tp_micro_batch_pairs on GPUs: "separate" one NSA core call per micro-batch (the same
  // bits as without pairs), "joint" the pair's two cores of a layer as one call over both
  // micro-batches' sequences (NsaTransformer::set_pair_core_joint).
  std::string tp_pair_core = "separate";
  // Data-parallel gradient bucket (one all-reduce call) in KiB: 25 MiB, as
  // parallel::kDefaultBucketBytes.
  std::int64_t grad_bucket_kib = 25600;
  // Several ranks: the communication watchdog's timeout (core/comm/watchdog.h); 0: off.
  double comm_timeout_s = 600;
  // GPU pipeline transfers: "auto" (the copy engines where every pipeline neighbour is on this
  // host and reachable, else NCCL), "nccl", "copy_engine" (parallel/copy_engine_communicator.h).
  std::string pp_transport = "auto";
  // GPU tensor-parallel sums: "auto" (the copy engines with tp_micro_batch_pairs where every
  // rank of the tp group is on this host and reachable, else NCCL), "nccl", "copy_engine"
  // (parallel/copy_engine_communicator.h, Role::TensorSums).
  std::string tp_transport = "auto";
};

struct RecomputeConfig {
  std::string policy = "none";
  std::int64_t layers = -1;  // -1: all layers
};

struct DataConfig {
  std::vector<std::string> train;
  std::vector<std::string> val;
  std::string format = "auto";
};

struct CheckpointConfig {
  std::string dir = "checkpoints";
  std::int64_t every = 0;  // 0: only at the end
  std::int64_t keep = 0;   // 0: keep all
  std::string resume = "auto";
};

struct LogConfig {
  std::int64_t every = 10;
  std::string metrics;  // empty: no metrics file
  std::int64_t profile_step = 0;  // 0: off; else the step whose op families are timed
  std::string trace;              // with profile_step: that step's timeline (Chrome trace JSON); empty: none
};

struct RunConfig {
  ModelConfig model;
  NsaConfig nsa;
  TrainConfig train;
  OptimConfig optim;
  ParallelConfig parallel;
  RecomputeConfig recompute;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;

  std::string source;      // the file it came from
  std::int64_t world_size = 1;

  std::int64_t dp() const { return world_size / (parallel.tp * parallel.pp); }
  std::int64_t grad_accum_steps() const { return train.global_batch / (train.micro_batch * dp()); }
  // The layers [begin, end) of pipeline stage pp_rank (0 <= pp_rank < parallel.pp): the
  // parallel.pp_layers split when given, else an even one. Needs a validated config; throws
  // std::out_of_range for a pp_rank outside [0, pp).
  // With parallel.virtual_stages > 1 a stage holds several ranges: std::logic_error here, use
  // stage_chunks.
  std::pair<std::int64_t, std::int64_t> stage_layers(std::int64_t pp_rank) const;
  // The layers [begin, end) of each model chunk of pipeline stage pp_rank, in increasing
  // order: parallel.virtual_stages of them, chunk v being the model's chunk v * pp + pp_rank of
  // pp * virtual_stages (equal ones, or parallel.pp_layers' sizes); one range,
  // stage_layers(pp_rank), without virtual stages.
  std::vector<std::pair<std::int64_t, std::int64_t>> stage_chunks(std::int64_t pp_rank) const;
};

// A config that failed validation: one "FILE:LINE:COL: section.key: what is wrong" per
// problem found (all of them, not only the first).
struct ConfigError : UserError {
  explicit ConfigError(std::vector<std::string> msgs);
  std::vector<std::string> messages;
};

// Parses, applies `--set section.key=value` overrides, validates for `world_size` ranks, and
// fills in derived values. Throws ConfigError.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                      std::int64_t world_size = 1);
RunConfig parse_config(std::string_view text, const std::string& source_name,
                       const std::vector<std::string>& overrides = {}, std::int64_t world_size = 1);

// An override "section.key=value" with where it came from, for its error messages: a sweep
// file's "FILE:LINE:COL" in place of "--set section.key=value".
struct LocatedOverride {
  std::string text;
  std::string origin;
};
// parse_config with overrides that name their origin. world_size 0: the world is not known
// yet, and the rules on it (tp * pp divides it, global_batch divides by micro_batch * dp) are
// left for a later parse that knows it. Throws ConfigError.
RunConfig parse_config_with_origins(std::string_view text, const std::string& source_name,
                                    const std::vector<LocatedOverride>& overrides, std::int64_t world_size);

// The resolved config as TOML: every section and key, defaults and derived values filled in.
// parse_config(to_toml(c)) gives c back.
std::string to_toml(const RunConfig& c);

// docs/config.md, generated from the key table.
std::string config_reference_markdown();

}  // namespace nsatron
