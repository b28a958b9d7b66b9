#include "data/shard.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/util/error.h"

static_assert(std::endian::native == std::endian::little,
              "nsatron's shard readers assume a little-endian host");

namespace nsatron::data {

using detail::concat;

std::size_t token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::U8:
    case TokenDType::I8: return 1;
    case TokenDType::I16:
    case TokenDType::U16: return 2;
    case TokenDType::I32:
    case TokenDType::U32: return 4;
    case TokenDType::I64: return 8;
  }
  return 0;
}

std::string_view token_dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::U8: return "uint8";
    case TokenDType::I8: return "int8";
    case TokenDType::I16: return "int16";
    case TokenDType::U16: return "uint16";
    case TokenDType::I32: return "int32";
    case TokenDType::U32: return "uint32";
    case TokenDType::I64: return "int64";
  }
  return "?";
}

std::string_view shard_format_name(ShardFormat f) {
  switch (f) {
    case ShardFormat::Auto: return "auto";
    case ShardFormat::LlmC: return "llmc";
    case ShardFormat::Megatron: return "megatron";
  }
  return "?";
}

ShardFormat parse_shard_format(std::string_view s, std::string_view what) {
  if (s == "auto") return ShardFormat::Auto;
  if (s == "llmc") return ShardFormat::LlmC;
  if (s == "megatron") return ShardFormat::Megatron;
  throw UserError(concat(what, ": unknown shard format '", s,
                         "' (expected \"auto\", \"llmc\" or \"megatron\")"));
}

int megatron_dtype_code(TokenDType t) {
  switch (t) {
    case TokenDType::U8: return 1;
    case TokenDType::I8: return 2;
    case TokenDType::I16: return 3;
    case TokenDType::I32: return 4;
    case TokenDType::I64: return 5;
    case TokenDType::U16: return 8;
    case TokenDType::U32: break;
  }
  throw UserError(concat("data: the Megatron indexed dataset has no dtype code for ",
                         token_dtype_name(t), " (Megatron defines uint8, int8, int16, int32, "
                         "int64, uint16 for integers)"));
}

namespace {

template <class T> T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Reads the first n bytes of a file (fewer if it is shorter); empty if it cannot be opened.
std::string read_prefix(const std::string& path, std::size_t n) {
  std::string buf(n, '\0');
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return {};
  std::size_t got = std::fread(buf.data(), 1, n, f);
  std::fclose(f);
  buf.resize(got);
  return buf;
}

bool has_megatron_magic(const std::string& idx_path) {
  std::string head = read_prefix(idx_path, sizeof(kMegatronMagic));
  return head.size() == sizeof(kMegatronMagic) &&
         std::memcmp(head.data(), kMegatronMagic, sizeof(kMegatronMagic)) == 0;
}

bool has_llmc_magic(const std::string& path) {
  std::string head = read_prefix(path, 4);
  if (head.size() < 4) return false;
  std::int32_t m = load<std::int32_t>(reinterpret_cast<const std::uint8_t*>(head.data()));
  return m == kLlmcMagicU16 || m == kLlmcMagicU32;
}

std::string strip_megatron_ext(const std::string& path) {
  if (ends_with(path, ".bin") || ends_with(path, ".idx")) return path.substr(0, path.size() - 4);
  return path;
}

// Converts `count` raw tokens of type T at `src` to int32, checking the range; `pos` is the
// stream position of the first one, for the message.
template <class T>
void convert(const std::uint8_t* src, std::int64_t count, std::int32_t* out, const TokenShard& sh,
             std::int64_t pos) {
  for (std::int64_t i = 0; i < count; ++i) {
    T v = load<T>(src + i * sizeof(T));
    if constexpr (std::is_signed_v<T> || sizeof(T) >= 4) {
      if (std::int64_t(v) < 0 || std::uint64_t(v) > std::uint64_t(std::numeric_limits<std::int32_t>::max()))
        throw UserError(concat("data: shard '", sh.name(), "': token ", pos + i, " has id ",
                               std::int64_t(v), ", outside the token id range [0, 2^31)"));
    }
    out[i] = std::int32_t(v);
  }
}

template <class F> decltype(auto) dispatch(TokenDType t, F&& f) {
  switch (t) {
    case TokenDType::U8: return f(std::uint8_t{});
    case TokenDType::I8: return f(std::int8_t{});
    case TokenDType::I16: return f(std::int16_t{});
    case TokenDType::U16: return f(std::uint16_t{});
    case TokenDType::I32: return f(std::int32_t{});
    case TokenDType::U32: return f(std::uint32_t{});
    case TokenDType::I64: return f(std::int64_t{});
  }
  return f(std::uint16_t{});
}

}  // namespace

