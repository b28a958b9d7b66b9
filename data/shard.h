// Token shards on disk, read by mmap, and their writers. Two formats (docs/data.md):
//
//  llm.c (karpathy/llm.c `.bin`): a header of 256 little-endian int32, then the tokens.
//    header[0] = magic, header[1] = version, header[2] = number of tokens;
//    magic 20240520 + version 1: uint16 tokens; magic 20240801 + version 7: uint32 tokens.
//    The file is exactly 1024 + n_tokens * sizeof(token) bytes.
//
//  Megatron-LM indexed dataset (`PREFIX.bin` holding the tokens, `PREFIX.idx` the index),
//    all little-endian:
//      9 bytes   magic "MMIDIDX\0\0"
//      uint64    version (1)
//      uint8     dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16
//                (6 and 7 are floating point and refused: they cannot hold token ids)
//      uint64    S, the number of sequences
//      uint64    D, the number of document-index entries
//      int32[S]  sequence lengths, in tokens
//      int64[S]  sequence pointers, byte offsets into PREFIX.bin
//      int64[D]  document indices: sequence index where each document starts, with a final
//                entry S (non-decreasing, each in [0, S])
//      int8[S]   (optional) sequence modes, written by Megatron's multimodal builder; ignored
//
// A shard presents its tokens as one stream: llm.c as stored, Megatron as the sequences
// concatenated in index order. Every read converts to int32 token ids.
//
// Every check that fails throws nsatron::UserError naming the file and what is wrong.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/mapped_file.h"

namespace nsatron::data {

enum class TokenDType : std::uint8_t { U8, I8, I16, U16, I32, U32, I64 };
std::size_t token_dtype_size(TokenDType t);
std::string_view token_dtype_name(TokenDType t);  // "uint16", ...

enum class ShardFormat : std::uint8_t { Auto, LlmC, Megatron };
std::string_view shard_format_name(ShardFormat f);  // "auto", "llmc", "megatron"
// Parses "auto" | "llmc" | "megatron"; `what` names the setting in the error message.
ShardFormat parse_shard_format(std::string_view s, std::string_view what = "data.format");

inline constexpr std::int32_t kLlmcMagicU16 = 20240520;  // version 1, uint16 tokens
inline constexpr std::int32_t kLlmcMagicU32 = 20240801;  // version 7, uint32 tokens
inline constexpr std::size_t kLlmcHeaderBytes = 256 * 4;
inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py DType).
int megatron_dtype_code(TokenDType t);

struct TokenRange {
  std::int64_t min = 0, max = -1;  // max < min when the shard is empty
};

class TokenShard {
 public:
  // `path`: an llm.c file; or a Megatron dataset as PREFIX, PREFIX.bin or PREFIX.idx.
  // ShardFormat::Auto tells them apart by content (the .idx magic, the llm.c magic).
  static TokenShard open(const std::string& path, ShardFormat format = ShardFormat::Auto);

  ShardFormat format() const { return format_; }
  TokenDType dtype() const { return dtype_; }
  const std::string& path() const { return bin_.path(); }         // the token file
  const std::string& index_path() const { return idx_.path(); }   // Megatron .idx, else ""
  std::string name() const;  // path(), or PREFIX.{bin,idx} for Megatron, for messages
  std::int64_t num_tokens() const { return num_tokens_; }
  int llmc_version() const { return llmc_version_; }             // 0 for Megatron
  std::int64_t num_sequences() const { return num_sequences_; }  // 1 for llm.c
  std::int64_t num_documents() const { return num_documents_; }  // D - 1 for Megatron, 1 llm.c

  // Copies tokens [begin, begin + count) of the stream to `out` as int32. Throws UserError
  // (naming the shard and the position) for an id that is negative or does not fit int32.
  void read(std::int64_t begin, std::int64_t count, std::int32_t* out) const;
  std::vector<std::int32_t> read(std::int64_t begin, std::int64_t count) const;

  // Smallest and largest token id (reads the whole shard).
  TokenRange scan() const;
  // Throws UserError naming the shard, the position and the id of the first token outside
  // [0, vocab_size).
  void check_vocab(std::int64_t vocab_size) const;

 private:
  TokenShard() = default;
  static TokenShard open_llmc(const std::string& path);
  static TokenShard open_megatron(const std::string& prefix);
  // Raw tokens [begin, begin + count) that lie in one contiguous run of the .bin.
  template <class F> void for_each_run(std::int64_t begin, std::int64_t count, F&& f) const;

  ShardFormat format_ = ShardFormat::LlmC;
  TokenDType dtype_ = TokenDType::U16;
  MappedFile bin_, idx_;
  std::int64_t num_tokens_ = 0;
  int llmc_version_ = 0;
  std::int64_t num_sequences_ = 1, num_documents_ = 1;
  // Contiguous storage (llm.c, and Megatron files whose sequences follow each other, as
  // Megatron's builder writes them): token i of the stream is at base_ + i * itemsize.
  const std::uint8_t* base_ = nullptr;
  // Otherwise (Megatron with arbitrary pointers): stream offset where each sequence starts
  // (size S + 1) and each sequence's byte pointer.
  std::vector<std::int64_t> seq_begin_;
  std::vector<std::int64_t> seq_ptr_;
};

// ---- writers (used by `nsatron data prepare` and the tests) --------------------------------
// Each writes to PATH.tmp, fsyncs, and renames onto PATH, so a reader never sees a partial
// shard. Throws UserError when a token id does not fit the dtype or a write fails.

// llm.c: dtype U16 (magic 20240520, version 1) or U32 (magic 20240801, version 7).
void write_llmc_shard(const std::string& path, std::span<const std::int32_t> tokens,
                      TokenDType dtype = TokenDType::U16);

// Megatron: writes PREFIX.bin and PREFIX.idx. `sequence_lengths` split `tokens` into
// sequences (they must sum to tokens.size()); `document_indices` as in the .idx (starting
// at 0, ending at the number of sequences). Pointers are written contiguous from 0.
void write_megatron_shard(const std::string& prefix, std::span<const std::int32_t> tokens,
                          std::span<const std::int64_t> sequence_lengths,
                          std::span<const std::int64_t> document_indices,
                          TokenDType dtype = TokenDType::U16);

}  // namespace nsatron::data
