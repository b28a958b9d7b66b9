#include "data/sampler.h"

#include <algorithm>
#include <charconv>
#include <sstream>

#include "core/util/error.h"

namespace nsatron::data {

using detail::concat;

// ---- randomness --------------------------------------------------------------------------

std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t SplitMix64::next() {
  state += 0x9e3779b97f4a7c15ull;
  return splitmix64_mix(state);
}

IndexPermutation::IndexPermutation(std::uint64_t n, std::uint64_t key) : n_(n) {
  NSA_CHECK(n > 0, "a permutation of an empty range");
  unsigned bits = 0;
  while (bits < 64 && (std::uint64_t(1) << bits) < n) ++bits;
  if (bits < 2) bits = 2;
  if (bits & 1u) ++bits;  // balanced halves
  NSA_CHECK(bits <= 62, "permutation range too large: ", n);
  half_bits_ = bits / 2;
  half_mask_ = (std::uint64_t(1) << half_bits_) - 1;
  SplitMix64 rng(key);
  for (auto& k : round_keys_) k = rng.next();
}

std::uint64_t IndexPermutation::encrypt(std::uint64_t x) const {
  std::uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (std::uint64_t k : round_keys_) {
    const std::uint64_t f = splitmix64_mix(k ^ right) & half_mask_;
    const std::uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

std::uint64_t IndexPermutation::operator()(std::uint64_t i) const {
  NSA_CHECK(i < n_, "permutation index ", i, " out of [0, ", n_, ")");
  // Cycle walking: the Feistel network permutes [0, 2^bits); following x's cycle until it
  // lands back in [0, n) permutes [0, n). Expected steps < 4 since 2^bits < 4n.
  std::uint64_t x = encrypt(i);
  while (x >= n_) x = encrypt(x);
  return x;
}

// ---- batches -----------------------------------------------------------------------------

void BatchLayout::validate() const {
  if (global_batch <= 0 || micro_batch <= 0 || dp <= 0)
    throw UserError(concat("data: batch sizes must be positive (global_batch = ", global_batch,
                           ", micro_batch = ", micro_batch, ", dp = ", dp, ")"));
  if (global_batch % (micro_batch * dp) != 0)
    throw UserError(concat("data: global_batch (", global_batch,
                           ") must be a multiple of micro_batch * dp (", micro_batch, " * ", dp,
                           ")"));
  if (dp_rank < 0 || dp_rank >= dp)
    throw UserError(concat("data: dp_rank ", dp_rank, " outside [0, ", dp, ")"));
}

void TokenBatch::resize(std::int64_t r, std::int64_t l) {
  rows = r;
  seq_len = l;
  inputs.resize(std::size_t(r * l));
  targets.resize(std::size_t(r * l));
  samples.resize(std::size_t(r));
  starts.resize(std::size_t(r));
}

// ---- position ----------------------------------------------------------------------------

std::string SamplerPosition::serialize() const {
  std::ostringstream os;
  os << "nsatron-sampler/1 consumed_samples=" << consumed_samples << " seed=" << seed
     << " seq_len=" << seq_len << " shuffle=" << (shuffle ? 1 : 0)
     << " dataset_tokens=" << dataset_tokens << " dataset_fingerprint=" << dataset_fingerprint;
  return os.str();
}

namespace {
template <class T> T parse_number(std::string_view key, std::string_view v, std::string_view text) {
  T out{};
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size())
    throw UserError(concat("data: sampler position: bad value '", v, "' for ", key, " in '", text,
                           "'"));
  return out;
}
}  // namespace

SamplerPosition SamplerPosition::deserialize(std::string_view text) {
  std::vector<std::string_view> words;
  for (std::size_t i = 0; i < text.size();) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t')) ++i;
    std::size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\n' && text[j] != '\t') ++j;
    if (j > i) words.push_back(text.substr(i, j - i));
    i = j;
  }
  if (words.empty() || words[0] != "nsatron-sampler/1")
    throw UserError(concat("data: sampler position: expected 'nsatron-sampler/1 ...', got '", text,
                           "'"));
  SamplerPosition pos;
  unsigned seen = 0;
  for (std::size_t w = 1; w < words.size(); ++w) {
    const std::size_t eq = words[w].find('=');
    if (eq == std::string_view::npos)
      throw UserError(concat("data: sampler position: '", words[w], "' is not key=value"));
    const std::string_view key = words[w].substr(0, eq), v = words[w].substr(eq + 1);
    unsigned bit;
    if (key == "consumed_samples") { pos.consumed_samples = parse_number<std::int64_t>(key, v, text); bit = 1; }
    else if (key == "seed") { pos.seed = parse_number<std::uint64_t>(key, v, text); bit = 2; }
    else if (key == "seq_len") { pos.seq_len = parse_number<std::int64_t>(key, v, text); bit = 4; }
    else if (key == "shuffle") { pos.shuffle = parse_number<int>(key, v, text) != 0; bit = 8; }
    else if (key == "dataset_tokens") { pos.dataset_tokens = parse_number<std::int64_t>(key, v, text); bit = 16; }
    else if (key == "dataset_fingerprint") { pos.dataset_fingerprint = parse_number<std::uint64_t>(key, v, text); bit = 32; }
    else throw UserError(concat("data: sampler position: unknown key '", key, "'"));
    if (seen & bit) throw UserError(concat("data: sampler position: key '", key, "' given twice"));
    seen |= bit;
  }
  if (seen != 63)
    throw UserError(concat("data: sampler position: missing keys in '", text, "'"));
  if (pos.consumed_samples < 0)
    throw UserError(concat("data: sampler position: negative consumed_samples in '", text, "'"));
  return pos;
}

// ---- training sampler ----------------------------------------------------------------------

namespace {
std::int64_t count_windows(const TokenDataset& ds, std::int64_t seq_len, const char* who) {
  if (seq_len <= 0) throw UserError(concat("data: seq_len must be positive, got ", seq_len));
  if (ds.num_tokens() < seq_len + 1)
    throw UserError(concat(ds.what(), ": ", who, " needs at least seq_len + 1 = ", seq_len + 1,
                           " tokens, the shards hold ", ds.num_tokens()));
  return (ds.num_tokens() - 1) / seq_len;
}

void fill_window(const TokenDataset& ds, std::int64_t start, std::int64_t seq_len,
                 std::int32_t* inputs, std::int32_t* targets) {
  ds.read(start, seq_len, inputs);
  // Targets: the same window shifted by one; all but the last are already in `inputs`.
  std::copy(inputs + 1, inputs + seq_len, targets);
  ds.read(start + seq_len, 1, targets + seq_len - 1);
}
}  // namespace

TrainSampler::TrainSampler(std::shared_ptr<const TokenDataset> dataset, std::int64_t seq_len,
                           std::uint64_t seed, bool shuffle)
    : ds_(std::move(dataset)), seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  NSA_CHECK(ds_ != nullptr, "null dataset");
  windows_ = count_windows(*ds_, seq_len_, "the training sampler");
}

