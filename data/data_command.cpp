#include "data/data_command.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "core/util/error.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

namespace nsatron::data {

using detail::concat;

namespace {

const char* kUsage =
    "usage: nsatron data <command> [options]\n"
    "\n"
    "commands:\n"
    "  prepare   tokenize text files into training and validation shards\n"
    "  inspect   describe token shards (format, dtype, token count, a decoded preview)\n"
    "\n"
    "`nsatron data <command> --help` describes each; docs/data.md has the formats.\n";

const char* kPrepareUsage =
    "usage: nsatron data prepare --input FILE... --output DIR [options]\n"
    "\n"
    "Reads the input files in the order given as one text (each file one document, nothing\n"
    "inserted between them), tokenizes it and writes DIR/train_000000.bin, ... and\n"
    "DIR/val_000000.bin, ...: the last round(F * N) of the N tokens are the validation split.\n"
    "\n"
    "options:\n"
    "  --input FILE...       text files (one or more; the option may repeat)\n"
    "  --output DIR          output directory (created if missing)\n"
    "  --tokenizer NAME      bytes (default): vocabulary 256, one token per byte\n"
    "  --val-fraction F      fraction of the tokens for validation, in [0, 1) (default 0.1)\n"
    "  --format FMT          llmc (default: llm.c v1, uint16 tokens) or megatron (.bin + .idx)\n"
    "  --shard-tokens N      at most N tokens per shard (default 100000000)\n"
    "  --force               replace train_*/val_* shards already in DIR\n"
    "  -h, --help            this text\n";

const char* kInspectUsage =
    "usage: nsatron data inspect PATH... [options]\n"
    "\n"
    "Describes each shard: format, dtype, token count, smallest and largest token id, the\n"
    "unigram entropy of its tokens (a baseline for the loss) and a preview of its first\n"
    "tokens. PATH: an llm.c file, a Megatron PREFIX / PREFIX.bin / PREFIX.idx, or a glob of\n"
    "them (quote it).\n"
    "\n"
    "options:\n"
    "  --format FMT          auto (default), llmc or megatron\n"
    "  --tokenizer NAME      bytes (default): preview decoded as text; none: token ids\n"
    "  --preview N           tokens to preview (default 160; 0: none)\n"
    "  --vocab-size V        also check every token id is below V\n"
    "  -h, --help            this text\n";

bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

// Splits "--key=value" into key and value; "--key" alone leaves value empty.
struct Opt {
  std::string key, value;
  bool has_value = false;
};
Opt split_opt(const std::string& a) {
  Opt o;
  const auto eq = a.find('=');
  if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
    o.key = a.substr(0, eq);
    o.value = a.substr(eq + 1);
    o.has_value = true;
  } else {
    o.key = a;
  }
  return o;
}

template <class T> T parse_num(const std::string& cmd, const std::string& key, const std::string& v) {
  T out{};
  if constexpr (std::is_floating_point_v<T>) {
    char* end = nullptr;
    errno = 0;
    out = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || errno != 0)
      throw UserError(concat(cmd, ": ", key, " expects a number, got '", v, "'"));
    return out;
  } else {
    const char* e = v.data() + v.size();
    const std::from_chars_result r = std::from_chars(v.data(), e, out);
    if (v.empty() || r.ec != std::errc() || r.ptr != e)
      throw UserError(concat(cmd, ": ", key, " expects an integer, got '", v, "'"));
    return out;
  }
}

// Takes the value of option `o` (inline or the next argument).
std::string take_value(const std::string& cmd, const Opt& o, const std::vector<std::string>& args,
                       std::size_t& i) {
  if (o.has_value) return o.value;
  if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
    throw UserError(concat(cmd, ": ", o.key, " expects a value"));
  return args[++i];
}