std::string TokenShard::name() const {
  if (format_ == ShardFormat::Megatron) return strip_megatron_ext(bin_.path()) + ".{bin,idx}";
  return bin_.path();
}

TokenShard TokenShard::open(const std::string& path, ShardFormat format) {
  if (format == ShardFormat::LlmC) return open_llmc(path);
  if (format == ShardFormat::Megatron) return open_megatron(strip_megatron_ext(path));
  // Auto: by extension and content.
  if (ends_with(path, ".idx")) return open_megatron(strip_megatron_ext(path));
  const std::string prefix = strip_megatron_ext(path);
  const std::string idx = prefix + ".idx";
  const bool is_bin = ends_with(path, ".bin");
  if (is_bin || !file_exists(path)) {
    if (file_exists(idx) && has_megatron_magic(idx)) return open_megatron(prefix);
  }
  if (!file_exists(path)) {
    if (!is_bin && file_exists(prefix + ".bin") && file_exists(idx)) return open_megatron(prefix);
    throw UserError(concat("data: shard '", path, "' not found"));
  }
  if (has_llmc_magic(path)) return open_llmc(path);
  if (is_bin && file_exists(idx)) return open_megatron(prefix);  // reports the bad .idx
  std::string head = read_prefix(path, 4);
  std::string found = head.size() < 4
      ? concat("the file holds only ", head.size(), " bytes")
      : concat("its first int32 is ",
               load<std::int32_t>(reinterpret_cast<const std::uint8_t*>(head.data())));
  throw UserError(concat("data: cannot tell the format of shard '", path,
                         "': not an llm.c shard (magic ", kLlmcMagicU16, " or ", kLlmcMagicU32,
                         "; ", found, ") and no Megatron index '", idx, "' beside it"));
}

TokenShard TokenShard::open_llmc(const std::string& path) {
  TokenShard s;
  s.format_ = ShardFormat::LlmC;
  s.bin_ = MappedFile(path);
  const std::size_t size = s.bin_.size();
  auto fail = [&](const std::string& what) -> UserError {
    return UserError(concat("data: llm.c shard '", path, "': ", what));
  };
  if (size < kLlmcHeaderBytes)
    throw fail(concat("truncated: ", size, " bytes, shorter than the ", kLlmcHeaderBytes,
                      "-byte header"));
  const std::uint8_t* h = s.bin_.data();
  const std::int32_t magic = load<std::int32_t>(h), version = load<std::int32_t>(h + 4),
                     ntok = load<std::int32_t>(h + 8);
  if (magic == kLlmcMagicU16) {
    if (version != 1)
      throw fail(concat("unsupported version ", version, " for magic ", magic, " (expected 1)"));
    s.dtype_ = TokenDType::U16;
  } else if (magic == kLlmcMagicU32) {
    if (version != 7)
      throw fail(concat("unsupported version ", version, " for magic ", magic, " (expected 7)"));
    s.dtype_ = TokenDType::U32;
  } else {
    throw fail(concat("bad magic ", magic, " (expected ", kLlmcMagicU16,
                      " for uint16 tokens or ", kLlmcMagicU32, " for uint32 tokens)"));
  }
  s.llmc_version_ = version;
  if (ntok < 0) throw fail(concat("negative token count ", ntok, " in the header"));
  const std::size_t item = token_dtype_size(s.dtype_);
  const std::size_t want = kLlmcHeaderBytes + std::size_t(ntok) * item;
  if (size < want)
    throw fail(concat("truncated: the header declares ", ntok, " ", token_dtype_name(s.dtype_),
                      " tokens (", want, " bytes with the header) but the file holds ", size,
                      " bytes"));
  if (size > want)
    throw fail(concat("size mismatch: the header declares ", ntok, " ",
                      token_dtype_name(s.dtype_), " tokens (", want,
                      " bytes with the header) but the file holds ", size, " bytes (",
                      size - want, " unexpected trailing bytes)"));
  s.num_tokens_ = ntok;
  s.base_ = h + kLlmcHeaderBytes;
  return s;
}

