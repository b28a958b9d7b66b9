// Cross entropy: finite differences on the logits (with ignored rows), the loss against a
// direct evaluation, the denominator and chunking contract, fused vs unfused, in-place
// backward, target checks, thread-count determinism; the vocabulary-slice ops against their
// formulas, and three uneven slices composed by hand against the whole-logits loss/gradient.
#include <cmath>

#include "core/ops/cross_entropy.h"
#include "tests/ops/op_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

std::vector<std::int32_t> random_targets(Rng& rng, std::int64_t n, std::int64_t V,
                                         double p_ignore, std::int32_t ignore) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = rng.uniform(0, 1) < p_ignore ? ignore : std::int32_t(rng.integer(0, V - 1));
  return t;
}

// The loss straight from the definition.
double direct_loss(const Tensor& logits, const std::vector<std::int32_t>& t, std::int32_t ignore) {
  auto z = logits.to_vector();
  const std::int64_t V = logits.dim(-1);
  double sum = 0;
  int count = 0;
  for (std::size_t n = 0; n < t.size(); ++n) {
    if (t[n] == ignore) continue;
    double s = 0;
    for (std::int64_t v = 0; v < V; ++v) s += std::exp(z[n * V + v]);
    sum += std::log(s) - z[n * V + t[n]];
    ++count;
  }
  return count ? sum / count : 0.0;
}

TEST(CrossEntropy, FiniteDifferences) {
  Rng rng(41);
  struct Case {
    Shape logits;
    double p_ignore;
  };
  for (const Case& c : {Case{{1, 1}, 0.0}, Case{{1, 7}, 0.0}, Case{{5, 3}, 0.3},
                        Case{{2, 3, 11}, 0.25}, Case{{9, 64}, 0.1}}) {
    const std::int64_t V = c.logits.back(), N = shape_numel(c.logits) / V;
    Tensor z = rng.randn(c.logits, DType::F64, 2.0);
    auto t = random_targets(rng, N, V, c.p_ignore, -100);
    t[0] = std::int32_t(V - 1);  // at least one counted row
    Tensor loss = Tensor::empty({1}, DType::F64), lse = Tensor::empty({N}, DType::F64);
    auto f = [&] {
      cross_entropy_forward(z, t, loss, lse);
      return 0.7 * loss.to_vector()[0];
    };
    f();
    EXPECT_NEAR(loss.to_vector()[0], direct_loss(z, t, -100), 1e-13);
    Tensor dz = test::filled(c.logits, 42.0);
    cross_entropy_backward(z, t, lse, 0.7, dz);
    test::expect_fd_grad(f, z, dz.to_vector(), "cross_entropy " + shape_str(c.logits));
  }
}

TEST(CrossEntropy, FusedEqualsUnfusedAndInPlace) {
  Rng rng(42);
  const std::int64_t N = 37, V = 50;
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor z = rng.randn({N, V}, dt, 3.0);
    auto t = random_targets(rng, N, V, 0.2, 7);  // an ignore index inside [0, V)
    CrossEntropyOptions opt{.ignore_index = 7};
    Tensor loss = Tensor::empty({1}, dt), lse = Tensor::empty({N}, dt);
    Tensor dz = Tensor::empty({N, V}, dt);
    cross_entropy_forward(z, t, loss, lse, opt);
    cross_entropy_backward(z, t, lse, 1.0, dz, opt);
    Tensor z2 = z.clone();  // in place: dlogits over logits
    cross_entropy_backward(z2, t, lse, 1.0, z2, opt);
    EXPECT_TRUE(test::same_bits(z2, dz));
    Tensor z3 = z.clone(), loss3 = Tensor::empty({1}, dt);
    cross_entropy_fused(z3, t, loss3, 1.0, opt);
    EXPECT_TRUE(test::same_bits(z3, dz));
    EXPECT_TRUE(test::same_bits(loss3, loss));
    // Ignored rows have zero gradient, counted rows sum to zero.
    auto dv = dz.to_vector();
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (std::int64_t v = 0; v < V; ++v) {
        if (t[n] == 7) {
          EXPECT_EQ(dv[n * V + v], 0.0);
        }
        s += dv[n * V + v];
      }
      EXPECT_NEAR(s, 0.0, dt == DType::F32 ? 1e-7 : 1e-16);
    }
  }
}

