// FastDiv (nsa/cuda/fast_div.h): the GPU kernels' division by the heads per group, checked on
// the host against / and % (the device form differs only in how it takes the high product).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "nsa/cuda/fast_div.h"

using nsatron::nsa::cuda::FastDiv;

TEST(FastDiv, MatchesIntegerDivision) {
  std::mt19937_64 rng(20261126);
  std::uniform_int_distribution<int> any(0, INT32_MAX);
  for (int d : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 31, 32, 33, 40, 48, 64, 72, 100, 127, 128,
                136, 255, 1000, 65535, 1 << 20, 123456789, INT32_MAX}) {
    const FastDiv f(d);
    auto check = [&](int n) {
      int q = -1, r = -1;
      f.divmod(n, q, r);
      ASSERT_EQ(q, n / d) << "n " << n << " d " << d;
      ASSERT_EQ(r, n % d) << "n " << n << " d " << d;
    };
    for (int n = 0; n < 5000; ++n) check(n);
    for (int e = 0; e < 20000; ++e) check(any(rng));
    for (int k = 1; k < 2000; ++k) {  // around multiples of d, and the top of the range
      const std::int64_t m = std::int64_t(k) * d;
      for (std::int64_t n : {m - 1, m, m + 1, std::int64_t(INT32_MAX) - k})
        if (n >= 0 && n <= INT32_MAX) check(int(n));
    }
  }
}

TEST(FastDiv, RejectsANonPositiveDivisor) {
  EXPECT_THROW(FastDiv(0), std::invalid_argument);
  EXPECT_THROW(FastDiv(-3), std::invalid_argument);
}
