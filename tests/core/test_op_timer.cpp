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
