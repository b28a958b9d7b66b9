// CUDA embedding against the CPU: the forward copies rows exactly; the backward (sorted by
// row, each row's pieces summed in fp64 in the order core/ops/embedding.h fixes, as on the
// CPU) gives the CPU's bits for an fp32 table gradient, from fp32 or bf16 rows; vocab-parallel
// shards; repeated ids, rows whose positions span many of the backward's pieces
// (kEmbeddingGradPiece sorted positions) and rows ending at a piece's edge, widths that leave
// threads of a block idle; identical bits on a second run at a training-sized batch; bad ids
// are reported.
#include <algorithm>

#include "core/ops/embedding.h"
#include "tests/ops_cuda/cuda_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

// Mostly a few frequent ids (long runs after sorting), the rest uniform.
std::vector<std::int32_t> skewed_tokens(Rng& rng, std::int64_t n, std::int64_t lo,
                                        std::int64_t hi) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t)
    x = std::int32_t(rng.uniform(0, 1) < 0.5 ? rng.integer(lo, std::min(hi, lo + 3))
                                             : rng.integer(lo, hi));
  return t;
}

struct Case {
  std::int64_t V, C, N, vocab_start, vocab_size;
};
const Case kCases[] = {{1, 1, 1, 0, 0},         {50, 768, 1000, 0, 0}, {37, 13, 257, 0, 0},
                       {50304, 64, 4096, 0, 0}, {20, 9, 300, 10, 45},  {16, 8, 64, 0, 40},
                       {7, 200, 9000, 0, 0},    {1, 130, 3000, 0, 0},  {1, 33, 512, 0, 0},
                       {2, 40, 1024, 0, 0},     {300, 24, 4096, 100, 900}};

TEST(EmbeddingCuda, MatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : kCases) {
      const std::string tag = test::dt_name(dt) + " V=" + std::to_string(c.V) +
                              " C=" + std::to_string(c.C) + " N=" + std::to_string(c.N) +
                              " start=" + std::to_string(c.vocab_start);
      const EmbeddingOptions opt{c.vocab_start, c.vocab_size};
      const std::int64_t vocab = c.vocab_size ? c.vocab_size : c.V;
      const auto tokens = skewed_tokens(rng, c.N, 0, vocab - 1);
      test::DeviceIds ids(tokens);
      Tensor table = rng.randn({c.V, c.C}, DType::F32);
      Tensor out = Tensor::empty({c.N, c.C}, DType::F32);
      embedding_forward(tokens, test::rounded_f32(table, dt), out, opt);
      Tensor outd = Tensor::empty({c.N, c.C}, dt, Device::CUDA);
      embedding_forward(ids.span(), test::on_gpu(table, dt), outd, opt);
      EXPECT_EQ(outd.to_vector(), out.to_vector()) << "forward " << tag;

      Tensor dout = rng.randn({c.N, c.C}, DType::F32), d0 = rng.randn({c.V, c.C}, DType::F32);
      Tensor dtable = d0.clone();
      embedding_backward(tokens, test::rounded_f32(dout, dt), dtable, opt);
      Tensor dtabled = d0.to(Device::CUDA);  // fp32 gradient
      embedding_backward(ids.span(), test::on_gpu(dout, dt), dtabled, opt);
      EXPECT_TRUE(test::same_bits_any(dtabled, dtable)) << "backward (fp32 dtable) " << tag;
      if (dt == DType::BF16) {  // a bf16 table gradient: one rounding of the fp64 sum
        Tensor db = test::on_gpu(d0, dt);
        embedding_backward(ids.span(), test::on_gpu(dout, dt), db, opt);
        test::expect_close_rms(db, dtable, test::kRtolBF16, "backward (bf16 dtable) " + tag);
      }
    }
  cuda::check_id_errors();  // nothing recorded
}

TEST(EmbeddingCuda, BackwardIsDeterministic) {
  NSATRON_SKIP_WITHOUT_GPU();
  Rng rng(test::fresh_seed());
  const std::int64_t V = 50304, C = 768, N = 32768;
  const auto tokens = skewed_tokens(rng, N, 0, V - 1);
  test::DeviceIds ids(tokens);
  Tensor dout = test::on_gpu(rng.randn({N, C}, DType::F32), DType::BF16);
  Tensor d0 = rng.randn({V, C}, DType::F32, 0.1).to(Device::CUDA);
  Tensor d1 = d0.clone(), d2 = d0.clone();
  embedding_backward(ids.span(), dout, d1);
  embedding_backward(ids.span(), dout, d2);
  EXPECT_TRUE(test::same_bits_any(d1, d2));
}

TEST(EmbeddingCuda, ReportsBadIds) {
  NSATRON_SKIP_WITHOUT_GPU();
  Tensor table = Tensor::zeros({10, 4}, DType::F32, Device::CUDA);
  Tensor out = Tensor::empty({3, 4}, DType::F32, Device::CUDA);
  test::DeviceIds ids(std::vector<std::int32_t>{1, 10, 2});
  embedding_forward(ids.span(), table, out);
  try {
    cuda::check_id_errors();
    ADD_FAILURE() << "no error reported";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("embedding_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("10 at position 1"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(cuda::check_id_errors());  // cleared
  const auto v = out.to_vector();
  EXPECT_TRUE(std::isnan(v[4])) << "the bad row is NaN";
  EXPECT_EQ(v[0], 0.0);
  Tensor dtable = Tensor::zeros({10, 4}, DType::F32, Device::CUDA);
  embedding_backward(ids.span(), out, dtable);
  EXPECT_THROW(cuda::check_id_errors(), std::invalid_argument);
  for (double x : dtable.to_vector()) EXPECT_EQ(x, 0.0);  // rows 1 and 2 got zeros, row 10 none
}

}  // namespace
}  // namespace nsatron
