// A 20-step training run on the GPU (bf16) tracks the CPU fp32 run of the same config, with
// NSA attention and with dense attention.
#include <gtest/gtest.h>

#include <cmath>

#include "core/device/device.h"
#include "tests/train/train_fixture.h"

namespace {

// `settings` on top of the tiny config; the GPU run's log must contain `log_says`.
void expect_gpu_tracks_cpu(const fs::path& dir_, const std::string& config, const std::string& settings,
                           const std::string& log_says) {
  const std::string common = " --set train.steps=20 --set train.eval_every=0 --set optim.lr=3e-3" + settings;
  CommandResult cpu = run_nsatron("train " + config + common + " --set checkpoint.dir=" + (dir_ / "cpu").string() +
                                  " --set log.metrics=" + (dir_ / "cpu.jsonl").string());
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  CommandResult gpu = run_nsatron("train " + config + common + " --set train.device=cuda --set train.dtype=bf16" +
                                  " --set checkpoint.dir=" + (dir_ / "gpu").string() + " --set log.metrics=" +
                                  (dir_ / "gpu.jsonl").string());
  ASSERT_EQ(gpu.code, 0) << gpu.out << gpu.err;
  EXPECT_NE(gpu.out.find(log_says), std::string::npos) << gpu.out;
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

}  // namespace

TEST_F(TrainRun, GpuBf16TracksCpuFp32LossCurve) {
  if (!nsatron::cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_gpu_tracks_cpu(dir_, config(), "", "nsa core     CUDA kernels");
}

TEST_F(TrainRun, GpuBf16TracksCpuFp32LossCurveDense) {
  if (!nsatron::cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_gpu_tracks_cpu(dir_, config(), " --set model.attention=dense",
                        "attention    dense: flash-style CUDA kernels (nsa/cuda/dense.h)");
}
