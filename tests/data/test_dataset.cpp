// TokenDataset: glob expansion (sorted, errors naming the glob), concatenation across shards
// and formats, vocab checks at open.
#include <gtest/gtest.h>

#include "data/dataset.h"
#include "test_util.h"

namespace nsatron::data {
namespace {

using test::expect_user_error;
using test::ScratchDir;

std::vector<std::int64_t> range(std::int64_t a, std::int64_t b) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

TEST(DataTokenDataset, GlobsSortedAndConcatenated) {
  ScratchDir dir;
  // Written out of order; the glob sorts them: s_0 (0..9), s_1 (10..29), s_2 (30..34).
  test::write_file(dir / "s_2.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(30, 35)));
  test::write_file(dir / "s_0.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 10)));
  test::write_file(dir / "s_1.bin", test::llmc_bytes<std::uint32_t>(20240801, 7, range(10, 30)));
  const auto ds = TokenDataset::open({dir / "s_*.bin"});
  ASSERT_EQ(ds->num_shards(), 3u);
  EXPECT_EQ(ds->shard(0).path(), dir / "s_0.bin");
  EXPECT_EQ(ds->shard(2).path(), dir / "s_2.bin");
  EXPECT_EQ(ds->num_tokens(), 35);
  std::vector<std::int32_t> all(35);
  ds->read(0, 35, all.data());
  for (int i = 0; i < 35; ++i) EXPECT_EQ(all[std::size_t(i)], i);
  std::vector<std::int32_t> cross(25);
  ds->read(5, 25, cross.data());  // spans all three shards
  for (int i = 0; i < 25; ++i) EXPECT_EQ(cross[std::size_t(i)], 5 + i);
  EXPECT_NE(ds->describe().find("s_1.bin  llmc v7 uint32  20 tokens"), std::string::npos) << ds->describe();
}

TEST(DataTokenDataset, GlobsKeepTheirOrderAndMixFormats) {
  ScratchDir dir;
  test::write_file(dir / "a.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(100, 104)));
  test::write_megatron<std::int32_t>(dir / "m", {{1, 2}, {3}}, 4);
  // The second glob matches m.bin and m.idx: one Megatron shard.
  const auto ds = TokenDataset::open({dir / "m*", dir / "a.bin"});
  ASSERT_EQ(ds->num_shards(), 2u);
  EXPECT_EQ(ds->shard(0).format(), ShardFormat::Megatron);
  std::vector<std::int32_t> all(7);
  ds->read(0, 7, all.data());
  EXPECT_EQ(all, (std::vector<std::int32_t>{1, 2, 3, 100, 101, 102, 103}));
  // A Megatron prefix without extension works as a plain path.
  EXPECT_EQ(TokenDataset::open({dir / "m"})->num_tokens(), 3);
}

TEST(DataTokenDataset, EmptyShardsInTheMiddle) {
  ScratchDir dir;
  test::write_file(dir / "x0.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 3)));
  test::write_file(dir / "x1.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, {}));
  test::write_file(dir / "x2.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(3, 6)));
  const auto ds = TokenDataset::open({dir / "x*.bin"});
  std::vector<std::int32_t> all(4);
  ds->read(2, 4, all.data());
  EXPECT_EQ(all, (std::vector<std::int32_t>{2, 3, 4, 5}));
}

TEST(DataTokenDataset, GlobMatchingNothingIsNamed) {
  ScratchDir dir;
  test::write_file(dir / "a.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 4)));
  expect_user_error([&] { TokenDataset::open({dir / "a.bin", dir / "train_*.bin"}, {}, "data.train"); },
                    {"data.train", "the glob '" + dir / "train_*.bin" + "' matches no file"});
  expect_user_error([&] { TokenDataset::open({dir / "b.bin"}, {}, "data.val"); },
                    {"data.val", dir / "b.bin", "not found"});
  expect_user_error([&] { TokenDataset::open({}, {}, "data.train"); }, {"data.train", "no shard"});
}

TEST(DataTokenDataset, CorruptShardNamedThroughDataset) {
  ScratchDir dir;
  test::write_file(dir / "s_0.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 10)));
  auto bad = test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 10));
  bad.resize(bad.size() - 1);
  test::write_file(dir / "s_1.bin", bad);
  expect_user_error([&] { TokenDataset::open({dir / "s_*.bin"}); }, {dir / "s_1.bin", "truncated"});
}

TEST(DataTokenDataset, VocabCheckedAtOpen) {
  ScratchDir dir;
  test::write_file(dir / "s_0.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 10)));
  test::write_file(dir / "s_1.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, {1, 2, 256}));
  DatasetOptions opt;
  opt.vocab_size = 256;
  expect_user_error([&] { TokenDataset::open({dir / "s_*.bin"}, opt); },
                    {dir / "s_1.bin", "token 2", "id 256", "[0, 256)"});
  opt.vocab_size = 257;
  EXPECT_EQ(TokenDataset::open({dir / "s_*.bin"}, opt)->num_tokens(), 13);
}

TEST(DataTokenDataset, EmptyDatasetIsAnError) {
  ScratchDir dir;
  test::write_file(dir / "e.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, {}));
  expect_user_error([&] { TokenDataset::open({dir / "e.bin"}, {}, "data.train"); }, {"data.train", "no tokens"});
}

TEST(DataTokenDataset, FingerprintFollowsLayoutNotPath) {
  ScratchDir a, b;
  for (const ScratchDir* d : {&a, &b}) {
    test::write_file(*d / "s_0.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 10)));
    test::write_file(*d / "s_1.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 20)));
  }
  EXPECT_EQ(TokenDataset::open({a / "*.bin"})->fingerprint(), TokenDataset::open({b / "*.bin"})->fingerprint());
  test::write_file(b / "s_1.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 5)));
  test::write_file(b / "s_0.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, range(0, 25)));
  const auto d2 = TokenDataset::open({b / "*.bin"});
  EXPECT_EQ(d2->num_tokens(), 30);
  EXPECT_NE(TokenDataset::open({a / "*.bin"})->fingerprint(), d2->fingerprint());
}

}  // namespace
}  // namespace nsatron::data
