#include "core/ops/adamw.h"

#include <cmath>

#include "core/ops/grad_norm.h"
#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                std::span<const ParamSegment> segments, const AdamWHyper& hp, std::int64_t step,
                double grad_scale, const AdamWExtra& extra) {
  const std::string op = "adamw_step";
  same_dtype_device(op, {&param, &grad, &m, &v});
  for (const Tensor* t : std::initializer_list<const Tensor*>{&param, &grad, &m, &v})
    require(t->ndim() == 1 && t->numel() == param.numel(), op,
            "param, grad, m and v must be 1-D of one length, got " + param.describe() + " and " +
                t->describe());
  require(step >= 1, op, "the step count starts at 1, got " + std::to_string(step));
  require(hp.lr >= 0 && hp.eps > 0 && hp.weight_decay >= 0 && hp.beta1 >= 0 && hp.beta1 < 1 &&
              hp.beta2 >= 0 && hp.beta2 < 1,
          op, "hyperparameters out of range (need lr >= 0, eps > 0, weight_decay >= 0, "
              "0 <= beta1, beta2 < 1)");
  require(std::isfinite(grad_scale), op, "grad_scale must be finite");
  cpu::check_segments(segments, param.numel());
  if (extra.compute_copy) {
    const Tensor& c = *extra.compute_copy;
    require(c.numel() == param.numel() && c.device() == param.device(), op,
            "the compute copy must have the parameters' numel and device, got " + c.describe() +
                " for " + param.describe());
  }
  if (extra.clip_norm) {
    require(extra.clip_norm->numel() == 1 && extra.clip_norm->device() == param.device(), op,
            "the clipping norm must be one element on the parameters' device, got " +
                extra.clip_norm->describe());
    require(extra.max_norm > 0, op, "max_norm must be > 0");
  }
  if (param.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    require_f32(op, param, "param (the master weights)");
    Tensor* c = extra.compute_copy;
    if (c) cuda_compute_dtype(op, *c);
    cuda::adamw_step(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(),
                     c ? c->dtype() : DType::BF16, c ? c->raw() : nullptr, param.numel(),
                     segments, hp, step, grad_scale,
                     extra.clip_norm ? extra.clip_norm->raw() : nullptr,
                     extra.clip_norm ? extra.clip_norm->dtype() : DType::F32, extra.max_norm);
    return;
#else
    no_cuda(op);
#endif
  }
  double scale = grad_scale;
  if (extra.clip_norm) {
    const double norm = extra.clip_norm->to_vector()[0];
    if (!std::isfinite(norm)) return;  // skipped step
    scale *= clip_coefficient(norm, extra.max_norm);
  }
  dispatch_cpu(op, param, [&](auto tag) {
    using T = decltype(tag);
    cpu::adamw_step<T>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), param.numel(),
                       segments, hp, step, scale);
    if (Tensor* c = extra.compute_copy) {
      const T* p = param.data<T>();
      const std::int64_t n = param.numel();
      auto convert = [&](auto* out) {
        using C = std::remove_pointer_t<decltype(out)>;
        for (std::int64_t i = 0; i < n; ++i) out[i] = C(float(p[i]));
      };
      switch (c->dtype()) {
        case DType::F32: convert(c->data<float>()); break;
        case DType::F64: {
          double* out = c->data<double>();
          for (std::int64_t i = 0; i < n; ++i) out[i] = double(p[i]);
          break;
        }
        case DType::BF16: convert(c->data<bf16>()); break;
      }
    }
  });
}

}  // namespace nsatron
