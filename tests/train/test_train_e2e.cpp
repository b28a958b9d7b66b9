// `nsatron train` end to end on a small prepared text: the loss falls, the metrics file has
// one record per step, validation runs, bad data and diverging runs fail clearly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "tests/cli/run_command.h"

namespace fs = std::filesystem;

namespace {

// A working directory with a prepared corpus and a tiny config.
class TrainRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("train_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
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
        << "\"\n[log]\nevery = 10\nmetrics = \"" << (dir_ / "metrics.jsonl").string() << "\"\n";
  }
  std::string config() const { return (dir_ / "tiny.toml").string(); }
  fs::path dir_;
};

std::vector<double> field_values(const std::string& jsonl, const std::string& field) {
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

}  // namespace

TEST_F(TrainRun, LossFallsAndEveryStepIsRecorded) {
  CommandResult r = run_nsatron("train " + config());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // Start-up report: resolved config, parameter count, FLOPs, implementations.
  EXPECT_NE(r.out.find("# resolved config"), std::string::npos);
  EXPECT_NE(r.out.find("parameters"), std::string::npos);
  EXPECT_NE(r.out.find("flops/token"), std::string::npos);
  EXPECT_NE(r.out.find("nsa core"), std::string::npos);
  EXPECT_NE(r.out.find("step     40/40 | loss"), std::string::npos) << r.out;
  std::string metrics = read_file_text((dir_ / "metrics.jsonl").string());
  std::vector<double> losses = field_values(metrics, "loss");
  std::vector<double> val = field_values(metrics, "val_loss");
  ASSERT_EQ(losses.size(), 40u);
  ASSERT_EQ(val.size(), 3u);  // before training, steps 20 and 40
  EXPECT_LT(losses.back(), losses.front() - 1.0) << "training loss did not fall";
  EXPECT_LT(val[2], val[0] - 1.0) << "validation loss did not fall";
  EXPECT_LT(val[2], 3.0) << "validation loss should fall below the byte unigram entropy";
  for (const char* f : {"lr", "grad_norm", "tokens_per_s", "ms_per_step", "peak_mem_bytes"})
    EXPECT_EQ(field_values(metrics, f).size(), 40u) << f;
}

TEST_F(TrainRun, SameConfigGivesSameLosses) {
  CommandResult a = run_nsatron("train " + config() + " --set train.steps=6");
  ASSERT_EQ(a.code, 0) << a.err;
  std::vector<double> la = field_values(read_file_text((dir_ / "metrics.jsonl").string()), "loss");
  CommandResult b = run_nsatron("train " + config() + " --set train.steps=6");
  ASSERT_EQ(b.code, 0) << b.err;
  std::vector<double> lb = field_values(read_file_text((dir_ / "metrics.jsonl").string()), "loss");
  EXPECT_EQ(la, lb);
}

TEST_F(TrainRun, MissingDataIsNamed) {
  CommandResult r = run_nsatron("train " + config() + " --set data.train=/nonexistent/*.bin");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("data.train"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/*.bin"), std::string::npos) << r.err;
}

TEST_F(TrainRun, DivergingRunSkipsNonFiniteStepsThenStops) {
  // An absurd learning rate blows the weights up after the first update: every later step
  // has a non-finite loss, is skipped, and max_bad_steps in a row stop the run.
  CommandResult r = run_nsatron("train " + config() + " --set optim.lr=1e30 --set optim.min_lr=1e30"
                                " --set optim.grad_clip=0.0 --set train.max_bad_steps=3");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("3 steps in a row had a non-finite loss or gradient norm"), std::string::npos) << r.err;
}
