// The learning-rate schedule: warmup, then cosine / linear / constant decay to min_lr.
#include <gtest/gtest.h>

#include <cmath>

#include "core/optim/schedule.h"

using namespace nsatron;

namespace {
OptimConfig optim(const char* decay) {
  OptimConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 10;
  o.decay = decay;
  return o;
}
}  // namespace

TEST(Schedule, LinearWarmupFromZero) {
  OptimConfig o = optim("cosine");
  EXPECT_DOUBLE_EQ(learning_rate(o, 110, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(o, 110, 4), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(o, 110, 9), 1.0);
}

TEST(Schedule, CosineEndsAtMinLr) {
  OptimConfig o = optim("cosine");
  EXPECT_DOUBLE_EQ(learning_rate(o, 110, 10), 1.0);                 // p = 0
  EXPECT_NEAR(learning_rate(o, 110, 60), 0.55, 1e-12);              // p = 1/2: halfway
  EXPECT_NEAR(learning_rate(o, 110, 109), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.99)), 1e-12);
  for (int s = 10; s < 109; ++s) EXPECT_GE(learning_rate(o, 110, s), learning_rate(o, 110, s + 1));
}

TEST(Schedule, LinearAndConstant) {
  EXPECT_NEAR(learning_rate(optim("linear"), 110, 60), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(optim("linear"), 110, 35), 1.0 - 0.9 * 0.25, 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(optim("constant"), 110, 100), 1.0);
}

TEST(Schedule, NoWarmup) {
  OptimConfig o = optim("linear");
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(o, 10, 0), 1.0);
  EXPECT_NEAR(learning_rate(o, 10, 5), 0.55, 1e-12);
}
