// Copies between host and device (label gpu; skips without a GPU).
#include <gtest/gtest.h>

#include "core/device/device.h"
#include "core/tensor/tensor.h"

using namespace nsatron;

TEST(TensorCuda, RoundTripEveryDType) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    Tensor h = Tensor::from_vector({1, -2, 3.5, 4, 5, 6, 7}, {7}, dt);
    Tensor d = h.to(Device::CUDA);
    EXPECT_EQ(d.device(), Device::CUDA);
    Tensor d2 = d.clone();  // device to device
    EXPECT_EQ(d2.to(Device::CPU).to_vector(), h.to_vector());
    d2.zero_();
    for (double v : d2.to_vector()) EXPECT_EQ(v, 0.0);
  }
}