std::string with_commas(std::int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

int prepare_main(const std::vector<std::string>& args) {
  const std::string cmd = "prepare";
  PrepareOptions opt;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (is_help(args[i])) {
      std::cout << kPrepareUsage;
      return 0;
    }
  }
  for (std::size_t i = 0; i < args.size(); ++i) {
    const Opt o = split_opt(args[i]);
    if (o.key == "--input") {
      if (o.has_value) {
        opt.inputs.push_back(o.value);
      } else {
        std::size_t n = 0;
        while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
          opt.inputs.push_back(args[++i]);
          ++n;
        }
        if (n == 0) throw UserError(cmd + ": --input expects one or more files");
      }
    } else if (o.key == "--output") {
      opt.output_dir = take_value(cmd, o, args, i);
    } else if (o.key == "--tokenizer") {
      opt.tokenizer = take_value(cmd, o, args, i);
    } else if (o.key == "--val-fraction") {
      opt.val_fraction = parse_num<double>(cmd, o.key, take_value(cmd, o, args, i));
    } else if (o.key == "--format") {
      const std::string f = take_value(cmd, o, args, i);
      opt.format = parse_shard_format(f, cmd + ": --format");
      if (opt.format == ShardFormat::Auto)
        throw UserError(cmd + ": --format must be llmc or megatron (auto is for reading)");
    } else if (o.key == "--shard-tokens") {
      opt.shard_tokens = parse_num<std::int64_t>(cmd, o.key, take_value(cmd, o, args, i));
    } else if (o.key == "--force" && !o.has_value) {
      opt.force = true;
    } else if (o.key.rfind("-", 0) == 0) {
      throw UserError(concat(cmd, ": unknown option '", args[i], "' (see nsatron data prepare --help)"));
    } else {
      throw UserError(concat(cmd, ": unexpected argument '", args[i],
                             "' (input files follow --input; see nsatron data prepare --help)"));
    }
  }
  if (opt.inputs.empty()) throw UserError(cmd + ": --input FILE... is required");
  if (opt.output_dir.empty()) throw UserError(cmd + ": --output DIR is required");

  const PrepareResult r = prepare_text(opt);
  std::cout << "nsatron data prepare: " << opt.inputs.size() << " input file"
            << (opt.inputs.size() == 1 ? "" : "s") << ", " << with_commas(r.input_bytes)
            << " bytes; tokenizer " << opt.tokenizer << " (vocab " << r.vocab_size << ")\n";
  const char* fmt = opt.format == ShardFormat::Megatron ? "megatron uint16" : "llmc v1 uint16";
  int n_train = 0, n_val = 0;
  for (const PreparedShard& s : r.shards) {
    std::cout << "  wrote " << s.path << (opt.format == ShardFormat::Megatron ? " (+ .idx)" : "")
              << "  " << fmt << "  " << with_commas(s.tokens) << " tokens  (" << s.split << ")\n";
    (s.split == "train" ? n_train : n_val)++;
  }
  std::cout << "train: " << with_commas(r.train_tokens) << " tokens in " << n_train << " shard"
            << (n_train == 1 ? "" : "s") << "; val: " << with_commas(r.val_tokens)
            << " tokens in " << n_val << " shard" << (n_val == 1 ? "" : "s");
  if (r.val_tokens > 0)
    std::cout << " (the last " << opt.val_fraction * 100 << "% of the text)\n";
  else
    std::cout << " (no validation split: --val-fraction 0)\n";
  return 0;
}

