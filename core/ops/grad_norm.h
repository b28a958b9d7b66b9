// Global gradient norm and clipping, over a list of buffers (the gradients of all tensors,
// or one flat gradient buffer).
//   this header        - the math, the Tensor-level entry points
//   grad_norm.cpp      - the entry points
//   cpu/grad_norm.cpp  - the CPU implementation
//   cuda/grad_norm.cu  - on device, the result left in device memory (no host sync)
//
// Math:
//   sumsq = sum over buffers b, elements i of g_bi^2       (fp64 accumulation)
//   norm  = sqrt(sumsq)
//   clip:   g *= c,  c = min(1, max_norm / (norm + 1e-6))  (torch.nn.utils.clip_grad_norm_)
// With tensor/data parallelism the ranks all-reduce sumsq (counting replicated tensors once)
// and take the root afterwards, hence sum_squares as its own entry point.
// A non-finite norm leaves the buffers untouched by clipping: the caller skips that step.
// Deterministic: each buffer is summed in fixed chunks of kNormChunk elements, whose fp64
// partial sums are added in order, so the bits do not depend on the thread count. (On CUDA
// each chunk and the list of partials are summed by fixed trees: deterministic too, though
// not the CPU's bits.) On CUDA the buffers are fp32 or bf16, all on the GPU, and clipping
// reads the norm on the device.
// Results are written to a one-element tensor (fp32 or fp64) on the buffers' device, so the
// CUDA version needs no host synchronisation; read it with to_vector() where a log needs it.
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor/tensor.h"

namespace nsatron {

inline constexpr std::int64_t kNormChunk = 4096;

// out (one element) = sum of squares / L2 norm over all buffers.
void sum_squares(std::span<const Tensor> buffers, Tensor& out);
void global_norm(std::span<const Tensor> buffers, Tensor& out);
// Every buffer *= factor (in place; buffers are handles to the gradient storage).
void scale_(std::span<const Tensor> buffers, double factor);
// The clip factor min(1, max_norm / (norm + 1e-6)); 1 when norm is not finite.
double clip_coefficient(double norm, double max_norm);
// Scales the buffers by clip_coefficient(norm, max_norm), norm read from the one-element
// tensor written by global_norm.
void clip_by_global_norm_(std::span<const Tensor> buffers, const Tensor& norm, double max_norm);

namespace cpu {
// Sum of squares in fp64 (chunked, ordered; see above).
template <class T> double sum_squares(const T* x, std::int64_t n);
template <class T> void scale(T* x, std::int64_t n, double factor);
}  // namespace cpu

namespace cuda {
// A gradient buffer in device memory (fp32 or bf16).
struct NormBuffer {
  void* data;
  std::int64_t n;
  DType dtype;
};
// out (one element of out_dt, fp32 or fp64, device memory) = sum of squares over the buffers,
// or its square root. fp64 partial sums per kNormChunk chunk (a scratch of one double per
// chunk), added in a fixed order: deterministic. Default stream, no host synchronisation.
void sum_squares(std::span<const NormBuffer> buffers, void* out, DType out_dt, bool take_sqrt);
// Every buffer *= factor.
void scale_(std::span<const NormBuffer> buffers, double factor);
// Every buffer *= clip_coefficient(*norm, max_norm), the norm (fp32 or fp64) read on the
// device: nothing changes when it is not finite or the coefficient is 1.
void clip_by_norm_(std::span<const NormBuffer> buffers, const void* norm, DType norm_dt,
                   double max_norm);
}  // namespace cuda

}  // namespace nsatron
