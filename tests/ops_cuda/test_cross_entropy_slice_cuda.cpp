// CUDA vocabulary-slice cross entropy (cross_entropy_slice_stats / _combine / _grad) against
// the CPU on fresh random inputs: fp32 and bf16 logits, one row, slices of width 1, 7, 1000 and
// 16768, an unaligned view, a custom ignore index; the slice's statistics combined with
// another slice's as the all-gather would lay them out; the same bits on a second call. Then
// three uneven slices composed (stats, laid end to end, combined) against cross_entropy_fused
// on the whole logits on the GPU, and bad targets reported through cuda::check_id_errors().
// cross_entropy_slice_loss (the running fp64 loss total) against the CPU's ordered sum.
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "tests/ops_cuda/cuda_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

// A device tensor of `shape` in dtype `dt` holding `host` (CPU fp32), viewed one element past
// a 16-byte boundary when `unaligned` (so the kernels take their scalar path).
Tensor device_logits(const Tensor& host, DType dt, bool unaligned) {
  if (!unaligned) return test::on_gpu(host, dt);
  const std::int64_t n = host.numel();
  std::vector<double> v = host.to_vector();
  v.insert(v.begin(), 0.0);
  Tensor big = test::on_gpu(Tensor::from_vector(v, {n + 1}, DType::F32), dt);
  return big.slice0(1, n + 1).view(host.shape());
}

Tensor f64_on_gpu(const std::vector<double>& v) {
  return Tensor::from_vector(v, {std::int64_t(v.size())}, DType::F64).to(Device::CUDA);
}

// |got - want| <= rtol |want| + atol, element by element.
void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                     double atol, const std::string& what) {
  test::expect_close(got, want, rtol, atol, what);
}

struct SliceCase {
  std::int64_t N, V, vocab_start;
  std::int32_t ignore_index;
  bool unaligned;
};
const SliceCase kSliceCases[] = {
    {1, 1, 0, -100, false},      {1, 7, 3, -100, false},       {5, 7, 0, -100, false},
    {3, 1000, 1000, -100, false}, {37, 1000, 17, 5, false},    {2, 16768, 33536, -100, false},
    {4, 16768, 0, -100, true},   {6, 1000, 2000, -100, true},  {1, 16768, 7, -100, false}};

