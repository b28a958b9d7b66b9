// Strict config validation: every kind of bad config is refused with FILE:LINE:COL and the key.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/config/config.h"

using namespace nsatron;

namespace {

// Runs parse_config and returns every error message ("" joined by \n if none: then it passed).
std::string errors_of(const std::string& text, const std::vector<std::string>& overrides = {},
                      std::int64_t world = 1) {
  try {
    parse_config(text, "run.toml", overrides, world);
  } catch (const ConfigError& e) {
    std::string all;
    for (const auto& m : e.messages) all += m + "\n";
    return all;
  }
  return "";
}

// A boolean switch of [parallel] (`field`, named `key`): false by default; `enabled` (a config
// turning it on, for `world` ranks) parses and round-trips through the resolved config; and
// `key = 1` after the line `[parallel]` and `tp_line` is refused as a wrong type at its line, 3.
void expect_parallel_switch(bool ParallelConfig::*field, const std::string& key, const std::string& enabled,
                            std::int64_t world, const std::string& tp_line) {
  SCOPED_TRACE(key);
  EXPECT_FALSE(parse_config("", "run.toml").parallel.*field);
  const RunConfig c = parse_config(enabled, "run.toml", {}, world);
  EXPECT_TRUE(c.parallel.*field);
  EXPECT_TRUE(parse_config(to_toml(c), "resolved.toml", {}, world).parallel.*field);
  const std::string e = errors_of("[parallel]\n" + tp_line + "\n" + key + " = 1\n");
  EXPECT_NE(e.find("run.toml:3:1: parallel." + key + ": expected a boolean, got an integer"), std::string::npos) << e;
}

}  // namespace

TEST(Config, DefaultsAreValidAndDerived) {
  RunConfig c = parse_config("", "empty.toml");
  EXPECT_EQ(c.model.head_dim, 64);        // 768 / 12
  EXPECT_EQ(c.model.ffn_hidden, 2048);    // 8/3 * 768 = 2048
  EXPECT_EQ(c.recompute.layers, 12);      // -1 -> all
  EXPECT_EQ(c.dp(), 1);
}

TEST(Config, ReadsEveryKindOfValue) {
  RunConfig c = parse_config(
      "[model]\nn_layers = 4\nrope_theta = 500000\ntie_embeddings = false\n"
      "[data]\ntrain = [\"a/*.bin\", \"b/*.bin\"]\nval = \"v.bin\"\n[optim]\nlr = 1e-3\n",
      "run.toml");
  EXPECT_EQ(c.model.n_layers, 4);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 500000.0);  // integer literal for a float key is exact
  EXPECT_FALSE(c.model.tie_embeddings);
  ASSERT_EQ(c.data.train.size(), 2u);
  EXPECT_EQ(c.data.train[1], "b/*.bin");
  ASSERT_EQ(c.data.val.size(), 1u);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
}

TEST(Config, UnknownKeyNamesLineAndSuggests) {
  std::string e = errors_of("[model]\nd_model = 64\nn_layer = 4\n");
  EXPECT_NE(e.find("run.toml:3:1: model.n_layer: unknown key (did you mean 'n_layers'?)"), std::string::npos) << e;
}

TEST(Config, KeyInTheWrongSectionIsPointedToItsSection) {
  std::string e = errors_of("[train]\nlr = 0.1\n");
  EXPECT_NE(e.find("run.toml:2:1: train.lr: unknown key (did you mean 'optim.lr' in [optim]?)"), std::string::npos) << e;
}

TEST(Config, UnknownSection) {
  std::string e = errors_of("[modle]\nd_model = 64\n");
  EXPECT_NE(e.find("run.toml:1:2: modle: unknown section (did you mean 'model'?)"), std::string::npos) << e;
}

TEST(Config, WrongTypesAreNotConverted) {
  std::string e = errors_of("[optim]\nlr = \"3e-4\"\n[model]\nn_layers = 12.5\ntie_embeddings = 1\n");
  EXPECT_NE(e.find("run.toml:2:1: optim.lr: expected a float, got a string"), std::string::npos) << e;
  EXPECT_NE(e.find("run.toml:4:1: model.n_layers: expected an integer, got a float (12.5)"), std::string::npos) << e;
  EXPECT_NE(e.find("run.toml:5:1: model.tie_embeddings: expected a boolean, got an integer"), std::string::npos) << e;
}

