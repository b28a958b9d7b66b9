// CUDA SwiGLU against the CPU: fused layout [.., 2F] and split layout, forward and backward,
// the backward in place over its input, fp32 and bf16, widths 1, odd, not a multiple of the
// vector width; large |a| (the sigmoid must neither overflow nor give NaN).
#include "core/ops/swiglu.h"
#include "tests/ops_cuda/cuda_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

const Shape kOut[] = {{1, 1}, {1, 7}, {3, 5, 9}, {17, 1536}, {33, 1000}, {2, 4097}};

TEST(SwiGLUCuda, FusedMatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& so : kOut) {
      const std::string tag = test::dt_name(dt) + " out " + shape_str(so);
      Shape su = so;
      su.back() *= 2;
      Tensor u = rng.randn(su, DType::F32, 3.0);
      {  // a few large gates
        float* p = u.data<float>();
        p[0] = 120.f;
        if (u.numel() > 2) p[1] = -120.f;
      }
      Tensor ur = test::rounded_f32(u, dt);
      Tensor out = Tensor::empty(so, DType::F32);
      swiglu_forward(ur, out);
      Tensor ud = test::on_gpu(u, dt), outd = Tensor::empty(so, dt, Device::CUDA);
      swiglu_forward(ud, outd);
      test::expect_close_rms(outd, out, test::rtol_for(dt), "out " + tag);

      Tensor dout = rng.randn(so, DType::F32);
      Tensor doutr = test::rounded_f32(dout, dt);
      Tensor du = Tensor::empty(su, DType::F32);
      swiglu_backward(doutr, ur, du);
      Tensor doutd = test::on_gpu(dout, dt);
      swiglu_backward(doutd, ud, ud);  // du written over u
      test::expect_close_rms(ud, du, test::rtol_for(dt), "du (in place) " + tag);
    }
}

TEST(SwiGLUCuda, SplitMatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : kOut) {
      const std::string tag = test::dt_name(dt) + " " + shape_str(s);
      Tensor a = rng.randn(s, DType::F32, 3.0), b = rng.randn(s, DType::F32);
      Tensor ar = test::rounded_f32(a, dt), br = test::rounded_f32(b, dt);
      Tensor out = Tensor::empty(s, DType::F32);
      swiglu_forward(ar, br, out);
      Tensor ad = test::on_gpu(a, dt), bd = test::on_gpu(b, dt);
      Tensor outd = Tensor::empty(s, dt, Device::CUDA);
      swiglu_forward(ad, bd, outd);
      test::expect_close_rms(outd, out, test::rtol_for(dt), "out " + tag);

      Tensor dout = rng.randn(s, DType::F32);
      Tensor da = Tensor::empty(s, DType::F32), db = Tensor::empty(s, DType::F32);
      swiglu_backward(test::rounded_f32(dout, dt), ar, br, da, db);
      Tensor doutd = test::on_gpu(dout, dt);
      Tensor dad = Tensor::empty(s, dt, Device::CUDA), dbd = Tensor::empty(s, dt, Device::CUDA);
      swiglu_backward(doutd, ad, bd, dad, dbd);
      test::expect_close_rms(dad, da, test::rtol_for(dt), "da " + tag);
      test::expect_close_rms(dbd, db, test::rtol_for(dt), "db " + tag);
      swiglu_backward(doutd, ad, bd, ad, bd);  // in place
      test::expect_close_rms(ad, da, test::rtol_for(dt), "da in place " + tag);
      test::expect_close_rms(bd, db, test::rtol_for(dt), "db in place " + tag);
    }
}

}  // namespace
}  // namespace nsatron