TEST(CrossEntropySliceCuda, OpsMatchCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (const SliceCase& c : kSliceCases) {
      const std::string tag = test::dt_name(dt) + " N=" + std::to_string(c.N) + " V_r=" +
                              std::to_string(c.V) + " start=" + std::to_string(c.vocab_start) +
                              (c.unaligned ? " unaligned" : "");
      const std::int64_t N = c.N, V = c.V, total = c.vocab_start + V + 11;
      // Targets: in the slice, elsewhere in the vocabulary, or ignored; the slice's last and
      // first columns, and an ignored row, where the rows allow.
      std::vector<std::int32_t> t(static_cast<std::size_t>(N));
      for (auto& x : t) {
        const double u = rng.uniform(0, 1);
        x = u < 0.2 ? c.ignore_index
                    : std::int32_t(u < 0.6 ? c.vocab_start + rng.integer(0, V - 1) : rng.integer(0, total - 1));
      }
      t[0] = std::int32_t(c.vocab_start + V - 1);
      if (N > 1) t[1] = std::int32_t(c.vocab_start);
      if (N > 2) t[2] = c.ignore_index;
      test::DeviceIds ids(t);

      Tensor z = rng.randn({N, V}, DType::F32, 2.0);
      Tensor zr = test::rounded_f32(z, dt);
      Tensor zd = device_logits(z, dt, c.unaligned);

      // This slice's statistics: the row maxima and the target logits exact, the sums of fp32
      // exponentials (the CPU's in fp64) to fp32 rounding.
      Tensor st_cpu = Tensor::empty({3 * N}, DType::F64);
      cross_entropy_slice_stats(zr, t, c.vocab_start, c.ignore_index, st_cpu, total);
      Tensor st_gpu = Tensor::empty({3 * N}, DType::F64, Device::CUDA);
      cross_entropy_slice_stats(zd, ids.span(), c.vocab_start, c.ignore_index, st_gpu, total);
      const auto sc = st_cpu.to_vector(), sg = st_gpu.to_vector();
      auto part = [N](const std::vector<double>& v, int k) {
        return std::vector<double>(v.begin() + k * N, v.begin() + (k + 1) * N);
      };
      EXPECT_EQ(part(sg, 0), part(sc, 0)) << "row maxima " << tag;
      expect_near_all(part(sg, 1), part(sc, 1), test::kRtolF32, 0.0, "sums " + tag);
      EXPECT_EQ(part(sg, 2), part(sc, 2)) << "target logits " << tag;
      Tensor st_gpu2 = Tensor::empty({3 * N}, DType::F64, Device::CUDA);
      cross_entropy_slice_stats(zd, ids.span(), c.vocab_start, c.ignore_index, st_gpu2, total);
      EXPECT_TRUE(test::same_bits_any(st_gpu, st_gpu2)) << "stats bits " << tag;

      // Another rank's statistics (a max above or below this slice's, an fp32 value as every
      // maximum of fp32 / bf16 logits is; the target where this slice lacks it), laid after
      // this slice's as the all-gather would, combined on both devices from the same numbers.
      std::vector<double> both = sg;
      both.resize(std::size_t(6 * N));
      for (std::int64_t n = 0; n < N; ++n) {
        both[std::size_t(3 * N + n)] = double(float(sc[std::size_t(n)] + rng.uniform(-3, 3)));
        both[std::size_t(4 * N + n)] = rng.uniform(0.5, 4);
        const std::int64_t col = t[std::size_t(n)] - c.vocab_start;
        const bool elsewhere = t[std::size_t(n)] != c.ignore_index && (col < 0 || col >= V);
        both[std::size_t(5 * N + n)] = elsewhere ? rng.normal(2.0) : 0.0;
      }
      Tensor gmax = Tensor::empty({N}, DType::F64), gsum = Tensor::empty({2 * N}, DType::F64);
      cross_entropy_slice_combine(Tensor::from_vector(both, {6 * N}, DType::F64), gmax, gsum);
      Tensor gmax_d = Tensor::empty({N}, DType::F64, Device::CUDA), gsum_d = Tensor::empty({2 * N}, DType::F64, Device::CUDA);
      cross_entropy_slice_combine(f64_on_gpu(both), gmax_d, gsum_d);
      EXPECT_EQ(gmax_d.to_vector(), gmax.to_vector()) << "combined maxima " << tag;
      expect_near_all(gsum_d.to_vector(), gsum.to_vector(), 1e-14, 0.0, "combined sums " + tag);

      // Gradient (in place) and row losses.
      const double scale = 1.3 / double(N);
      Tensor dz = zr.clone(), l_cpu = Tensor::empty({N}, DType::F64);
      cross_entropy_slice_grad(dz, t, c.vocab_start, c.ignore_index, gmax, gsum, scale, l_cpu);
      Tensor dzd = zd.clone(), l_gpu = Tensor::empty({N}, DType::F64, Device::CUDA);
      cross_entropy_slice_grad(dzd, ids.span(), c.vocab_start, c.ignore_index, gmax_d, gsum_d, scale, l_gpu);
      test::expect_close_rms(dzd, dz, test::rtol_for(dt), "dlogits " + tag);
      expect_near_all(l_gpu.to_vector(), l_cpu.to_vector(), 1e-12, 1e-12, "row_loss " + tag);
      const auto dv = dzd.to_vector(), lv = l_gpu.to_vector();
      for (std::int64_t n = 0; n < N; ++n) {
        if (t[std::size_t(n)] != c.ignore_index) continue;
        EXPECT_EQ(lv[std::size_t(n)], 0.0) << "ignored row " << n << " " << tag;
        for (std::int64_t v = 0; v < V; ++v)
          if (dv[std::size_t(n * V + v)] != 0.0) {
            ADD_FAILURE() << "ignored row " << n << " column " << v << ": " << dv[std::size_t(n * V + v)] << " " << tag;
            break;
          }
      }
      Tensor dzd2 = zd.clone(), l_gpu2 = Tensor::empty({N}, DType::F64, Device::CUDA);
      cross_entropy_slice_grad(dzd2, ids.span(), c.vocab_start, c.ignore_index, gmax_d, gsum_d, scale, l_gpu2);
      EXPECT_TRUE(test::same_bits_any(dzd, dzd2)) << "dlogits bits " << tag;
      EXPECT_TRUE(test::same_bits_any(l_gpu, l_gpu2)) << "row_loss bits " << tag;
    }
  cuda::check_id_errors();  // nothing recorded
}