TEST(Config, ArrayOfNonStringsIsRefused) {
  std::string e = errors_of("[data]\ntrain = [1, 2]\n");
  EXPECT_NE(e.find("run.toml:2:1: data.train: expected a string or array of strings"), std::string::npos) << e;
}

TEST(Config, OutOfRangeValues) {
  std::string e = errors_of("[nsa]\nsel_count = 2\n[optim]\nbeta1 = 1.0\n[train]\ndevice = \"gpu\"\nseq_len = 0\n");
  EXPECT_NE(e.find("run.toml:2:1: nsa.sel_count: value 2 is out of range (must be >= 3)"), std::string::npos) << e;
  EXPECT_NE(e.find("run.toml:4:1: optim.beta1: value 1.0 is out of range (must be >= 0, < 1)"), std::string::npos) << e;
  EXPECT_NE(e.find("run.toml:6:1: train.device: \"gpu\" is not one of \"cpu\", \"cuda\""), std::string::npos) << e;
  EXPECT_NE(e.find("run.toml:7:1: train.seq_len: value 0 is out of range (must be >= 1)"), std::string::npos) << e;
}

TEST(Config, NsaSpecConstraints) {
  EXPECT_NE(errors_of("[nsa]\ncmp_block = 32\ncmp_stride = 12\n").find("run.toml:3:1: nsa.cmp_stride: cmp_stride = 12 must divide cmp_block = 32"),
            std::string::npos);
  EXPECT_NE(errors_of("[nsa]\ncmp_block = 16\ncmp_stride = 16\nsel_block = 24\n").find("nsa.cmp_stride: cmp_stride = 16 must divide sel_block = 24"),
            std::string::npos);
  EXPECT_NE(errors_of("[nsa]\ncmp_block = 128\ncmp_stride = 16\nsel_block = 64\n").find("run.toml:2:1: nsa.cmp_block: cmp_block = 128 must not exceed sel_block = 64"),
            std::string::npos);
  EXPECT_NE(errors_of("[model]\nd_model = 96\nn_heads = 4\nhead_dim = 23\n").find("run.toml:4:1: model.head_dim: head_dim = 23 must be even"),
            std::string::npos);
}

TEST(Config, HeadsAndParallelRules) {
  EXPECT_NE(errors_of("[model]\nn_heads = 12\nn_kv_heads = 5\n").find("run.toml:3:1: model.n_kv_heads: n_heads = 12 is not divisible by n_kv_heads = 5"),
            std::string::npos);
  EXPECT_NE(errors_of("[model]\nn_kv_heads = 3\n[parallel]\ntp = 2\n", {}, 2).find("run.toml:4:1: parallel.tp: tp = 2 must divide n_kv_heads = 3"),
            std::string::npos);
  EXPECT_NE(errors_of("[parallel]\npp = 5\n", {}, 5).find("run.toml:2:1: parallel.pp: pp = 5 must divide n_layers = 12"),
            std::string::npos);
  EXPECT_NE(errors_of("[model]\nn_kv_heads = 4\n[parallel]\ntp = 8\n", {}, 8)
                .find("run.toml:4:1: parallel.tp: tp = 8 exceeds n_kv_heads = 4: NSA is sharded by KV group, so each "
                      "tensor-parallel rank needs at least one KV group (tp > n_kv_heads is not supported)"),
            std::string::npos);
  EXPECT_EQ(errors_of("[model]\nn_kv_heads = 4\n[parallel]\ntp = 8\n", {}, 8).find("must divide n_kv_heads"),
            std::string::npos);
  EXPECT_NE(errors_of("[parallel]\ntp = 2\n", {}, 3).find("parallel.tp: the world size 3 is not a multiple of tp * pp = 2"),
            std::string::npos);
}

TEST(Config, TensorParallelDividesFfnHidden) {
  // n_kv_heads = 6, tp = 3: the KV groups split, ffn_hidden = 512 does not.
  const std::string heads = "[model]\nd_model = 384\nn_heads = 6\nn_kv_heads = 6\n";
  std::string e = errors_of(heads + "ffn_hidden = 512\n[parallel]\ntp = 3\n", {}, 3);
  EXPECT_NE(e.find("run.toml:7:1: parallel.tp: tp = 3 must divide ffn_hidden = 512 (the MLP is sharded by hidden columns"),
            std::string::npos) << e;
  // The derived ffn_hidden (8/3 * 384 = 1024) is what is checked.
  e = errors_of(heads + "[parallel]\ntp = 3\n", {}, 3);
  EXPECT_NE(e.find("run.toml:6:1: parallel.tp: tp = 3 must divide ffn_hidden = 1024"), std::string::npos) << e;
  EXPECT_EQ(errors_of(heads + "ffn_hidden = 768\n[parallel]\ntp = 3\n", {}, 3), "");
  EXPECT_EQ(errors_of(heads + "ffn_hidden = 768\n[parallel]\ntp = 6\n", {}, 6), "");
  // With the default tp, set through --set: the message names the override.
  e = errors_of(heads + "ffn_hidden = 512\n", {"parallel.tp=3"}, 3);
  EXPECT_NE(e.find("--set parallel.tp=3: parallel.tp: tp = 3 must divide ffn_hidden = 512"), std::string::npos) << e;
}

