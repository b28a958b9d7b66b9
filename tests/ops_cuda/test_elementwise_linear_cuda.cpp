// CUDA add / add_ and the linear layer's bias kernels against the CPU: fp32 and bf16, sizes
// 1, odd, not a multiple of the vector width, unaligned views, aliasing (out = a, out = b);
// the bias gradient accumulating in fp32 from bf16 rows, and its bits on a second run.
// regroup_rows and zero_columns: the CPU's bits.
// split_columns / join_columns: the same bits as the CPU for every unit width the kernel picks
// (odd widths, zero widths, unaligned views, the 125M model's projection), also with grouped,
// padded packed rows (the pad never written). Linear with padded y / dy rows (y_pitch,
// dy_pitch): the CPU's values, the pad of y untouched, the pad of dy (NaN) unread.
// cuda::gemm_strided_batched: each product of the batch as cuda::gemm computes it alone.
// cuda::sum_in_order (the tensor-parallel sums on the copy engines): the bits of the CPU's fp32
// sums left to right, rounded once, for 1 to 8 inputs, unaligned views, out = an input, a grid
// of 3 blocks.
#include "core/ops/elementwise.h"
#include "core/ops/linear.h"
#include "core/ops/matmul.h"
#include "tests/ops_cuda/cuda_test_util.h"