TEST(CrossEntropy, ChunksWithAGlobalDenominatorAddUp) {
  Rng rng(43);
  const std::int64_t N = 20, V = 9;
  Tensor z = rng.randn({N, V});
  auto t = random_targets(rng, N, V, 0.3, -100);
  t[0] = 1;
  const std::int64_t D = count_targets(t, -100);
  Tensor loss = Tensor::empty({1}, DType::F64), dz = z.clone();
  cross_entropy_fused(dz, t, loss, 1.0);
  // Rows [0, 8) and [8, 20) with D of the whole batch, the loss accumulated.
  Tensor loss_c = Tensor::zeros({}, DType::F64), dz_c = z.clone();
  for (auto [b, e] : {std::pair<std::int64_t, std::int64_t>{0, 8}, {8, 20}}) {
    Tensor chunk = dz_c.slice0(b, e);
    std::span<const std::int32_t> tc(t.data() + b, std::size_t(e - b));
    cross_entropy_fused(chunk, tc, loss_c, 1.0,
                        {.denominator = double(D), .accumulate_loss = true});
  }
  EXPECT_NEAR(loss_c.to_vector()[0], loss.to_vector()[0], 1e-15);
  EXPECT_TRUE(test::same_bits(dz_c, dz));
}

TEST(CrossEntropy, AllIgnoredGivesZero) {
  Tensor z = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::F64);
  std::vector<std::int32_t> t = {-100, -100};
  Tensor loss = Tensor::empty({1}, DType::F64), dz = z.clone();
  cross_entropy_fused(dz, t, loss, 1.0);
  EXPECT_EQ(loss.to_vector()[0], 0.0);
  for (double v : dz.to_vector()) EXPECT_EQ(v, 0.0);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  Tensor z = Tensor::from_vector({1000, -1000, 999, 0}, {1, 4}, DType::F32);
  std::vector<std::int32_t> t = {2};
  Tensor loss = Tensor::empty({1}, DType::F32), lse = Tensor::empty({1}, DType::F32);
  cross_entropy_forward(z, t, loss, lse);
  EXPECT_NEAR(loss.to_vector()[0], std::log1p(std::exp(1.0)), 1e-4);
}

TEST(CrossEntropy, RejectsBadTargets) {
  Tensor z = Tensor::zeros({3, 4}, DType::F32), loss = Tensor::empty({1}, DType::F32);
  Tensor lse = Tensor::empty({3}, DType::F32);
  std::vector<std::int32_t> bad = {0, 4, 1};
  try {
    cross_entropy_forward(z, bad, loss, lse);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("position 1"), std::string::npos) << e.what();
  }
  std::vector<std::int32_t> two = {0, 1};
  EXPECT_THROW(cross_entropy_forward(z, two, loss, lse), std::invalid_argument);
  std::vector<std::int32_t> ok = {0, 1, 2};
  Tensor loss2 = Tensor::empty({2}, DType::F32);
  EXPECT_THROW(cross_entropy_forward(z, ok, loss2, lse), std::invalid_argument);
}

TEST(CrossEntropy, SameBitsForAnyThreadCount) {
  Rng rng(44);
  const std::int64_t N = 301, V = 257;
  Tensor z = rng.randn({N, V}, DType::F32, 2.0);
  auto t = random_targets(rng, N, V, 0.1, -100);
  auto run = [&](int threads) {
    Tensor loss = Tensor::empty({1}, DType::F32), d = z.clone();
    test::with_threads(threads, [&] { cross_entropy_fused(d, t, loss, 1.0); });
    return std::pair{loss, d};
  };
  auto [l1, d1] = run(1);
  auto [l3, d3] = run(3);
  EXPECT_TRUE(test::same_bits(l1, l3));
  EXPECT_TRUE(test::same_bits(d1, d3));
}

