// Linear: finite differences on x, W and b (with and without bias), accumulate/assign
// conventions, accumulate_dx, bias-gradient determinism; y / dy with padded rows (the same bits
// as unpadded ones, the pad columns untouched and unread).
#include "core/ops/linear.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

Shape with_last(Shape s, std::int64_t last) {
  s.back() = last;
  return s;
}

TEST(Linear, FiniteDifferences) {
  Rng rng(51);
  struct Case {
    Shape x;
    std::int64_t out;
  };
  for (const Case& c : {Case{{1, 1}, 1}, Case{{1, 5}, 3}, Case{{4, 7}, 9}, Case{{2, 3, 5}, 1},
                        Case{{13, 3}, 17}}) {
    for (bool use_bias : {false, true}) {
      const std::int64_t in = c.x.back();
      const Shape ys = with_last(c.x, c.out);
      Tensor x = rng.randn(c.x), w = rng.randn({c.out, in}), b = rng.randn({c.out});
      Tensor y = Tensor::empty(ys, DType::F64);
      const std::vector<double> probe = rng.normals(y.numel());
      auto loss = [&] {
        linear_forward(x, w, use_bias ? &b : nullptr, y);
        return test::dot(y, probe);
      };
      Tensor dy = Tensor::from_vector(probe, ys, DType::F64);
      Tensor dx = test::filled(c.x, 3.0);
      Tensor dw0 = rng.randn({c.out, in}), dw = dw0.clone();
      Tensor db0 = rng.randn({c.out}), db = db0.clone();
      linear_backward(dy, x, w, {.dx = &dx, .dw = &dw, .dbias = use_bias ? &db : nullptr});
      const std::string tag = "linear " + shape_str(c.x) + "->" + std::to_string(c.out) +
                              (use_bias ? " +b" : "");
      test::expect_fd_grad(loss, x, dx.to_vector(), tag + " dx");
      test::expect_fd_grad(loss, w, test::minus(dw.to_vector(), dw0.to_vector()), tag + " dW");
      if (use_bias)
        test::expect_fd_grad(loss, b, test::minus(db.to_vector(), db0.to_vector()), tag + " db");
      else
        EXPECT_TRUE(test::same_bits(db, db0));
    }
  }
}

TEST(Linear, AccumulateDxAndOptionalGrads) {
  Rng rng(52);
  Tensor x = rng.randn({6, 4}), w = rng.randn({5, 4}), dy = rng.randn({6, 5});
  Tensor dx = Tensor::empty({6, 4}, DType::F64);
  linear_backward(dy, x, w, {.dx = &dx});
  Tensor acc0 = rng.randn({6, 4}), acc = acc0.clone();
  linear_backward(dy, x, w, {.dx = &acc, .accumulate_dx = true});
  auto a = acc.to_vector(), a0 = acc0.to_vector(), d = dx.to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], a0[i] + d[i], 1e-14);
  // Only dW requested: nothing else touched.
  Tensor dw = Tensor::zeros({5, 4}, DType::F64);
  linear_backward(dy, x, w, {.dw = &dw});
}

TEST(Linear, RejectsBadShapes) {
  Tensor x = Tensor::zeros({2, 4}, DType::F32), w = Tensor::zeros({3, 5}, DType::F32);
  Tensor y = Tensor::empty({2, 3}, DType::F32);
  EXPECT_THROW(linear_forward(x, w, nullptr, y), std::invalid_argument);
  Tensor w2 = Tensor::zeros({3, 4}, DType::F32), b = Tensor::zeros({4}, DType::F32);
  EXPECT_THROW(linear_forward(x, w2, &b, y), std::invalid_argument);
  Tensor y2 = Tensor::empty({2, 4}, DType::F32);
  EXPECT_THROW(linear_forward(x, w2, nullptr, y2), std::invalid_argument);
}

