#include <gtest/gtest.h>

#include "core/device/device.h"
#include "core/tensor/tensor.h"

using namespace nsatron;

TEST(Tensor, ShapeAndBytes) {
  Tensor t = Tensor::zeros({2, 3, 4}, DType::F32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(t.describe(), "fp32[2, 3, 4] cpu");
  for (double v : t.to_vector()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw()) % 64, 0u);
}

TEST(Tensor, TypedAccessChecksDType) {
  Tensor t = Tensor::empty({3}, DType::F64);
  EXPECT_NO_THROW(t.data<double>());
  EXPECT_THROW(t.data<float>(), std::invalid_argument);
}

TEST(Tensor, ViewAndSliceShareStorage) {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {3, 2}, DType::F32);
  Tensor v = t.view({6});
  v.data<float>()[5] = 50.f;
  EXPECT_EQ(t.to_vector()[5], 50.0);
  Tensor s = t.slice0(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.to_vector(), (std::vector<double>{2, 3, 4, 50}));
  EXPECT_THROW(t.view({4}), std::invalid_argument);
  EXPECT_THROW(t.slice0(2, 4), std::out_of_range);
}

TEST(Tensor, CloneIsDeep) {
  Tensor t = Tensor::from_vector({1, 2}, {2}, DType::F64);
  Tensor c = t.clone();
  c.data<double>()[0] = 9;
  EXPECT_EQ(t.to_vector()[0], 1.0);
}

TEST(Tensor, DTypeConversionAndBf16Rounding) {
  Tensor t = Tensor::from_vector({1.0, -2.5, 3.14159265, 1e-3}, {4}, DType::F64);
  Tensor b = t.to_dtype(DType::BF16);
  auto v = b.to_vector();
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[1], -2.5);
  EXPECT_NEAR(v[2], 3.14159265, 3.14159265 / 256);  // 8 significant bits
  EXPECT_EQ(v[2], 3.140625);                          // round to nearest
  EXPECT_NEAR(v[3], 1e-3, 1e-3 / 256);
  // Ties round to even: 1 + 2^-8 is half-way between 1 and 1 + 2^-7.
  EXPECT_EQ(float(bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(float(bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
}

TEST(Tensor, CudaWithoutDeviceIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; covered by test_tensor_cuda";
  EXPECT_THROW(Tensor::empty({4}, DType::F32, Device::CUDA), std::runtime_error);
}
