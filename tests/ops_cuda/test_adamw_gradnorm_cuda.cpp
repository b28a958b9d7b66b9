// CUDA AdamW and gradient norm against the CPU.
// AdamW: fp32 master weights and moments over several segments (decay on and off, empty
// ones, odd sizes, more runs than one launch carries), several steps, a grad scale; the bf16
// (and fp32) compute copy written in the same pass; clipping by a norm in device memory,
// including a non-finite norm that skips the step; the 16-byte path (4 elements per thread,
// runs ending inside a vector) and the one-element path (buffers not 16-byte aligned) give
// the same bits.
// Norm: many buffers of odd sizes (an empty one, fp32 and bf16), fp32/fp64 results, the
// same bits on a second run, scale_ and clip_by_global_norm_ with the norm on the device.
#include <cmath>
#include <limits>

#include "core/ops/adamw.h"
#include "core/ops/grad_norm.h"
#include "tests/ops_cuda/cuda_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

std::vector<ParamSegment> make_segments(Rng& rng, std::int64_t count, std::int64_t& total) {
  std::vector<ParamSegment> segs;
  total = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t n = i % 7 == 3 ? 0 : rng.integer(1, 3000);
    segs.push_back({total, n, i % 3 != 1});
    total += n;
  }
  return segs;
}

