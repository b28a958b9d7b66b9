// TokenDataset: a list of shards presenting one concatenated token stream.
//
// Built from file globs (glob(3), each glob's matches sorted, globs in the given order; a glob
// that matches nothing is an error naming it). A Megatron dataset matched as both PREFIX.bin
// and PREFIX.idx counts once. The stream is shard 0's tokens, then shard 1's, and so on; a
// read may cross shard boundaries.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/shard.h"

namespace nsatron::data {

// Expands globs into shard paths as described above (a path without glob characters must
// exist, or name a Megatron PREFIX whose .bin/.idx exist). `what` names the setting in errors.
std::vector<std::string> expand_shard_globs(const std::vector<std::string>& globs,
                                            ShardFormat format = ShardFormat::Auto,
                                            const std::string& what = "data");

struct DatasetOptions {
  ShardFormat format = ShardFormat::Auto;
  // When > 0, every token of every shard is checked to lie in [0, vocab_size) at open
  // (one pass over the data); an id outside is an error naming the shard and the position.
  std::int64_t vocab_size = 0;
};

class TokenDataset {
 public:
  // Opens the shards matched by `globs`. `what` names the setting (e.g. "data.train") in
  // error messages. An empty dataset (no tokens at all) is an error.
  static std::shared_ptr<const TokenDataset> open(const std::vector<std::string>& globs,
                                                  const DatasetOptions& options = {},
                                                  const std::string& what = "data");
  // From explicit shard paths (no glob expansion).
  static std::shared_ptr<const TokenDataset> open_paths(const std::vector<std::string>& paths,
                                                        const DatasetOptions& options = {},
                                                        const std::string& what = "data");

  std::int64_t num_tokens() const { return total_; }
  std::size_t num_shards() const { return shards_.size(); }
  const TokenShard& shard(std::size_t i) const { return shards_[i]; }
  std::int64_t shard_begin(std::size_t i) const { return begin_[i]; }  // stream offset
  const std::string& what() const { return what_; }

  // Tokens [begin, begin + count) of the concatenated stream as int32.
  void read(std::int64_t begin, std::int64_t count, std::int32_t* out) const;

  // A 64-bit fingerprint of the stream's layout: the token count of each shard, in order.
  // (Not of paths, so a moved data directory still matches; not of contents, which would
  // need a full read.) Saved with the sampler position to catch a changed dataset on resume.
  std::uint64_t fingerprint() const { return fingerprint_; }

  // One line per shard: "  path  llmc v1 uint16  1234 tokens".
  std::string describe() const;

 private:
  std::string what_;
  std::vector<TokenShard> shards_;
  std::vector<std::int64_t> begin_;  // size shards + 1
  std::int64_t total_ = 0;
  std::uint64_t fingerprint_ = 0;
};

}  // namespace nsatron::data