TEST(Config, PipelineStageLayers) {
  RunConfig c = parse_config("[model]\nn_layers = 8\n[parallel]\npp = 2\npp_layers = [3, 5]\n", "run.toml", {}, 2);
  EXPECT_EQ(c.parallel.pp_layers, (std::vector<std::int64_t>{3, 5}));
  EXPECT_EQ(c.stage_layers(0), (std::pair<std::int64_t, std::int64_t>{0, 3}));
  EXPECT_EQ(c.stage_layers(1), (std::pair<std::int64_t, std::int64_t>{3, 8}));
  EXPECT_THROW(c.stage_layers(2), std::out_of_range);
  EXPECT_THROW(c.stage_layers(-1), std::out_of_range);

  // Empty: an even split.
  RunConfig even = parse_config("[model]\nn_layers = 12\n[parallel]\npp = 3\n", "run.toml", {}, 3);
  EXPECT_TRUE(even.parallel.pp_layers.empty());
  EXPECT_EQ(even.stage_layers(0), (std::pair<std::int64_t, std::int64_t>{0, 4}));
  EXPECT_EQ(even.stage_layers(1), (std::pair<std::int64_t, std::int64_t>{4, 8}));
  EXPECT_EQ(even.stage_layers(2), (std::pair<std::int64_t, std::int64_t>{8, 12}));
  EXPECT_EQ(parse_config("", "run.toml").stage_layers(0), (std::pair<std::int64_t, std::int64_t>{0, 12}));

  // An uneven split is allowed where pp does not divide n_layers; an override works too.
  RunConfig odd = parse_config("[model]\nn_layers = 7\n[parallel]\npp = 3\n", "run.toml", {"parallel.pp_layers=[1,3,3]"}, 3);
  EXPECT_EQ(odd.stage_layers(0), (std::pair<std::int64_t, std::int64_t>{0, 1}));
  EXPECT_EQ(odd.stage_layers(2), (std::pair<std::int64_t, std::int64_t>{4, 7}));
  // The stages tile the layers.
  std::int64_t next = 0;
  for (std::int64_t s = 0; s < 3; ++s) {
    EXPECT_EQ(odd.stage_layers(s).first, next);
    next = odd.stage_layers(s).second;
  }
  EXPECT_EQ(next, 7);
}

TEST(Config, PipelineStageLayersErrors) {
  // Length differs from pp.
  std::string e = errors_of("[model]\nn_layers = 8\n[parallel]\npp = 2\npp_layers = [2, 3, 3]\n", {}, 2);
  EXPECT_NE(e.find("run.toml:5:1: parallel.pp_layers: has 3 entries but pp = 2 (one entry per pipeline stage)"),
            std::string::npos) << e;
  // Sum differs from n_layers.
  e = errors_of("[model]\nn_layers = 8\n[parallel]\npp = 2\npp_layers = [3, 4]\n", {}, 2);
  EXPECT_NE(e.find("run.toml:5:1: parallel.pp_layers: entries sum to 7 but n_layers = 8"), std::string::npos) << e;
  e = errors_of("[model]\nn_layers = 8\n[parallel]\npp = 2\npp_layers = [9223372036854775807, 2]\n", {}, 2);
  EXPECT_NE(e.find("run.toml:5:1: parallel.pp_layers: entries sum to more than 2^63 but n_layers = 8"), std::string::npos) << e;
  // An entry below 1.
  e = errors_of("[model]\nn_layers = 8\n[parallel]\npp = 2\npp_layers = [8, 0]\n", {}, 2);
  EXPECT_NE(e.find("run.toml:5:1: parallel.pp_layers: the entry at index 1 is 0, out of range (each entry must be >= 1)"),
            std::string::npos) << e;
  // Not an array of integers.
  e = errors_of("[parallel]\npp_layers = [6, 6.5]\n");
  EXPECT_NE(e.find("run.toml:2:1: parallel.pp_layers: expected an array of integers, got an array"),
            std::string::npos) << e;
  e = errors_of("[parallel]\npp_layers = 12\n");
  EXPECT_NE(e.find("run.toml:2:1: parallel.pp_layers: expected an array of integers, got an integer (12)"),
            std::string::npos) << e;
  // Without pp_layers, pp still divides n_layers; the message points to pp_layers.
  e = errors_of("[model]\nn_layers = 7\n[parallel]\npp = 3\n", {}, 3);
  EXPECT_NE(e.find("run.toml:4:1: parallel.pp: pp = 3 must divide n_layers = 7 (or give each stage's layers in "
                   "parallel.pp_layers)"),
            std::string::npos) << e;
  // Overrides name themselves.
  e = errors_of("[model]\nn_layers = 8\n", {"parallel.pp=2", "parallel.pp_layers=[4,5]"}, 2);
  EXPECT_NE(e.find("--set parallel.pp_layers=[4,5]: parallel.pp_layers: entries sum to 9 but n_layers = 8"),
            std::string::npos) << e;
  e = errors_of("", {"parallel.pp_layers=x"});
  EXPECT_NE(e.find("--set parallel.pp_layers=x: parallel.pp_layers: 'x' is not a valid TOML value"), std::string::npos) << e;
}

