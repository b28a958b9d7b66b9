// Elementwise helpers: values, aliasing, argument checks; split/join of columns (grouped,
// padded rows included); regroup_rows and zero_columns.
#include "core/ops/elementwise.h"
#include "tests/ops/op_test_util.h"

#include <numeric>

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

// The part widths the column and row tests run: one part, a zero width, the 125M projection's
// eight parts, odd widths.
const std::vector<std::vector<std::int64_t>> kPartWidths = {
    {1}, {3, 0, 5}, {384, 64, 64, 64, 64, 64, 64, 18}, {7, 1, 2, 9, 4}};
std::int64_t total_width(const std::vector<std::int64_t>& widths) {
  return std::accumulate(widths.begin(), widths.end(), std::int64_t(0));
}

// Parts of random widths (zero and odd widths included) of an [R, W] matrix.
std::vector<Tensor> parts_of(test::Rng& rng, std::int64_t R, const std::vector<std::int64_t>& widths, DType dt) {
  std::vector<Tensor> parts;
  for (std::int64_t w : widths) parts.push_back(rng.randn({R, w}, DType::F64).to_dtype(dt));
  return parts;
}

TEST(Elementwise, SplitColumnsIsTheColumnSliceAndJoinItsInverse) {
  test::Rng rng(84);
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (const std::vector<std::int64_t>& widths : kPartWidths)
      for (std::int64_t R : {1, 3, 37}) {
        const std::int64_t W = total_width(widths);
        const std::string tag = std::string(dtype_name(dt)) + " R=" + std::to_string(R) + " W=" + std::to_string(W);
        Tensor packed = rng.randn({R, W}, DType::F64).to_dtype(dt);
        std::vector<Tensor> parts = parts_of(rng, R, widths, dt);
        std::vector<Tensor*> ptrs;
        for (Tensor& t : parts) ptrs.push_back(&t);
        split_columns(packed, ptrs);
        const auto pv = packed.to_vector();
        std::int64_t col = 0;
        for (std::size_t k = 0; k < widths.size(); ++k) {
          const auto got = parts[k].to_vector();
          for (std::int64_t r = 0; r < R; ++r)
            for (std::int64_t j = 0; j < widths[k]; ++j)
              ASSERT_EQ(got[std::size_t(r * widths[k] + j)], pv[std::size_t(r * W + col + j)]) << tag << " part " << k;
          col += widths[k];
        }
        // join(split(p)) = p, bit for bit (into a fresh tensor: every element is written).
        Tensor back = rng.randn({R, W}, DType::F64).to_dtype(dt);
        join_columns(std::vector<const Tensor*>(ptrs.begin(), ptrs.end()), back);
        EXPECT_TRUE(test::same_bits(back, packed)) << tag;
      }
}

// Grouped, padded rows (PackedColumns): packed [R, pitch] holds G groups of the parts' columns
// then pad; part k [R, G * w_k]. The split against a plain loop; the join leaves the pad
// alone (a sentinel survives it), or with zero_pad writes zeros there; join(split(p)) = p on
// the groups' columns, bit for bit.
TEST(Elementwise, GroupedPaddedSplitAndJoinFollowThePlainLoop) {
  test::Rng rng(86);
  const double sentinel = -3.5;
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (const std::vector<std::int64_t>& widths : kPartWidths)
      for (std::int64_t G : {1, 2, 4, 9})  // 9 groups of 8 parts: two raw calls (at most 64 pairs each)
        for (std::int64_t R : {1, 3, 37}) {
          const std::int64_t W = total_width(widths);
          for (std::int64_t pitch : {G * W, G * W + 5, (G * W + 63) / 64 * 64}) {
            const std::string tag = std::string(dtype_name(dt)) + " G=" + std::to_string(G) + " R=" +
                                    std::to_string(R) + " W=" + std::to_string(W) +
                                    " pitch=" + std::to_string(pitch);
            const PackedColumns layout{.groups = G, .pitch = pitch};
            Tensor packed = rng.randn({R, pitch}, DType::F64).to_dtype(dt);
            std::vector<Tensor> parts;
            for (std::int64_t w : widths) parts.push_back(rng.randn({R, G * w}, DType::F64).to_dtype(dt));
            std::vector<Tensor*> ptrs;
            for (Tensor& t : parts) ptrs.push_back(&t);
            split_columns(packed, ptrs, layout);
            const auto pv = packed.to_vector();
            for (std::int64_t g = 0, col = 0; g < G; ++g)
              for (std::size_t k = 0; k < widths.size(); col += widths[k], ++k) {
                const auto got = parts[k].to_vector();
                for (std::int64_t r = 0; r < R; ++r)
                  for (std::int64_t j = 0; j < widths[k]; ++j)
                    ASSERT_EQ(got[std::size_t((r * G + g) * widths[k] + j)],
                              pv[std::size_t(r * pitch + col + j)])
                        << tag << " group " << g << " part " << k;
              }
            for (bool zero_pad : {false, true}) {
              Tensor back = test::padded_columns(rng.randn({R, G * W}, DType::F64).to_dtype(dt), pitch, sentinel);
              join_columns(std::vector<const Tensor*>(ptrs.begin(), ptrs.end()), back,
                           {.groups = G, .pitch = pitch, .zero_pad = zero_pad});
              EXPECT_TRUE(test::same_bits(test::columns(back, 0, G * W), test::columns(packed, 0, G * W))) << tag;
              EXPECT_EQ(test::columns(back, G * W, pitch).to_vector(),
                        std::vector<double>(std::size_t(R * (pitch - G * W)), zero_pad ? 0.0 : sentinel))
                  << tag << " pad, zero_pad " << zero_pad;
            }
          }
        }
}

