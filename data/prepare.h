// Text -> token shards: the library side of `nsatron data prepare` (docs/data.md).
//
// The input files are read in the order given and concatenated into one text (each file
// one document, nothing inserted between them), tokenized (bytes: one token per byte), and
// split deterministically: the last round(val_fraction * N) tokens of the N are the
// validation split, the rest the training split. Each split is written as shards of at most
// shard_tokens tokens: OUTPUT/train_000000.bin, train_000001.bin, ..., OUTPUT/val_000000.bin,
// ... (llm.c format version 1, uint16 tokens; or Megatron PREFIX.bin + PREFIX.idx with
// uint16 tokens, where each input file's part inside a shard is one sequence and one
// document).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/shard.h"

namespace nsatron::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files
  std::string output_dir;           // created if missing
  std::string tokenizer = "bytes";
  double val_fraction = 0.1;        // in [0, 1)
  ShardFormat format = ShardFormat::LlmC;  // LlmC or Megatron
  std::int64_t shard_tokens = 100'000'000;  // per shard, at most 2^31 - 1
  bool force = false;  // replace train_*/val_* shards already in output_dir
};

struct PreparedShard {
  std::string split;  // "train" or "val"
  std::string path;   // the .bin (Megatron: its .idx lies beside it)
  std::int64_t tokens = 0;
};

struct PrepareResult {
  std::int64_t input_bytes = 0;
  std::int64_t train_tokens = 0, val_tokens = 0;
  std::int64_t vocab_size = 0;
  std::vector<PreparedShard> shards;
};

// Throws UserError for bad options, unreadable inputs, an empty text, an empty training
// split, or (without force) shards already present in output_dir.
PrepareResult prepare_text(const PrepareOptions& options);

}  // namespace nsatron::data