TEST(Config, VirtualStagesCutTheLayersIntoInterleavedChunks) {
  RunConfig c = parse_config("[model]\nn_layers = 8\n[parallel]\npp = 2\nvirtual_stages = 2\n[train]\nglobal_batch = 4\n",
                             "run.toml", {}, 2);
  EXPECT_EQ(c.parallel.virtual_stages, 2);
  using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
  // Chunk c of pp * V = 4 (2 layers each) on stage c % pp.
  EXPECT_EQ(c.stage_chunks(0), (Ranges{{0, 2}, {4, 6}}));
  EXPECT_EQ(c.stage_chunks(1), (Ranges{{2, 4}, {6, 8}}));
  EXPECT_THROW(c.stage_chunks(2), std::out_of_range);
  EXPECT_THROW(c.stage_layers(0), std::logic_error);  // several ranges: stage_chunks
  RunConfig four = parse_config("[model]\nn_layers = 12\n", "run.toml",
                                {"parallel.pp=2", "parallel.virtual_stages=3", "train.global_batch=2"}, 2);
  EXPECT_EQ(four.stage_chunks(1), (Ranges{{2, 4}, {6, 8}, {10, 12}}));
  // Without virtual stages, stage_chunks is stage_layers.
  RunConfig plain = parse_config("[model]\nn_layers = 8\n[parallel]\npp = 2\npp_layers = [3, 5]\n", "run.toml", {}, 2);
  EXPECT_EQ(plain.parallel.virtual_stages, 1);
  EXPECT_EQ(plain.stage_chunks(1), (Ranges{{3, 8}}));
  // The key round-trips through the resolved config.
  EXPECT_EQ(parse_config(to_toml(c), "resolved.toml", {}, 2).parallel.virtual_stages, 2);
  // Uneven chunks: pp_layers gives each of the pp * V chunks' layers, in model order.
  RunConfig uneven = parse_config("[model]\nn_layers = 12\n[parallel]\npp = 2\nvirtual_stages = 2\n"
                                  "pp_layers = [4, 3, 3, 2]\n[train]\nglobal_batch = 4\n",
                                  "run.toml", {}, 2);
  EXPECT_EQ(uneven.stage_chunks(0), (Ranges{{0, 4}, {7, 10}}));
  EXPECT_EQ(uneven.stage_chunks(1), (Ranges{{4, 7}, {10, 12}}));
  EXPECT_EQ(parse_config(to_toml(uneven), "resolved.toml", {}, 2).stage_chunks(0), (Ranges{{0, 4}, {7, 10}}));
  // ... and equal chunks need not divide n_layers then (7 layers in 4 chunks).
  EXPECT_EQ(parse_config("[model]\nn_layers = 7\n", "run.toml",
                         {"parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_layers=[2,2,2,1]",
                          "train.global_batch=4"},
                         2)
                .stage_chunks(1),
            (Ranges{{2, 4}, {6, 7}}));
  // One entry per chunk, summing to n_layers.
  std::string e = errors_of("[model]\nn_layers = 8\n[parallel]\npp = 2\nvirtual_stages = 2\npp_layers = [3, 5]\n"
                            "[train]\nglobal_batch = 4\n",
                            {}, 2);
  EXPECT_NE(e.find("run.toml:6:1: parallel.pp_layers: has 2 entries but pp * virtual_stages = 2 * 2 = 4 (one "
                   "entry per model chunk"),
            std::string::npos)
      << e;
  e = errors_of("[model]\nn_layers = 8\n[parallel]\npp = 2\nvirtual_stages = 2\npp_layers = [3, 2, 2, 2]\n"
                "[train]\nglobal_batch = 4\n",
                {}, 2);
  EXPECT_NE(e.find("parallel.pp_layers: entries sum to 9 but n_layers = 8 (each layer belongs to exactly one chunk)"),
            std::string::npos)
      << e;
}