// regroup_rows against the plain loop of its definition (part k of group g: group-major rows
// g * W + o_k, part-major rows G * o_k + g * w_k), its inverse restores the rows, and rows past
// G * W are neither read nor written; zero_columns zeroes its columns only.
TEST(Elementwise, RegroupRowsFollowsThePlainLoopAndZeroColumnsItsColumns) {
  test::Rng rng(88);
  const double sentinel = -3.5;
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (const std::vector<std::int64_t>& widths : kPartWidths)
      for (std::int64_t G : {1, 2, 3})
        for (std::int64_t C : {1, 5, 8}) {
          const std::int64_t W = total_width(widths);
          const std::string tag = std::string(dtype_name(dt)) + " G=" + std::to_string(G) + " W=" + std::to_string(W) +
                                  " C=" + std::to_string(C);
          const std::int64_t R = G * W, extra = 2;  // two rows past the regrouped ones
          Tensor in = rng.randn({R + extra, C}, DType::F64).to_dtype(dt);
          Tensor out = Tensor::from_vector(std::vector<double>(std::size_t((R + extra) * C), sentinel), {R + extra, C}, dt);
          regroup_rows(in, out, widths, G, true);
          const auto iv = in.to_vector(), ov = out.to_vector();
          for (std::int64_t g = 0; g < G; ++g)
            for (std::size_t k = 0, o = 0; k < widths.size(); o += std::size_t(widths[k]), ++k)
              for (std::int64_t j = 0; j < widths[k]; ++j)
                for (std::int64_t c = 0; c < C; ++c)
                  ASSERT_EQ(ov[std::size_t(((G * std::int64_t(o) + g * widths[k] + j)) * C + c)],
                            iv[std::size_t((g * W + std::int64_t(o) + j) * C + c)])
                      << tag << " group " << g << " part " << k << " row " << j;
          for (std::size_t i = std::size_t(R * C); i < ov.size(); ++i) ASSERT_EQ(ov[i], sentinel) << tag << " past the rows";
          Tensor back = Tensor::from_vector(std::vector<double>(std::size_t((R + extra) * C), sentinel), {R + extra, C}, dt);
          regroup_rows(out, back, widths, G, false);
          EXPECT_TRUE(test::same_bits(back.slice0(0, R), in.slice0(0, R))) << tag << " inverse";
          EXPECT_EQ(back.slice0(R, R + extra).to_vector(), std::vector<double>(std::size_t(extra * C), sentinel)) << tag;
        }
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor x = rng.randn({4, 9}, DType::F64).to_dtype(dt);
    const auto before = x.to_vector();
    zero_columns(x, 3, 7);
    const auto after = x.to_vector();
    for (std::size_t i = 0; i < after.size(); ++i) {
      const std::size_t c = i % 9;
      EXPECT_EQ(after[i], c >= 3 && c < 7 ? 0.0 : before[i]) << dtype_name(dt) << " element " << i;
    }
  }
  Tensor x = Tensor::zeros({2, 4}, DType::F32);
  EXPECT_THROW(zero_columns(x, 3, 5), std::invalid_argument);
  Tensor small = Tensor::zeros({3, 2}, DType::F32), big = Tensor::zeros({8, 2}, DType::F32);
  EXPECT_THROW(regroup_rows(small, big, std::vector<std::int64_t>{2, 2}, 1, true), std::invalid_argument);  // 4 rows
}