namespace nsatron {
namespace {

using test::Rng;

TEST(ElementwiseCuda, AddMatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (std::int64_t n : {1, 7, 8, 4097, (1 << 20) + 3}) {
      const std::string tag = test::dt_name(dt) + " n=" + std::to_string(n);
      // One extra element so that the views starting at 1 are not 16-byte aligned.
      Tensor a = rng.randn({n + 1}, DType::F32), b = rng.randn({n + 1}, DType::F32);
      Tensor ar = test::rounded_f32(a, dt), br = test::rounded_f32(b, dt);
      Tensor want = Tensor::empty({n + 1}, DType::F32);
      add(ar, br, want);
      Tensor ad = test::on_gpu(a, dt), bd = test::on_gpu(b, dt);
      Tensor out = Tensor::empty({n + 1}, dt, Device::CUDA);
      add(ad, bd, out);
      test::expect_close_rms(out, want, test::rtol_for(dt), "add " + tag);
      // Unaligned views.
      Tensor wv = want.slice0(1, n + 1);
      Tensor ov = Tensor::empty({n}, dt, Device::CUDA);
      add(ad.slice0(1, n + 1), bd.slice0(1, n + 1), ov);
      test::expect_close_rms(ov, wv, test::rtol_for(dt), "add unaligned " + tag);
      // out = b, then acc += x (add_) with acc = a.
      Tensor b2 = bd.clone();
      add(ad, b2, b2);
      test::expect_close_rms(b2, want, test::rtol_for(dt), "add into b " + tag);
      Tensor acc = ad.clone();
      add_(acc, bd);
      test::expect_close_rms(acc, want, test::rtol_for(dt), "add_ " + tag);
      Tensor accv = ad.slice0(1, n + 1);
      add_(accv, bd.slice0(1, n + 1));
      test::expect_close_rms(accv, wv, test::rtol_for(dt), "add_ unaligned " + tag);
    }
}

TEST(ElementwiseCuda, SumInOrderMatchesCpuBitForBit) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (int count : {1, 2, 3, 8})
      for (std::int64_t n : {1, 7, 8, 4097, (1 << 20) + 3})
        for (std::int64_t skip : {0, 1}) {  // skip 1: views one element in (not 16-byte aligned)
          const std::string tag = test::dt_name(dt) + " count=" + std::to_string(count) + " n=" + std::to_string(n) +
                                  " skip=" + std::to_string(skip);
          std::vector<Tensor> dev;
          std::vector<const void*> inputs;
          Tensor want = Tensor::zeros({n}, DType::F32);
          for (int k = 0; k < count; ++k) {
            // Mixed scales, so that the order of the additions shows in the rounding.
            Tensor x = rng.randn({n + skip}, DType::F32).to_dtype(dt);
            Tensor xf = x.slice0(skip, n + skip).to_dtype(DType::F32);
            if (k == 0)
              want.copy_from(xf);
            else
              add_(want, xf);  // the CPU's fp32 sum, left to right
            dev.push_back(x.to(Device::CUDA).slice0(skip, n + skip));
            inputs.push_back(dev.back().raw());
          }
          Tensor out = Tensor::empty({n + skip}, dt, Device::CUDA).slice0(skip, n + skip);
          cuda::sum_in_order(dt, out.raw(), inputs, n);
          EXPECT_TRUE(test::same_bits_any(out, want.to_dtype(dt))) << tag;
          // In 3 blocks: the grid-stride loop's later rounds (the copy-engine sums' bounded grid).
          Tensor out3 = Tensor::empty({n}, dt, Device::CUDA);
          cuda::sum_in_order(dt, out3.raw(), inputs, n, nullptr, 3);
          EXPECT_TRUE(test::same_bits_any(out3, want.to_dtype(dt))) << tag << " in 3 blocks";
          if (count == 2) {  // the bits of add
            Tensor sum = Tensor::empty({n}, dt, Device::CUDA);
            add(dev[0], dev[1], sum);
            EXPECT_TRUE(test::same_bits_any(out, sum)) << tag << " against add";
          }
          // In place into the last input.
          Tensor& last = dev.back();
          cuda::sum_in_order(dt, last.raw(), inputs, n);
          EXPECT_TRUE(test::same_bits_any(last, want.to_dtype(dt))) << tag << " in place";
        }
  std::vector<const void*> none;
  EXPECT_THROW(cuda::sum_in_order(DType::F32, nullptr, none, 1), std::invalid_argument);
}

TEST(ElementwiseCuda, SplitAndJoinColumnsMatchCpuBitForBit) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  struct Case { std::int64_t R; std::vector<std::int64_t> widths; std::int64_t skip; };
  // skip: the packed rows start this many elements into their buffer (unaligned views).
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : {Case{1, {1}, 0}, Case{7, {3, 0, 5}, 1}, Case{37, {8, 8, 16}, 0}, Case{37, {8, 8, 16}, 2},
                          Case{1000, {7, 1, 2, 9, 4}, 0}, Case{4097, {384, 64, 64, 64, 64, 64, 64, 18}, 0},
                          Case{33, {32, 64, 64}, 0}, Case{5, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, 3}}) {
      std::int64_t W = 0;
      for (std::int64_t w : c.widths) W += w;
      const std::string tag = test::dt_name(dt) + " R=" + std::to_string(c.R) + " W=" + std::to_string(W) +
                              " skip=" + std::to_string(c.skip);
      Tensor host = rng.randn({c.R * W + c.skip}, DType::F32).to_dtype(dt);
      Tensor packed_h = host.slice0(c.skip, c.R * W + c.skip).view({c.R, W});
      Tensor packed_d = host.to(Device::CUDA).slice0(c.skip, c.R * W + c.skip).view({c.R, W});
      std::vector<Tensor> ph, pd;
      for (std::int64_t w : c.widths) {
        ph.push_back(Tensor::empty({c.R, w}, dt));
        // Device parts one element into a buffer: unaligned unless the unit is one element.
        pd.push_back(Tensor::empty({c.R * w + c.skip}, dt, Device::CUDA).slice0(c.skip, c.R * w + c.skip).view({c.R, w}));
      }
      std::vector<Tensor*> hp, dp;
      for (std::size_t k = 0; k < c.widths.size(); ++k) {
        hp.push_back(&ph[k]);
        dp.push_back(&pd[k]);
      }
      // bf16 has no CPU arithmetic, but a copy is a copy: the CPU split works on any dtype.
      split_columns(packed_h, hp);
      split_columns(packed_d, dp);
      for (std::size_t k = 0; k < c.widths.size(); ++k)
        EXPECT_TRUE(test::same_bits_any(pd[k], ph[k])) << tag << " part " << k;
      Tensor back = Tensor::zeros({c.R, W}, dt, Device::CUDA);
      join_columns(std::vector<const Tensor*>(dp.begin(), dp.end()), back);
      EXPECT_TRUE(test::same_bits_any(back, packed_h)) << tag << " join";
    }
}

