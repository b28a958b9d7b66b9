// op_timer: off records nothing; on, a model step reports its op families.
#include <gtest/gtest.h>

#include <algorithm>
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

// by_step_family lays totals out on the fixed family list ("other" for the unlisted);
// ranks_line compares ranks by compute (every family but the communication groups': a family
// named like a group without the space, "embedding", is compute) and names the slowest's excess.
TEST(OpTimer, RanksLineComparesTheRanksCompute) {
  const std::vector<std::string>& families = op_timer::step_families();
  auto at = [&](const std::vector<double>& laid, const std::string& family) {
    return laid[std::size_t(std::find(families.begin(), families.end(), family) - families.begin())];
  };
  const std::vector<double> a = op_timer::by_step_family(
      {{"matmul", 5.0}, {"tp all-reduce", 2.0}, {"embedding", 0.5}, {"embedding all-reduce", 1.0},
       {"pp transfer", 3.0}, {"dp all-gather", 0.25}, {"rmsnorm", 1.5}, {"a new family", 0.125}});
  ASSERT_EQ(a.size(), families.size());
  EXPECT_EQ(at(a, "matmul"), 5.0);
  EXPECT_EQ(at(a, "other"), 0.125);
  EXPECT_EQ(at(a, "swiglu"), 0.0);
  const std::vector<double> b = op_timer::by_step_family(
      {{"matmul", 6.0}, {"tp all-reduce", 0.5}, {"embedding", 0.5}, {"rmsnorm", 1.75}, {"swiglu", 1.0}});
  EXPECT_EQ(op_timer::ranks_line({a}), "");
  // Compute: a 5 + 0.5 + 1.5 + 0.125 = 7.125, b 6 + 0.5 + 1.75 + 1 = 9.25 (+29.8%).
  const std::string line = op_timer::ranks_line({b, a});
  EXPECT_NE(line.find("fastest rank 1 7.1 ms, slowest rank 0 9.2 ms (+29.8%)"), std::string::npos) << line;
  EXPECT_NE(line.find("the slowest's excess: matmul +1.0 ms, swiglu +1.0 ms, rmsnorm +0.2 ms"), std::string::npos)
      << line;
}

// Every family a model step times is on the fixed list (none falls into "other").
TEST(OpTimer, AModelStepsFamiliesAreListed) {
  NsaTransformer model(test::tiny_dims(), DType::F32);
  model.params().initialize(3);
  test::Batch b = test::random_batch(11, 2, 13, 4);
  op_timer::reset();
  op_timer::enable(true);
  model.forward_backward(b.tokens, b.targets, b.B, b.T);
  op_timer::enable(false);
  const std::vector<std::string>& families = op_timer::step_families();
  for (const auto& [family, ms] : op_timer::totals_ms())
    EXPECT_NE(std::find(families.begin(), families.end() - 1, family), families.end() - 1) << family;
  op_timer::reset();
}
