#include "data/dataset.h"

#include <glob.h>

#include <algorithm>
#include <sstream>

#include "core/util/error.h"

namespace nsatron::data {

using detail::concat;

namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::uint64_t mix64(std::uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<std::string> expand_shard_globs(const std::vector<std::string>& globs,
                                            ShardFormat format, const std::string& what) {
  if (globs.empty()) throw UserError(concat(what, ": no shard files given"));
  std::vector<std::string> out;
  for (const std::string& g : globs) {
    std::vector<std::string> matches;
    if (has_glob_chars(g)) {
      glob_t gl{};
      const int rc = ::glob(g.c_str(), GLOB_NOSORT, nullptr, &gl);
      if (rc == 0)
        for (std::size_t i = 0; i < gl.gl_pathc; ++i) matches.emplace_back(gl.gl_pathv[i]);
      ::globfree(&gl);
      if (rc != 0 && rc != GLOB_NOMATCH)
        throw UserError(concat(what, ": cannot expand the glob '", g, "' (glob error ", rc, ")"));
      // Byte order, independent of the locale.
      std::sort(matches.begin(), matches.end());
      // Leave out the temporary files of an interrupted `nsatron data prepare`.
      std::erase_if(matches, [](const std::string& m) { return ends_with(m, ".tmp"); });
      if (matches.empty()) throw UserError(concat(what, ": the glob '", g, "' matches no file"));
    } else {
      const bool megatron_prefix = file_exists(g + ".bin") && file_exists(g + ".idx");
      if (!file_exists(g) && !megatron_prefix)
        throw UserError(concat(what, ": shard '", g, "' not found"));
      matches.push_back(g);
    }
    // A Megatron dataset is one shard, whether matched as PREFIX.bin, PREFIX.idx or both.
    std::vector<std::string> keys;
    for (const std::string& m : matches) {
      std::string key = m;
      if (format != ShardFormat::LlmC && (ends_with(m, ".bin") || ends_with(m, ".idx"))) {
        const std::string prefix = m.substr(0, m.size() - 4);
        if (ends_with(m, ".idx") || file_exists(prefix + ".idx")) key = prefix + ".bin";
      }
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
    out.insert(out.end(), keys.begin(), keys.end());
  }
  return out;
}

std::shared_ptr<const TokenDataset> TokenDataset::open(const std::vector<std::string>& globs,
                                                       const DatasetOptions& options,
                                                       const std::string& what) {
  return open_paths(expand_shard_globs(globs, options.format, what), options, what);
}

std::shared_ptr<const TokenDataset> TokenDataset::open_paths(const std::vector<std::string>& paths,
                                                             const DatasetOptions& options,
                                                             const std::string& what) {
  if (paths.empty()) throw UserError(concat(what, ": no shard files given"));
  auto ds = std::make_shared<TokenDataset>();
  ds->what_ = what;
  ds->begin_.push_back(0);
  std::uint64_t fp = mix64(0x6e73617472646174ull ^ paths.size());
  for (const std::string& p : paths) {
    TokenShard s = TokenShard::open(p, options.format);
    if (options.vocab_size > 0) s.check_vocab(options.vocab_size);
    ds->total_ += s.num_tokens();
    ds->begin_.push_back(ds->total_);
    fp = mix64(fp ^ std::uint64_t(s.num_tokens()));
    ds->shards_.push_back(std::move(s));
  }
  ds->fingerprint_ = fp;
  if (ds->total_ == 0) throw UserError(concat(what, ": the shards hold no tokens"));
  return ds;
}

void TokenDataset::read(std::int64_t begin, std::int64_t count, std::int32_t* out) const {
  NSA_CHECK(begin >= 0 && count >= 0 && begin + count <= total_, "read [", begin, ", +", count,
            ") of a dataset with ", total_, " tokens");
  if (count == 0) return;
  // The shard holding `begin`: the last with begin_ <= begin (skipping empty shards).
  std::size_t s = std::size_t(std::upper_bound(begin_.begin(), begin_.end(), begin) - begin_.begin()) - 1;
  std::int64_t pos = begin, left = count;
  while (left > 0) {
    const std::int64_t n = std::min(left, begin_[s + 1] - pos);
    if (n > 0) shards_[s].read(pos - begin_[s], n, out + (pos - begin));
    pos += n;
    left -= n;
    ++s;
  }
}

std::string TokenDataset::describe() const {
  std::ostringstream os;
  for (const TokenShard& s : shards_) {
    os << "  " << s.name() << "  " << shard_format_name(s.format());
    if (s.format() == ShardFormat::LlmC) os << " v" << s.llmc_version();
    os << " " << token_dtype_name(s.dtype()) << "  " << s.num_tokens() << " tokens\n";
  }
  return os.str();
}

}  // namespace nsatron::data
