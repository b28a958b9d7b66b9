// CRC-32: the check value of the catalogue, the slicing-by-8 path against the bytewise
// definition, chaining.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/crc32.h"
#include "core/model/rng.h"

using nsatron::checkpoint::crc32;
using nsatron::checkpoint::crc32_bytewise;

TEST(Crc32, CheckValues) {
  EXPECT_EQ(crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(crc32_bytewise("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32(""), 0u);
  EXPECT_EQ(crc32("a"), 0xE8B7BE43u);  // zlib.crc32(b"a")
  EXPECT_EQ(crc32("The quick brown fox jumps over the lazy dog"), 0x414FA339u);
}

TEST(Crc32, FastPathMatchesDefinitionAtEveryLengthAndAlignment) {
  nsatron::SplitMix64 rng(99);
  std::vector<unsigned char> buf(300);
  for (auto& b : buf) b = static_cast<unsigned char>(rng.next());
  for (std::size_t start = 0; start < 9; ++start)
    for (std::size_t len = 0; start + len <= buf.size(); len += 1 + len / 8)
      ASSERT_EQ(crc32(buf.data() + start, len), crc32_bytewise(buf.data() + start, len)) << start << " " << len;
}

TEST(Crc32, ChainsAndSeesEveryBit) {
  const std::string a = "nsatron checkpoint ", b = "datasets";
  EXPECT_EQ(crc32(b, crc32(a)), crc32(a + b));
  std::string s(1000, 'x');
  const auto base = crc32(s);
  for (std::size_t i = 0; i < s.size(); i += 37)
    for (int bit = 0; bit < 8; ++bit) {
      std::string t = s;
      t[i] = char(t[i] ^ (1 << bit));
      ASSERT_NE(crc32(t), base) << i << " " << bit;
    }
}