// ---- vocabulary slices ---------------------------------------------------------------------


TEST(CrossEntropySlice, OpsMatchTheFormula) {
  Rng rng(45);
  struct Case {
    std::int64_t N, V, vocab_start;
  };
  for (const Case& c : {Case{1, 1, 0}, Case{1, 7, 3}, Case{6, 5, 10}, Case{13, 29, 4}}) {
    const std::string tag = "N=" + std::to_string(c.N) + " V_r=" + std::to_string(c.V);
    const std::int64_t total = c.vocab_start + c.V + 6;  // the whole vocabulary
    Tensor z = rng.randn({c.N, c.V}, DType::F64, 2.0);
    auto t = random_targets(rng, c.N, total, 0.2, -100);
    t[0] = std::int32_t(c.vocab_start + c.V - 1);        // the slice's last column
    if (c.N > 2) t[2] = std::int32_t(c.vocab_start);     // its first
    const auto zv = z.to_vector();

    Tensor stats = test::filled({3 * c.N}, 42.0);
    cross_entropy_slice_stats(z, t, c.vocab_start, -100, stats, total);
    const auto st = stats.to_vector();
    // This slice's own statistics; then a second slice's, as another rank would give them, and
    // the two combined in rank order.
    std::vector<double> other(std::size_t(3 * c.N)), g(std::size_t(c.N)), s_global(std::size_t(2 * c.N));
    for (std::int64_t n = 0; n < c.N; ++n) {
      double m = -INFINITY;
      for (std::int64_t v = 0; v < c.V; ++v) m = std::max(m, zv[std::size_t(n * c.V + v)]);
      EXPECT_EQ(st[std::size_t(n)], m) << tag;
      double s = 0;
      for (std::int64_t v = 0; v < c.V; ++v) s += std::exp(zv[std::size_t(n * c.V + v)] - m);
      EXPECT_NEAR(st[std::size_t(c.N + n)], s, 1e-14 * s) << tag << " row " << n;
      const std::int64_t col = t[std::size_t(n)] == -100 ? -1 : t[std::size_t(n)] - c.vocab_start;
      const bool here = col >= 0 && col < c.V;
      const double zt = here ? zv[std::size_t(n * c.V + col)] : 0.0;
      EXPECT_EQ(st[std::size_t(2 * c.N + n)], zt) << tag << " row " << n;
      // The other slice: a larger max on odd rows, and the target where this one lacks it.
      const double mo = m + (n % 2 ? rng.uniform(0, 3) : -rng.uniform(0, 3));
      const double so = rng.uniform(0.5, 4);
      const double zto = here || t[std::size_t(n)] == -100 ? 0.0 : rng.normal(2.0);
      other[std::size_t(n)] = mo;
      other[std::size_t(c.N + n)] = so;
      other[std::size_t(2 * c.N + n)] = zto;
      g[std::size_t(n)] = std::max(m, mo);
      s_global[std::size_t(n)] = s * std::exp(m - g[std::size_t(n)]) + so * std::exp(mo - g[std::size_t(n)]);
      s_global[std::size_t(c.N + n)] = zt + zto;
    }
    std::vector<double> both = st;
    both.insert(both.end(), other.begin(), other.end());
    Tensor gathered = Tensor::from_vector(both, {2 * 3 * c.N}, DType::F64);
    Tensor gmax = test::filled({c.N}, 42.0), combined = test::filled({2 * c.N}, 42.0);
    cross_entropy_slice_combine(gathered, gmax, combined);
    EXPECT_EQ(gmax.to_vector(), g) << tag;
    const auto cv = combined.to_vector();
    for (std::int64_t n = 0; n < c.N; ++n) {
      EXPECT_NEAR(cv[std::size_t(n)], s_global[std::size_t(n)], 1e-14 * s_global[std::size_t(n)]) << tag << " row " << n;
      EXPECT_EQ(cv[std::size_t(c.N + n)], s_global[std::size_t(c.N + n)]) << tag << " row " << n;
    }
    Tensor sg = Tensor::from_vector(s_global, {2 * c.N}, DType::F64);
    Tensor dz = z.clone(), row_loss = test::filled({c.N}, 42.0);
    cross_entropy_slice_grad(dz, t, c.vocab_start, -100, gmax, sg, 0.7, row_loss);
    const auto dv = dz.to_vector(), lv = row_loss.to_vector();
    for (std::int64_t n = 0; n < c.N; ++n) {
      const bool ignored = t[std::size_t(n)] == -100;
      const double m = g[std::size_t(n)], s = s_global[std::size_t(n)];
      EXPECT_NEAR(lv[std::size_t(n)], ignored ? 0.0 : std::log(s) + m - s_global[std::size_t(c.N + n)], 1e-13)
          << tag << " row " << n;
      for (std::int64_t v = 0; v < c.V; ++v) {
        const double p = std::exp(zv[std::size_t(n * c.V + v)] - m) / s;
        const double want = ignored ? 0.0 : 0.7 * (p - (t[std::size_t(n)] - c.vocab_start == v ? 1.0 : 0.0));
        EXPECT_NEAR(dv[std::size_t(n * c.V + v)], want, 1e-15) << tag << " row " << n << " column " << v;
      }
    }
  }
}

