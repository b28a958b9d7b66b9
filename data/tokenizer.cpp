#include "data/tokenizer.h"

#include "core/util/error.h"

namespace nsatron::data {

Tokenizer Tokenizer::get(std::string_view name) {
  if (name == "bytes") {
    Tokenizer t;
    t.name_ = "bytes";
    t.vocab_size_ = 256;
    return t;
  }
  throw UserError(detail::concat("data: unknown tokenizer '", name, "' (known: bytes)"));
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = std::int32_t(std::uint8_t(text[i]));
  return ids;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out(ids.size(), '\0');
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_)
      throw UserError(detail::concat("data: token id ", ids[i], " is outside the ", name_,
                                     " tokenizer's vocabulary [0, ", vocab_size_, ")"));
    out[i] = char(std::uint8_t(ids[i]));
  }
  return out;
}

std::string escape_text(std::string_view bytes) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (char ch : bytes) {
    const auto c = std::uint8_t(ch);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '\\') out += "\\\\";
    else if (c >= 0x20 && c < 0x7f) out += char(c);
    else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace nsatron::data