int inspect_main(const std::vector<std::string>& args) {
  const std::string cmd = "inspect";
  std::vector<std::string> paths;
  ShardFormat format = ShardFormat::Auto;
  std::string tokenizer = "bytes";
  std::int64_t preview = 160, vocab = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (is_help(args[i])) {
      std::cout << kInspectUsage;
      return 0;
    }
  }
  for (std::size_t i = 0; i < args.size(); ++i) {
    const Opt o = split_opt(args[i]);
    if (o.key == "--format") {
      format = parse_shard_format(take_value(cmd, o, args, i), cmd + ": --format");
    } else if (o.key == "--tokenizer") {
      tokenizer = take_value(cmd, o, args, i);
      if (tokenizer != "none") Tokenizer::get(tokenizer);  // validates the name
    } else if (o.key == "--preview") {
      preview = parse_num<std::int64_t>(cmd, o.key, take_value(cmd, o, args, i));
      if (preview < 0) throw UserError(cmd + ": --preview must be >= 0");
    } else if (o.key == "--vocab-size") {
      vocab = parse_num<std::int64_t>(cmd, o.key, take_value(cmd, o, args, i));
      if (vocab <= 0) throw UserError(cmd + ": --vocab-size must be positive");
    } else if (o.key.rfind("-", 0) == 0) {
      throw UserError(concat(cmd, ": unknown option '", args[i], "' (see nsatron data inspect --help)"));
    } else {
      paths.push_back(args[i]);
    }
  }
  if (paths.empty()) throw UserError(cmd + ": no shard given (nsatron data inspect PATH...)");

  std::int64_t total = 0;
  const std::vector<std::string> shards = expand_shard_globs(paths, format, cmd);
  for (const std::string& p : shards) {
    const TokenShard s = TokenShard::open(p, format);
    std::cout << s.name() << "\n";
    if (s.format() == ShardFormat::LlmC) {
      std::cout << "  format     llmc (magic "
                << (s.dtype() == TokenDType::U16 ? kLlmcMagicU16 : kLlmcMagicU32) << ", version "
                << s.llmc_version() << ")\n";
      std::cout << "  file       " << s.path() << " (" << with_commas(std::int64_t(kLlmcHeaderBytes) +
                       s.num_tokens() * std::int64_t(token_dtype_size(s.dtype())))
                << " bytes)\n";
    } else {
      std::cout << "  format     megatron indexed dataset (version 1, dtype code "
                << megatron_dtype_code(s.dtype()) << ")\n";
      std::cout << "  files      " << s.path() << ", " << s.index_path() << "\n";
      std::cout << "  sequences  " << with_commas(s.num_sequences()) << " in "
                << with_commas(s.num_documents()) << " documents\n";
    }
    std::cout << "  dtype      " << token_dtype_name(s.dtype()) << "\n";
    std::cout << "  tokens     " << with_commas(s.num_tokens()) << "\n";
    const TokenRange range = s.scan();
    if (s.num_tokens() > 0)
      std::cout << "  token ids  min " << range.min << ", max " << range.max << "\n";
    if (s.num_tokens() > 0 && range.min >= 0 && range.max < (1 << 24)) {
      // Unigram entropy: the loss of the best model that ignores context, a baseline for the
      // validation loss.
      std::vector<std::int64_t> counts(std::size_t(range.max) + 1, 0);
      std::vector<std::int32_t> buf;
      for (std::int64_t b = 0; b < s.num_tokens(); b += 1 << 20) {
        const std::int64_t n = std::min<std::int64_t>(1 << 20, s.num_tokens() - b);
        buf.resize(std::size_t(n));
        s.read(b, n, buf.data());
        for (std::int32_t v : buf) ++counts[std::size_t(v)];
      }
      double h = 0;
      for (std::int64_t c : counts)
        if (c > 0) {
          const double p = double(c) / double(s.num_tokens());
          h -= p * std::log(p);
        }
      char line[96];
      std::snprintf(line, sizeof(line), "%.4f nats (%.4f bits) per token", h, h / std::log(2.0));
      std::cout << "  unigram    entropy " << line << "\n";
    }
    if (vocab > 0) {
      s.check_vocab(vocab);
      std::cout << "  vocab      every id below " << vocab << "\n";
    }
    const std::int64_t n = std::min(preview, s.num_tokens());
    if (n > 0) {
      const std::vector<std::int32_t> ids = s.read(0, n);
      const bool as_text = tokenizer != "none" && range.min >= 0 &&
                           std::all_of(ids.begin(), ids.end(), [&](std::int32_t v) {
                             return v < Tokenizer::get(tokenizer).vocab_size();
                           });
      if (as_text) {
        std::cout << "  preview    \"" << escape_text(Tokenizer::get(tokenizer).decode(ids))
                  << "\"" << (n < s.num_tokens() ? " ..." : "") << "  (first " << n
                  << " tokens, " << tokenizer << " tokenizer)\n";
      } else {
        std::ostringstream os;
        for (std::int64_t i = 0; i < n; ++i) os << (i ? " " : "") << ids[std::size_t(i)];
        std::cout << "  preview    [" << os.str() << (n < s.num_tokens() ? " ..." : "")
                  << "]  (first " << n << " token ids)\n";
      }
    }
    total += s.num_tokens();
  }
  if (shards.size() > 1)
    std::cout << shards.size() << " shards, " << with_commas(total) << " tokens\n";
  return 0;
}

}  // namespace

int data_main(const std::vector<std::string>& args) {
  if (args.empty())
    throw UserError("expected a command: prepare or inspect (see nsatron data --help)");
  const std::string& sub = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (is_help(sub) || sub == "help") {
    std::cout << kUsage;
    return 0;
  }
  try {
    if (sub == "prepare") return prepare_main(rest);
    if (sub == "inspect") return inspect_main(rest);
  } catch (const UserError& e) {
    // The CLI prefixes "nsatron data: "; drop the library's own "data: " to avoid saying it twice.
    const std::string_view m = e.what();
    if (m.rfind("data: ", 0) == 0) throw UserError(std::string(m.substr(6)));
    throw;
  }
  throw UserError(concat("unknown command '", sub,
                         "' (expected prepare or inspect; see nsatron data --help)"));
}

}  // namespace nsatron::data
