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
//
// Padded rows: y (forward) and dy (backward) may be [.., P] with a pitch P > out when asked for
// (y_pitch / LinearGrads::dy_pitch = P; 0: P = out). Only their first `out` columns take part:
// the forward writes y[.., :out] (a GEMM with ldc = P), the backward reads dy[.., :out]
// (dx = dy W with K = out, lda = P; dW += dy^T x over the first out columns); the pad columns
// [out, P) are never read or written. Use: a pitch that is a multiple of 64 elements keeps
// every row 16-byte aligned (cuBLASLt's fast kernels) for an `out` that is not. No bias then.
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

namespace nsatron {

// bias: nullptr for none. y_pitch: y's padded row length (see above), 0: y is [.., out].
void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                    std::int64_t y_pitch = 0);

struct LinearGrads {
  Tensor* dx = nullptr;     // nullptr: not needed (e.g. x is a leaf)
  Tensor* dw = nullptr;     // nullptr: W frozen
  Tensor* dbias = nullptr;  // nullptr: no bias
  bool accumulate_dx = false;  // dx += dy W (x feeds several layers) instead of dx =
  std::int64_t dy_pitch = 0;   // dy's padded row length (see above), 0: dy is [.., out]
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