TEST(CrossEntropySliceCuda, SlicesComposeToTheFusedCrossEntropy) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const double dloss = 1.7;
  struct Case {
    std::int64_t N, V;
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : {Case{1, 37}, Case{37, 50}, Case{5, 1000}, Case{9, 50304}, Case{64, 4099}}) {
      const std::int64_t N = c.N, V = c.V;
      const std::string tag = test::dt_name(dt) + " N=" + std::to_string(N) + " V=" + std::to_string(V);
      std::vector<std::int32_t> t(static_cast<std::size_t>(N));
      for (auto& x : t) x = rng.uniform(0, 1) < 0.2 ? -100 : std::int32_t(rng.integer(0, V - 1));
      t[0] = std::int32_t(V - 1);
      test::DeviceIds ids(t);
      const double D = double(count_targets(t, -100));
      Tensor z = test::rounded_f32(rng.randn({N, V}, DType::F32, 3.0), dt);

      // Reference: the whole logits on the GPU.
      Tensor whole = test::on_gpu(z, dt);
      Tensor ref_loss = Tensor::zeros({1}, DType::F32, Device::CUDA);
      cross_entropy_fused(whole, ids.span(), ref_loss, dloss, {.denominator = D});

      const std::int64_t bounds[] = {0, V / 5, V / 5 + V / 2, V};  // uneven
      std::vector<Tensor> parts;
      Tensor gathered = Tensor::empty({3 * 3 * N}, DType::F64, Device::CUDA);  // the all-gather's layout
      for (int r = 0; r < 3; ++r) {
        parts.push_back(test::on_gpu(test::columns(z, bounds[r], bounds[r + 1]), dt));
        Tensor own = gathered.slice0(3 * N * r, 3 * N * (r + 1));
        cross_entropy_slice_stats(parts.back(), ids.span(), bounds[r], -100, own, V);
      }
      Tensor row_max = Tensor::empty({N}, DType::F64, Device::CUDA), sums = Tensor::empty({2 * N}, DType::F64, Device::CUDA);
      cross_entropy_slice_combine(gathered, row_max, sums);
      std::vector<double> grad(std::size_t(N * V)), first_loss;
      double loss = 0;
      for (int r = 0; r < 3; ++r) {
        Tensor row_loss = Tensor::empty({N}, DType::F64, Device::CUDA);
        cross_entropy_slice_grad(parts[std::size_t(r)], ids.span(), bounds[r], -100, row_max, sums, dloss / D,
                                 row_loss);
        const auto lv = row_loss.to_vector();
        if (r == 0) {
          first_loss = lv;
          for (double l : lv) loss += l;
        } else {
          EXPECT_EQ(lv, first_loss) << "every slice gets the same row losses, " << tag;
        }
        const auto gv = parts[std::size_t(r)].to_vector();
        const std::int64_t w = bounds[r + 1] - bounds[r];
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t k = 0; k < w; ++k) grad[std::size_t(n * V + bounds[r] + k)] = gv[std::size_t(n * w + k)];
      }
      loss /= D;
      const double want = ref_loss.to_vector()[0];
      EXPECT_NEAR(loss, want, test::kRtolF32 * std::abs(want)) << "loss " << tag;
      test::expect_close_rms(grad, whole.to_vector(), test::rtol_for(dt), "dlogits " + tag);
    }
  cuda::check_id_errors();
}

TEST(CrossEntropySliceCuda, LossMatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (std::int64_t N : {1, 37, 1024, 4097}) {
    const std::vector<double> rows = rng.normals(std::size_t(N));
    Tensor host_rows = Tensor::from_vector(rows, {N}, DType::F64);
    Tensor want = Tensor::from_vector({0.25}, {1}, DType::F64);
    cross_entropy_slice_loss(host_rows, 7.0, want);
    cross_entropy_slice_loss(host_rows, 7.0, want);  // a running total over two chunks
    Tensor dev_rows = host_rows.to(Device::CUDA), got = f64_on_gpu({0.25});
    cross_entropy_slice_loss(dev_rows, 7.0, got);
    cross_entropy_slice_loss(dev_rows, 7.0, got);
    // fp64 sums of N terms in another (fixed) order.
    EXPECT_NEAR(got.to_vector()[0], want.to_vector()[0], 1e-13 * double(N)) << "N = " << N;
    Tensor again = f64_on_gpu({0.25});
    cross_entropy_slice_loss(dev_rows, 7.0, again);
    cross_entropy_slice_loss(dev_rows, 7.0, again);
    EXPECT_TRUE(test::same_bits_any(again, got)) << "N = " << N;
    cross_entropy_slice_loss(dev_rows, 0.0, again);  // D = 0: nothing added
    EXPECT_TRUE(test::same_bits_any(again, got)) << "N = " << N;
  }
}

