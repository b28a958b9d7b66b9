// `nsatron train` end to end on a small prepared text: the loss falls, the metrics file has
// one record per step, validation runs, bad data and diverging runs fail clearly.
#include <gtest/gtest.h>

#include "tests/train/train_fixture.h"

// With `settings` on top of the tiny config; the log's attention lines must contain
// `attention_says` and `implementation_says`.
void expect_loss_falls_and_every_step_recorded(const fs::path& dir_, const std::string& config,
                                               const std::string& settings, const std::string& attention_says,
                                               const std::string& implementation_says) {
  CommandResult r = run_nsatron("train " + config + settings);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // Start-up report: resolved config, parameter count, FLOPs, implementations.
  EXPECT_NE(r.out.find("# resolved config"), std::string::npos);
  EXPECT_NE(r.out.find("parameters"), std::string::npos);
  EXPECT_NE(r.out.find("flops/token"), std::string::npos);
  EXPECT_NE(r.out.find(attention_says), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(implementation_says), std::string::npos) << r.out;
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

TEST_F(TrainRun, LossFallsAndEveryStepIsRecorded) {
  expect_loss_falls_and_every_step_recorded(dir_, config(), "", "attention    nsa (model.attention): cmp 8/4, sel 8 x 3, window 16",
                                            "nsa core     CPU reference");
}

TEST_F(TrainRun, DenseAttentionLossFallsAndEveryStepIsRecorded) {
  expect_loss_falls_and_every_step_recorded(dir_, config(), " --set model.attention=dense", "attention    dense (model.attention)",
                                            "attention    dense: CPU reference forward/backward (nsa/dense.h");
}

TEST_F(TrainRun, SameConfigGivesSameLosses) {
  CommandResult a = run_nsatron("train " + config() + " --set train.steps=6 --set checkpoint.dir=" + (dir_ / "a").string());
  ASSERT_EQ(a.code, 0) << a.err;
  std::vector<double> la = field_values(read_file_text((dir_ / "metrics.jsonl").string()), "loss");
  CommandResult b = run_nsatron("train " + config() + " --set train.steps=6 --set checkpoint.dir=" + (dir_ / "b").string());
  ASSERT_EQ(b.code, 0) << b.err;
  std::vector<double> lb = field_values(read_file_text((dir_ / "metrics.jsonl").string()), "loss");
  EXPECT_EQ(la, lb);
}

// log.profile_step: the step's op families on rank 0, with the time outside them; only that step.
TEST_F(TrainRun, ProfileStepPrintsTheOpFamilies) {
  CommandResult r = run_nsatron("train " + config() + " --set train.steps=4 --set log.profile_step=3");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# step 3: time per op family on rank 0 (log.profile_step)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("# step 2: time per op family"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("# step 4: time per op family"), std::string::npos) << r.out;
  for (const char* family : {"nsa core forward", "nsa core backward", "matmul", "(outside the scopes)"})
    EXPECT_NE(r.out.find(std::string("#   ") + family), std::string::npos) << family << "\n" << r.out;
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
