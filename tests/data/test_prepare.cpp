// `nsatron data prepare` / `inspect`: the bytes written, the split, shard sizes, errors, and
// the command line (in process and through the built executable).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>

#include "data/data_command.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace nsatron::data {
namespace {

using test::expect_user_error;
using test::ScratchDir;

std::string make_text(int lines, const std::string& tag) {
  std::string t;
  for (int i = 0; i < lines; ++i) t += tag + " line " + std::to_string(i) + ": caf\xc3\xa9 \xe2\x9c\x93\n";
  return t;
}

std::vector<std::int32_t> read_all(const std::vector<std::string>& globs, ShardFormat f = ShardFormat::Auto) {
  DatasetOptions o;
  o.format = f;
  o.vocab_size = 256;
  const auto ds = TokenDataset::open(globs, o);
  std::vector<std::int32_t> out(std::size_t(ds->num_tokens()));
  ds->read(0, ds->num_tokens(), out.data());
  return out;
}

std::vector<std::int32_t> bytes_of(const std::string& s) { return Tokenizer::get("bytes").encode(s); }

TEST(DataTokenizer, BytesRoundTrip) {
  const Tokenizer t = Tokenizer::get("bytes");
  EXPECT_EQ(t.vocab_size(), 256);
  const std::string s = std::string("a\0\xff\xc3\xa9", 5);
  const auto ids = t.encode(s);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{97, 0, 255, 195, 169}));
  EXPECT_EQ(t.decode(ids), s);
  expect_user_error([&] { t.decode(std::vector<std::int32_t>{256}); }, {"256", "vocabulary"});
  expect_user_error([] { Tokenizer::get("gpt2"); }, {"unknown tokenizer 'gpt2'", "bytes"});
  EXPECT_EQ(escape_text(std::string("a\n\t\\\x01", 5)), "a\\n\\t\\\\\\x01");
}

TEST(DataPrepare, LlmcBytesAndSplit) {
  ScratchDir dir;
  const std::string a = make_text(40, "alpha"), b = make_text(25, "beta");
  test::write_text(dir / "a.txt", a);
  test::write_text(dir / "b.txt", b);
  PrepareOptions o;
  o.inputs = {dir / "a.txt", dir / "b.txt"};
  o.output_dir = dir / "out";
  o.val_fraction = 0.2;
  o.shard_tokens = 500;
  const PrepareResult r = prepare_text(o);
  const std::string text = a + b;
  const std::int64_t N = std::int64_t(text.size());
  const std::int64_t n_val = std::llround(0.2 * double(N));
  EXPECT_EQ(r.input_bytes, N);
  EXPECT_EQ(r.val_tokens, n_val);
  EXPECT_EQ(r.train_tokens, N - n_val);
  // Train: the first N - n_val bytes, in shards of 500; val: the last n_val bytes.
  EXPECT_EQ(read_all({o.output_dir + "/train_*.bin"}), bytes_of(text.substr(0, std::size_t(N - n_val))));
  EXPECT_EQ(read_all({o.output_dir + "/val_*.bin"}), bytes_of(text.substr(std::size_t(N - n_val))));
  std::int64_t n_train_shards = (N - n_val + 499) / 500, n_val_shards = (n_val + 499) / 500;
  ASSERT_EQ(std::int64_t(r.shards.size()), n_train_shards + n_val_shards);
  EXPECT_EQ(r.shards[0].path, o.output_dir + "/train_000000.bin");
  EXPECT_EQ(r.shards[0].tokens, 500);
  EXPECT_EQ(r.shards[std::size_t(n_train_shards)].path, o.output_dir + "/val_000000.bin");
  // The first shard's bytes: the llm.c v1 header, then uint16 tokens.
  std::vector<std::int64_t> first;
  for (int i = 0; i < 500; ++i) first.push_back(std::uint8_t(text[std::size_t(i)]));
  EXPECT_EQ(test::read_file(o.output_dir + "/train_000000.bin"), test::llmc_bytes<std::uint16_t>(20240520, 1, first));
}

TEST(DataPrepare, MegatronDocumentsFollowFiles) {
  ScratchDir dir;
  const std::string a = make_text(10, "alpha"), b = make_text(10, "beta");
  test::write_text(dir / "a.txt", a);
  test::write_text(dir / "b.txt", b);
  PrepareOptions o;
  o.inputs = {dir / "a.txt", dir / "b.txt"};
  o.output_dir = dir / "meg";
  o.val_fraction = 0.1;
  o.format = ShardFormat::Megatron;
  const PrepareResult r = prepare_text(o);
  const std::string text = a + b;
  const std::int64_t n_val = std::llround(0.1 * double(text.size()));
  EXPECT_EQ(read_all({o.output_dir + "/train_*"}, ShardFormat::Megatron),
            bytes_of(text.substr(0, text.size() - std::size_t(n_val))));
  EXPECT_EQ(read_all({o.output_dir + "/val_*.bin"}), bytes_of(text.substr(text.size() - std::size_t(n_val))));
  const TokenShard t = TokenShard::open(o.output_dir + "/train_000000.bin");
  EXPECT_EQ(t.format(), ShardFormat::Megatron);
  EXPECT_EQ(t.num_sequences(), 2);  // a.txt, then the training part of b.txt
  EXPECT_EQ(t.num_documents(), 2);
  EXPECT_EQ(TokenShard::open(o.output_dir + "/val_000000.idx").num_sequences(), 1);
  EXPECT_EQ(r.shards.size(), 2u);
}