TEST(Config, OverlapGradReduce) {
  // Off by default; a boolean, round-tripping through the resolved config; a wrong type names
  // the key and the line (or the override).
  expect_parallel_switch(&ParallelConfig::overlap_grad_reduce, "overlap_grad_reduce",
                         "[parallel]\noverlap_grad_reduce = true\n[train]\nglobal_batch = 2\n", 2, "tp = 1");
  std::string e = errors_of("", {"parallel.overlap_grad_reduce=yes"});
  EXPECT_NE(e.find("--set parallel.overlap_grad_reduce=yes: parallel.overlap_grad_reduce:"), std::string::npos) << e;
  // On GPUs too (NCCL on a communication stream), with data parallelism alone.
  EXPECT_TRUE(parse_config("[train]\ndevice = \"cuda\"\nglobal_batch = 2\n[parallel]\noverlap_grad_reduce = true\n",
                           "run.toml", {}, 2)
                  .parallel.overlap_grad_reduce);
  e = errors_of("[train]\ndevice = \"cuda\"\n[parallel]\ntp = 2\noverlap_grad_reduce = true\n");
  EXPECT_NE(e.find("run.toml:5:1: parallel.overlap_grad_reduce: overlap_grad_reduce on GPUs is built for data "
                   "parallelism alone"),
            std::string::npos)
      << e;
  // The bucket size: KiB, at least 1.
  EXPECT_EQ(parse_config("", "run.toml").parallel.grad_bucket_kib, 25600);
  e = errors_of("[parallel]\ngrad_bucket_kib = 0\n");
  EXPECT_NE(e.find("run.toml:2:1: parallel.grad_bucket_kib: value 0 is out of range"), std::string::npos) << e;
  e = errors_of("[parallel]\ngrad_bucket_kib = 2000000000000\n");
  EXPECT_NE(e.find("run.toml:2:1: parallel.grad_bucket_kib: grad_bucket_kib = 2000000000000 exceeds 2^40 KiB"),
            std::string::npos) << e;
  e = errors_of("[parallel]\nzero1 = true\noverlap_grad_reduce = true\n");
  EXPECT_NE(e.find("run.toml:3:1: parallel.overlap_grad_reduce: overlap_grad_reduce cannot be combined with zero1"),
            std::string::npos) << e;
}

TEST(Config, TensorParallelOverlap) {
  // Off by default; a boolean, round-tripping; with tp > 1 it needs two sequences per micro-batch.
  expect_parallel_switch(&ParallelConfig::tp_overlap, "tp_overlap",
                         "[parallel]\ntp = 2\ntp_overlap = true\n[train]\nmicro_batch = 2\nglobal_batch = 2\n", 2,
                         "tp = 1");
  std::string e = errors_of("[parallel]\ntp = 2\ntp_overlap = true\n");
  EXPECT_NE(e.find("run.toml:3:1: parallel.tp_overlap: tp_overlap runs each micro-batch in two halves of its "
                   "sequences and needs micro_batch >= 2 (it is 1)"),
            std::string::npos)
      << e;
  // No effect (and no error) without tensor parallelism.
  EXPECT_TRUE(parse_config("[parallel]\ntp_overlap = true\n", "run.toml").parallel.tp_overlap);
}

// parallel.tp_transport: "auto" by default, the three values, anything else named with its line.
TEST(Config, TensorParallelTransport) {
  EXPECT_EQ(parse_config("", "run.toml").parallel.tp_transport, "auto");
  for (const char* v : {"auto", "nccl", "copy_engine"})
    EXPECT_EQ(parse_config(std::string("[parallel]\ntp_transport = \"") + v + "\"\n", "run.toml").parallel.tp_transport, v);
  const std::string e = errors_of("[parallel]\ntp_transport = \"nvlink\"\n");
  EXPECT_NE(e.find("run.toml:2:1: parallel.tp_transport: \"nvlink\" is not one of \"auto\", \"nccl\", \"copy_engine\""),
            std::string::npos)
      << e;
}