std::int64_t TrainSampler::window(std::int64_t k) const {
  NSA_CHECK(k >= 0, "negative sample index ", k);
  const std::int64_t e = k / windows_, j = k % windows_;
  if (!shuffle_) return j;
  // Key of epoch e: mixes the seed and the epoch so that nearby seeds or epochs give
  // unrelated permutations. Building the permutation is 6 hashes: no cache, no state.
  const std::uint64_t key = splitmix64_mix(seed_ ^ 0x6e73612d64617461ull) ^
                            splitmix64_mix(std::uint64_t(e) + 0x243f6a8885a308d3ull);
  const IndexPermutation perm(std::uint64_t(windows_), key);
  return std::int64_t(perm(std::uint64_t(j)));
}

void TrainSampler::fill_sample(std::int64_t k, std::int32_t* inputs, std::int32_t* targets) const {
  fill_window(*ds_, window_start(k), seq_len_, inputs, targets);
}

void TrainSampler::fill(std::int64_t first, const BatchLayout& layout, std::int64_t micro,
                        TokenBatch& out) const {
  layout.validate();
  NSA_CHECK(micro >= 0 && micro < layout.micro_batches(), "micro-batch ", micro, " of ",
            layout.micro_batches());
  out.resize(layout.micro_batch, seq_len_);
  for (std::int64_t r = 0; r < layout.micro_batch; ++r) {
    const std::int64_t k = first + layout.index_in_batch(micro, r);
    out.samples[r] = k;
    out.starts[r] = window_start(k);
    fill_window(*ds_, out.starts[r], seq_len_, out.inputs.data() + r * seq_len_,
                out.targets.data() + r * seq_len_);
  }
}