// The slices' statistics laid end to end as the all-gather would and combined give the loss
// and, column by column, the gradient of cross_entropy_fused on the whole logits.
void compose(DType dt, std::int64_t N, std::int64_t V, double tol, std::uint64_t seed) {
  Rng rng(seed);
  const std::string tag = std::string(dtype_name(dt)) + " N=" + std::to_string(N) + " V=" + std::to_string(V);
  Tensor z = rng.randn({N, V}, dt, 3.0);
  auto t = random_targets(rng, N, V, 0.2, -100);
  t[0] = std::int32_t(V - 1);
  const double dloss = 1.7;
  Tensor ref = z.clone(), ref_loss = Tensor::empty({1}, dt);
  cross_entropy_fused(ref, t, ref_loss, dloss);
  const double D = double(count_targets(t, -100));

  const std::int64_t bounds[] = {0, V / 5, V / 5 + V / 2, V};  // uneven: 7, 18, 12 of 37
  std::vector<Tensor> parts;
  Tensor gathered = Tensor::empty({3 * 3 * N}, DType::F64);  // the all-gather's layout
  for (int r = 0; r < 3; ++r) {
    parts.push_back(test::columns(z, bounds[r], bounds[r + 1]));
    Tensor own = gathered.slice0(3 * N * r, 3 * N * (r + 1));
    cross_entropy_slice_stats(parts.back(), t, bounds[r], -100, own, V);
  }
  Tensor row_max = Tensor::empty({N}, DType::F64), sums = Tensor::empty({2 * N}, DType::F64);
  cross_entropy_slice_combine(gathered, row_max, sums);
  double loss = 0;
  std::vector<double> grad(std::size_t(N * V));
  for (int r = 0; r < 3; ++r) {
    Tensor row_loss = Tensor::empty({N}, DType::F64);
    cross_entropy_slice_grad(parts[std::size_t(r)], t, bounds[r], -100, row_max, sums, dloss / D, row_loss);
    const auto lv = row_loss.to_vector();
    if (r == 0)  // every rank gets the same row losses
      for (double l : lv) loss += l;
    const auto gv = parts[std::size_t(r)].to_vector();
    const std::int64_t w = bounds[r + 1] - bounds[r];
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t c = 0; c < w; ++c) grad[std::size_t(n * V + bounds[r] + c)] = gv[std::size_t(n * w + c)];
  }
  loss /= D;
  const double want = ref_loss.to_vector()[0];
  EXPECT_NEAR(loss, want, tol * std::abs(want)) << tag;
  test::expect_close(grad, ref.to_vector(), 0.0, tol, "gradient " + tag);
}

