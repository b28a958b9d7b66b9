// SwiGLU, the MLP's gated activation: out = silu(a) * b, silu(a) = a * sigmoid(a).
//   this header      - the math, the Tensor-level entry points
//   swiglu.cpp       - the entry points
//   cpu/swiglu.cpp   - the CPU implementation (elementwise, OpenMP over rows)
//   cuda/swiglu.cu   - the CUDA kernels, same contract (fp32 or bf16, fp32 arithmetic)
//
// Layouts (F: the hidden width):
//   fused: u [.., 2F] holds a = u[.., 0:F] (the gate) then b = u[.., F:2F] (the up half) in each
//          row, as produced by one projection W_in [2F, C] whose first F rows are the gate and
//          whose last F rows are the up projection. Under tensor parallelism a rank's shard of
//          W_in must hold its F/tp gate rows followed by its F/tp up rows.
//   split: a [.., F] and b [.., F], two tensors of the same shape.
//   out [.., F] in both.
//
// Backward, with s = sigmoid(a):
//   db = dout * silu(a)
//   da = dout * b * s * (1 + a * (1 - s))                     both ASSIGNED (activations)
// Saves nothing: the backward recomputes s from its input a (cheap, so "selective" recompute
// keeps only u).
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

namespace nsatron {

// Fused layout: u [.., 2F] -> out [.., F].
void swiglu_forward(const Tensor& u, Tensor& out);
// du [.., 2F] from dout [.., F]; du may be u itself (the input is read before it is overwritten).
void swiglu_backward(const Tensor& dout, const Tensor& u, Tensor& du);

// Split layout: a, b [.., F] -> out [.., F].
void swiglu_forward(const Tensor& a, const Tensor& b, Tensor& out);
// da may be a and db may be b (in place).
void swiglu_backward(const Tensor& dout, const Tensor& a, const Tensor& b, Tensor& da, Tensor& db);

namespace cpu {
// N rows of F elements. a and b (and da, db) step by ld_in elements per row, out and dout by
// ld_out: the fused layout is a = u, b = u + F, ld_in = 2F; the split one is ld_in = F.
template <class T>
void swiglu_forward(T* out, const T* a, const T* b, std::int64_t N, std::int64_t F,
                    std::int64_t ld_in, std::int64_t ld_out);
// da may alias a and db may alias b.
template <class T>
void swiglu_backward(T* da, T* db, const T* dout, const T* a, const T* b, std::int64_t N,
                     std::int64_t F, std::int64_t ld_in, std::int64_t ld_out);
}  // namespace cpu

namespace cuda {
// Same contract as the cpu:: functions, on device pointers of dtype `dt` (fp32 or bf16;
// arithmetic in fp32), default stream.
void swiglu_forward(DType dt, void* out, const void* a, const void* b, std::int64_t N,
                    std::int64_t F, std::int64_t ld_in, std::int64_t ld_out);
void swiglu_backward(DType dt, void* da, void* db, const void* dout, const void* a, const void* b,
                     std::int64_t N, std::int64_t F, std::int64_t ld_in, std::int64_t ld_out);
}  // namespace cuda

}  // namespace nsatron
