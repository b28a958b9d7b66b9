// Token embedding: finite differences on the table, gradient accumulation, repeated tokens,
// vocab-parallel shards, id checks, thread-count determinism.
#include "core/ops/embedding.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

std::vector<std::int32_t> random_tokens(Rng& rng, std::int64_t n, std::int64_t V) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = std::int32_t(rng.integer(0, V - 1));
  return t;
}

TEST(Embedding, FiniteDifferences) {
  Rng rng(31);
  struct Case {
    std::int64_t V, C;
    Shape out;
  };
  for (const Case& c : {Case{1, 1, {1, 1}}, Case{5, 3, {1, 3}}, Case{7, 9, {2, 5, 9}},
                        Case{3, 17, {11, 17}}}) {
    Tensor table = rng.randn({c.V, c.C});
    const std::int64_t N = shape_numel(c.out) / c.C;
    auto tokens = random_tokens(rng, N, c.V);
    if (N > 2) tokens[1] = tokens[0];  // a repeat
    Tensor out = Tensor::empty(c.out, DType::F64);
    const std::vector<double> probe = rng.normals(out.numel());
    auto loss = [&] {
      embedding_forward(tokens, table, out);
      return test::dot(out, probe);
    };
    Tensor dout = Tensor::from_vector(probe, c.out, DType::F64);
    Tensor d0 = rng.randn({c.V, c.C}), d = d0.clone();
    embedding_backward(tokens, dout, d);
    test::expect_fd_grad(loss, table, test::minus(d.to_vector(), d0.to_vector()),
                         "embedding V=" + std::to_string(c.V) + " " + shape_str(c.out));
  }
}

TEST(Embedding, ForwardCopiesRows) {
  Rng rng(32);
  Tensor table = rng.randn({6, 4});
  std::vector<std::int32_t> tokens = {5, 0, 5, 2};
  Tensor out = Tensor::empty({4, 4}, DType::F64);
  embedding_forward(tokens, table, out);
  auto tv = table.to_vector(), ov = out.to_vector();
  for (int n = 0; n < 4; ++n)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(ov[n * 4 + c], tv[tokens[n] * 4 + c]);
}

TEST(Embedding, ShardsSumToTheFullLookup) {
  Rng rng(33);
  const std::int64_t V = 10, C = 5, N = 23;
  Tensor table = rng.randn({V, C});
  auto tokens = random_tokens(rng, N, V);
  Tensor full = Tensor::empty({N, C}, DType::F64);
  embedding_forward(tokens, table, full);
  Tensor dout = rng.randn({N, C});
  Tensor dfull = Tensor::zeros({V, C}, DType::F64);
  embedding_backward(tokens, dout, dfull);
  // Shards [0, 4), [4, 10).
  std::vector<double> sum(std::size_t(N * C), 0.0), dcat;
  for (auto [b, e] : {std::pair<std::int64_t, std::int64_t>{0, 4}, {4, 10}}) {
    Tensor shard = table.slice0(b, e).clone();
    Tensor out = Tensor::empty({N, C}, DType::F64);
    EmbeddingOptions opt{.vocab_start = b, .vocab_size = V};
    embedding_forward(tokens, shard, out, opt);
    auto ov = out.to_vector();
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += ov[i];
    Tensor d = Tensor::zeros({e - b, C}, DType::F64);
    embedding_backward(tokens, dout, d, opt);
    auto dv = d.to_vector();
    dcat.insert(dcat.end(), dv.begin(), dv.end());
  }
  EXPECT_EQ(sum, full.to_vector());
  EXPECT_EQ(dcat, dfull.to_vector());
}

TEST(Embedding, RejectsIdsOutsideTheVocabulary) {
  Tensor table = Tensor::zeros({4, 2}, DType::F32), out = Tensor::empty({3, 2}, DType::F32);
  std::vector<std::int32_t> bad = {0, 4, 1};
  try {
    embedding_forward(bad, table, out);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("position 1"), std::string::npos) << e.what();
  }
  std::vector<std::int32_t> neg = {0, 1, -1};
  EXPECT_THROW(embedding_backward(neg, out, table), std::invalid_argument);
  std::vector<std::int32_t> two = {0, 1};
  EXPECT_THROW(embedding_forward(two, table, out), std::invalid_argument);  // row count
  EXPECT_THROW(embedding_forward(two, table, out, {.vocab_start = 2, .vocab_size = 5}),
               std::invalid_argument);  // [2, 6) not inside [0, 5)
}

TEST(Embedding, BackwardSameBitsForAnyThreadCount) {
  Rng rng(34);
  const std::int64_t V = 13, C = 70, N = 5000;  // ~400 repeats per id, fp32
  auto tokens = random_tokens(rng, N, V);
  Tensor dout = rng.randn({N, C}, DType::F32);
  Tensor init = rng.randn({V, C}, DType::F32);
  auto run = [&](int threads) {
    Tensor d = init.clone();
    test::with_threads(threads, [&] { embedding_backward(tokens, dout, d); });
    return d;
  };
  Tensor d1 = run(1), d2 = run(2), d5 = run(5);
  EXPECT_TRUE(test::same_bits(d1, d2));
  EXPECT_TRUE(test::same_bits(d1, d5));
}

}  // namespace
}  // namespace nsatron