TEST(Elementwise, GroupedSplitColumnsRejectsMismatches) {
  Tensor packed = Tensor::zeros({3, 16}, DType::F32);
  Tensor a = Tensor::zeros({3, 4}, DType::F32), b = Tensor::zeros({3, 2}, DType::F32);
  Tensor odd = Tensor::zeros({3, 3}, DType::F32);
  EXPECT_NO_THROW(split_columns(packed, std::vector<Tensor*>{&a, &b}, {.groups = 2, .pitch = 16}));
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{&a, &b}, {.groups = 2}),
               std::invalid_argument);  // 12 != 16
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{&a, &b}, {.groups = 2, .pitch = 15}),
               std::invalid_argument);  // packed is not [3, 15]
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{&a, &b}, {.groups = 4, .pitch = 16}),
               std::invalid_argument);  // b is not [3, 4 * w]
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{&a, &odd}, {.groups = 2, .pitch = 16}),
               std::invalid_argument);  // 3 columns are not 2 groups
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{&a, &b}, {.groups = 0, .pitch = 16}),
               std::invalid_argument);
  // More parts than one raw call takes: 65 parts.
  std::vector<Tensor> many(kMaxColumnParts + 1, Tensor::zeros({3, 1}, DType::F32));
  std::vector<Tensor*> mp;
  for (Tensor& t : many) mp.push_back(&t);
  Tensor wide = Tensor::zeros({3, kMaxColumnParts + 1}, DType::F32);
  EXPECT_THROW(split_columns(wide, mp), std::invalid_argument);
}

TEST(Elementwise, JoinColumnsIsTheAdjointOfSplitColumns) {
  // The backward of the split is the join: <split(x), g> = <x, join(g)> for every x and g
  // (a copy: the finite-difference check of a linear map, exactly).
  test::Rng rng(85);
  const std::vector<std::int64_t> widths = {4, 1, 6};
  const std::int64_t R = 5, W = 11;
  Tensor x = rng.randn({R, W}), joined = Tensor::empty({R, W}, DType::F64);
  std::vector<Tensor> split = parts_of(rng, R, widths, DType::F64), g = parts_of(rng, R, widths, DType::F64);
  std::vector<Tensor*> sp;
  std::vector<const Tensor*> gp;
  for (std::size_t k = 0; k < widths.size(); ++k) {
    sp.push_back(&split[k]);
    gp.push_back(&g[k]);
  }
  split_columns(x, sp);
  join_columns(gp, joined);
  double lhs = 0;
  for (std::size_t k = 0; k < widths.size(); ++k) lhs += test::dot(split[k], g[k].to_vector());
  EXPECT_NEAR(lhs, test::dot(x, joined.to_vector()), 1e-12 * (1 + std::abs(lhs)));
}

TEST(Elementwise, SplitColumnsRejectsMismatches) {
  Tensor packed = Tensor::zeros({3, 5}, DType::F32);
  Tensor a = Tensor::zeros({3, 2}, DType::F32), b = Tensor::zeros({3, 2}, DType::F32);
  Tensor c = Tensor::zeros({3, 3}, DType::F32), d = Tensor::zeros({2, 3}, DType::F32);
  Tensor e = Tensor::zeros({3, 3}, DType::F64);
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{&a, &b}), std::invalid_argument);  // 4 != 5
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{&a, &d}), std::invalid_argument);  // rows
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{&a, &e}), std::invalid_argument);  // dtype
  EXPECT_THROW(split_columns(packed, std::vector<Tensor*>{}), std::invalid_argument);
  EXPECT_NO_THROW(split_columns(packed, std::vector<Tensor*>{&a, &c}));
  EXPECT_THROW(join_columns(std::vector<const Tensor*>{&a, &b}, packed), std::invalid_argument);
}

}  // namespace
}  // namespace nsatron
