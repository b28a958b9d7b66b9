// A working directory with a small prepared corpus and a tiny NSA config, for tests that run
// the nsatron executable end to end.
#pragma once
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/cli/run_command.h"

namespace fs = std::filesystem;

namespace train_test {

// A working directory with a prepared corpus and a tiny config.
class TrainRun : public ::testing::Test {
 protected:
  void SetUp() override {
    // A directory of its own (mkdtemp): two suites running side by side on one machine must
    // not share it (one removed the other's config mid-test). Removed when the test passes,
    // kept (and named) when it fails. (From branch i14.)
    std::string tmpl = (fs::temp_directory_path() /
                        ("nsatron_train_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                         "_XXXXXX"))
                           .string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << tmpl;
    dir_ = tmpl;
    std::ofstream text(dir_ / "corpus.txt");
    const char* lines[] = {"the cat sat on the mat. ", "a dog ran in the park. ", "the sun is warm today. ",
                           "we read a book at night. "};
    for (int i = 0; i < 3000; ++i) text << lines[(i * 7 + i / 3) % 4];
    text.close();
    CommandResult prep = run_nsatron("data prepare --input " + (dir_ / "corpus.txt").string() + " --output " +
                                     (dir_ / "data").string() + " --tokenizer bytes --val-fraction 0.1");
    ASSERT_EQ(prep.code, 0) << prep.err;
    std::ofstream cfg(dir_ / "tiny.toml");
    cfg << "[model]\nvocab_size = 256\nd_model = 32\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nhead_dim = 8\n"
           "ffn_hidden = 64\n[nsa]\ncmp_block = 8\ncmp_stride = 4\nsel_block = 8\nsel_count = 3\nwindow = 16\n"
           "[train]\nseq_len = 64\nmicro_batch = 4\nglobal_batch = 8\nsteps = 40\neval_every = 20\neval_batches = 2\n"
           "[optim]\nlr = 1e-2\nmin_lr = 1e-3\nwarmup_steps = 5\n"
           "[data]\ntrain = \"" << (dir_ / "data/train_*.bin").string() << "\"\nval = \"" << (dir_ / "data/val_*.bin").string()
        << "\"\n[log]\nevery = 10\nmetrics = \"" << (dir_ / "metrics.jsonl").string() << "\"\n"
        << "[checkpoint]\ndir = \"" << (dir_ / "ckpt").string() << "\"\n";
  }
  void TearDown() override {
    if (HasFailure()) {
      std::printf("kept %s for inspection\n", dir_.c_str());
      return;
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string config() const { return (dir_ / "tiny.toml").string(); }
  std::string metrics_text() const { return read_file_text((dir_ / "metrics.jsonl").string()); }
  fs::path dir_;
};

inline std::vector<double> field_values(const std::string& jsonl, const std::string& field) {
  std::vector<double> out;
  std::regex re("\"" + field + "\": ([-0-9.e+]+)");
  std::istringstream in(jsonl);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) out.push_back(std::stod(m[1]));
  }
  return out;
}

}  // namespace train_test

using train_test::TrainRun;
using train_test::field_values;