TokenBatch TrainSampler::next(const BatchLayout& layout, std::int64_t micro) const {
  TokenBatch b;
  next(layout, micro, b);
  return b;
}

SamplerPosition TrainSampler::position() const {
  SamplerPosition p;
  p.consumed_samples = consumed_;
  p.seed = seed_;
  p.seq_len = seq_len_;
  p.shuffle = shuffle_;
  p.dataset_tokens = ds_->num_tokens();
  p.dataset_fingerprint = ds_->fingerprint();
  return p;
}

void TrainSampler::restore(const SamplerPosition& pos, bool allow_dataset_change) {
  auto fail = [&](const std::string& what) {
    throw UserError(concat("data: cannot restore the sampler position: ", what));
  };
  if (pos.seed != seed_) fail(concat("it was saved with seed ", pos.seed, ", the run has ", seed_));
  if (pos.seq_len != seq_len_)
    fail(concat("it was saved with seq_len ", pos.seq_len, ", the run has ", seq_len_));
  if (pos.shuffle != shuffle_)
    fail(concat("it was saved with shuffle ", pos.shuffle ? "on" : "off", ", the run has it ",
                shuffle_ ? "on" : "off"));
  if (!allow_dataset_change) {
    if (pos.dataset_tokens != ds_->num_tokens())
      fail(concat("the training data changed: it held ", pos.dataset_tokens, " tokens, now ",
                  ds_->num_tokens()));
    if (pos.dataset_fingerprint != ds_->fingerprint())
      fail("the training data changed: same token count, different shard layout");
  }
  if (pos.consumed_samples < 0) fail("negative consumed_samples");
  consumed_ = pos.consumed_samples;
}

// ---- validation ----------------------------------------------------------------------------

ValidationReader::ValidationReader(std::shared_ptr<const TokenDataset> dataset, std::int64_t seq_len)
    : ds_(std::move(dataset)), seq_len_(seq_len) {
  NSA_CHECK(ds_ != nullptr, "null dataset");
  windows_ = count_windows(*ds_, seq_len_, "validation");
}

void ValidationReader::fill(std::int64_t batch_index, const BatchLayout& layout, std::int64_t micro,
                            TokenBatch& out) const {
  layout.validate();
  NSA_CHECK(batch_index >= 0, "negative eval batch index");
  NSA_CHECK(micro >= 0 && micro < layout.micro_batches(), "micro-batch ", micro, " of ",
            layout.micro_batches());
  out.resize(layout.micro_batch, seq_len_);
  for (std::int64_t r = 0; r < layout.micro_batch; ++r) {
    const std::int64_t j = batch_index * layout.global_batch + layout.index_in_batch(micro, r);
    out.samples[r] = j;
    out.starts[r] = (j % windows_) * seq_len_;
    fill_window(*ds_, out.starts[r], seq_len_, out.inputs.data() + r * seq_len_,
                out.targets.data() + r * seq_len_);
  }
}

TokenBatch ValidationReader::batch(std::int64_t batch_index, const BatchLayout& layout,
                                   std::int64_t micro) const {
  TokenBatch b;
  fill(batch_index, layout, micro, b);
  return b;
}

}  // namespace nsatron::data