// log.trace: a path, written at the profiled step; without one (profile_step = 0) an error naming
// both keys.
TEST(Config, LogTraceNeedsAProfiledStep) {
  const RunConfig c = parse_config("[log]\nprofile_step = 3\ntrace = \"out/step3.json\"\n", "run.toml");
  EXPECT_EQ(c.log.trace, "out/step3.json");
  EXPECT_EQ(parse_config("", "run.toml").log.trace, "");
  const std::string e = errors_of("[log]\ntrace = \"t.json\"\n");
  EXPECT_NE(e.find("run.toml:2:1: log.trace: trace writes the timeline of the profiled step, but profile_step = 0"),
            std::string::npos)
      << e;
}

TEST(Config, TensorParallelMicroBatchPairs) {
  // Off by default; a boolean, round-tripping; not with pp > 1 or tp_overlap (under tp > 1).
  expect_parallel_switch(&ParallelConfig::tp_micro_batch_pairs, "tp_micro_batch_pairs",
                         "[parallel]\ntp = 2\ntp_micro_batch_pairs = true\n", 2, "tp = 2");
  std::string e = errors_of("[parallel]\ntp = 2\npp = 2\ntp_micro_batch_pairs = true\n[model]\nn_layers = 4\n");
  EXPECT_NE(e.find("run.toml:4:1: parallel.tp_micro_batch_pairs: tp_micro_batch_pairs runs the whole model's "
                   "forward for two micro-batches in turn and is built for pp = 1 (it is 2"),
            std::string::npos)
      << e;
  e = errors_of("[parallel]\ntp = 2\ntp_overlap = true\ntp_micro_batch_pairs = true\n[train]\nmicro_batch = 2\n");
  EXPECT_NE(e.find("run.toml:4:1: parallel.tp_micro_batch_pairs: tp_micro_batch_pairs and tp_overlap are two ways "
                   "to hide the TP all-reduces and cannot be combined"),
            std::string::npos)
      << e;
  // No effect (and no error) without tensor parallelism, with a pipeline too.
  EXPECT_TRUE(parse_config("[parallel]\npp = 2\ntp_micro_batch_pairs = true\n[model]\nn_layers = 4\n", "run.toml",
                           {}, 2)
                  .parallel.tp_micro_batch_pairs);
}

TEST(Config, CommTimeout) {
  // 600 s by default, a number of seconds >= 0 (0: no watchdog), round-tripping.
  EXPECT_EQ(parse_config("", "run.toml").parallel.comm_timeout_s, 600);
  RunConfig c = parse_config("[parallel]\ncomm_timeout_s = 12.5\n", "run.toml");
  EXPECT_EQ(c.parallel.comm_timeout_s, 12.5);
  EXPECT_EQ(parse_config(to_toml(c), "resolved.toml").parallel.comm_timeout_s, 12.5);
  EXPECT_EQ(parse_config("[parallel]\ncomm_timeout_s = 0\n", "run.toml").parallel.comm_timeout_s, 0);
  std::string e = errors_of("[parallel]\ncomm_timeout_s = -1\n");
  EXPECT_NE(e.find("run.toml:2:1: parallel.comm_timeout_s: value -1.0 is out of range (must be >= 0)"), std::string::npos) << e;
  e = errors_of("[parallel]\ncomm_timeout_s = \"ten\"\n");
  EXPECT_NE(e.find("run.toml:2:1: parallel.comm_timeout_s:"), std::string::npos) << e;
}

