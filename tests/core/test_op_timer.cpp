// op_timer: off records nothing; on, a model step reports its op families.
#include <gtest/gtest.h>

#include <map>

#include "core/model/model.h"
#include "core/util/op_timer.h"
#include "tests/model/model_test_util.h"

using namespace nsatron;

TEST(OpTimer, OffRecordsNothingOnReportsTheFamiliesOfAStep) {
  NsaTransformer model(test::tiny_dims(), DType::F32);
  model.params().initialize(3);
  test::Batch b = test::random_batch(11, 2, 13, 4);
  op_timer::reset();
  model.forward_backward(b.tokens, b.targets, b.B, b.T);
  EXPECT_TRUE(op_timer::totals_ms().empty());

  op_timer::enable(true);
  model.forward_backward(b.tokens, b.targets, b.B, b.T);
  op_timer::enable(false);
  std::map<std::string, double> got;
  for (const auto& [family, ms] : op_timer::totals_ms()) got[family] = ms;
  for (const char* family : {"matmul", "rmsnorm", "swiglu", "nsa core forward", "nsa core backward", "embedding",
                             "cross entropy", "split/gather projection"}) {
    ASSERT_TRUE(got.count(family)) << family;
    EXPECT_GE(got[family], 0.0) << family;
  }
  // The residual adds run inside the norms (add_rmsnorm): a whole-model step has none of its own.
  EXPECT_FALSE(got.count("residual add"));
  op_timer::reset();
  EXPECT_TRUE(op_timer::totals_ms().empty());
}

// split_lines: a line per family in the given order, then the rest of the step outside them.
TEST(OpTimer, SplitLinesAddTheTimeOutsideTheScopes) {
  const std::vector<std::string> lines = op_timer::split_lines({{"matmul", 3.0}, {"swiglu", 1.0}}, 10.0);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("matmul", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("3.0 ms"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("30.0%"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[2].rfind("(outside the scopes)", 0), 0u) << lines[2];
  EXPECT_NE(lines[2].find("6.0 ms"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("60.0%"), std::string::npos) << lines[2];
}

// hidden_lines: per group with busy time, the compute stream's time in that group's families
// ("dp all-reduce" and "dp all-gather" both count for dp; "tp" does not take "tpx ..."), and
// the fraction hidden, never below zero.
TEST(OpTimer, HiddenLinesSetTheWaitsAgainstTheBusyTime) {
  const std::vector<std::string> lines = op_timer::hidden_lines(
      {{"dp", 40.0}, {"pp", 10.0}, {"tp", 100.0}},
      {{"matmul", 300.0}, {"tp all-reduce", 25.0}, {"dp all-reduce", 8.0}, {"dp all-gather", 2.0},
       {"tpx other", 5.0}, {"pp transfer", 12.0}});
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "dp communication: 40.0 ms busy on the GPU, 10.0 ms waited for by the compute stream "
                      "(dp all-reduce, dp all-gather): 75% hidden");
  EXPECT_EQ(lines[1], "pp communication: 10.0 ms busy on the GPU, 12.0 ms waited for by the compute stream "
                      "(pp transfer): 0% hidden");
  EXPECT_EQ(lines[2], "tp communication: 100.0 ms busy on the GPU, 25.0 ms waited for by the compute stream "
                      "(tp all-reduce): 75% hidden");
  EXPECT_EQ(op_timer::hidden_lines({{"tp", 5.0}}, {{"matmul", 1.0}})[0],
            "tp communication: 5.0 ms busy on the GPU, 0.0 ms waited for by the compute stream (no scope): 100% "
            "hidden");
  // Without CUDA work (CPU ranks) there is no busy time and no line.
  EXPECT_TRUE(op_timer::hidden_lines({}, {{"tp all-reduce", 3.0}}).empty());
}

// compute_ms leaves out the communication groups' families (a family named like a group
// without the space, "embedding", is compute); ranks_line names the fastest and slowest rank.
TEST(OpTimer, RanksComputeLeavesOutTheCommunication) {
  const std::vector<std::pair<std::string, double>> totals = {
      {"matmul", 5.0},   {"tp all-reduce", 2.0}, {"embedding", 0.5}, {"embedding all-reduce", 1.0},
      {"pp wait", 3.0},  {"dp all-gather", 0.25}, {"rmsnorm", 1.5}};
  EXPECT_EQ(op_timer::compute_ms(totals), 7.0);
  EXPECT_EQ(op_timer::ranks_line({100.0}), "");
  const std::string line = op_timer::ranks_line({101.0, 100.0, 102.0});
  EXPECT_NE(line.find("fastest rank 1 100.0 ms"), std::string::npos) << line;
  EXPECT_NE(line.find("slowest rank 2 102.0 ms (+2.0%)"), std::string::npos) << line;
}
