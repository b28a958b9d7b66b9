// Deterministic training sampler and validation reader (docs/data.md, "The sampler").
//
// The token stream of N tokens is cut into W = floor((N - 1) / L) windows of L + 1 tokens,
// L = seq_len: window w covers tokens [w L, w L + L] (inputs: the first L, targets: the last
// L; neighbouring windows share one token, so every token but the first is a target once
// per epoch). Sample k of the run (k = 0, 1, 2, ...; the k-th sample the run consumes,
// k = step * global_batch + i when global_batch is constant) is
//
//     epoch e = k / W,   j = k % W,   window = P_{seed,e}(j)      (shuffle = true)
//                                     window = j                  (shuffle = false)
//
// where P_{seed,e} is a pseudo-random permutation of [0, W): a 6-round Feistel network on
// the smallest even number of bits covering W, with cycle walking, keyed by splitmix64 of
// (seed, e). It is a pure function of (seed, e, j) in 64-bit integer arithmetic, so every
// platform, every rank and every resumed run computes the same sample k with no state.
//
// Global batch of a step: samples first .. first + global_batch - 1 (first = the samples
// consumed before the step). Data-parallel rank r of dp takes the contiguous slice
// [r B/dp, (r+1) B/dp) of it, and its micro-batch m the rows [m b, (m+1) b) of that slice
// (B = global_batch, b = micro_batch). The ranks' slices are disjoint and their union is
// the global batch, whatever dp is.
//
// Position: the number of consumed samples (plus what identifies the stream, checked on
// restore); SamplerPosition serialises to one line of text for a checkpoint attribute.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"

namespace nsatron::data {

// ---- portable randomness ------------------------------------------------------------------
// splitmix64 (Steele, Lea, Flood 2014): state += golden gamma, then the finaliser.
std::uint64_t splitmix64_mix(std::uint64_t z);
struct SplitMix64 {
  std::uint64_t state;
  explicit SplitMix64(std::uint64_t seed) : state(seed) {}
  std::uint64_t next();
};

// A keyed pseudo-random permutation of [0, n), evaluated one index at a time in O(1) memory.
class IndexPermutation {
 public:
  IndexPermutation(std::uint64_t n, std::uint64_t key);
  std::uint64_t size() const { return n_; }
  std::uint64_t operator()(std::uint64_t i) const;  // i < n

 private:
  std::uint64_t encrypt(std::uint64_t x) const;
  std::uint64_t n_;
  unsigned half_bits_;
  std::uint64_t half_mask_;
  std::uint64_t round_keys_[6];
};

// ---- batches -----------------------------------------------------------------------------
// How a global batch is split over data-parallel ranks and micro-batches.
struct BatchLayout {
  std::int64_t global_batch = 1;  // sequences per optimizer step, over all DP ranks
  std::int64_t micro_batch = 1;   // sequences per forward/backward on one rank
  int dp = 1;                     // data-parallel ranks
  int dp_rank = 0;                // this rank, in [0, dp)

  // Throws UserError unless global_batch % (micro_batch * dp) == 0 and 0 <= dp_rank < dp.
  void validate() const;
  std::int64_t rank_batch() const { return global_batch / dp; }                 // B / dp
  std::int64_t micro_batches() const { return global_batch / (micro_batch * dp); }
  // Index within the global batch of row `row` of micro-batch `micro` on this rank.
  std::int64_t index_in_batch(std::int64_t micro, std::int64_t row) const {
    return dp_rank * rank_batch() + micro * micro_batch + row;
  }
};

// Row-major [rows, seq_len] token ids; targets[r][t] = the token after inputs[r][t].
struct TokenBatch {
  std::int64_t rows = 0, seq_len = 0;
  std::vector<std::int32_t> inputs, targets;
  std::vector<std::int64_t> samples;  // the sample index (k, or j for validation) of each row
  std::vector<std::int64_t> starts;   // each row's window start in the token stream
  void resize(std::int64_t rows, std::int64_t seq_len);
};

// ---- position ----------------------------------------------------------------------------
struct SamplerPosition {
  std::int64_t consumed_samples = 0;
  // What the position refers to, checked by TrainSampler::restore.
  std::uint64_t seed = 0;
  std::int64_t seq_len = 0;
  bool shuffle = true;
  std::int64_t dataset_tokens = 0;
  std::uint64_t dataset_fingerprint = 0;

