// Linear layer: y = x W^T (+ b), the projections of attention and MLP and the LM head.
//   this header      - the math, the Tensor-level entry points
//   linear.cpp       - the entry points: matrix products through core/ops/matmul.h (so they
//                      run wherever matmul does), the bias through cpu/linear.cpp
//   cpu/linear.cpp   - the CPU bias kernels and a raw-pointer linear on cpu::gemm
//   cuda/linear.cu   - the CUDA bias kernels (dbias may be fp32 for bf16 activations)
//
// Math: x [.., in] (N rows), W [out, in] (PyTorch's nn.Linear layout), b [out], y [.., out]:
//   y = x W^T + b
// Backward:
//   dx  = dy W                     ASSIGNED (activation gradient), or accumulated on request
//   dW += dy^T x                   ACCUMULATED (parameter gradient)
//   db += sum over rows of dy      ACCUMULATED, summed over rows in order per column block
// Saves nothing: the backward needs x (the caller keeps it) and W.
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

namespace nsatron {

// bias: nullptr for none.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);

struct LinearGrads {
  Tensor* dx = nullptr;     // nullptr: not needed (e.g. x is a leaf)
  Tensor* dw = nullptr;     // nullptr: W frozen
  Tensor* dbias = nullptr;  // nullptr: no bias
  bool accumulate_dx = false;  // dx += dy W (x feeds several layers) instead of dx =
};
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const LinearGrads& grads);

namespace cpu {
// y[n, :] += b for N rows of `out` elements.
template <class T> void add_bias(T* y, const T* b, std::int64_t N, std::int64_t out);
// db[o] += sum_n dy[n, o] (fp64 sums, rows in order).
template <class T> void bias_backward(T* db, const T* dy, std::int64_t N, std::int64_t out);
// Raw linear on contiguous row-major arrays; b / db / dx / dw may be null.
template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::int64_t N, std::int64_t in,
                    std::int64_t out);
template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::int64_t N,
                     std::int64_t in, std::int64_t out, bool accumulate_dx);
}  // namespace cpu

namespace cuda {
// y[n, :] += b (y, b of dtype dt: fp32 or bf16), default stream.
void add_bias(DType dt, void* y, const void* b, std::int64_t N, std::int64_t out);
// db[o] += sum_n dy[n, o]: dy of dtype dt, db of db_dt (fp32 or dt). Rows in fixed chunks
// (fp32 sums in row order), the chunks added in order in fp64; a scratch buffer of at most
// 256 * out floats.
void bias_backward(DType dt, DType db_dt, void* db, const void* dy, std::int64_t N,
                   std::int64_t out);
}  // namespace cuda

}  // namespace nsatron