TokenShard TokenShard::open_megatron(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  auto fail = [&](const std::string& file, const std::string& what) -> UserError {
    return UserError(concat("data: Megatron dataset '", file, "': ", what));
  };
  if (!file_exists(idx_path)) throw fail(idx_path, "index file not found");
  if (!file_exists(bin_path)) throw fail(bin_path, "data file not found (beside its .idx)");
  TokenShard s;
  s.format_ = ShardFormat::Megatron;
  s.idx_ = MappedFile(idx_path);
  s.bin_ = MappedFile(bin_path);
  const std::uint8_t* p = s.idx_.data();
  const std::uint64_t isize = s.idx_.size();
  constexpr std::uint64_t kHeader = 9 + 8 + 1 + 8 + 8;
  if (isize < kHeader)
    throw fail(idx_path, concat("truncated: ", isize, " bytes, shorter than the ", kHeader,
                                "-byte header"));
  if (std::memcmp(p, kMegatronMagic, 9) != 0)
    throw fail(idx_path, "bad magic: the file does not start with \"MMIDIDX\\0\\0\"");
  const std::uint64_t version = load<std::uint64_t>(p + 9);
  if (version != 1) throw fail(idx_path, concat("unsupported version ", version, " (expected 1)"));
  const int code = p[17];
  switch (code) {
    case 1: s.dtype_ = TokenDType::U8; break;
    case 2: s.dtype_ = TokenDType::I8; break;
    case 3: s.dtype_ = TokenDType::I16; break;
    case 4: s.dtype_ = TokenDType::I32; break;
    case 5: s.dtype_ = TokenDType::I64; break;
    case 8: s.dtype_ = TokenDType::U16; break;
    case 6:
    case 7:
      throw fail(idx_path, concat("dtype code ", code,
                                  " is floating point; token ids need an integer dtype"));
    default:
      throw fail(idx_path, concat("unknown dtype code ", code,
                                  " (expected 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)"));
  }
  const std::uint64_t S = load<std::uint64_t>(p + 18), D = load<std::uint64_t>(p + 26);
  // S and D beyond the file size cannot be right; checking first keeps the sums below exact.
  if (S > isize || D > isize)
    throw fail(idx_path, concat("truncated or corrupt: declares ", S, " sequences and ", D,
                                " document indices but the file holds only ", isize, " bytes"));
  const std::uint64_t want = kHeader + S * 4 + S * 8 + D * 8;
  if (isize < want)
    throw fail(idx_path, concat("truncated: declares ", S, " sequences and ", D,
                                " document indices, needing ", want, " bytes, but the file holds ",
                                isize, " bytes"));
  if (isize != want && isize != want + S)  // + S: the optional int8 sequence modes
    throw fail(idx_path, concat("size mismatch: declares ", S, " sequences and ", D,
                                " document indices (", want, " bytes) but the file holds ", isize,
                                " bytes"));
  const std::uint8_t* lens = p + kHeader;
  const std::uint8_t* ptrs = lens + S * 4;
  const std::uint8_t* docs = ptrs + S * 8;
  const std::int64_t item = std::int64_t(token_dtype_size(s.dtype_));
  const std::int64_t bsize = std::int64_t(s.bin_.size());
  std::int64_t total = 0;
  bool contiguous = true;
  const std::int64_t ptr0 = S > 0 ? load<std::int64_t>(ptrs) : 0;
  for (std::uint64_t i = 0; i < S; ++i) {
    const std::int32_t len = load<std::int32_t>(lens + 4 * i);
    const std::int64_t ptr = load<std::int64_t>(ptrs + 8 * i);
    if (len < 0) throw fail(idx_path, concat("sequence ", i, " has negative length ", len));
    if (ptr < 0 || ptr > bsize || std::int64_t(len) * item > bsize - ptr)
      throw fail(idx_path, concat("sequence ", i, " (byte pointer ", ptr, ", ", len, " tokens of ",
                                  item, " bytes) lies outside the data file '", bin_path, "' of ",
                                  bsize, " bytes"));
    if (ptr != ptr0 + total * item) contiguous = false;
    total += len;
  }
  std::int64_t prev = 0;
  for (std::uint64_t j = 0; j < D; ++j) {
    const std::int64_t d = load<std::int64_t>(docs + 8 * j);
    if (d < prev || d > std::int64_t(S))
      throw fail(idx_path, concat("document index ", j, " is ", d, " (expected non-decreasing, in [",
                                  prev, ", ", S, "])"));
    if (j == 0 && d != 0)
      throw fail(idx_path, concat("the first document index is ", d, " (expected 0)"));
    prev = d;
  }
  if (D == 0) throw fail(idx_path, "no document indices (expected at least the entry 0)");
  if (prev != std::int64_t(S))
    throw fail(idx_path, concat("the last document index is ", prev, " (expected the sequence count ",
                                S, ")"));
  s.num_tokens_ = total;
  s.num_sequences_ = std::int64_t(S);
  s.num_documents_ = std::int64_t(D) - 1;
  if (contiguous) {
    s.base_ = s.bin_.data() ? s.bin_.data() + ptr0 : nullptr;
  } else {
    s.seq_begin_.resize(S + 1);
    s.seq_ptr_.resize(S);
    std::int64_t acc = 0;
    for (std::uint64_t i = 0; i < S; ++i) {
      s.seq_begin_[i] = acc;
      s.seq_ptr_[i] = load<std::int64_t>(ptrs + 8 * i);
      acc += load<std::int32_t>(lens + 4 * i);
    }
    s.seq_begin_[S] = acc;
  }
  return s;
}