  // One line: "nsatron-sampler/1 consumed_samples=... seed=... seq_len=... shuffle=1
  // dataset_tokens=... dataset_fingerprint=...". deserialize() throws UserError on anything
  // else (unknown or missing key, bad number, other version).
  std::string serialize() const;
  static SamplerPosition deserialize(std::string_view text);
  bool operator==(const SamplerPosition&) const = default;
};

// ---- training sampler ----------------------------------------------------------------------
class TrainSampler {
 public:
  // Throws UserError when the dataset holds fewer than seq_len + 1 tokens.
  TrainSampler(std::shared_ptr<const TokenDataset> dataset, std::int64_t seq_len,
               std::uint64_t seed, bool shuffle = true);

  std::int64_t seq_len() const { return seq_len_; }
  std::uint64_t seed() const { return seed_; }
  std::int64_t windows_per_epoch() const { return windows_; }  // W
  const TokenDataset& dataset() const { return *ds_; }

  // ---- pure functions of the sample index k
  std::int64_t epoch(std::int64_t k) const { return k / windows_; }
  std::int64_t window(std::int64_t k) const;                      // in [0, W)
  std::int64_t window_start(std::int64_t k) const { return window(k) * seq_len_; }
  // Writes seq_len inputs and seq_len targets of sample k.
  void fill_sample(std::int64_t k, std::int32_t* inputs, std::int32_t* targets) const;
  // Micro-batch `micro` of this rank (layout) in the step whose first sample is `first`.
  void fill(std::int64_t first, const BatchLayout& layout, std::int64_t micro,
            TokenBatch& out) const;

  // ---- the run's position
  std::int64_t consumed_samples() const { return consumed_; }
  // Micro-batch `micro` of this rank in the current step (first = consumed_samples()).
  void next(const BatchLayout& layout, std::int64_t micro, TokenBatch& out) const {
    fill(consumed_, layout, micro, out);
  }
  TokenBatch next(const BatchLayout& layout, std::int64_t micro) const;
  // After the step: consumed_samples += global_batch.
  void advance(const BatchLayout& layout) { consumed_ += layout.global_batch; }
  // Fractional epochs consumed (for logs).
  double epochs_consumed() const { return double(consumed_) / double(windows_); }

  SamplerPosition position() const;
  // Continues from `pos`. Throws UserError naming the difference when pos was saved with
  // another seed, seq_len or shuffle, or (unless allow_dataset_change) another dataset
  // (token count or shard layout).
  void restore(const SamplerPosition& pos, bool allow_dataset_change = false);

 private:
  std::shared_ptr<const TokenDataset> ds_;
  std::int64_t seq_len_;
  std::uint64_t seed_;
  bool shuffle_;
  std::int64_t windows_;
  std::int64_t consumed_ = 0;
};

// ---- validation --------------------------------------------------------------------------
// Deterministic sequential windows of the validation stream: sample j is window j mod W
// (window w = tokens [w L, w L + L], as above; no shuffle). Eval batch b of a layout holds
// samples b * global_batch + layout.index_in_batch(micro, row), split over DP ranks and
// micro-batches exactly like a training step. Batches past the W windows wrap around (see
// max_batches()).
class ValidationReader {
 public:
  // Throws UserError when the dataset holds fewer than seq_len + 1 tokens.
  ValidationReader(std::shared_ptr<const TokenDataset> dataset, std::int64_t seq_len);

  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t num_windows() const { return windows_; }  // W
  // Eval batches of this global batch size that fit without repeating a window.
  std::int64_t max_batches(std::int64_t global_batch) const { return windows_ / global_batch; }
  const TokenDataset& dataset() const { return *ds_; }

  void fill(std::int64_t batch_index, const BatchLayout& layout, std::int64_t micro,
            TokenBatch& out) const;
  TokenBatch batch(std::int64_t batch_index, const BatchLayout& layout, std::int64_t micro) const;

 private:
  std::shared_ptr<const TokenDataset> ds_;
  std::int64_t seq_len_;
  std::int64_t windows_;
};

}  // namespace nsatron::data
