// Helpers for the data tests: a scratch directory, raw file writing, and shard writers built
// from the documented layouts (independent of data/shard.cpp's writers, so the readers are
// checked against the formats as documented, not against themselves).
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/util/error.h"

namespace nsatron::data::test {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "nsatron_data_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}
inline void write_text(const std::string& path, const std::string& text) {
  write_file(path, std::vector<std::uint8_t>(text.begin(), text.end()));
}
inline std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Appends v little-endian.
template <class T> void put(std::vector<std::uint8_t>& out, T v) {
  static_assert(std::is_integral_v<T>);
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(std::uint8_t(std::uint64_t(v) >> (8 * i)));
}

// llm.c: 256 int32 header {magic, version, n_tokens, 0...}, then tokens of type T.
template <class T>
std::vector<std::uint8_t> llmc_bytes(std::int32_t magic, std::int32_t version,
                                     const std::vector<std::int64_t>& tokens,
                                     std::int64_t declared = -1) {
  std::vector<std::uint8_t> b;
  put<std::int32_t>(b, magic);
  put<std::int32_t>(b, version);
  put<std::int32_t>(b, std::int32_t(declared >= 0 ? declared : std::int64_t(tokens.size())));
  for (int i = 3; i < 256; ++i) put<std::int32_t>(b, 0);
  for (std::int64_t t : tokens) put<T>(b, T(t));
  return b;
}

// Megatron .idx from its parts (the documented layout), with explicit counts so that tests
// can declare wrong ones.
struct MegatronIndex {
  std::string magic = std::string("MMIDIDX\0\0", 9);
  std::uint64_t version = 1;
  std::uint8_t dtype_code = 8;
  std::vector<std::int32_t> lengths;
  std::vector<std::int64_t> pointers;
  std::vector<std::int64_t> doc_idx;
  std::int64_t declared_sequences = -1, declared_documents = -1;  // -1: the true counts

  std::vector<std::uint8_t> bytes() const {
    std::vector<std::uint8_t> b(magic.begin(), magic.end());
    put<std::uint64_t>(b, version);
    put<std::uint8_t>(b, dtype_code);
    put<std::uint64_t>(b, declared_sequences >= 0 ? std::uint64_t(declared_sequences) : lengths.size());
    put<std::uint64_t>(b, declared_documents >= 0 ? std::uint64_t(declared_documents) : doc_idx.size());
    for (auto v : lengths) put<std::int32_t>(b, v);
    for (auto v : pointers) put<std::int64_t>(b, v);
    for (auto v : doc_idx) put<std::int64_t>(b, v);
    return b;
  }
};

// A contiguous Megatron dataset: sequences (each a document) written back to back.
template <class T>
void write_megatron(const std::string& prefix, const std::vector<std::vector<std::int64_t>>& seqs,
                    std::uint8_t code) {
  std::vector<std::uint8_t> bin;
  MegatronIndex idx;
  idx.dtype_code = code;
  idx.doc_idx.push_back(0);
  for (const auto& s : seqs) {
    idx.lengths.push_back(std::int32_t(s.size()));
    idx.pointers.push_back(std::int64_t(bin.size()));
    for (auto t : s) put<T>(bin, T(t));
    idx.doc_idx.push_back(std::int64_t(idx.lengths.size()));
  }
  write_file(prefix + ".bin", bin);
  write_file(prefix + ".idx", idx.bytes());
}

// EXPECT that `f` throws UserError whose message contains every one of `parts`.
template <class F> void expect_user_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected a UserError containing '" << (parts.empty() ? "" : parts[0]) << "'";
  } catch (const nsatron::UserError& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

}  // namespace nsatron::data::test