template <class F>
void TokenShard::for_each_run(std::int64_t begin, std::int64_t count, F&& f) const {
  NSA_CHECK(begin >= 0 && count >= 0 && begin + count <= num_tokens_, "read [", begin, ", +",
            count, ") of shard '", name(), "' with ", num_tokens_, " tokens");
  if (count == 0) return;
  const std::int64_t item = std::int64_t(token_dtype_size(dtype_));
  if (base_ || seq_begin_.empty()) {
    f(base_ + begin * item, count, begin);
    return;
  }
  // The sequence holding `begin`: the last with seq_begin_ <= begin.
  std::size_t s = std::size_t(std::upper_bound(seq_begin_.begin(), seq_begin_.end(), begin) -
                              seq_begin_.begin()) - 1;
  std::int64_t pos = begin, left = count;
  while (left > 0) {
    const std::int64_t in_seq = pos - seq_begin_[s];
    const std::int64_t n = std::min(left, seq_begin_[s + 1] - pos);
    if (n > 0) f(bin_.data() + seq_ptr_[s] + in_seq * item, n, pos);
    pos += n;
    left -= n;
    ++s;
  }
}

void TokenShard::read(std::int64_t begin, std::int64_t count, std::int32_t* out) const {
  for_each_run(begin, count, [&](const std::uint8_t* src, std::int64_t n, std::int64_t pos) {
    dispatch(dtype_, [&](auto tag) { convert<decltype(tag)>(src, n, out + (pos - begin), *this, pos); });
  });
}

std::vector<std::int32_t> TokenShard::read(std::int64_t begin, std::int64_t count) const {
  std::vector<std::int32_t> out(static_cast<std::size_t>(count));
  read(begin, count, out.data());
  return out;
}

TokenRange TokenShard::scan() const {
  TokenRange r;
  r.min = std::numeric_limits<std::int64_t>::max();
  r.max = std::numeric_limits<std::int64_t>::min();
  for_each_run(0, num_tokens_, [&](const std::uint8_t* src, std::int64_t n, std::int64_t) {
    dispatch(dtype_, [&](auto tag) {
      using T = decltype(tag);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t v = std::int64_t(load<T>(src + i * sizeof(T)));
        r.min = std::min(r.min, v);
        r.max = std::max(r.max, v);
      }
    });
  });
  if (num_tokens_ == 0) r = TokenRange{};
  return r;
}

void TokenShard::check_vocab(std::int64_t vocab_size) const {
  // Nothing to read when the dtype cannot hold an id outside the vocabulary.
  if ((dtype_ == TokenDType::U8 && vocab_size >= 256) || (dtype_ == TokenDType::U16 && vocab_size >= 65536))
    return;
  for_each_run(0, num_tokens_, [&](const std::uint8_t* src, std::int64_t n, std::int64_t pos) {
    dispatch(dtype_, [&](auto tag) {
      using T = decltype(tag);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t v = std::int64_t(load<T>(src + i * sizeof(T)));
        if (v < 0 || v >= vocab_size)
          throw UserError(concat("data: shard '", name(), "': token ", pos + i, " has id ", v,
                                 ", outside the vocabulary [0, ", vocab_size, ")"));
      }
    });
  });
}

// ---- writers ---------------------------------------------------------------------------

