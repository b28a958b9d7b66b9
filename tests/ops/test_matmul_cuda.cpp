// cuBLAS matmul against the CPU matmul on the same random inputs: every transpose
// combination, fp32/fp64/bf16, awkward shapes, beta accumulation. Skips without a GPU.
#include <cmath>
#include <cstdio>

#include "core/device/device.h"
#include "tests/ops/matmul_test_util.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

TEST(MatmulCuda, MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << cuda_device_summary();
  const std::uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const auto& c : test::kGemmCases)
          for (double beta : {0.0, 1.0}) {
            const Shape as = ta ? Shape{c.K, c.M} : Shape{c.M, c.K};
            const Shape bs = tb ? Shape{c.N, c.K} : Shape{c.K, c.N};
            Tensor a = rng.randn(as, dt), b = rng.randn(bs, dt), c0 = rng.randn({c.M, c.N}, dt);
            const MatmulOptions opt{.trans_a = ta, .trans_b = tb, .alpha = 0.5, .beta = beta};
            Tensor c_cpu = c0.clone();
            matmul(a, b, c_cpu, opt);
            Tensor ad = a.to(Device::CUDA), bd = b.to(Device::CUDA), cd = c0.to(Device::CUDA);
            matmul(ad, bd, cd, opt);
            const auto got = cd.to_vector(), want = c_cpu.to_vector();
            std::vector<double> ref, scale;
            test::naive_gemm(ta, tb, c.M, c.N, c.K, 0.5, a.to_vector(), b.to_vector(), beta,
                             c0.to_vector(), ref, scale);
            int bad = 0;
            for (std::size_t i = 0; i < got.size(); ++i) {
              // Both differ from the exact value by at most the summation error plus one
              // rounding of the stored result; so they differ from each other by twice that.
              const double bound = 2.0 * (2.0 * double(c.K + 2) * test::accumulate_eps(dt) * scale[i] +
                                          test::storage_eps(dt) * std::fabs(ref[i])) + 1e-300;
              if (!(std::fabs(got[i] - want[i]) <= bound) && bad++ < 3)
                ADD_FAILURE() << dtype_name(dt) << " ta=" << ta << " tb=" << tb << " M=" << c.M
                              << " N=" << c.N << " K=" << c.K << " beta=" << beta << " [" << i
                              << "]: cuda " << got[i] << " vs cpu " << want[i];
            }
          }
}

}  // namespace
}  // namespace nsatron
