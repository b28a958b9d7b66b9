// Copies between host and device, the asynchronous host-to-device copy of the token ids among
// them (label gpu; skips without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

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

// copy_to_device_async: the source may be reused as soon as the call returns, whatever the
// device is still doing; more copies than the staging ring has slots, of growing sizes (the
// slots grow), each landing with its own bytes.
TEST(TensorCuda, CopyToDeviceAsyncTakesTheBytesAtTheCall) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<Tensor> dst;
  std::vector<std::vector<double>> want;
  std::vector<float> src;
  for (int k = 0; k < 21; ++k) {
    const std::int64_t n = 1 + 997 * k;
    src.assign(std::size_t(n), 0.f);
    for (std::int64_t i = 0; i < n; ++i) src[std::size_t(i)] = float(k * 100000 + i);
    dst.push_back(Tensor::empty({n}, DType::F32, Device::CUDA));
    copy_to_device_async(dst.back().raw(), src.data(), src.size() * sizeof(float));
    want.emplace_back(src.begin(), src.end());
    std::fill(src.begin(), src.end(), -1.f);  // the caller's buffer changes at once
  }
  for (std::size_t k = 0; k < dst.size(); ++k) EXPECT_EQ(dst[k].to_vector(), want[k]) << "copy " << k;
}