TEST(Config, VirtualStagesErrors) {
  const std::string base = "[model]\nn_layers = 8\n[parallel]\npp = 2\nvirtual_stages = 2\n";
  // pp * V must divide n_layers.
  std::string e = errors_of("[model]\nn_layers = 6\n[parallel]\npp = 2\nvirtual_stages = 2\n", {}, 2);
  EXPECT_NE(e.find("run.toml:5:1: parallel.virtual_stages: pp * virtual_stages = 2 * 2 = 4 must divide n_layers = 6 "
                   "(the layers are cut into pp * virtual_stages equal chunks; or give each chunk's layers in "
                   "parallel.pp_layers)"),
            std::string::npos) << e;
  // pp_layers with one entry per stage instead of one per chunk.
  e = errors_of(base + "pp_layers = [4, 4]\n", {}, 2);
  EXPECT_NE(e.find("run.toml:6:1: parallel.pp_layers: has 2 entries but pp * virtual_stages = 2 * 2 = 4"),
            std::string::npos) << e;
  // Several chunks need several stages.
  e = errors_of("[parallel]\nvirtual_stages = 2\n");
  EXPECT_NE(e.find("run.toml:2:1: parallel.virtual_stages: virtual_stages = 2 needs pp >= 2, but pp = 1"),
            std::string::npos) << e;
  // A = global_batch / (micro_batch * dp) a multiple of pp: 6 / (1 * 1) = 6 is, 3 is not; with
  // dp = 2 (world 4), 6 / (1 * 2) = 3 is not.
  EXPECT_EQ(errors_of(base + "[train]\nglobal_batch = 6\n", {}, 2), "");
  e = errors_of(base + "[train]\nglobal_batch = 3\n", {}, 2);
  EXPECT_NE(e.find("run.toml:7:1: train.global_batch: global_batch = 3 gives A = global_batch / (micro_batch * dp) = "
                   "3 / (1 * 1) = 3 micro-batches per step, not a multiple of pp = 2: with virtual_stages = 2 the "
                   "interleaved schedule runs the micro-batches through each stage's chunks in groups of pp"),
            std::string::npos) << e;
  e = errors_of(base + "[train]\nglobal_batch = 6\n", {}, 4);
  EXPECT_NE(e.find("train.global_batch: global_batch = 6 gives A = global_batch / (micro_batch * dp) = 6 / (1 * 2) = 3"),
            std::string::npos) << e;
  // Through --set: the message names the override; below 1 is out of range.
  e = errors_of("[model]\nn_layers = 6\n", {"parallel.pp=2", "parallel.virtual_stages=2"}, 2);
  EXPECT_NE(e.find("--set parallel.virtual_stages=2: parallel.virtual_stages: pp * virtual_stages = 2 * 2 = 4 must "
                   "divide n_layers = 6"),
            std::string::npos) << e;
  e = errors_of("", {"parallel.virtual_stages=0"});
  EXPECT_NE(e.find("--set parallel.virtual_stages=0: parallel.virtual_stages: value 0 is out of range (must be >= 1)"),
            std::string::npos) << e;
  // The world not known yet (a sweep's first parse): the rule on A waits for it.
  EXPECT_NO_THROW(parse_config_with_origins(base + "[train]\nglobal_batch = 3\n", "run.toml", {}, 0));
}

TEST(Config, GlobalBatchMustSplitOverMicroBatchesAndDataParallelRanks) {
  const std::string text = "[train]\nmicro_batch = 2\nglobal_batch = 6\n";
  EXPECT_EQ(errors_of(text, {}, 1), "");  // 6 % (2 * 1) == 0
  std::string e = errors_of(text, {}, 2);  // dp = 2: 6 % 4 != 0
  EXPECT_NE(e.find("run.toml:3:1: train.global_batch: global_batch = 6 is not a multiple of micro_batch * dp = 2 * 2"),
            std::string::npos) << e;
}

TEST(Config, OtherRules) {
  EXPECT_NE(errors_of("[train]\ndtype = \"bf16\"\n").find("train.dtype: bf16 needs train.device = \"cuda\""), std::string::npos);
  EXPECT_NE(errors_of("[optim]\nlr = 1e-4\nmin_lr = 1e-3\n").find("run.toml:3:1: optim.min_lr: min_lr = 0.001 exceeds lr = 1e-04"),
            std::string::npos);
  EXPECT_NE(errors_of("[recompute]\nlayers = 13\n").find("recompute.layers: layers = 13 exceeds n_layers = 12"), std::string::npos);
}

TEST(Config, RuleIsReportedAtTheKeyThatIsSet) {
  std::string e = errors_of("[model]\nd_model = 100\n");  // 100 % 12 != 0 with head_dim derived
  EXPECT_NE(e.find("run.toml:2:1: model.d_model: head_dim = 0 derives d_model / n_heads, but d_model = 100"),
            std::string::npos) << e;
}

TEST(Config, RuleBrokenByDefaultsPointsAtSectionOrFileStart) {
  // global_batch = 1 and micro_batch = 1 are defaults; 3 ranks make dp = 3.
  std::string e = errors_of("[train]\nseed = 1\n", {}, 3);
  EXPECT_NE(e.find("run.toml:1:2: train.global_batch: global_batch = 1 is not a multiple of micro_batch * dp = 1 * 3"),
            std::string::npos) << e;
  e = errors_of("[model]\nd_model = 768\n", {}, 3);
  EXPECT_NE(e.find("run.toml:1:1: train.global_batch"), std::string::npos) << e;
}