namespace {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) throw UserError(concat("data: cannot create '", tmp_, "': ", std::strerror(errno)));
  }
  ~AtomicFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  void write(const void* p, std::size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n)
      throw UserError(concat("data: writing '", tmp_, "' failed: ", std::strerror(errno)));
  }
  void commit() {
    bool ok = std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
    ok = (std::fclose(f_) == 0) && ok;
    f_ = nullptr;
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      int e = errno;
      std::remove(tmp_.c_str());
      throw UserError(concat("data: finishing '", path_, "' failed: ", std::strerror(e)));
    }
  }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
};

// Writes tokens converted to `dtype`, in chunks.
void write_tokens(AtomicFile& f, const std::string& path, std::span<const std::int32_t> tokens,
                  TokenDType dtype) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr std::size_t kChunk = 1 << 16;
    std::vector<T> buf;
    buf.reserve(kChunk);
    for (std::size_t i = 0; i < tokens.size(); i += kChunk) {
      buf.clear();
      const std::size_t n = std::min(kChunk, tokens.size() - i);
      for (std::size_t j = 0; j < n; ++j) {
        const std::int64_t v = tokens[i + j];
        if (v < std::int64_t(std::numeric_limits<T>::min()) ||
            v > std::int64_t(std::numeric_limits<T>::max()))
          throw UserError(concat("data: cannot write '", path, "': token ", i + j, " (id ", v,
                                 ") does not fit ", token_dtype_name(dtype)));
        buf.push_back(T(v));
      }
      f.write(buf.data(), n * sizeof(T));
    }
  });
}

}  // namespace

void write_llmc_shard(const std::string& path, std::span<const std::int32_t> tokens,
                      TokenDType dtype) {
  if (dtype != TokenDType::U16 && dtype != TokenDType::U32)
    throw UserError(concat("data: llm.c shards hold uint16 or uint32 tokens, not ",
                           token_dtype_name(dtype)));
  if (tokens.size() > std::size_t(std::numeric_limits<std::int32_t>::max()))
    throw UserError(concat("data: cannot write '", path, "': ", tokens.size(),
                           " tokens exceed the llm.c header's int32 count"));
  std::int32_t header[256] = {};
  header[0] = dtype == TokenDType::U16 ? kLlmcMagicU16 : kLlmcMagicU32;
  header[1] = dtype == TokenDType::U16 ? 1 : 7;
  header[2] = std::int32_t(tokens.size());
  AtomicFile f(path);
  f.write(header, sizeof(header));
  write_tokens(f, path, tokens, dtype);
  f.commit();
}

void write_megatron_shard(const std::string& prefix, std::span<const std::int32_t> tokens,
                          std::span<const std::int64_t> sequence_lengths,
                          std::span<const std::int64_t> document_indices, TokenDType dtype) {
  const int code = megatron_dtype_code(dtype);
  std::int64_t sum = 0;
  for (std::int64_t l : sequence_lengths) {
    if (l < 0 || l > std::numeric_limits<std::int32_t>::max())
      throw UserError(concat("data: cannot write '", prefix, ".idx': sequence length ", l,
                             " outside [0, 2^31)"));
    sum += l;
  }
  if (sum != std::int64_t(tokens.size()))
    throw UserError(concat("data: cannot write '", prefix, ".idx': sequence lengths sum to ", sum,
                           " but there are ", tokens.size(), " tokens"));
  {
    AtomicFile bin(prefix + ".bin");
    write_tokens(bin, prefix + ".bin", tokens, dtype);
    bin.commit();
  }
  AtomicFile idx(prefix + ".idx");
  const std::uint64_t version = 1, S = sequence_lengths.size(), D = document_indices.size();
  const std::uint8_t dcode = std::uint8_t(code);
  idx.write(kMegatronMagic, sizeof(kMegatronMagic));
  idx.write(&version, 8);
  idx.write(&dcode, 1);
  idx.write(&S, 8);
  idx.write(&D, 8);
  std::vector<std::int32_t> lens(sequence_lengths.begin(), sequence_lengths.end());
  idx.write(lens.data(), lens.size() * 4);
  std::vector<std::int64_t> ptrs(S);
  std::int64_t off = 0;
  const std::int64_t item = std::int64_t(token_dtype_size(dtype));
  for (std::size_t i = 0; i < S; ++i) {
    ptrs[i] = off;
    off += sequence_lengths[i] * item;
  }
  idx.write(ptrs.data(), ptrs.size() * 8);
  idx.write(document_indices.data(), D * 8);
  idx.commit();
}

}  // namespace nsatron::data
