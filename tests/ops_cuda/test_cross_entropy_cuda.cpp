// CUDA cross entropy against the CPU: forward (loss, lse), backward, fused; vocabularies of
// 1, odd sizes, 50257, 50304 and 65536; ignored targets, a custom ignore index, a given
// denominator, loss accumulation, every target ignored (D = 0); fp32 and bf16 logits (loss
// and lse fp32).
// On the GPU the fused and unfused paths give the same bits, the backward in place too (the
// fused pass stages its row in shared memory where it fits: on Hopper's 227 KB 50304 in
// either dtype and 65536 in bf16; the 65536 fp32 row (256 KB) is beyond any device's block
// and takes the uncached path, the odd widths the element-by-element one); the fused loss
// does not depend on what an earlier call left in the scratch.
#include "core/ops/cross_entropy.h"
#include "tests/ops_cuda/cuda_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

struct Case {
  Shape logits;
  std::int32_t ignore_index;
  double denominator;
  bool accumulate;
};
const Case kCases[] = {{{1, 1}, -100, 0, false},    {{1, 5}, -100, 0, false},
                       {{7, 50304}, -100, 0, false}, {{3, 50257}, -100, 0, true},
                       {{5, 33}, 3, 0, false},       {{64, 1000}, -100, 517.0, false},
                       {{2, 3, 77}, -100, 0, true},  {{9, 4099}, -100, 0, false},
                       {{3, 65536}, -100, 0, false}};

std::vector<std::int32_t> targets_for(Rng& rng, std::int64_t N, std::int64_t V,
                                      std::int32_t ignore) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(N));
  for (auto& x : t) x = rng.uniform(0, 1) < 0.2 ? ignore : std::int32_t(rng.integer(0, V - 1));
  if (N > 1) t[1] = ignore;
  t[0] = std::int32_t(V - 1);  // at least one counted target, at the row's end
  return t;
}

TEST(CrossEntropyCuda, MatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const double dloss = 1.3;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : kCases) {
      const std::string tag = test::dt_name(dt) + " " + shape_str(c.logits);
      const std::int64_t V = c.logits.back(), N = shape_numel(c.logits) / V;
      const CrossEntropyOptions opt{c.ignore_index, c.denominator, c.accumulate};
      const auto targets = targets_for(rng, N, V, c.ignore_index);
      test::DeviceIds ids(targets);
      Tensor z = rng.randn(c.logits, DType::F32, 2.0);
      if (N > 2) {  // a row of large logits: the softmax must subtract its max
        float* p = z.data<float>() + 2 * V;
        for (std::int64_t v = 0; v < V; ++v) p[v] += 80.f;
      }
      Tensor zr = test::rounded_f32(z, dt);
      Tensor loss = Tensor::from_vector({0.25}, {1}, DType::F32);
      Tensor lse = Tensor::empty({N}, DType::F32);
      cross_entropy_forward(zr, targets, loss, lse, opt);
      Tensor dz = Tensor::empty(c.logits, DType::F32);
      cross_entropy_backward(zr, targets, lse, dloss, dz, opt);

      Tensor zd = test::on_gpu(z, dt);
      Tensor lossd = Tensor::from_vector({0.25}, {1}, DType::F32).to(Device::CUDA);
      Tensor lsed = Tensor::empty({N}, DType::F32, Device::CUDA);
      cross_entropy_forward(zd, ids.span(), lossd, lsed, opt);
      test::expect_close_rms(lossd, loss, test::kRtolF32, "loss " + tag);
      test::expect_close_rms(lsed, lse, test::kRtolF32, "lse " + tag);
      Tensor dzd = Tensor::empty(c.logits, dt, Device::CUDA);
      cross_entropy_backward(zd, ids.span(), lsed, dloss, dzd, opt);
      test::expect_close_rms(dzd, dz, test::rtol_for(dt), "dlogits " + tag);

      // In place, and fused: the same bits as the unfused GPU path.
      Tensor inplace = zd.clone();
      cross_entropy_backward(inplace, ids.span(), lsed, dloss, inplace, opt);
      EXPECT_TRUE(test::same_bits_any(inplace, dzd)) << "in-place backward bits " << tag;
      Tensor fused = zd.clone();
      Tensor lossf = Tensor::from_vector({0.25}, {1}, DType::F32).to(Device::CUDA);
      cross_entropy_fused(fused, ids.span(), lossf, dloss, opt);
      EXPECT_TRUE(test::same_bits_any(lossf, lossd)) << "fused loss bits " << tag;
      EXPECT_TRUE(test::same_bits_any(fused, dzd)) << "fused dlogits bits " << tag;
    }
  cuda::check_id_errors();  // nothing recorded
}