TEST(CrossEntropySliceCuda, ReportsBadTargets) {
  NSATRON_SKIP_WITHOUT_GPU();
  Tensor z = Tensor::zeros({3, 5}, DType::F32, Device::CUDA);
  Tensor m = Tensor::zeros({3}, DType::F64, Device::CUDA);
  Tensor s = Tensor::zeros({6}, DType::F64, Device::CUDA), l = Tensor::zeros({3}, DType::F64, Device::CUDA);
  auto message = [] {
    try {
      cuda::check_id_errors();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("nothing reported");
  };
  Tensor st = Tensor::zeros({9}, DType::F64, Device::CUDA);
  {  // A negative target: its row's sum and target logit become NaN, and so its combined sums.
    test::DeviceIds ids(std::vector<std::int32_t>{1, -7, 2});
    cross_entropy_slice_stats(z, ids.span(), 0, -100, st);
    const auto sv = st.to_vector();
    EXPECT_TRUE(std::isnan(sv[4]) && std::isnan(sv[7]));
    EXPECT_FALSE(std::isnan(sv[3]) || std::isnan(sv[5]) || std::isnan(sv[1]));
    cross_entropy_slice_combine(st, m, s);
    const auto cv = s.to_vector();
    EXPECT_TRUE(std::isnan(cv[1]) && std::isnan(cv[4]));
    EXPECT_FALSE(std::isnan(cv[0]) || std::isnan(cv[2]));
    const std::string msg = message();
    EXPECT_NE(msg.find("cross_entropy_slice_stats"), std::string::npos) << msg;
    EXPECT_NE(msg.find("target -7 at position 1"), std::string::npos) << msg;
    EXPECT_EQ(message(), "nothing reported");  // cleared
  }
  {  // Beyond the vocabulary, when its size is given.
    test::DeviceIds ids(std::vector<std::int32_t>{1, -100, 12});
    cross_entropy_slice_stats(z, ids.span(), 5, -100, st, 10);
    EXPECT_TRUE(std::isnan(st.to_vector()[5]));
    const std::string msg = message();
    EXPECT_NE(msg.find("target 12 at position 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 10)"), std::string::npos) << msg;
  }
  {  // The gradient: a negative target makes its row NaN.
    test::DeviceIds ids(std::vector<std::int32_t>{1, -3, -100});
    Tensor sums = f64_on_gpu({5.0, 5.0, 5.0, 0.0, 0.0, 0.0});
    cross_entropy_slice_grad(z, ids.span(), 0, -100, m, sums, 1.0, l);
    const auto lv = l.to_vector(), g = z.to_vector();
    EXPECT_TRUE(std::isnan(lv[1]));
    EXPECT_EQ(lv[2], 0.0);
    for (int v = 0; v < 5; ++v) {
      EXPECT_TRUE(std::isnan(g[std::size_t(5 + v)]));
      EXPECT_EQ(g[std::size_t(10 + v)], 0.0);
    }
    const std::string msg = message();
    EXPECT_NE(msg.find("cross_entropy_slice_grad"), std::string::npos) << msg;
    EXPECT_NE(msg.find("target -3 at position 1"), std::string::npos) << msg;
  }
}

TEST(CrossEntropySliceCuda, ChecksDtypesAndDevices) {
  NSATRON_SKIP_WITHOUT_GPU();
  Tensor z = Tensor::zeros({2, 5}, DType::BF16, Device::CUDA);
  Tensor m32 = Tensor::zeros({2}, DType::F32, Device::CUDA);
  Tensor m_cpu = Tensor::zeros({2}, DType::F64);
  Tensor st = Tensor::zeros({6}, DType::F64, Device::CUDA), st32 = Tensor::zeros({6}, DType::F32, Device::CUDA);
  Tensor st_cpu = Tensor::zeros({6}, DType::F64), m = Tensor::zeros({2}, DType::F64, Device::CUDA);
  Tensor s = Tensor::zeros({4}, DType::F64, Device::CUDA);
  test::DeviceIds ids(std::vector<std::int32_t>{1, 2});
  EXPECT_THROW(cross_entropy_slice_stats(z, ids.span(), 0, -100, st32), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_stats(z, ids.span(), 0, -100, st_cpu), std::invalid_argument);
  EXPECT_NO_THROW(cross_entropy_slice_stats(z, ids.span(), 0, -100, st));
  Tensor z64 = Tensor::zeros({2, 5}, DType::F64, Device::CUDA);
  EXPECT_THROW(cross_entropy_slice_stats(z64, ids.span(), 0, -100, st), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_combine(st, m32, s), std::invalid_argument);
  EXPECT_THROW(cross_entropy_slice_combine(st, m_cpu, s), std::invalid_argument);
  EXPECT_NO_THROW(cross_entropy_slice_combine(st, m, s));
}

}  // namespace
}  // namespace nsatron
