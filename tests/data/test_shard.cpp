// Shard readers: llm.c (v1 uint16, v7 uint32) and Megatron indexed datasets, written here
// from the documented layouts and read back exactly; every corruption detected and named.
#include <gtest/gtest.h>

#include <numeric>

#include "data/shard.h"
#include "test_util.h"

namespace nsatron::data {
namespace {

using test::expect_user_error;
using test::MegatronIndex;
using test::ScratchDir;

std::vector<std::int64_t> iota_tokens(std::int64_t n, std::int64_t mul, std::int64_t mod) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = (i * mul + 7) % mod;
  return v;
}

std::vector<std::int32_t> as_i32(const std::vector<std::int64_t>& v) {
  return std::vector<std::int32_t>(v.begin(), v.end());
}

// ---- llm.c -------------------------------------------------------------------------------

TEST(DataLlmcShard, ReadsVersion1Uint16Exactly) {
  ScratchDir dir;
  const auto toks = iota_tokens(1000, 37, 65536);
  test::write_file(dir / "a.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, toks));
  for (ShardFormat f : {ShardFormat::LlmC, ShardFormat::Auto}) {
    const TokenShard s = TokenShard::open(dir / "a.bin", f);
    EXPECT_EQ(s.format(), ShardFormat::LlmC);
    EXPECT_EQ(s.dtype(), TokenDType::U16);
    EXPECT_EQ(s.llmc_version(), 1);
    EXPECT_EQ(s.num_tokens(), 1000);
    EXPECT_EQ(s.read(0, 1000), as_i32(toks));
    EXPECT_EQ(s.read(333, 5), std::vector<std::int32_t>(toks.begin() + 333, toks.begin() + 338));
  }
}

TEST(DataLlmcShard, ReadsVersion7Uint32Exactly) {
  ScratchDir dir;
  std::vector<std::int64_t> toks = iota_tokens(777, 1000003, 200000);
  toks[5] = 2147483647;  // the largest id that fits int32
  test::write_file(dir / "b.bin", test::llmc_bytes<std::uint32_t>(20240801, 7, toks));
  const TokenShard s = TokenShard::open(dir / "b.bin");
  EXPECT_EQ(s.dtype(), TokenDType::U32);
  EXPECT_EQ(s.llmc_version(), 7);
  EXPECT_EQ(s.read(0, 777), as_i32(toks));
  const TokenRange r = s.scan();
  EXPECT_EQ(r.max, 2147483647);
}

TEST(DataLlmcShard, EmptyShardIsValid) {
  ScratchDir dir;
  test::write_file(dir / "e.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, {}));
  EXPECT_EQ(TokenShard::open(dir / "e.bin").num_tokens(), 0);
}

TEST(DataLlmcShard, TruncatedHeaderNamesFile) {
  ScratchDir dir;
  auto b = test::llmc_bytes<std::uint16_t>(20240520, 1, {1, 2, 3});
  b.resize(100);
  test::write_file(dir / "t.bin", b);
  expect_user_error([&] { TokenShard::open(dir / "t.bin", ShardFormat::LlmC); },
                    {dir / "t.bin", "truncated", "100 bytes"});
}

TEST(DataLlmcShard, TruncatedBodyNamesFile) {
  ScratchDir dir;
  auto b = test::llmc_bytes<std::uint16_t>(20240520, 1, iota_tokens(50, 1, 100));
  b.resize(b.size() - 3);
  test::write_file(dir / "t.bin", b);
  for (ShardFormat f : {ShardFormat::LlmC, ShardFormat::Auto})
    expect_user_error([&] { TokenShard::open(dir / "t.bin", f); },
                      {dir / "t.bin", "truncated", "declares 50 uint16 tokens"});
}

TEST(DataLlmcShard, CountBeyondFileSize) {
  ScratchDir dir;
  test::write_file(dir / "c.bin", test::llmc_bytes<std::uint32_t>(20240801, 7, {1, 2, 3}, 1 << 30));
  expect_user_error([&] { TokenShard::open(dir / "c.bin"); },
                    {dir / "c.bin", "truncated", "declares 1073741824 uint32 tokens"});
}

TEST(DataLlmcShard, TrailingBytesAreAnError) {
  ScratchDir dir;
  auto b = test::llmc_bytes<std::uint16_t>(20240520, 1, {1, 2, 3});
  b.push_back(0);
  test::write_file(dir / "x.bin", b);
  expect_user_error([&] { TokenShard::open(dir / "x.bin"); }, {dir / "x.bin", "size mismatch", "1 unexpected"});
}

TEST(DataLlmcShard, NegativeCount) {
  ScratchDir dir;
  test::write_file(dir / "n.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, {}, 0xffffffffll));
  expect_user_error([&] { TokenShard::open(dir / "n.bin"); }, {dir / "n.bin", "negative token count"});
}

TEST(DataLlmcShard, BadMagicNamesFile) {
  ScratchDir dir;
  test::write_file(dir / "m.bin", test::llmc_bytes<std::uint16_t>(12345, 1, {1, 2}));
  expect_user_error([&] { TokenShard::open(dir / "m.bin", ShardFormat::LlmC); },
                    {dir / "m.bin", "bad magic 12345"});
  // Auto: neither an llm.c magic nor a Megatron index beside it.
  expect_user_error([&] { TokenShard::open(dir / "m.bin"); },
                    {dir / "m.bin", "cannot tell the format", "12345"});
}

TEST(DataLlmcShard, BadVersionNamesFile) {
  ScratchDir dir;
  test::write_file(dir / "v1.bin", test::llmc_bytes<std::uint16_t>(20240520, 2, {1, 2}));
  expect_user_error([&] { TokenShard::open(dir / "v1.bin"); },
                    {dir / "v1.bin", "unsupported version 2"});
  test::write_file(dir / "v7.bin", test::llmc_bytes<std::uint32_t>(20240801, 1, {1, 2}));
  expect_user_error([&] { TokenShard::open(dir / "v7.bin"); },
                    {dir / "v7.bin", "unsupported version 1", "expected 7"});
}

TEST(DataLlmcShard, MissingFile) {
  ScratchDir dir;
  expect_user_error([&] { TokenShard::open(dir / "nope.bin"); }, {dir / "nope.bin", "not found"});
  expect_user_error([&] { TokenShard::open(dir / "nope.bin", ShardFormat::LlmC); },
                    {dir / "nope.bin", "cannot open"});
}

TEST(DataLlmcShard, VocabCheckNamesShardAndPosition) {
  ScratchDir dir;
  test::write_file(dir / "v.bin", test::llmc_bytes<std::uint16_t>(20240520, 1, {1, 2, 300, 4}));
  const TokenShard s = TokenShard::open(dir / "v.bin");
  EXPECT_NO_THROW(s.check_vocab(301));
  expect_user_error([&] { s.check_vocab(256); }, {dir / "v.bin", "token 2", "id 300", "[0, 256)"});
}

TEST(DataLlmcShard, UInt32IdsAboveInt32AreRefusedOnRead) {
  ScratchDir dir;
  test::write_file(dir / "big.bin", test::llmc_bytes<std::uint32_t>(20240801, 7, {1, 3000000000ll}));
  const TokenShard s = TokenShard::open(dir / "big.bin");
  EXPECT_EQ(s.read(0, 1), std::vector<std::int32_t>{1});
  expect_user_error([&] { s.read(0, 2); }, {dir / "big.bin", "token 1", "3000000000"});
}

TEST(DataLlmcShard, WriterRoundTrip) {
  ScratchDir dir;
  const auto toks = as_i32(iota_tokens(5000, 31, 50000));
  write_llmc_shard(dir / "w16.bin", toks, TokenDType::U16);
  write_llmc_shard(dir / "w32.bin", toks, TokenDType::U32);
  // Bytes exactly as the documented layout.
  const std::vector<std::int64_t> t64(toks.begin(), toks.end());
  EXPECT_EQ(test::read_file(dir / "w16.bin"), test::llmc_bytes<std::uint16_t>(20240520, 1, t64));
  EXPECT_EQ(test::read_file(dir / "w32.bin"), test::llmc_bytes<std::uint32_t>(20240801, 7, t64));
  EXPECT_EQ(TokenShard::open(dir / "w32.bin").read(0, 5000), toks);
  EXPECT_FALSE(file_exists(dir / "w16.bin.tmp"));
  expect_user_error([&] { write_llmc_shard(dir / "w.bin", std::vector<std::int32_t>{70000}); },
                    {"does not fit uint16"});
}

// ---- Megatron -----------------------------------------------------------------------------

template <class T> void megatron_roundtrip(std::uint8_t code, TokenDType dt, std::int64_t lo, std::int64_t hi) {
  ScratchDir dir;
  std::vector<std::vector<std::int64_t>> seqs = {{}, {}, {}};
  std::vector<std::int64_t> all;
  std::int64_t v = lo;
  const std::size_t lens[] = {5, 0, 17};
  for (std::size_t s = 0; s < 3; ++s)
    for (std::size_t i = 0; i < lens[s]; ++i) {
      seqs[s].push_back(v);
      all.push_back(v);
      v = v + 7 > hi ? lo : v + 7;
    }
  test::write_megatron<T>(dir / "ds", seqs, code);
  for (const std::string& p : {dir / "ds", dir / "ds.bin", dir / "ds.idx"}) {
    for (ShardFormat f : {ShardFormat::Megatron, ShardFormat::Auto}) {
      const TokenShard s = TokenShard::open(p, f);
      ASSERT_EQ(s.format(), ShardFormat::Megatron);
      EXPECT_EQ(s.dtype(), dt);
      EXPECT_EQ(s.num_tokens(), 22);
      EXPECT_EQ(s.num_sequences(), 3);
      EXPECT_EQ(s.num_documents(), 3);
      EXPECT_EQ(s.read(0, 22), as_i32(all));
      EXPECT_EQ(s.index_path(), dir / "ds.idx");
    }
  }
}

TEST(DataMegatronShard, ReadsEveryIntegerDtype) {
  megatron_roundtrip<std::uint8_t>(1, TokenDType::U8, 0, 255);
  megatron_roundtrip<std::int8_t>(2, TokenDType::I8, 0, 127);
  megatron_roundtrip<std::int16_t>(3, TokenDType::I16, 0, 32767);
  megatron_roundtrip<std::int32_t>(4, TokenDType::I32, 100000, 2000000000);
  megatron_roundtrip<std::int64_t>(5, TokenDType::I64, 100000, 2000000000);
  megatron_roundtrip<std::uint16_t>(8, TokenDType::U16, 60000, 65535);
}

TEST(DataMegatronShard, NonContiguousPointersFollowIndexOrder) {
  ScratchDir dir;
  // .bin holds [A A A][junk][B B][C C C C]; the index lists C, A, B.
  std::vector<std::uint8_t> bin;
  auto put16 = [&](std::uint16_t x) { test::put<std::uint16_t>(bin, x); };
  for (int x : {1, 2, 3}) put16(std::uint16_t(x));
  put16(999);
  for (int x : {4, 5}) put16(std::uint16_t(x));
  for (int x : {6, 7, 8, 9}) put16(std::uint16_t(x));
  test::write_file(dir / "nc.bin", bin);
  MegatronIndex idx;
  idx.lengths = {4, 3, 2};
  idx.pointers = {12, 0, 8};
  idx.doc_idx = {0, 2, 3};
  test::write_file(dir / "nc.idx", idx.bytes());
  const TokenShard s = TokenShard::open(dir / "nc");
  EXPECT_EQ(s.num_tokens(), 9);
  EXPECT_EQ(s.num_documents(), 2);
  EXPECT_EQ(s.read(0, 9), (std::vector<std::int32_t>{6, 7, 8, 9, 1, 2, 3, 4, 5}));
  EXPECT_EQ(s.read(3, 4), (std::vector<std::int32_t>{9, 1, 2, 3}));
  EXPECT_EQ(s.read(6, 3), (std::vector<std::int32_t>{3, 4, 5}));
  EXPECT_EQ(s.scan().max, 9);
}

TEST(DataMegatronShard, OptionalSequenceModesAccepted) {
  ScratchDir dir;
  test::write_megatron<std::uint16_t>(dir / "mm", {{1, 2}, {3}}, 8);
  auto b = test::read_file(dir / "mm.idx");
  b.push_back(0);
  b.push_back(0);  // one int8 mode per sequence
  test::write_file(dir / "mm.idx", b);
  EXPECT_EQ(TokenShard::open(dir / "mm").read(0, 3), (std::vector<std::int32_t>{1, 2, 3}));
}

struct Corrupt {
  const char* name;
  void (*mutate)(MegatronIndex&);
  std::vector<std::string> expect;
};

TEST(DataMegatronShard, CorruptIndexDetectedAndNamed) {
  const std::vector<Corrupt> cases = {
      {"bad magic", [](MegatronIndex& i) { i.magic = std::string("MMIDIDY\0\0", 9); }, {"bad magic"}},
      {"bad version", [](MegatronIndex& i) { i.version = 2; }, {"unsupported version 2"}},
      {"float dtype", [](MegatronIndex& i) { i.dtype_code = 7; }, {"dtype code 7", "floating point"}},
      {"unknown dtype", [](MegatronIndex& i) { i.dtype_code = 42; }, {"unknown dtype code 42"}},
      {"sequences beyond file", [](MegatronIndex& i) { i.declared_sequences = 1ll << 40; },
       {"declares 1099511627776 sequences"}},
      {"sequences beyond file (small)", [](MegatronIndex& i) { i.declared_sequences = 5; },
       {"truncated", "declares 5 sequences"}},
      {"documents beyond file", [](MegatronIndex& i) { i.declared_documents = 9; },
       {"truncated", "3 sequences and 9 document"}},
      {"too few declared", [](MegatronIndex& i) { i.declared_documents = 2; }, {"size mismatch"}},
      {"pointer out of range", [](MegatronIndex& i) { i.pointers[2] = 1000; },
       {"sequence 2", "byte pointer 1000", "outside the data file", ".bin"}},
      {"negative pointer", [](MegatronIndex& i) { i.pointers[0] = -2; }, {"sequence 0", "outside the data file"}},
      {"length past end", [](MegatronIndex& i) { i.lengths[2] = 9; }, {"sequence 2", "9 tokens", "outside"}},
      {"negative length", [](MegatronIndex& i) { i.lengths[1] = -1; }, {"sequence 1", "negative length"}},
      {"doc index decreasing", [](MegatronIndex& i) { i.doc_idx = {0, 2, 1, 3}; }, {"document index 2"}},
      {"doc index beyond", [](MegatronIndex& i) { i.doc_idx = {0, 1, 2, 4}; }, {"document index 3 is 4"}},
      {"doc index first", [](MegatronIndex& i) { i.doc_idx = {1, 1, 2, 3}; }, {"first document index is 1"}},
      {"doc index last", [](MegatronIndex& i) { i.doc_idx = {0, 1, 2, 2}; }, {"last document index is 2"}},
  };
  for (const Corrupt& c : cases) {
    SCOPED_TRACE(c.name);
    ScratchDir dir;
    test::write_megatron<std::uint16_t>(dir / "ds", {{1, 2}, {3, 4, 5}, {6, 7, 8}}, 8);
    MegatronIndex idx;
    idx.lengths = {2, 3, 3};
    idx.pointers = {0, 4, 10};
    idx.doc_idx = {0, 1, 2, 3};
    ASSERT_EQ(idx.bytes(), test::read_file(dir / "ds.idx"));  // the test writer agrees
    c.mutate(idx);
    test::write_file(dir / "ds.idx", idx.bytes());
    std::vector<std::string> want = c.expect;
    want.push_back(dir / "ds");  // the dataset's files are named
    for (ShardFormat f : {ShardFormat::Megatron, ShardFormat::Auto})
      expect_user_error([&] { TokenShard::open(dir / "ds.bin", f); }, want);
  }
}

TEST(DataMegatronShard, TruncatedIndexAndData) {
  ScratchDir dir;
  test::write_megatron<std::uint16_t>(dir / "ds", {{1, 2}, {3, 4, 5}}, 8);
  auto idx = test::read_file(dir / "ds.idx");
  // Cut inside the header, then inside the arrays.
  for (std::size_t cut : {std::size_t(0), std::size_t(5), std::size_t(20), idx.size() - 1}) {
    SCOPED_TRACE(cut);
    test::write_file(dir / "ds.idx", std::vector<std::uint8_t>(idx.begin(), idx.begin() + long(cut)));
    expect_user_error([&] { TokenShard::open(dir / "ds", ShardFormat::Megatron); },
                      {dir / "ds.idx", cut < 9 ? "truncated" : ""});
  }
  test::write_file(dir / "ds.idx", idx);
  auto bin = test::read_file(dir / "ds.bin");
  bin.resize(bin.size() - 2);
  test::write_file(dir / "ds.bin", bin);
  expect_user_error([&] { TokenShard::open(dir / "ds"); },
                    {dir / "ds.idx", "sequence 1", "outside the data file", dir / "ds.bin", "8 bytes"});
}

TEST(DataMegatronShard, MissingFiles) {
  ScratchDir dir;
  test::write_megatron<std::uint16_t>(dir / "ds", {{1}}, 8);
  std::filesystem::remove(dir / "ds.bin");
  expect_user_error([&] { TokenShard::open(dir / "ds.idx"); }, {dir / "ds.bin", "not found"});
  expect_user_error([&] { TokenShard::open(dir / "zz", ShardFormat::Megatron); }, {dir / "zz.idx", "not found"});
}

TEST(DataMegatronShard, NegativeIdsRefused) {
  ScratchDir dir;
  test::write_megatron<std::int16_t>(dir / "neg", {{5, -3}}, 3);
  const TokenShard s = TokenShard::open(dir / "neg");
  expect_user_error([&] { s.read(0, 2); }, {dir / "neg", "token 1", "id -3"});
  expect_user_error([&] { s.check_vocab(100); }, {"token 1", "id -3"});
}

TEST(DataMegatronShard, WriterMatchesDocumentedLayout) {
  ScratchDir dir;
  const std::vector<std::int32_t> toks = {10, 11, 12, 13, 14, 15};
  const std::vector<std::int64_t> lens = {1, 3, 2}, docs = {0, 2, 3};
  write_megatron_shard(dir / "w", toks, lens, docs, TokenDType::I32);
  MegatronIndex idx;
  idx.dtype_code = 4;
  idx.lengths = {1, 3, 2};
  idx.pointers = {0, 4, 16};
  idx.doc_idx = {0, 2, 3};
  EXPECT_EQ(test::read_file(dir / "w.idx"), idx.bytes());
  const TokenShard s = TokenShard::open(dir / "w.bin");
  EXPECT_EQ(s.read(0, 6), toks);
  EXPECT_EQ(s.num_documents(), 2);
  expect_user_error([&] { write_megatron_shard(dir / "u", toks, lens, docs, TokenDType::U32); },
                    {"no dtype code for uint32"});
  expect_user_error([&] { write_megatron_shard(dir / "u", toks, std::vector<std::int64_t>{1}, docs); },
                    {"sum to 1"});
}

TEST(DataShardFormat, Parse) {
  EXPECT_EQ(parse_shard_format("llmc"), ShardFormat::LlmC);
  EXPECT_EQ(parse_shard_format("megatron"), ShardFormat::Megatron);
  EXPECT_EQ(parse_shard_format("auto"), ShardFormat::Auto);
  expect_user_error([] { parse_shard_format("numpy", "data.format"); }, {"data.format", "numpy"});
}

}  // namespace
}  // namespace nsatron::data