TEST(CrossEntropySlice, SlicesComposeToTheWholeCrossEntropy) {
  std::uint64_t seed = 46;
  for (std::int64_t N : {1, 37})
    for (std::int64_t V : {37, 50}) {
      compose(DType::F64, N, V, 1e-12, seed++);
      compose(DType::F32, N, V, 1e-5, seed++);
    }
}

TEST(CrossEntropySlice, IgnoredRowsAndTargetsOutsideTheSlice) {
  // Rows: target in the slice, in another slice, ignored (a custom ignore index).
  Tensor z = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3}, DType::F64);
  const std::vector<std::int32_t> t = {11, 3, 99};
  Tensor st = Tensor::empty({9}, DType::F64), m = Tensor::empty({3}, DType::F64), s = Tensor::empty({6}, DType::F64);
  cross_entropy_slice_stats(z, t, 10, 99, st);
  const auto sv = st.to_vector();
  EXPECT_EQ(std::vector<double>(sv.begin(), sv.begin() + 3), (std::vector<double>{3, 6, 9}));
  EXPECT_EQ(sv[6], 2.0);  // column 1 of row 0
  EXPECT_EQ(sv[7], 0.0);  // another slice's target
  EXPECT_EQ(sv[8], 0.0);  // ignored
  cross_entropy_slice_combine(st, m, s);  // one slice: its own statistics
  EXPECT_EQ(m.to_vector(), (std::vector<double>{3, 6, 9}));
  EXPECT_EQ(s.to_vector(), (std::vector<double>{sv[3], sv[4], sv[5], 2.0, 0.0, 0.0}));
  Tensor loss = Tensor::empty({3}, DType::F64);
  cross_entropy_slice_grad(z, t, 10, 99, m, s, 1.0, loss);
  const auto g = z.to_vector();
  EXPECT_EQ(loss.to_vector()[2], 0.0);
  for (int v = 0; v < 3; ++v) EXPECT_EQ(g[std::size_t(6 + v)], 0.0);
  // Row 1 has no target here: its gradient is the softmax part alone (positive).
  for (int v = 0; v < 3; ++v) EXPECT_GT(g[std::size_t(3 + v)], 0.0);
  EXPECT_LT(g[1], 0.0);  // row 0's target column
}

