// Tokenizers that turn text into token ids. One so far:
//
//   bytes: vocabulary 256, token id = the value of one byte of the text (UTF-8 text becomes
//          its bytes, one token each). No special tokens: documents are simply concatenated.
//          Decoding any id sequence in [0, 256) gives back the exact bytes.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nsatron::data {

class Tokenizer {
 public:
  // By name ("bytes"); throws UserError for an unknown name, listing the known ones.
  static Tokenizer get(std::string_view name);

  const std::string& name() const { return name_; }
  std::int64_t vocab_size() const { return vocab_size_; }
  std::vector<std::int32_t> encode(std::string_view text) const;
  // Throws UserError for an id outside [0, vocab_size).
  std::string decode(std::span<const std::int32_t> ids) const;

 private:
  std::string name_;
  std::int64_t vocab_size_ = 0;
};

// Text made printable on one line: printable ASCII as is, \n \t \r \\ escaped, other bytes as
// \xNN. For previews.
std::string escape_text(std::string_view bytes);

}  // namespace nsatron::data