TEST(Config, ReportsEveryErrorInLineOrder) {
  std::string e = errors_of("[model]\nn_layer = 4\nd_model = 1.5\n[optim]\nlr = \"x\"\n");
  auto a = e.find(":2:1:"), b = e.find(":3:1:"), c = e.find(":5:1:");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(c, std::string::npos);
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
}

TEST(Config, SyntaxErrorHasPosition) {
  std::string e = errors_of("[model\nd_model = 64\n");
  EXPECT_NE(e.find("run.toml:1:7: TOML syntax error"), std::string::npos) << e;
  e = errors_of("[model]\nd_model = 64\nd_model = 65\n");
  EXPECT_NE(e.find("run.toml:3:"), std::string::npos) << e;
}

TEST(Config, OverridesAreValidatedTheSameWay) {
  RunConfig c = parse_config("[model]\nn_layers = 4\n", "run.toml", {"model.n_layers=6", "train.device=cuda", "optim.lr=1e-3"});
  EXPECT_EQ(c.model.n_layers, 6);
  EXPECT_EQ(c.train.device, "cuda");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_NE(errors_of("", {"model.n_layers=12.5"}).find("--set model.n_layers=12.5: model.n_layers: expected an integer, got a float (12.5)"),
            std::string::npos);
  EXPECT_NE(errors_of("", {"optim.lr=\"3e-4\""}).find("--set optim.lr=\"3e-4\": optim.lr: expected a float, got a string"),
            std::string::npos);
  EXPECT_NE(errors_of("", {"model.n_layer=4"}).find("model.n_layer: unknown key (did you mean 'model.n_layers'?)"),
            std::string::npos);
  EXPECT_NE(errors_of("", {"nsa.sel_count=1"}).find("--set nsa.sel_count=1: nsa.sel_count: value 1 is out of range"),
            std::string::npos);
  EXPECT_NE(errors_of("", {"n_layers"}).find("expected section.key=value"), std::string::npos);
}

TEST(Config, ResolvedTomlRoundTrips) {
  RunConfig c = parse_config("[model]\nd_model = 256\nn_heads = 8\nn_layers = 5\n[optim]\nlr = 0.0007\n"
                             "[data]\ntrain = [\"x\", \"y\\\"z\"]\n[parallel]\npp = 2\npp_layers = [2, 3]\n",
                             "run.toml", {}, 2);
  std::string text = to_toml(c);
  EXPECT_NE(text.find("\npp_layers = [2, 3]\n"), std::string::npos) << text;
  RunConfig again = parse_config(text, "resolved.toml", {}, 2);
  EXPECT_EQ(to_toml(again), text);
  EXPECT_EQ(again.model.head_dim, 32);
  EXPECT_DOUBLE_EQ(again.optim.lr, 0.0007);
  EXPECT_EQ(again.data.train[1], "y\"z");
  EXPECT_EQ(again.parallel.pp_layers, (std::vector<std::int64_t>{2, 3}));
  // The default, empty, round trips too.
  const std::string plain = to_toml(parse_config("", "run.toml"));
  EXPECT_NE(plain.find("\npp_layers = []\n"), std::string::npos) << plain;
  EXPECT_TRUE(parse_config(plain, "resolved.toml").parallel.pp_layers.empty());
}

TEST(Config, ShippedConfigsAreValid) {
  for (const char* name : {"demo_cpu.toml", "nsa_125m.toml"}) {
    std::string path = std::string(NSATRON_SOURCE_DIR) + "/configs/" + name;
    EXPECT_NO_THROW(load_config(path)) << path;
  }
  RunConfig big = load_config(std::string(NSATRON_SOURCE_DIR) + "/configs/nsa_125m.toml");
  EXPECT_EQ(big.model.d_model, 768);
  EXPECT_EQ(big.model.n_kv_heads, 2);
  EXPECT_EQ(big.nsa.window, 512);
  EXPECT_EQ(big.train.dtype, "bf16");
}

TEST(Config, DocsAreCurrent) {
  std::ifstream in(std::string(NSATRON_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), config_reference_markdown())
      << "docs/config.md is stale: regenerate with `nsatron config docs > docs/config.md`";
}