TEST(DataPrepare, NoValidationSplit) {
  ScratchDir dir;
  test::write_text(dir / "a.txt", "abc");
  PrepareOptions o;
  o.inputs = {dir / "a.txt"};
  o.output_dir = dir / "o";
  o.val_fraction = 0;
  const PrepareResult r = prepare_text(o);
  ASSERT_EQ(r.shards.size(), 1u);
  EXPECT_EQ(r.shards[0].split, "train");
  EXPECT_FALSE(file_exists(dir / "o/val_000000.bin"));
}

TEST(DataPrepare, Errors) {
  ScratchDir dir;
  test::write_text(dir / "a.txt", "some text");
  test::write_text(dir / "empty.txt", "");
  PrepareOptions o;
  o.inputs = {dir / "a.txt"};
  o.output_dir = dir / "o";
  auto with = [&](auto f) {
    PrepareOptions c = o;
    f(c);
    return c;
  };
  expect_user_error([&] { prepare_text(with([](auto& c) { c.val_fraction = 1.0; })); }, {"--val-fraction", "[0, 1)"});
  expect_user_error([&] { prepare_text(with([](auto& c) { c.val_fraction = -0.1; })); }, {"--val-fraction"});
  expect_user_error([&] { prepare_text(with([](auto& c) { c.val_fraction = 0.01; })); }, {"leaves no validation tokens"});
  expect_user_error([&] { prepare_text(with([](auto& c) { c.val_fraction = 0.99; })); }, {"leaves no training tokens"});
  expect_user_error([&] { prepare_text(with([&](auto& c) { c.inputs = {dir / "nope.txt"}; })); },
                    {dir / "nope.txt", "not found"});
  expect_user_error([&] { prepare_text(with([&](auto& c) { c.inputs = {dir.path()}; })); }, {"is not a file"});
  expect_user_error([&] { prepare_text(with([&](auto& c) { c.inputs = {dir / "empty.txt"}; })); }, {"empty"});
  expect_user_error([&] { prepare_text(with([](auto& c) { c.shard_tokens = 0; })); }, {"--shard-tokens"});
  expect_user_error([&] { prepare_text(with([](auto& c) { c.tokenizer = "sentencepiece"; })); }, {"unknown tokenizer"});
  expect_user_error([&] { prepare_text(with([&](auto& c) { c.output_dir = dir / "a.txt/sub"; })); },
                    {"cannot create the output directory"});
}

TEST(DataPrepare, ExistingShardsNeedForce) {
  ScratchDir dir;
  test::write_text(dir / "a.txt", std::string(1000, 'x'));
  PrepareOptions o;
  o.inputs = {dir / "a.txt"};
  o.output_dir = dir / "o";
  o.val_fraction = 0.5;
  o.shard_tokens = 100;  // 5 train shards
  prepare_text(o);
  EXPECT_TRUE(file_exists(dir / "o/train_000004.bin"));
  expect_user_error([&] { prepare_text(o); }, {"already holds shards", "--force"});
  o.force = true;
  o.shard_tokens = 1000;
  const PrepareResult r = prepare_text(o);
  EXPECT_EQ(r.shards.size(), 2u);
  EXPECT_FALSE(file_exists(dir / "o/train_000004.bin"));  // stale shards removed, not mixed in
  EXPECT_EQ(read_all({dir / "o/train_*.bin"}).size(), 500u);
}

// ---- the command line ------------------------------------------------------------------

int run_data(const std::vector<std::string>& args, std::string* out = nullptr) {
  testing::internal::CaptureStdout();
  int rc = -1;
  try {
    rc = data_main(args);
  } catch (...) {
    testing::internal::GetCapturedStdout();
    throw;
  }
  const std::string s = testing::internal::GetCapturedStdout();
  if (out) *out = s;
  return rc;
}

