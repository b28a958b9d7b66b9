// AdamW: one fused update over a flat parameter buffer (all parameters of a rank laid end to
// end), with its gradient, first and second moments in buffers of the same layout.
//   this header      - the math, the Tensor-level entry point
//   adamw.cpp        - the entry point
//   cpu/adamw.cpp    - the CPU implementation (elementwise, OpenMP)
//   cuda/adamw.cu    - one fused kernel, fp32 master weights and state, writing the bf16
//                      compute copy of the weights in the same pass (AdamWExtra)
//
// Math, at step t >= 1 (the caller counts; the first update is t = 1), for each element,
// with g = grad * grad_scale (grad_scale: e.g. the clipping factor; the grad buffer is read,
// never written):
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p  = p * (1 - lr * weight_decay)                     only in segments with decay = true
//   p  = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// This is PyTorch's torch.optim.AdamW (decoupled weight decay, bias correction), step for
// step. Norm gains and biases are the segments with decay = false.
//
// Segments: the per-tensor flags. They must tile the buffer exactly: in order, without gaps
// or overlaps, from offset 0 to the buffer's end.
// Deterministic: elementwise.
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor/tensor.h"

namespace nsatron {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct ParamSegment {
  std::int64_t offset = 0;  // first element in the flat buffer
  std::int64_t numel = 0;
  bool decay = true;        // apply weight decay to this tensor
};

// Optional parts of a step.
struct AdamWExtra {
  // Written in the same pass: the updated weights converted to this tensor's dtype (the bf16
  // compute copy of the fp32 master weights), same numel, same device. nullptr: none.
  Tensor* compute_copy = nullptr;
  // One-element gradient norm (fp32 or fp64, on the buffers' device), e.g. from global_norm:
  // g is further scaled by clip_coefficient(norm, max_norm), and a non-finite norm skips the
  // update (param, m, v and the copy untouched). On CUDA it is read on the device, so a
  // clipped step needs no host synchronisation. nullptr: no clipping here.
  const Tensor* clip_norm = nullptr;
  double max_norm = 0.0;
};

// param, grad, m, v: 1-D buffers of one length, dtype (fp32; fp64 for tests, CPU only) and
// device.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                std::span<const ParamSegment> segments, const AdamWHyper& hp, std::int64_t step,
                double grad_scale = 1.0, const AdamWExtra& extra = {});

namespace cpu {
// Throws std::invalid_argument unless the segments tile [0, n) in order.
void check_segments(std::span<const ParamSegment> segments, std::int64_t n);
template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, std::int64_t n,
                std::span<const ParamSegment> segments, const AdamWHyper& hp, std::int64_t step,
                double grad_scale);
}  // namespace cpu

namespace cuda {
// Device pointers, default stream; fp32 master weights, gradient and moments, arithmetic in
// fp64 as on the CPU. copy: nullptr, or n elements of copy_dt (bf16 or fp32) written with the
// updated weights. clip_norm: nullptr, or one element of norm_dt (fp32 or fp64) in device
// memory (see AdamWExtra). Throws std::invalid_argument unless the segments tile [0, n).
void adamw_step(float* param, const float* grad, float* m, float* v, DType copy_dt, void* copy,
                std::int64_t n, std::span<const ParamSegment> segments, const AdamWHyper& hp,
                std::int64_t step, double grad_scale, const void* clip_norm, DType norm_dt,
                double max_norm);
}  // namespace cuda

}  // namespace nsatron
