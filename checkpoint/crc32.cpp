#include "checkpoint/crc32.h"

#include <array>
#include <cstring>

namespace nsatron::checkpoint {

namespace {

constexpr std::uint32_t kPoly = 0xEDB88320u;  // x^32 + x^26 + ... + 1, bit-reversed

// tables[0][b]: the CRC register after shifting byte b through it (the classic table).
// tables[k][b]: the same for byte b followed by k zero bytes, so eight table look-ups
// advance the register by eight input bytes at once.
struct Tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  Tables() {
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t r = b;
      for (int bit = 0; bit < 8; ++bit) r = (r & 1u) ? (r >> 1) ^ kPoly : r >> 1;
      t[0][b] = r;
    }
    for (std::size_t k = 1; k < 8; ++k)
      for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
};

const Tables& tables() {
  static const Tables tabs;
  return tabs;
}

inline std::uint32_t load_le32(const unsigned char* p) {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}

}  // namespace

std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto& t = tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t r = ~crc;
  while (bytes >= 8) {
    const std::uint32_t lo = r ^ load_le32(p);
    const std::uint32_t hi = load_le32(p + 4);
    r = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
    p += 8;
    bytes -= 8;
  }
  while (bytes--) r = (r >> 8) ^ t[0][(r ^ *p++) & 0xFFu];
  return ~r;
}

std::uint32_t crc32_bytewise(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t r = ~crc;
  for (std::size_t i = 0; i < bytes; ++i) {
    r ^= p[i];
    for (int bit = 0; bit < 8; ++bit) r = (r & 1u) ? (r >> 1) ^ kPoly : r >> 1;
  }
  return ~r;
}

}  // namespace nsatron::checkpoint