TEST(CrossEntropySlice, RejectsBadTargetsAndArguments) {
  Tensor z = Tensor::zeros({3, 4}, DType::F32);
  Tensor m = Tensor::zeros({3}, DType::F64), s = Tensor::zeros({6}, DType::F64), l = Tensor::zeros({3}, DType::F64);
  Tensor st = Tensor::zeros({9}, DType::F64);
  const std::vector<std::int32_t> ok = {0, -100, 9};
  const std::vector<std::int32_t> negative = {0, -5, 1};
  const std::vector<std::int32_t> beyond = {0, 1, 12};
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_NE(message([&] { cross_entropy_slice_stats(z, negative, 4, -100, st); }).find("position 1"), std::string::npos);
  EXPECT_NE(message([&] { cross_entropy_slice_grad(z, negative, 4, -100, m, s, 1.0, l); }).find("position 1"),
            std::string::npos);
  EXPECT_NE(message([&] { cross_entropy_slice_stats(z, beyond, 4, -100, st, 12); }).find("position 2"),
            std::string::npos);
  EXPECT_NO_THROW(cross_entropy_slice_stats(z, beyond, 4, -100, st));  // no vocab_size: unknown
  EXPECT_NO_THROW(cross_entropy_slice_stats(z, ok, 4, -100, st, 12));
  // The slice must fit the vocabulary; fp64 row results of the right sizes; targets per row.
  EXPECT_THROW(cross_entropy_slice_stats(z, ok, 9, -100, st, 12), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_stats(z, ok, -1, -100, st), std::invalid_argument);
  Tensor st32 = Tensor::zeros({9}, DType::F32), m32 = Tensor::zeros({3}, DType::F32), s3 = Tensor::zeros({3}, DType::F64);
  EXPECT_THROW(cross_entropy_slice_stats(z, ok, 4, -100, st32), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_stats(z, ok, 4, -100, s), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_grad(z, ok, 4, -100, m, s3, 1.0, l), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_grad(z, ok, 4, -100, m, s, 1.0, s), std::invalid_argument);
  const std::vector<std::int32_t> two = {0, 1};
  EXPECT_THROW(cross_entropy_slice_stats(z, two, 4, -100, st), std::invalid_argument);
  Tensor bf = Tensor::zeros({3, 4}, DType::BF16);
  EXPECT_THROW(cross_entropy_slice_stats(bf, ok, 4, -100, st), std::invalid_argument);
  Tensor empty = Tensor::zeros({3, 0}, DType::F32);
  EXPECT_THROW(cross_entropy_slice_stats(empty, ok, 4, -100, st), std::invalid_argument);
  // combine: whole slices' statistics (P x 3N, P >= 1), fp64 results of N and 2N.
  Tensor st8 = Tensor::zeros({8}, DType::F64), st18 = Tensor::zeros({18}, DType::F64), none = Tensor::zeros({0}, DType::F64);
  EXPECT_NO_THROW(cross_entropy_slice_combine(st18, m, s));
  EXPECT_THROW(cross_entropy_slice_combine(st8, m, s), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_combine(none, m, s), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_combine(st, m32, s), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_combine(st, m, s3), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_combine(st32, m, s), std::invalid_argument);
}

TEST(CrossEntropySlice, LossAddsTheRowsInOrderOverTheDenominator) {
  test::Rng rng(187);
  for (std::int64_t N : {0, 1, 37, 1024}) {
    const std::vector<double> rows = rng.normals(std::size_t(N));
    Tensor row_loss = Tensor::from_vector(rows, {N}, DType::F64);
    Tensor loss = Tensor::from_vector({0.25}, {1}, DType::F64);
    cross_entropy_slice_loss(row_loss, 3.5, loss);
    double s = 0;
    for (double r : rows) s += r;
    EXPECT_EQ(loss.to_vector()[0], 0.25 + s / 3.5) << "N = " << N;  // the same operations: the same bits
    cross_entropy_slice_loss(row_loss, 0.0, loss);  // D = 0: nothing added
    EXPECT_EQ(loss.to_vector()[0], 0.25 + s / 3.5);
  }
  Tensor rows = Tensor::zeros({3}, DType::F64), loss = Tensor::zeros({1}, DType::F64);
  Tensor rows32 = Tensor::zeros({3}, DType::F32), two = Tensor::zeros({2}, DType::F64);
  EXPECT_THROW(cross_entropy_slice_loss(rows32, 1.0, loss), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_loss(rows, 1.0, two), std::invalid_argument);
}

TEST(CrossEntropySlice, SameBitsForAnyThreadCount) {
  Rng rng(47);
  const std::int64_t N = 301, V = 257;
  Tensor z = rng.randn({N, V}, DType::F32, 2.0);
  auto t = random_targets(rng, N, 3 * V, 0.1, -100);
  auto run = [&](int threads) {
    Tensor st = Tensor::empty({3 * N}, DType::F64), m = Tensor::empty({N}, DType::F64);
    Tensor s = Tensor::empty({2 * N}, DType::F64), l = Tensor::empty({N}, DType::F64), d = z.clone();
    test::with_threads(threads, [&] {
      cross_entropy_slice_stats(d, t, V, -100, st);
      cross_entropy_slice_combine(st, m, s);
      cross_entropy_slice_grad(d, t, V, -100, m, s, 0.3, l);
    });
    return std::vector<Tensor>{st, m, s, l, d};
  };
  const auto a = run(1), b = run(3);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(test::same_bits(a[i], b[i])) << i;
}

}  // namespace
}  // namespace nsatron
