#include "core/ops/linear.h"

#include "core/ops/matmul.h"
#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

namespace {
struct LinearDims {
  std::int64_t N, in, out;
};
LinearDims check_linear(const std::string& op, const Tensor& x, const Tensor& w) {
  same_dtype_device(op, {&x, &w});
  const std::int64_t in = last_dim(op, x, "x");
  require(w.ndim() == 2 && w.dim(1) == in, op,
          "W must be [out, " + std::to_string(in) + "] for x " + x.describe() + ", got " +
              w.describe());
  return {rows_of(x), in, w.dim(0)};
}
Shape with_last(const Tensor& t, std::int64_t last) {
  Shape s = t.shape();
  s.back() = last;
  return s;
}
// The row length of y / dy: `out`, or a padded pitch (no bias then: the bias kernels take
// contiguous rows).
std::int64_t checked_pitch(const std::string& op, std::int64_t pitch, std::int64_t out, bool has_bias,
                           const char* name) {
  if (pitch == 0) return out;
  require(pitch >= out, op,
          std::string(name) + "_pitch = " + std::to_string(pitch) + " must be at least out = " +
              std::to_string(out));
  require(!has_bias, op,
          std::string("a bias with a padded ") + name + " (" + name + "_pitch) is not supported");
  return pitch;
}
void check_bias(const std::string& op, const Tensor& x, const Tensor& b, std::int64_t out,
                const char* name) {
  same_dtype_device(op, {&x, &b});
  require(b.ndim() == 1 && b.dim(0) == out, op,
          std::string(name) + " must be [" + std::to_string(out) + "], got " + b.describe());
}
}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y, std::int64_t y_pitch) {
  const std::string op = "linear_forward";
  const LinearDims d = check_linear(op, x, w);
  same_dtype_device(op, {&x, &y});
  const std::int64_t pitch = checked_pitch(op, y_pitch, d.out, bias != nullptr, "y");
  require(y.shape() == with_last(x, pitch), op,
          "y must be " + shape_str(with_last(x, pitch)) + ", got " + y.describe());
  if (bias) check_bias(op, x, *bias, d.out, "bias");
  if (d.N == 0 || d.out == 0) return;
  if (d.in == 0) {
    y.zero_();
  } else {
    Tensor y2 = y.view({d.N, pitch});
    matmul(x.view({d.N, d.in}), w, y2, {.trans_a = false, .trans_b = true, .c_cols = d.out});
  }
  if (bias) {
    if (x.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
      cuda_compute_dtype(op, x);
      cuda::add_bias(x.dtype(), y.raw(), bias->raw(), d.N, d.out);
      return;
#else
      no_cuda(op + " (bias)");
#endif
    }
    dispatch_cpu(op, x, [&](auto tag) {
      using T = decltype(tag);
      cpu::add_bias<T>(y.data<T>(), bias->data<T>(), d.N, d.out);
    });
  }
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const LinearGrads& g) {
  const std::string op = "linear_backward";
  const LinearDims d = check_linear(op, x, w);
  same_dtype_device(op, {&x, &dy});
  const std::int64_t pitch = checked_pitch(op, g.dy_pitch, d.out, g.dbias != nullptr, "dy");
  require(dy.shape() == with_last(x, pitch), op,
          "dy must be " + shape_str(with_last(x, pitch)) + ", got " + dy.describe());
  if (g.dx) {
    same_dtype_device(op, {&x, g.dx});
    require(g.dx->shape() == x.shape(), op,
            "dx must have the shape of x " + x.describe() + ", got " + g.dx->describe());
  }
  if (g.dw) {
    if (x.device() == Device::CUDA) {
      all_on_cuda(op, {g.dw});
      grad_dtype(op, x, *g.dw, "dW");
    } else {
      same_dtype_device(op, {&x, g.dw});
    }
    require(g.dw->shape() == w.shape(), op,
            "dW must have the shape of W " + w.describe() + ", got " + g.dw->describe());
  }
  if (g.dbias) {
    if (x.device() == Device::CUDA) {
      all_on_cuda(op, {g.dbias});
      grad_dtype(op, x, *g.dbias, "dbias");
      require(g.dbias->ndim() == 1 && g.dbias->dim(0) == d.out, op,
              "dbias must be [" + std::to_string(d.out) + "], got " + g.dbias->describe());
    } else {
      check_bias(op, x, *g.dbias, d.out, "dbias");
    }
  }
  if (d.N == 0) return;
  const Tensor dy2 = dy.view({d.N, pitch});  // dy[:, :out] is the operand (lda = pitch)
  if (g.dx && d.in > 0) {
    Tensor dx2 = g.dx->view({d.N, d.in});
    if (d.out == 0) {
      if (!g.accumulate_dx) dx2.zero_();
    } else {
      matmul(dy2, w, dx2, {.beta = g.accumulate_dx ? 1.0 : 0.0, .a_cols = d.out});
    }
  }
  if (g.dw && d.in > 0 && d.out > 0)
    matmul(dy2, x.view({d.N, d.in}), *g.dw, {.trans_a = true, .beta = 1.0, .a_cols = d.out});
  if (g.dbias) {
    if (x.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
      cuda_compute_dtype(op, x);
      cuda::bias_backward(x.dtype(), g.dbias->dtype(), g.dbias->raw(), dy.raw(), d.N, d.out);
      return;
#else
      no_cuda(op + " (bias)");
#endif
    }
    dispatch_cpu(op, x, [&](auto tag) {
      using T = decltype(tag);
      cpu::bias_backward<T>(g.dbias->data<T>(), dy.data<T>(), d.N, d.out);
    });
  }
}

}  // namespace nsatron
