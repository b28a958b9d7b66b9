// A 20-step training run on the GPU (bf16) tracks the CPU fp32 run of the same config.
#include <gtest/gtest.h>

#include <cmath>

#include "core/device/device.h"
#include "tests/train/train_fixture.h"

TEST_F(TrainRun, GpuBf16TracksCpuFp32LossCurve) {
  if (!nsatron::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string common = " --set train.steps=20 --set train.eval_every=0 --set optim.lr=3e-3";
  CommandResult cpu = run_nsatron("train " + config() + common + " --set checkpoint.dir=" + (dir_ / "cpu").string() +
                                  " --set log.metrics=" + (dir_ / "cpu.jsonl").string());
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  CommandResult gpu = run_nsatron("train " + config() + common + " --set train.device=cuda --set train.dtype=bf16" +
                                  " --set checkpoint.dir=" + (dir_ / "gpu").string() + " --set log.metrics=" +
                                  (dir_ / "gpu.jsonl").string());
  ASSERT_EQ(gpu.code, 0) << gpu.out << gpu.err;
  EXPECT_NE(gpu.out.find("nsa core     CUDA kernels"), std::string::npos) << gpu.out;
  const auto lc = field_values(read_file_text((dir_ / "cpu.jsonl").string()), "loss");
  const auto lg = field_values(read_file_text((dir_ / "gpu.jsonl").string()), "loss");
  ASSERT_EQ(lc.size(), 20u);
  ASSERT_EQ(lg.size(), 20u);
  for (std::size_t i = 0; i < lc.size(); ++i) {
    std::printf("step %2zu cpu %.5f gpu %.5f\n", i + 1, lc[i], lg[i]);
    EXPECT_NEAR(lg[i], lc[i], 3e-2 * lc[i]) << "step " << i + 1;
  }
  EXPECT_LT(lg.back(), lg.front() - 0.5);
}
