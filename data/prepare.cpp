#include "data/prepare.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/util/error.h"
#include "data/tokenizer.h"

namespace nsatron::data {

using detail::concat;
namespace fs = std::filesystem;

namespace {

// Accumulates one split's tokens and writes a shard each time shard_tokens are reached.
class ShardBuilder {
 public:
  ShardBuilder(std::string split, const PrepareOptions& opt, PrepareResult& result)
      : split_(std::move(split)), opt_(opt), result_(result) {}

  // Appends tokens of input document `doc`.
  void add(const std::int32_t* tokens, std::int64_t n, std::int64_t doc) {
    while (n > 0) {
      const std::int64_t room = opt_.shard_tokens - std::int64_t(buf_.size());
      const std::int64_t take = std::min(room, n);
      if (doc != doc_ || seq_lengths_.empty()) {  // a new sequence: new document or new shard
        seq_lengths_.push_back(0);
        doc_ = doc;
      }
      buf_.insert(buf_.end(), tokens, tokens + take);
      seq_lengths_.back() += take;
      tokens += take;
      n -= take;
      if (std::int64_t(buf_.size()) == opt_.shard_tokens) flush();
    }
  }

  void flush() {
    if (buf_.empty()) return;
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%06d", split_.c_str(), index_++);
    const std::string prefix = (fs::path(opt_.output_dir) / name).string();
    if (opt_.format == ShardFormat::Megatron) {
      std::vector<std::int64_t> docs(seq_lengths_.size() + 1);
      for (std::size_t i = 0; i < docs.size(); ++i) docs[i] = std::int64_t(i);
      write_megatron_shard(prefix, buf_, seq_lengths_, docs, TokenDType::U16);
    } else {
      write_llmc_shard(prefix + ".bin", buf_, TokenDType::U16);
    }
    result_.shards.push_back({split_, prefix + ".bin", std::int64_t(buf_.size())});
    buf_.clear();
    seq_lengths_.clear();
  }

 private:
  std::string split_;
  const PrepareOptions& opt_;
  PrepareResult& result_;
  std::vector<std::int32_t> buf_;
  std::vector<std::int64_t> seq_lengths_;
  std::int64_t doc_ = -1;
  int index_ = 0;
};

std::vector<std::string> existing_shards(const std::string& dir) {
  std::vector<std::string> out;
  for (const char* pat : {"train_*.bin", "train_*.idx", "val_*.bin", "val_*.idx", "train_*.tmp",
                          "val_*.tmp"}) {
    const std::string g = (fs::path(dir) / pat).string();
    glob_t gl{};
    if (::glob(g.c_str(), 0, nullptr, &gl) == 0)
      for (std::size_t i = 0; i < gl.gl_pathc; ++i) out.emplace_back(gl.gl_pathv[i]);
    ::globfree(&gl);
  }
  return out;
}

}  // namespace

PrepareResult prepare_text(const PrepareOptions& opt) {
  const std::string who = "data: prepare";
  if (opt.inputs.empty()) throw UserError(who + ": no input files (--input FILE...)");
  if (opt.output_dir.empty()) throw UserError(who + ": no output directory (--output DIR)");
  const Tokenizer tok = Tokenizer::get(opt.tokenizer);
  if (!std::isfinite(opt.val_fraction) || opt.val_fraction < 0 || opt.val_fraction >= 1)
    throw UserError(concat(who, ": --val-fraction must be in [0, 1), got ", opt.val_fraction));
  if (opt.format != ShardFormat::LlmC && opt.format != ShardFormat::Megatron)
    throw UserError(concat(who, ": --format must be llmc or megatron"));
  if (opt.shard_tokens < 1 || opt.shard_tokens > std::numeric_limits<std::int32_t>::max())
    throw UserError(concat(who, ": --shard-tokens must be in [1, 2147483647], got ",
                           opt.shard_tokens));

  PrepareResult result;
  result.vocab_size = tok.vocab_size();
  for (const std::string& in : opt.inputs) {
    std::error_code ec;
    const auto st = fs::status(in, ec);
    if (ec || !fs::exists(st)) throw UserError(concat(who, ": input '", in, "' not found"));
    if (!fs::is_regular_file(st)) throw UserError(concat(who, ": input '", in, "' is not a file"));
    result.input_bytes += std::int64_t(fs::file_size(in));
  }
  const std::int64_t total = result.input_bytes;  // bytes tokenizer: one token per byte
  if (total == 0) throw UserError(concat(who, ": the input files are empty"));
  const std::int64_t n_val = std::llround(opt.val_fraction * double(total));
  if (opt.val_fraction > 0 && n_val == 0)
    throw UserError(concat(who, ": --val-fraction ", opt.val_fraction, " of ", total,
                           " tokens leaves no validation tokens"));
  const std::int64_t n_train = total - n_val;
  if (n_train <= 0)
    throw UserError(concat(who, ": --val-fraction ", opt.val_fraction, " of ", total,
                           " tokens leaves no training tokens"));

  {
    std::error_code ec;
    fs::create_directories(opt.output_dir, ec);
    if (ec || !fs::is_directory(opt.output_dir))
      throw UserError(concat(who, ": cannot create the output directory '", opt.output_dir,
                             "'", ec ? ": " + ec.message() : std::string()));
  }
  const std::vector<std::string> old = existing_shards(opt.output_dir);
  if (!old.empty()) {
    if (!opt.force)
      throw UserError(concat(who, ": '", opt.output_dir, "' already holds shards (", old.front(),
                             old.size() > 1 ? concat(" and ", old.size() - 1, " more") : "",
                             "); pass --force to replace them"));
    for (const std::string& f : old)
      if (std::remove(f.c_str()) != 0)
        throw UserError(concat(who, ": cannot remove '", f, "': ", std::strerror(errno)));
  }

  ShardBuilder train("train", opt, result), val("val", opt, result);
  std::int64_t offset = 0;  // tokens so far, over all inputs
  std::string chunk(1 << 20, '\0');
  for (std::size_t doc = 0; doc < opt.inputs.size(); ++doc) {
    const std::string& in = opt.inputs[doc];
    FILE* f = std::fopen(in.c_str(), "rb");
    if (!f) throw UserError(concat(who, ": cannot open '", in, "': ", std::strerror(errno)));
    for (;;) {
      const std::size_t got = std::fread(chunk.data(), 1, chunk.size(), f);
      if (got == 0) break;
      const std::vector<std::int32_t> ids = tok.encode(std::string_view(chunk.data(), got));
      const std::int64_t n = std::int64_t(ids.size());
      const std::int64_t to_train = std::clamp<std::int64_t>(n_train - offset, 0, n);
      if (offset + n > total) {
        std::fclose(f);
        throw UserError(concat(who, ": input '", in, "' grew while being read"));
      }
      train.add(ids.data(), to_train, std::int64_t(doc));
      val.add(ids.data() + to_train, n - to_train, std::int64_t(doc));
      offset += n;
    }
    const bool err = std::ferror(f);
    std::fclose(f);
    if (err) throw UserError(concat(who, ": reading '", in, "' failed"));
  }
  if (offset != total)
    throw UserError(concat(who, ": the inputs changed while being read (", offset, " of ", total,
                           " bytes)"));
  train.flush();
  val.flush();
  result.train_tokens = n_train;
  result.val_tokens = n_val;
  return result;
}

}  // namespace nsatron::data
