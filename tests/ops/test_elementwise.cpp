// Elementwise helpers: values, aliasing, argument checks; zero_rows.
#include "core/ops/elementwise.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

TEST(Elementwise, AddAndAccumulate) {
  test::Rng rng(81);
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor a = rng.randn({3, 5}, dt), b = rng.randn({3, 5}, dt), out = Tensor::empty({3, 5}, dt);
    add(a, b, out);
    auto av = a.to_vector(), bv = b.to_vector(), ov = out.to_vector();
    for (std::size_t i = 0; i < ov.size(); ++i) {
      const double want = dt == DType::F32 ? double(float(av[i]) + float(bv[i])) : av[i] + bv[i];
      EXPECT_EQ(ov[i], want);
    }
    Tensor a2 = a.clone();
    add(a2, b, a2);  // out over a
    EXPECT_TRUE(test::same_bits(a2, out));
    Tensor acc = a.clone();
    add_(acc, b);
    EXPECT_TRUE(test::same_bits(acc, out));
  }
}

TEST(Elementwise, AddFiniteDifferences) {
  // out = a + b: the gradient of sum(p * out) is p for both inputs.
  test::Rng rng(82);
  for (const Shape& s : {Shape{1}, Shape{1, 7}, Shape{3, 5}, Shape{2, 3, 9}}) {
    Tensor a = rng.randn(s), b = rng.randn(s), out = Tensor::empty(s, DType::F64);
    const std::vector<double> probe = rng.normals(a.numel());
    auto loss = [&] {
      add(a, b, out);
      return test::dot(out, probe);
    };
    test::expect_fd_grad(loss, a, probe, "add " + shape_str(s) + " da");
    test::expect_fd_grad(loss, b, probe, "add " + shape_str(s) + " db");
  }
}

TEST(Elementwise, RejectsMismatches) {
  Tensor a = Tensor::zeros({2, 3}, DType::F32), b = Tensor::zeros({3, 2}, DType::F32);
  Tensor c = Tensor::zeros({2, 3}, DType::F64);
  EXPECT_THROW(add(a, b, a), std::invalid_argument);
  EXPECT_THROW(add_(a, c), std::invalid_argument);
}

TEST(Elementwise, CastRoundsToNearestEvenAndRoundTrips) {
  Tensor f = Tensor::from_vector({1.0, -2.5, 3.14159265, 1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 1e-3}, {6}, DType::F32);
  Tensor b = Tensor::empty({6}, DType::BF16);
  cast(f, b);
  const auto v = b.to_vector();
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[1], -2.5);
  EXPECT_EQ(v[2], 3.140625);
  EXPECT_EQ(v[3], 1.0);                // a tie goes to the even neighbour
  EXPECT_EQ(v[4], 1.0 + 4.0 / 256);
  Tensor back = Tensor::empty({6}, DType::F32);
  cast(b, back);
  EXPECT_EQ(back.to_vector(), v);
  Tensor d = Tensor::empty({6}, DType::F64);
  cast(f, d);
  EXPECT_EQ(d.to_vector(), f.to_vector());
  Tensor same = Tensor::empty({6}, DType::F32);
  cast(f, same);
  EXPECT_EQ(same.to_vector(), f.to_vector());
  Tensor wrong = Tensor::empty({5}, DType::F32);
  EXPECT_THROW(cast(f, wrong), std::invalid_argument);
}

TEST(Elementwise, ZeroRowsClearsTheRowsNotKept) {
  test::Rng rng(83);
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (const Shape& s : {Shape{1}, Shape{1, 1}, Shape{5, 7}, Shape{4, 3, 5}, Shape{37, 1000}}) {
      const std::string tag = std::string(dtype_name(dt)) + " " + shape_str(s);
      Tensor x = rng.randn(s, DType::F64).to_dtype(dt);
      const auto before = x.to_vector();
      const std::int64_t N = s[0], row = x.numel() / N;
      std::vector<std::uint8_t> keep(static_cast<std::size_t>(N));
      for (auto& k : keep) k = std::uint8_t(rng.integer(0, 1) * rng.integer(1, 255));  // any non-zero keeps
      zero_rows(x, keep);
      const auto after = x.to_vector();
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        const double want = keep[std::size_t(i / row)] ? before[std::size_t(i)] : 0.0;
        ASSERT_EQ(after[std::size_t(i)], want) << tag << " element " << i;
        if (!keep[std::size_t(i / row)]) {
          ASSERT_FALSE(std::signbit(after[std::size_t(i)])) << tag;  // +0, zero bits
        }
      }
    }
  // A view: only its rows change.
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, DType::F32);
  Tensor v = x.slice0(1, 3);
  const std::vector<std::uint8_t> keep = {0, 1};
  zero_rows(v, keep);
  EXPECT_EQ(x.to_vector(), (std::vector<double>{1, 2, 0, 0, 5, 6}));
  const std::vector<std::uint8_t> wrong = {1};
  EXPECT_THROW(zero_rows(v, wrong), std::invalid_argument);
  Tensor none = Tensor::zeros({0, 4}, DType::F32);
  EXPECT_NO_THROW(zero_rows(none, std::span<const std::uint8_t>()));
}

}  // namespace
}  // namespace nsatron