// The fused pass writes a zero row loss for an ignored row into its scratch too: a forward
// over the same rows with every target counted leaves non-zero row losses there first.
TEST(CrossEntropyCuda, FusedIgnoredRowsAfterOtherCalls) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::int64_t N = 37, V = 50;
  Tensor z = rng.randn({N, V}, DType::F32, 3.0);
  std::vector<std::int32_t> all(static_cast<std::size_t>(N)), some;
  for (auto& x : all) x = std::int32_t(rng.integer(0, V - 1));
  some = all;
  for (std::size_t n = 1; n < some.size(); n += 3) some[n] = -100;
  test::DeviceIds ids_all(all), ids_some(some);
  Tensor zd = z.to(Device::CUDA);
  Tensor loss = Tensor::zeros({1}, DType::F32, Device::CUDA), lse = Tensor::empty({N}, DType::F32, Device::CUDA);
  cross_entropy_forward(zd, ids_all.span(), loss, lse);  // row losses of every row in the scratch
  Tensor fused = zd.clone(), lossf = Tensor::zeros({1}, DType::F32, Device::CUDA);
  cross_entropy_fused(fused, ids_some.span(), lossf, 1.0);
  Tensor want = Tensor::empty({1}, DType::F32), zc = z.clone();
  cross_entropy_fused(zc, some, want, 1.0);
  test::expect_close_rms(lossf, want, test::kRtolF32, "fused loss after a forward");
}

TEST(CrossEntropyCuda, AllIgnoredGivesZero) {
  NSATRON_SKIP_WITHOUT_GPU();
  Rng rng(test::fresh_seed());
  const std::int64_t N = 4, V = 11;
  test::DeviceIds ids(std::vector<std::int32_t>(N, -100));
  Tensor z = test::on_gpu(rng.randn({N, V}, DType::F32), DType::BF16);
  Tensor loss = Tensor::from_vector({7.0}, {1}, DType::F32).to(Device::CUDA);
  cross_entropy_fused(z, ids.span(), loss, 1.0);
  EXPECT_EQ(loss.to_vector()[0], 0.0);
  for (double g : z.to_vector()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropyCuda, ReportsBadTargets) {
  NSATRON_SKIP_WITHOUT_GPU();
  Tensor z = Tensor::zeros({3, 5}, DType::F32, Device::CUDA);
  test::DeviceIds ids(std::vector<std::int32_t>{1, -100, 5});
  Tensor loss = Tensor::zeros({1}, DType::F32, Device::CUDA);
  Tensor lse = Tensor::zeros({3}, DType::F32, Device::CUDA);
  cross_entropy_forward(z, ids.span(), loss, lse);
  EXPECT_TRUE(std::isnan(loss.to_vector()[0]));
  try {
    cuda::check_id_errors();
    ADD_FAILURE() << "no error reported";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cross_entropy_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("target 5 at position 2"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(cuda::check_id_errors());
}

TEST(CrossEntropyCuda, ChecksDtypes) {
  NSATRON_SKIP_WITHOUT_GPU();
  Tensor z = Tensor::zeros({2, 5}, DType::BF16, Device::CUDA);
  test::DeviceIds ids(std::vector<std::int32_t>{1, 2});
  Tensor loss_bf16 = Tensor::zeros({1}, DType::BF16, Device::CUDA);
  Tensor lse = Tensor::zeros({2}, DType::F32, Device::CUDA);
  EXPECT_THROW(cross_entropy_forward(z, ids.span(), loss_bf16, lse), std::invalid_argument);
}

}  // namespace
}  // namespace nsatron