// regroup_rows (both directions) and zero_columns: the CPU's bits, for every unit width the
// kernel picks (row sizes of 1, 6 and 1536 bytes; the 125M projection's weight rows).
TEST(ElementwiseCuda, RegroupRowsAndZeroColumnsMatchCpuBitForBit) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (const std::vector<std::int64_t>& widths :
         {std::vector<std::int64_t>{1}, {3, 0, 5}, {384, 64, 64, 64, 64, 64, 64, 18}})
      for (std::int64_t G : {1, 2, 4})
        for (std::int64_t C : {1, 3, 768}) {
          std::int64_t W = 0;
          for (std::int64_t w : widths) W += w;
          const std::string tag = test::dt_name(dt) + " G=" + std::to_string(G) + " W=" + std::to_string(W) +
                                  " C=" + std::to_string(C);
          const std::int64_t R = G * W + 3;  // 3 rows past the regrouped ones
          const Tensor in_h = rng.randn({R, C}, DType::F32).to_dtype(dt);
          for (bool to_part_major : {true, false}) {
            Tensor out_h = Tensor::from_vector(std::vector<double>(std::size_t(R * C), -3.5), {R, C}, dt);
            Tensor out_d = out_h.to(Device::CUDA);
            regroup_rows(in_h, out_h, widths, G, to_part_major);
            regroup_rows(in_h.to(Device::CUDA), out_d, widths, G, to_part_major);
            EXPECT_TRUE(test::same_bits_any(out_d, out_h)) << tag << " to_part_major " << to_part_major;
          }
          Tensor z_h = in_h.clone();
          Tensor z_d = z_h.to(Device::CUDA);
          zero_columns(z_h, C / 3, C);
          zero_columns(z_d, C / 3, C);
          EXPECT_TRUE(test::same_bits_any(z_d, z_h)) << tag << " zero_columns";
        }
}

TEST(ElementwiseCuda, GroupedPaddedSplitAndJoinMatchCpuBitForBit) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const double sentinel = -3.5;
  for (DType dt : {DType::F32, DType::BF16})
    for (const std::vector<std::int64_t>& widths :
         {std::vector<std::int64_t>{1}, {3, 0, 5}, {8, 8, 16}, {7, 1, 2, 9, 4},
          {384, 64, 64, 64, 64, 64, 64, 18}})
      for (std::int64_t G : {1, 2, 4, 9})  // 9 groups of 8 parts: two raw calls
        for (std::int64_t R : {1, 37, 1000}) {
          std::int64_t W = 0;
          for (std::int64_t w : widths) W += w;
          for (std::int64_t pitch : {G * W, G * W + 1, (G * W + 63) / 64 * 64}) {
            const std::string tag = test::dt_name(dt) + " G=" + std::to_string(G) + " R=" + std::to_string(R) +
                                    " W=" + std::to_string(W) + " pitch=" + std::to_string(pitch);
            const PackedColumns layout{.groups = G, .pitch = pitch};
            Tensor packed_h = rng.randn({R, pitch}, DType::F32).to_dtype(dt);
            Tensor packed_d = packed_h.to(Device::CUDA);
            std::vector<Tensor> ph, pd;
            for (std::int64_t w : widths) {
              ph.push_back(Tensor::empty({R, G * w}, dt));
              pd.push_back(Tensor::empty({R, G * w}, dt, Device::CUDA));
            }
            std::vector<Tensor*> hp, dp;
            for (std::size_t k = 0; k < widths.size(); ++k) {
              hp.push_back(&ph[k]);
              dp.push_back(&pd[k]);
            }
            split_columns(packed_h, hp, layout);  // the CPU side, checked against a loop in tests/ops
            split_columns(packed_d, dp, layout);
            for (std::size_t k = 0; k < widths.size(); ++k)
              EXPECT_TRUE(test::same_bits_any(pd[k], ph[k])) << tag << " part " << k;
            for (bool zero_pad : {false, true}) {
              Tensor back = test::padded_columns(Tensor::zeros({R, G * W}, dt), pitch, sentinel).to(Device::CUDA);
              join_columns(std::vector<const Tensor*>(dp.begin(), dp.end()), back,
                           {.groups = G, .pitch = pitch, .zero_pad = zero_pad});
              const Tensor back_h = back.to(Device::CPU);
              EXPECT_TRUE(test::same_bits(test::columns(back_h, 0, G * W), test::columns(packed_h, 0, G * W)))
                  << tag << " join";
              EXPECT_EQ(test::columns(back_h, G * W, pitch).to_vector(),
                        std::vector<double>(std::size_t(R * (pitch - G * W)), zero_pad ? 0.0 : sentinel))
                  << tag << " pad, zero_pad " << zero_pad;
            }
          }
        }
}

