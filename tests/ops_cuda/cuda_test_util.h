// Helpers for the CUDA-vs-CPU op tests: fresh seeds, bf16 rounding of inputs, device copies of
// id arrays, and the error bound the tests use.
//
// Bound: |cuda - cpu| <= rtol * (|cpu| + rms(cpu)) per element, rms over the whole output.
// The rms term lets elements that cancel to near zero (dx of a norm, a softmax gradient away
// from the target) be judged on the output's scale rather than their own; where a whole
// output cancels (RMSNorm's dx at width 1) the test passes the cancelling terms' magnitude.
//   fp32: rtol = 1e-5, the CPU computing in fp64 and rounding once, CUDA in fp32.
//   bf16: rtol = 1e-2, against the CPU in fp32 on the same bf16-rounded inputs (the CUDA
//         output itself is rounded to bf16: 2^-9 relative, plus intermediates such as the
//         residual sum that the bf16 path stores in bf16).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/tensor/tensor.h"
#include "tests/ops/op_test_util.h"

namespace nsatron::test {

constexpr double kRtolF32 = 1e-5;
constexpr double kRtolBF16 = 1e-2;
inline double rtol_for(DType t) { return t == DType::BF16 ? kRtolBF16 : kRtolF32; }

#define NSATRON_SKIP_WITHOUT_GPU() \
  if (!::nsatron::cuda_available()) GTEST_SKIP() << ::nsatron::cuda_device_summary()

// A fresh seed, printed and attached to failures; OPS_CUDA_SEED=<n> reproduces a printed one.
inline std::uint64_t fresh_seed() { return seed_from_env("OPS_CUDA_SEED", "CUDA op test"); }

// A CPU fp32 tensor holding `t` rounded to dtype `dt` (t itself for fp32).
inline Tensor rounded_f32(const Tensor& t, DType dt) {
  return t.to_dtype(dt).to_dtype(DType::F32);
}
// The device copy of `t` (CPU) in dtype `dt`.
inline Tensor on_gpu(const Tensor& t, DType dt) { return t.to_dtype(dt).to(Device::CUDA); }

inline double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return v.empty() ? 0.0 : std::sqrt(s / double(v.size()));
}

// terms (optional): per element, the magnitude of the terms that cancel in it (e.g. both
// terms of dx = rstd (g - xhat mean(g xhat)) of a norm of width 1, whose true value is ~eps);
// rounding errors scale with those, not with the result.
inline void expect_close_rms(const std::vector<double>& got, const std::vector<double>& want,
                             double rtol, const std::string& what,
                             const std::vector<double>* terms = nullptr) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (terms) {
    ASSERT_EQ(terms->size(), want.size()) << what;
  }
  const double r = rms(want);
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = rtol * (std::fabs(want[i]) + r + (terms ? (*terms)[i] : 0.0));
    const double d = std::fabs(got[i] - want[i]);
    if (!(d <= bound) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << got[i] << " vs cpu " << want[i]
                    << " (|diff| " << d << " > " << bound << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements out of bound";
}
inline void expect_close_rms(const Tensor& got, const Tensor& want, double rtol,
                             const std::string& what,
                             const std::vector<double>* terms = nullptr) {
  expect_close_rms(got.to_vector(), want.to_vector(), rtol, what, terms);
}

// Same bytes (copies both to the host first).
inline bool same_bits_any(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return same_bits(ha, hb);
}

// An int32 array in device memory.
struct DeviceIds {
  std::int32_t* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceIds(const std::vector<std::int32_t>& host) : n(host.size()) {
    if (n == 0) return;
    ptr = static_cast<std::int32_t*>(cuda_alloc(n * sizeof(std::int32_t)));
    memcpy_any(ptr, host.data(), n * sizeof(std::int32_t), CopyKind::HostToDevice);
  }
  ~DeviceIds() { cuda_free(ptr); }
  DeviceIds(const DeviceIds&) = delete;
  DeviceIds& operator=(const DeviceIds&) = delete;
  std::span<const std::int32_t> span() const { return {ptr, n}; }
};

inline std::string dt_name(DType t) { return std::string(dtype_name(t)); }

}  // namespace nsatron::test
