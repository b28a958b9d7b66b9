// RMSNorm over the last dimension, with an optional fused residual add.
//   this header       - the math, the Tensor-level entry points (shape checks, dispatch)
//   rmsnorm.cpp       - the entry points
//   cpu/rmsnorm.cpp   - the CPU implementation (fp32/fp64, fp64 accumulation, OpenMP over rows)
//   cuda/rmsnorm.cu   - the CUDA kernels, same contract; fp32 or bf16 in/out, fp32 rstd,
//                       dw fp32 (or the compute dtype)
//
// Math, per row x[C] (rows: all leading indices, N = numel / C):
//   rstd = 1 / sqrt(mean_c x_c^2 + eps)                        saved for the backward, [N]
//   y_c  = x_c * rstd * w_c                                    w: the gain, [C]
// Fused residual variant (the pre-norm block's "h = residual + branch; y = norm(h)"):
//   h = a + b;  y = rmsnorm(h)                                 writes both h and y
//
// Backward, with xhat = x * rstd and g = w * dy:
//   dx_c  = rstd * (g_c - xhat_c * mean_j(g_j xhat_j)) + dres_c   ASSIGNED (activation)
//   dw_c += sum_rows dy_c * xhat_c                                 ACCUMULATED (parameter)
// dres is the gradient that reaches x by other paths (the residual stream); passing it fuses
// the add. The fused variant's backward is this backward with x = h and dres = the gradient
// of h from downstream; since h = a + b, da = db = dh, so one tensor serves both.
//
// Saves: rstd [N] (same dtype as x on the CPU; fp32 on CUDA). x (or h) itself is needed by
// the backward.
// Deterministic: rows are independent; dw is reduced per column block over rows in
// ascending order, so the bits do not depend on the thread count.
#pragma once
#include <cstdint>

#include "core/tensor/tensor.h"

namespace nsatron {

// x [.., C], w [C] -> y [.., C] (same shape as x), rstd with numel N = numel(x) / C.
void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, double eps);

// h = a + b, y = rmsnorm(h). a, b, h, y [.., C]; h may be a or b (in-place residual update).
void add_rmsnorm_forward(const Tensor& a, const Tensor& b, const Tensor& w, Tensor& h, Tensor& y,
                         Tensor& rstd, double eps);

// dx = J^T dy (+ *dres); dw += sum over rows. dx may be the same tensor as dy or *dres.
// dres: nullptr for none.
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      Tensor& dx, Tensor& dw, const Tensor* dres = nullptr);

namespace cpu {
// Raw row-major arrays, rows of C contiguous elements.
template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, std::int64_t N, std::int64_t C,
                     double eps);
// h may alias a or b.
template <class T>
void add_rmsnorm_forward(T* h, T* y, T* rstd, const T* a, const T* b, const T* w, std::int64_t N,
                         std::int64_t C, double eps);
// dres may be null; dx may alias dy or dres (exactly, not partially).
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                      const T* dres, std::int64_t N, std::int64_t C);
}  // namespace cpu

namespace cuda {
// Device pointers on the current device, default stream. x, y, h, a, b, w, dy, dx, dres share
// dtype `dt` (fp32 or bf16; arithmetic in fp32); rstd is fp32; dw is `dw_dt` (fp32 or dt).
// Same aliasing as the CPU functions. The backward uses a scratch buffer of at most
// 1024 * C floats (chunks of rows) for the column sums of dw.
void rmsnorm_forward(DType dt, void* y, float* rstd, const void* x, const void* w, std::int64_t N,
                     std::int64_t C, double eps);
void add_rmsnorm_forward(DType dt, void* h, void* y, float* rstd, const void* a, const void* b,
                         const void* w, std::int64_t N, std::int64_t C, double eps);
void rmsnorm_backward(DType dt, DType dw_dt, void* dx, void* dw, const void* dy, const void* x,
                      const void* w, const float* rstd, const void* dres, std::int64_t N,
                      std::int64_t C);
}  // namespace cuda

}  // namespace nsatron