TEST(LinearCuda, PaddedRowsMatchCpuAndLeaveThePad) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  struct Case { std::int64_t N, in, out, pitch; };
  const double sentinel = -7.25, nan = std::nan("");
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : {Case{1, 1, 1, 64}, Case{5, 7, 3, 4}, Case{37, 13, 100, 128}, Case{3, 5, 17, 18},
                          Case{512, 768, 1572, 1600}}) {  // the 125M model's projection
      const std::string tag = test::dt_name(dt) + " N=" + std::to_string(c.N) + " in=" + std::to_string(c.in) +
                              " out=" + std::to_string(c.out) + " pitch=" + std::to_string(c.pitch);
      Tensor x = rng.randn({c.N, c.in}, DType::F32), w = rng.randn({c.out, c.in}, DType::F32);
      const Tensor xr = test::rounded_f32(x, dt), wr = test::rounded_f32(w, dt);
      Tensor xd = test::on_gpu(x, dt), wd = test::on_gpu(w, dt);
      Tensor y = Tensor::empty({c.N, c.out}, DType::F32);
      linear_forward(xr, wr, nullptr, y);
      Tensor yd = test::padded_columns(Tensor::zeros({c.N, c.out}, dt), c.pitch, sentinel).to(Device::CUDA);
      linear_forward(xd, wd, nullptr, yd, c.pitch);
      const Tensor yh = yd.to(Device::CPU);
      test::expect_close_rms(test::columns(yh, 0, c.out), y, test::rtol_for(dt), "y " + tag);
      EXPECT_EQ(test::columns(yh, c.out, c.pitch).to_vector(),
                std::vector<double>(std::size_t(c.N * (c.pitch - c.out)), sentinel)) << tag << " y pad";

      Tensor dy = rng.randn({c.N, c.out}, DType::F32);
      Tensor dyd = test::padded_columns(dy.to_dtype(dt), c.pitch, nan).to(Device::CUDA);
      Tensor dx = Tensor::empty({c.N, c.in}, DType::F32), dw0 = rng.randn({c.out, c.in}, DType::F32);
      Tensor dw = dw0.clone();
      linear_backward(test::rounded_f32(dy, dt), xr, wr, {.dx = &dx, .dw = &dw});
      Tensor dxd = Tensor::empty({c.N, c.in}, dt, Device::CUDA), dwd = dw0.to(Device::CUDA);  // fp32 dW
      linear_backward(dyd, xd, wd, {.dx = &dxd, .dw = &dwd, .dy_pitch = c.pitch});
      test::expect_close_rms(dxd, dx, test::rtol_for(dt), "dx " + tag);
      test::expect_close_rms(dwd, dw, test::rtol_for(dt), "dW " + tag);
    }
}

// A batch of 3 products with gaps between the matrices (strides above their sizes), every
// transpose, accumulating into C or not: product i of the batched call against cuda::gemm on
// the same operands (fp32 accumulation either way; the algorithms may differ in their order).
TEST(MatmulCuda, StridedBatchMatchesOneProductEach) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  constexpr int kBatch = 3;
  const std::int64_t M = 37, N = 24, K = 130;
  for (DType dt : {DType::F32, DType::BF16})
    for (const auto& [ta, tb] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}})
      for (const bool accumulate : {false, true}) {
        const std::string tag = test::dt_name(dt) + (ta ? " A^T" : "") + (tb ? " B^T" : "") + (accumulate ? " +=" : "");
        const std::int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 8;
        const std::int64_t sa = (ta ? K : M) * lda + 64, sb = (tb ? N : K) * ldb + 128, sc = M * ldc + 32;
        Tensor a = test::on_gpu(rng.randn({kBatch * sa}, DType::F32), dt);
        Tensor b = test::on_gpu(rng.randn({kBatch * sb}, DType::F32), dt);
        const Tensor c0 = rng.randn({kBatch * sc}, DType::F32);
        Tensor one = c0.to(Device::CUDA), batched = c0.to(Device::CUDA);
        const std::size_t e = dtype_size(dt);
        const double beta = accumulate ? 1.0 : 0.0;
        for (int i = 0; i < kBatch; ++i)
          cuda::gemm(dt, DType::F32, ta, tb, M, N, K, 1.0, static_cast<char*>(a.raw()) + i * sa * e, lda,
                     static_cast<char*>(b.raw()) + i * sb * e, ldb, beta, one.data<float>() + i * sc, ldc);
        cuda::gemm_strided_batched(dt, DType::F32, ta, tb, M, N, K, 1.0, a.raw(), lda, sa, b.raw(), ldb, sb, beta,
                                   batched.raw(), ldc, sc, kBatch);
        test::expect_close_rms(batched.to(Device::CPU), one.to(Device::CPU), 1e-5, tag);
      }
}