TEST(AdamWCuda, MatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const AdamWHyper hp{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (std::int64_t nseg : {1, 5, 600}) {  // 600 segments: about 400 runs, two launches
    std::int64_t n = 0;
    const auto segs = make_segments(rng, nseg, n);
    const std::string tag = std::to_string(nseg) + " segments, n=" + std::to_string(n);
    Tensor p = rng.randn({n}, DType::F32), m = Tensor::zeros({n}, DType::F32);
    Tensor v = Tensor::zeros({n}, DType::F32);
    Tensor pd = p.to(Device::CUDA), md = m.to(Device::CUDA), vd = v.to(Device::CUDA);
    Tensor copy = Tensor::empty({n}, DType::BF16, Device::CUDA);
    for (std::int64_t step = 1; step <= 3; ++step) {
      Tensor g = rng.randn({n}, DType::F32, 0.1);
      adamw_step(p, g, m, v, segs, hp, step, 0.7);
      Tensor gd = g.to(Device::CUDA);
      adamw_step(pd, gd, md, vd, segs, hp, step, 0.7, {.compute_copy = &copy});
      const std::string st = tag + " step " + std::to_string(step);
      test::expect_close_rms(pd, p, test::kRtolF32, "param " + st);
      test::expect_close_rms(md, m, test::kRtolF32, "m " + st);
      test::expect_close_rms(vd, v, test::kRtolF32, "v " + st);
      EXPECT_TRUE(test::same_bits_any(gd, g)) << "grad untouched " << st;
      // The copy is the updated fp32 weights rounded to bf16, element for element.
      const Tensor want = pd.to(Device::CPU).to_dtype(DType::BF16);
      EXPECT_TRUE(test::same_bits_any(copy, want)) << "bf16 copy " << st;
    }
  }
}

// The same update through 16-byte accesses (buffers from element 0 of an allocation) and
// element by element (the same buffers one element further on, not 16-byte aligned): the
// same bits for p, m, v and the bf16 copy. Segments of odd sizes, so runs end inside vectors.
TEST(AdamWCuda, VectorAndElementPathsGiveSameBits) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const AdamWHyper hp{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::int64_t n = 0;
  const auto segs = make_segments(rng, 41, n);
  auto run = [&](std::int64_t shift, Tensor& p_out, Tensor& m_out, Tensor& v_out, Tensor& c_out) {
    Rng r(seed + 1);  // the same inputs for both paths
    Tensor p = Tensor::zeros({n + shift}, DType::F32, Device::CUDA), m = p.clone(), v = p.clone();
    Tensor g = p.clone(), copy = Tensor::zeros({n + shift}, DType::BF16, Device::CUDA);
    Tensor ps = p.slice0(shift, n + shift), ms = m.slice0(shift, n + shift), vs = v.slice0(shift, n + shift);
    Tensor gs = g.slice0(shift, n + shift), cs = copy.slice0(shift, n + shift);
    ps.copy_from(r.randn({n}, DType::F32));
    for (std::int64_t step = 1; step <= 2; ++step) {
      gs.copy_from(r.randn({n}, DType::F32, 0.1));
      adamw_step(ps, gs, ms, vs, segs, hp, step, 0.7, {.compute_copy = &cs});
    }
    p_out = ps.clone();
    m_out = ms.clone();
    v_out = vs.clone();
    c_out = cs.clone();
  };
  Tensor p0, m0, v0, c0, p1, m1, v1, c1;
  run(0, p0, m0, v0, c0);
  run(1, p1, m1, v1, c1);
  EXPECT_TRUE(test::same_bits_any(p0, p1)) << "param";
  EXPECT_TRUE(test::same_bits_any(m0, m1)) << "m";
  EXPECT_TRUE(test::same_bits_any(v0, v1)) << "v";
  EXPECT_TRUE(test::same_bits_any(c0, c1)) << "bf16 copy";
}

TEST(AdamWCuda, ClipsByDeviceNorm) {
  NSATRON_SKIP_WITHOUT_GPU();
  Rng rng(test::fresh_seed());
  const AdamWHyper hp{};
  const std::int64_t n = 1000;
  const std::vector<ParamSegment> segs = {{0, 600, true}, {600, 400, false}};
  Tensor p = rng.randn({n}, DType::F32), g = rng.randn({n}, DType::F32);
  Tensor m = Tensor::zeros({n}, DType::F32), v = Tensor::zeros({n}, DType::F32);
  Tensor pd = p.to(Device::CUDA), gd = g.to(Device::CUDA), md = m.to(Device::CUDA),
         vd = v.to(Device::CUDA);
  const std::vector<Tensor> bufs = {gd};
  Tensor norm = Tensor::empty({1}, DType::F32, Device::CUDA);
  global_norm(bufs, norm);
  const double max_norm = 0.5;
  const double coef = clip_coefficient(norm.to_vector()[0], max_norm);
  ASSERT_LT(coef, 1.0);
  Tensor copy = Tensor::empty({n}, DType::F32, Device::CUDA);
  adamw_step(pd, gd, md, vd, segs, hp, 1, 1.0,
             {.compute_copy = &copy, .clip_norm = &norm, .max_norm = max_norm});
  adamw_step(p, g, m, v, segs, hp, 1, coef);
  test::expect_close_rms(pd, p, test::kRtolF32, "param (clipped)");
  test::expect_close_rms(md, m, test::kRtolF32, "m (clipped)");
  EXPECT_TRUE(test::same_bits_any(copy, pd)) << "fp32 copy";
  // A non-finite norm: nothing changes.
  Tensor bad = Tensor::from_vector({std::numeric_limits<double>::infinity()}, {1}, DType::F32)
                   .to(Device::CUDA);
  const Tensor p0 = pd.clone(), m0 = md.clone(), v0 = vd.clone();
  adamw_step(pd, gd, md, vd, segs, hp, 2, 1.0, {.clip_norm = &bad, .max_norm = max_norm});
  EXPECT_TRUE(test::same_bits_any(pd, p0));
  EXPECT_TRUE(test::same_bits_any(md, m0));
  EXPECT_TRUE(test::same_bits_any(vd, v0));
}

TEST(GradNormCuda, MatchesCpuAndIsDeterministic) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    std::vector<Tensor> host, dev;
    for (std::int64_t n : {std::int64_t(1), std::int64_t(0), std::int64_t(4095),
                           std::int64_t(4096), std::int64_t(4097), std::int64_t(123457),
                           std::int64_t(3 * 4096 + 1)}) {
      Tensor t = rng.randn({n}, DType::F32, 0.01);
      host.push_back(test::rounded_f32(t, dt));
      dev.push_back(test::on_gpu(t, dt));
    }
    for (int i = 0; i < 70; ++i) {  // more buffers than one launch takes
      Tensor t = rng.randn({rng.integer(1, 9000)}, DType::F32);
      host.push_back(test::rounded_f32(t, dt));
      dev.push_back(test::on_gpu(t, dt));
    }
    const std::string tag = test::dt_name(dt);
    Tensor want = Tensor::empty({1}, DType::F64), want_ss = Tensor::empty({1}, DType::F64);
    global_norm(host, want);
    sum_squares(host, want_ss);
    Tensor got = Tensor::empty({1}, DType::F64, Device::CUDA), got2 = got.clone();
    Tensor got_ss = got.clone(), got32 = Tensor::empty({1}, DType::F32, Device::CUDA);
    global_norm(dev, got);
    global_norm(dev, got2);
    sum_squares(dev, got_ss);
    global_norm(dev, got32);
    // Squares of fp32/bf16 values are exact in fp64: only the summation order differs.
    test::expect_close_rms(got, want, 1e-12, "norm " + tag);
    test::expect_close_rms(got_ss, want_ss, 1e-12, "sum of squares " + tag);
    test::expect_close_rms(got32, want, 1e-7, "norm into fp32 " + tag);
    EXPECT_TRUE(test::same_bits_any(got, got2)) << "norm bits " << tag;

    // Clipping with the norm on the device, and scale_.
    const double max_norm = 0.5 * want.to_vector()[0];
    clip_by_global_norm_(host, want, max_norm);
    clip_by_global_norm_(dev, got, max_norm);
    for (std::size_t i = 0; i < host.size(); ++i)
      test::expect_close_rms(dev[i], host[i], test::rtol_for(dt),
                             "clipped " + tag + " buffer " + std::to_string(i));
    scale_(host, 3.0);
    scale_(dev, 3.0);
    for (std::size_t i = 0; i < host.size(); ++i)
      test::expect_close_rms(dev[i], host[i], test::rtol_for(dt),
                             "scaled " + tag + " buffer " + std::to_string(i));
    // A norm that needs no clipping leaves the buffers as they are.
    std::vector<Tensor> before;
    for (const Tensor& t : dev) before.push_back(t.clone());
    Tensor small = Tensor::from_vector({1e-3}, {1}, DType::F32).to(Device::CUDA);
    clip_by_global_norm_(dev, small, 1.0);
    for (std::size_t i = 0; i < dev.size(); ++i) EXPECT_TRUE(test::same_bits_any(dev[i], before[i]));
  }
}

}  // namespace
}  // namespace nsatron
