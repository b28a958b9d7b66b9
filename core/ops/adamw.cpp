#include "core/ops/adamw.h"

#include <cmath>

#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                std::span<const ParamSegment> segments, const AdamWHyper& hp, std::int64_t step,
                double grad_scale) {
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
  if (param.device() == Device::CUDA) no_cuda(op);
  dispatch_cpu(op, param, [&](auto tag) {
    using T = decltype(tag);
    cpu::adamw_step<T>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), param.numel(),
                       segments, hp, step, grad_scale);
  });
}

}  // namespace nsatron