TEST(LinearCuda, BiasForwardMatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  struct Case { Shape x; std::int64_t out; };
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : {Case{{1, 1}, 1}, Case{{1, 5}, 7}, Case{{3, 4, 16}, 33},
                          Case{{65, 32}, 64}, Case{{130, 9}, 1001}}) {
      const std::string tag = test::dt_name(dt) + " x " + shape_str(c.x) + " out " +
                              std::to_string(c.out);
      const std::int64_t in = c.x.back();
      Tensor x = rng.randn(c.x, DType::F32), w = rng.randn({c.out, in}, DType::F32);
      Tensor b = rng.randn({c.out}, DType::F32);
      Shape ys = c.x;
      ys.back() = c.out;
      Tensor y = Tensor::empty(ys, DType::F32);
      const Tensor br = test::rounded_f32(b, dt);
      linear_forward(test::rounded_f32(x, dt), test::rounded_f32(w, dt), &br, y);
      Tensor xd = test::on_gpu(x, dt), wd = test::on_gpu(w, dt), bd = test::on_gpu(b, dt);
      Tensor yd = Tensor::empty(ys, dt, Device::CUDA);
      linear_forward(xd, wd, &bd, yd);
      // bf16: the product is rounded to bf16 before the bias is added, one more rounding.
      test::expect_close_rms(yd, y, test::rtol_for(dt), "y " + tag);
    }
}

TEST(LinearCuda, BiasBackwardMatchesCpu) {
  NSATRON_SKIP_WITHOUT_GPU();
  const auto seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& ys : {Shape{1, 1}, Shape{1, 7}, Shape{5, 3, 33}, Shape{1000, 64},
                            Shape{20000, 13}, Shape{70, 3000}}) {
      const std::string tag = test::dt_name(dt) + " dy " + shape_str(ys);
      const std::int64_t out = ys.back();
      Shape xs = ys;
      xs.back() = 3;
      Tensor dy = rng.randn(ys, DType::F32), x = rng.randn(xs, DType::F32);
      Tensor w = rng.randn({out, 3}, DType::F32), db0 = rng.randn({out}, DType::F32);
      Tensor db = db0.clone();
      linear_backward(test::rounded_f32(dy, dt), test::rounded_f32(x, dt),
                      test::rounded_f32(w, dt), {.dbias = &db});
      Tensor dyd = test::on_gpu(dy, dt), xd = test::on_gpu(x, dt), wd = test::on_gpu(w, dt);
      Tensor dbd = db0.to(Device::CUDA);  // fp32 gradient, also for bf16 rows
      linear_backward(dyd, xd, wd, {.dbias = &dbd});
      test::expect_close_rms(dbd, db, test::kRtolF32, "dbias fp32 " + tag);
      Tensor dbd2 = db0.to(Device::CUDA);
      linear_backward(dyd, xd, wd, {.dbias = &dbd2});
      EXPECT_TRUE(test::same_bits_any(dbd, dbd2)) << "dbias bits " << tag;
      if (dt == DType::BF16) {  // a bf16 bias gradient (accumulated and stored in bf16)
        // Its starting value is db0 rounded to bf16: the reference starts from the same value
        // (from db0 itself, the difference scales with |db0|, not with the result, and can
        // exceed any tolerance relative to a result that cancels db0).
        Tensor dbr = test::rounded_f32(db0, dt);
        linear_backward(test::rounded_f32(dy, dt), test::rounded_f32(x, dt), test::rounded_f32(w, dt),
                        {.dbias = &dbr});
        Tensor dbb = test::on_gpu(db0, dt);
        linear_backward(dyd, xd, wd, {.dbias = &dbb});
        test::expect_close_rms(dbb, dbr, test::kRtolBF16, "dbias bf16 " + tag);
      }
    }
}

}  // namespace
}  // namespace nsatron
