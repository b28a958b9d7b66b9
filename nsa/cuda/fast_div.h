// Division by a divisor fixed for a whole kernel launch, as a multiply-high, an add and a shift
// (a 32-bit integer division on the GPU is a ~20-instruction sequence through the reciprocal
// unit; the row and key kernels divided their row indices by the heads per group once per
// staged row, several percent of their instructions, docs/performance.md).
//
// For a divisor d >= 1 let s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1 (< 2^32, since
// 2^s - d < d). Then for every 0 <= n < 2^31, n / d = (mulhi(n, m) + n) >> s (Granlund and
// Montgomery, "Division by invariant integers using multiplication", 1994, section 4: the
// error of m / 2^32 against 2^s / d - 1 is below 2^-32 n-relative, too small to move the
// floor; the sum stays below 2^32 for n < 2^31). Plain C++ on the host (the launcher builds
// it, tests/nsa/test_fast_div.cpp checks it against / and %), __umulhi on the device.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "core/util/host_device.h"

namespace nsatron::nsa::cuda {

struct FastDiv {
  int d = 1;
  std::uint32_t mul = 1;
  int shift = 0;

  FastDiv() = default;
  explicit FastDiv(int divisor) : d(divisor) {
    if (divisor < 1) throw std::invalid_argument("FastDiv: the divisor must be at least 1");
    while ((std::int64_t(1) << shift) < divisor) ++shift;
    mul = std::uint32_t(((std::uint64_t(1) << 32) * ((std::uint64_t(1) << shift) - std::uint64_t(divisor))) /
                        std::uint64_t(divisor)) + 1u;
  }
  // n / d for 0 <= n < 2^31.
  NSATRON_HD int div(int n) const {
    const std::uint32_t u = std::uint32_t(n);
#ifdef __CUDA_ARCH__
    const std::uint32_t hi = __umulhi(u, mul);
#else
    const std::uint32_t hi = std::uint32_t((std::uint64_t(u) * mul) >> 32);
#endif
    return int((hi + u) >> shift);
  }
  // n / d and n % d.
  NSATRON_HD void divmod(int n, int& q, int& r) const {
    q = div(n);
    r = n - q * d;
  }
};

}  // namespace nsatron::nsa::cuda