TEST(DataCommand, PrepareAndInspect) {
  ScratchDir dir;
  const std::string text = make_text(30, "gamma");
  test::write_text(dir / "g.txt", text);
  std::string out;
  ASSERT_EQ(run_data({"prepare", "--input", dir / "g.txt", "--output", dir / "o", "--tokenizer", "bytes",
                      "--val-fraction", "0.25", "--shard-tokens=400"},
                     &out),
            0);
  EXPECT_NE(out.find(dir / "o/train_000000.bin"), std::string::npos) << out;
  EXPECT_NE(out.find(dir / "o/val_000000.bin"), std::string::npos) << out;
  EXPECT_NE(out.find("tokenizer bytes (vocab 256)"), std::string::npos) << out;
  EXPECT_EQ(read_all({dir / "o/val_*.bin"}), bytes_of(text.substr(text.size() - std::size_t(std::llround(0.25 * double(text.size()))))));

  ASSERT_EQ(run_data({"inspect", dir / "o/train_*.bin", "--preview", "12"}, &out), 0);
  EXPECT_NE(out.find("format     llmc (magic 20240520, version 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("dtype      uint16"), std::string::npos) << out;
  EXPECT_NE(out.find("tokens     400"), std::string::npos) << out;
  EXPECT_NE(out.find("preview    \"gamma line 0\" ..."), std::string::npos) << out;
  EXPECT_NE(out.find("shards,"), std::string::npos) << out;

  ASSERT_EQ(run_data({"prepare", "--input", dir / "g.txt", "--output", dir / "m", "--format", "megatron",
                      "--val-fraction", "0.1"},
                     &out),
            0);
  ASSERT_EQ(run_data({"inspect", dir / "m/val_000000", "--tokenizer", "none", "--preview", "3"}, &out), 0);
  EXPECT_NE(out.find("megatron indexed dataset (version 1, dtype code 8)"), std::string::npos) << out;
  EXPECT_NE(out.find("sequences  1 in 1 documents"), std::string::npos) << out;
  EXPECT_NE(out.find("preview    ["), std::string::npos) << out;
}

TEST(DataCommand, HelpAndBadArguments) {
  std::string out;
  EXPECT_EQ(run_data({"--help"}, &out), 0);
  EXPECT_NE(out.find("prepare"), std::string::npos);
  EXPECT_EQ(run_data({"prepare", "--help"}, &out), 0);
  EXPECT_NE(out.find("--val-fraction"), std::string::npos);
  EXPECT_EQ(run_data({"inspect", "-h"}, &out), 0);
  EXPECT_NE(out.find("--preview"), std::string::npos);

  ScratchDir dir;
  test::write_text(dir / "a.txt", "hello");
  const std::string in = dir / "a.txt", o = dir / "o";
  expect_user_error([] { run_data({}); }, {"expected a command"});
  expect_user_error([] { run_data({"frobnicate"}); }, {"unknown command 'frobnicate'"});
  expect_user_error([&] { run_data({"prepare", "--output", o}); }, {"--input FILE... is required"});
  expect_user_error([&] { run_data({"prepare", "--input", in}); }, {"--output DIR is required"});
  expect_user_error([&] { run_data({"prepare", "--input", "--output", o}); }, {"--input expects one or more"});
  expect_user_error([&] { run_data({"prepare", "--input", in, "--output"}); }, {"--output expects a value"});
  expect_user_error([&] { run_data({"prepare", "--input", in, "--output", o, "--val-fraction", "abc"}); },
                    {"--val-fraction expects a number, got 'abc'"});
  expect_user_error([&] { run_data({"prepare", "--input", in, "--output", o, "--shard-tokens", "1e3"}); },
                    {"--shard-tokens expects an integer"});
  expect_user_error([&] { run_data({"prepare", "--input", in, "--output", o, "--format", "auto"}); },
                    {"llmc or megatron"});
  expect_user_error([&] { run_data({"prepare", "--input", in, "--output", o, "--format", "parquet"}); },
                    {"unknown shard format 'parquet'"});
  expect_user_error([&] { run_data({"prepare", "--input", in, "--output", o, "--bogus"}); },
                    {"unknown option '--bogus'"});
  expect_user_error([&] { run_data({"inspect"}); }, {"no shard given"});
  expect_user_error([&] { run_data({"inspect", dir / "*.bin"}); }, {"matches no file"});
  // Library errors reach the command line without a doubled "data: " prefix.
  try {
    run_data({"inspect", in});
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cannot tell the format", 0), 0u) << e.what();
  }
}

TEST(DataCommand, ExecutableExitCodes) {
  ScratchDir dir;
  test::write_text(dir / "a.txt", make_text(20, "delta"));
  const std::string exe = NSATRON_BINARY;
  auto run = [&](const std::string& args) {
    const int st = std::system((exe + " data " + args + " >" + dir / "log.txt" + " 2>&1").c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  EXPECT_EQ(run("prepare --input " + dir / "a.txt" + " --output " + dir / "o --val-fraction 0.1"), 0);
  EXPECT_TRUE(file_exists(dir / "o/train_000000.bin"));
  EXPECT_EQ(run("inspect " + dir / "o/val_000000.bin"), 0);
  EXPECT_EQ(run("prepare --input " + dir / "missing.txt" + " --output " + dir / "o2"), 2);
  const auto log = test::read_file(dir / "log.txt");
  const std::string msg(log.begin(), log.end());
  EXPECT_NE(msg.find("nsatron data: prepare: input '" + dir / "missing.txt" + "' not found"), std::string::npos) << msg;
}

}  // namespace
}  // namespace nsatron::data