// y_pitch / dy_pitch: the product into / from the first `out` columns of rows of `pitch`
// elements is the same GEMM on the same data as the unpadded one, so the same bits on the CPU.
// The pad of y holds a sentinel that must survive; the pad of dy holds NaN, which would spread
// into dx and dW if it were read.
TEST(Linear, PaddedRowsGiveTheUnpaddedBitsAndLeaveThePad) {
  Rng rng(54);
  struct Case {
    std::int64_t N, in, out, pitch;
  };
  const double sentinel = -7.25, nan = std::nan("");
  for (DType dt : {DType::F32, DType::F64})
    for (const Case& c : {Case{1, 1, 1, 1}, Case{1, 1, 1, 64}, Case{5, 7, 3, 4}, Case{37, 13, 100, 128},
                          Case{64, 32, 1572 / 4, 1600 / 4}, Case{3, 5, 17, 18}}) {
      const std::string tag = std::string(dtype_name(dt)) + " N=" + std::to_string(c.N) + " in=" +
                              std::to_string(c.in) + " out=" + std::to_string(c.out) + " pitch=" +
                              std::to_string(c.pitch);
      Tensor x = rng.randn({c.N, c.in}, dt), w = rng.randn({c.out, c.in}, dt);
      Tensor y = Tensor::empty({c.N, c.out}, dt);
      linear_forward(x, w, nullptr, y);
      Tensor yp = test::padded_columns(rng.randn({c.N, c.out}, dt), c.pitch, sentinel);
      linear_forward(x, w, nullptr, yp, c.pitch);
      EXPECT_TRUE(test::same_bits(test::columns(yp, 0, c.out), y)) << tag << " y";
      EXPECT_EQ(test::columns(yp, c.out, c.pitch).to_vector(),
                std::vector<double>(std::size_t(c.N * (c.pitch - c.out)), sentinel)) << tag << " y pad";

      Tensor dy = rng.randn({c.N, c.out}, dt), dyp = test::padded_columns(dy, c.pitch, nan);
      for (bool accumulate_dx : {false, true}) {
        Tensor dx0 = rng.randn({c.N, c.in}, dt), dx = dx0.clone(), dxp = dx0.clone();
        Tensor dw0 = rng.randn({c.out, c.in}, dt), dw = dw0.clone(), dwp = dw0.clone();
        linear_backward(dy, x, w, {.dx = &dx, .dw = &dw, .accumulate_dx = accumulate_dx});
        linear_backward(dyp, x, w,
                        {.dx = &dxp, .dw = &dwp, .accumulate_dx = accumulate_dx, .dy_pitch = c.pitch});
        EXPECT_TRUE(test::same_bits(dxp, dx)) << tag << " dx" << (accumulate_dx ? " accumulated" : "");
        EXPECT_TRUE(test::same_bits(dwp, dw)) << tag << " dW";
      }
      // A 3-D y: the pitch is its last dimension.
      Tensor x3 = x.view({1, c.N, c.in}), y3 = Tensor::empty({1, c.N, c.pitch}, dt);
      linear_forward(x3, w, nullptr, y3, c.pitch);
      EXPECT_TRUE(test::same_bits(test::columns(y3.view({c.N, c.pitch}), 0, c.out), y)) << tag << " 3-D y";
    }
}

TEST(Linear, PaddedRowsRejectBadPitchesAndBias) {
  Tensor x = Tensor::zeros({2, 4}, DType::F32), w = Tensor::zeros({3, 4}, DType::F32);
  Tensor b = Tensor::zeros({3}, DType::F32), y = Tensor::empty({2, 8}, DType::F32);
  EXPECT_NO_THROW(linear_forward(x, w, nullptr, y, 8));
  EXPECT_THROW(linear_forward(x, w, nullptr, y, 7), std::invalid_argument);  // y is not [2, 7]
  Tensor y2 = Tensor::empty({2, 2}, DType::F32);
  EXPECT_THROW(linear_forward(x, w, nullptr, y2, 2), std::invalid_argument);  // pitch < out
  EXPECT_THROW(linear_forward(x, w, &b, y, 8), std::invalid_argument);        // bias
  Tensor dw = Tensor::zeros({3, 4}, DType::F32), db = Tensor::zeros({3}, DType::F32);
  EXPECT_NO_THROW(linear_backward(y, x, w, {.dw = &dw, .dy_pitch = 8}));
  EXPECT_THROW(linear_backward(y, x, w, {.dw = &dw}), std::invalid_argument);  // dy is not [2, 3]
  EXPECT_THROW(linear_backward(y, x, w, {.dw = &dw, .dbias = &db, .dy_pitch = 8}), std::invalid_argument);
}

TEST(Linear, BiasGradientSameBitsForAnyThreadCount) {
  Rng rng(53);
  Tensor x = rng.randn({999, 8}, DType::F32), w = rng.randn({130, 8}, DType::F32);
  Tensor dy = rng.randn({999, 130}, DType::F32);
  auto run = [&](int threads) {
    Tensor db = Tensor::zeros({130}, DType::F32);
    test::with_threads(threads, [&] { linear_backward(dy, x, w, {.dbias = &db}); });
    return db;
  };
  EXPECT_TRUE(test::same_bits(run(1), run(4)));
}

}  // namespace
}  // namespace nsatron
