// NSA compression on CUDA (fp32 math; outputs fp32):
//   forward   Y[b,i,g,:] = sum_{r<l, c<D} (x[b, i*d+r, g, c] + p[g, r, c]) W[g][r*D+c, :],
//             keys then rotated at i*d+l-1. One block per (16 compressed blocks, g, b):
//             the gathered inputs and W stream through shared memory 32 rows of the
//             flattened l*D axis at a time, thread e owns output column e of the 16 blocks.
//   backward  dx[b,s,g,c] = sum_{blocks i containing s} sum_e W[g][(s-i*d)*D+c, e] dY_i[e]
//             (one block per token, thread = c, reading a transposed copy of W so the loads
//             are coalesced; overlapping blocks add in ascending i);
//             dW[g][rc, e] += sum_{b,i} X_{b,i}[rc] dY_{b,i}[e] (one block per 32 rows rc,
//             thread = e, pairs (b,i) in ascending order through shared memory);
//             dp[g, r, c] += sum_e W[g][r*D+c, e] (sum_{b,i} dY_{b,i}[e]) (a warp per row).
// Every output element is owned by one thread and summed in a fixed order.
#include "nsa/cuda/internal.cuh"

namespace nsatron::nsa::cuda::detail {

namespace {

constexpr int IT = 16;  // compressed blocks per forward block
constexpr int KC = 32;  // flattened rows per shared-memory step
constexpr int THREADS = 128;

template <class T>
__global__ void __launch_bounds__(THREADS)
    compress_fwd_kernel(Geo g, const T* __restrict__ x, const T* __restrict__ w,
                        const T* __restrict__ p, const float2* __restrict__ rope,
                        float* __restrict__ y) {
  __shared__ float Xs[IT][KC + 1];
  __shared__ float Ws[KC][128];
  __shared__ float Ys[IT][128];
  const int i0 = blockIdx.x * IT, gi = blockIdx.y, b = blockIdx.z;
  const int e = threadIdx.x;
  const int LD = g.l * g.D;
  float acc[IT];
#pragma unroll
  for (int ii = 0; ii < IT; ++ii) acc[ii] = 0.f;
  for (int kk = 0; kk < LD; kk += KC) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < IT * KC; idx += blockDim.x) {
      const int ii = idx / KC, c = idx % KC, f = kk + c, i = i0 + ii;
      float v = 0.f;
      if (i < g.N && f < LD) {
        const int r = f / g.D, cc = f % g.D;
        v = ldf(x[((std::int64_t(b) * g.T + i * g.d + r) * g.G + gi) * g.D + cc]) +
            ldf(p[(std::int64_t(gi) * g.l + r) * g.D + cc]);
      }
      Xs[ii][c] = v;
    }
    for (int idx = threadIdx.x; idx < KC * 128; idx += blockDim.x) {
      const int c = idx / 128, e2 = idx % 128, f = kk + c;
      Ws[c][e2] = (f < LD && e2 < g.D) ? ldf(w[(std::int64_t(gi) * LD + f) * g.D + e2]) : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < KC; ++c) {
      const float wv = Ws[c][e];
#pragma unroll
      for (int ii = 0; ii < IT; ++ii) acc[ii] += Xs[ii][c] * wv;
    }
  }
  if (rope) {
#pragma unroll
    for (int ii = 0; ii < IT; ++ii) Ys[ii][e] = acc[ii];
    __syncthreads();
    for (int idx = threadIdx.x; idx < IT * g.D; idx += blockDim.x) {
      const int ii = idx / g.D, dd = idx % g.D, i = i0 + ii;
      if (i >= g.N) continue;
      y[((std::int64_t(b) * g.N + i) * g.G + gi) * g.D + dd] =
          rope_elem(&Ys[ii][0], dd, g.half, rope + std::int64_t(i * g.d + g.l - 1) * g.half);
    }
  } else if (e < g.D) {
#pragma unroll
    for (int ii = 0; ii < IT; ++ii)
      if (i0 + ii < g.N) y[((std::int64_t(b) * g.N + i0 + ii) * g.G + gi) * g.D + e] = acc[ii];
  }
}

// wt[g][r][e][c] = W[g][r*D+c][e]
template <class T>
__global__ void transpose_w_kernel(Geo g, const T* __restrict__ w, float* __restrict__ wt) {
  const std::int64_t total = std::int64_t(g.G) * g.l * g.D * g.D;
  for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += std::int64_t(gridDim.x) * blockDim.x) {
    const int c = int(idx % g.D);
    const int e = int((idx / g.D) % g.D);
    const std::int64_t gr = idx / (std::int64_t(g.D) * g.D);  // g*l + r
    wt[idx] = ldf(w[(gr * g.D + c) * g.D + e]);
  }
}

template <class T>
__global__ void __launch_bounds__(128)
    compress_dx_kernel(Geo g, const float* __restrict__ wt, const float* __restrict__ dy,
                       T* __restrict__ dx) {
  __shared__ float dys[128];
  const int s = blockIdx.x, gi = blockIdx.y, b = blockIdx.z, c = threadIdx.x;
  const int lo_num = s - g.l + 1;
  const int i_lo = lo_num <= 0 ? 0 : (lo_num + g.d - 1) / g.d;
  const int i_hi = min(g.N - 1, s / g.d);
  float acc = 0.f;
  for (int i = i_lo; i <= i_hi; ++i) {
    __syncthreads();
    if (c < g.D) dys[c] = dy[((std::int64_t(b) * g.N + i) * g.G + gi) * g.D + c];
    __syncthreads();
    if (c < g.D) {
      const float* wr = wt + (std::int64_t(gi) * g.l + (s - i * g.d)) * g.D * g.D + c;
      for (int e = 0; e < g.D; ++e) acc += wr[std::int64_t(e) * g.D] * dys[e];
    }
  }
  if (c < g.D) dx[((std::int64_t(b) * g.T + s) * g.G + gi) * g.D + c] = stf<T>(acc);
}

// sum[g, e] = sum over (b, i) ascending of dy[b, i, g, e]
__global__ void dy_sum_kernel(Geo g, const float* __restrict__ dy, float* __restrict__ sum) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= g.G * g.D) return;
  const int gi = idx / g.D, e = idx % g.D;
  float s = 0.f;
  for (int b = 0; b < g.B; ++b)
    for (int i = 0; i < g.N; ++i) s += dy[((std::int64_t(b) * g.N + i) * g.G + gi) * g.D + e];
  sum[idx] = s;
}

// dp[g, r, c] += W[g][r*D+c, :] . sum[g, :], one warp per row.
template <class T>
__global__ void compress_dp_kernel(Geo g, const T* __restrict__ w, const float* __restrict__ sum,
                                   float* __restrict__ dp) {
  const std::int64_t row = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= std::int64_t(g.G) * g.l * g.D) return;
  const int gi = int(row / (std::int64_t(g.l) * g.D));
  float s = 0.f;
  for (int e = lane; e < g.D; e += 32) s += ldf(w[row * g.D + e]) * sum[gi * g.D + e];
  s = warp_sum(s);
  if (lane == 0) dp[row] += s;
}

constexpr int DW_ROWS = 32, DW_PAIRS = 32;

template <class T>
__global__ void __launch_bounds__(128)
    compress_dw_kernel(Geo g, const T* __restrict__ x, const T* __restrict__ p,
                       const float* __restrict__ dy, float* __restrict__ dw) {
  __shared__ float Xs[DW_PAIRS][DW_ROWS + 1];
  __shared__ float Ys[DW_PAIRS][128];
  const int rc0 = blockIdx.x * DW_ROWS, gi = blockIdx.y, e = threadIdx.x;
  const int LD = g.l * g.D, BN = g.B * g.N;
  float acc[DW_ROWS];
#pragma unroll
  for (int rr = 0; rr < DW_ROWS; ++rr) acc[rr] = 0.f;
  for (int p0 = 0; p0 < BN; p0 += DW_PAIRS) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < DW_PAIRS * DW_ROWS; idx += blockDim.x) {
      const int pp = idx / DW_ROWS, rr = idx % DW_ROWS, pair = p0 + pp, rc = rc0 + rr;
      float v = 0.f;
      if (pair < BN && rc < LD) {
        const int b = pair / g.N, i = pair % g.N, r = rc / g.D, c = rc % g.D;
        v = ldf(x[((std::int64_t(b) * g.T + i * g.d + r) * g.G + gi) * g.D + c]) +
            ldf(p[(std::int64_t(gi) * g.l + r) * g.D + c]);
      }
      Xs[pp][rr] = v;
    }
    for (int idx = threadIdx.x; idx < DW_PAIRS * 128; idx += blockDim.x) {
      const int pp = idx / 128, e2 = idx % 128, pair = p0 + pp;
      float v = 0.f;
      if (pair < BN && e2 < g.D) {
        const int b = pair / g.N, i = pair % g.N;
        v = dy[((std::int64_t(b) * g.N + i) * g.G + gi) * g.D + e2];
      }
      Ys[pp][e2] = v;
    }
    __syncthreads();
#pragma unroll 2
    for (int pp = 0; pp < DW_PAIRS; ++pp) {
      const float yv = Ys[pp][e];
#pragma unroll
      for (int rr = 0; rr < DW_ROWS; ++rr) acc[rr] += Xs[pp][rr] * yv;
    }
  }
  if (e < g.D) {
#pragma unroll
    for (int rr = 0; rr < DW_ROWS; ++rr) {
      const int rc = rc0 + rr;
      if (rc < LD) dw[(std::int64_t(gi) * LD + rc) * g.D + e] += acc[rr];
    }
  }
}

}  // namespace

template <class T>
void launch_compress_forward(const Geo& g, const T* x, const T* w, const T* p, const float2* rope,
                             float* y, cudaStream_t s) {
  if (g.N == 0) return;
  const dim3 grid(unsigned((g.N + IT - 1) / IT), unsigned(g.G), unsigned(g.B));
  compress_fwd_kernel<T><<<grid, THREADS, 0, s>>>(g, x, w, p, rope, y);
  check_launch("compress_fwd_kernel");
}

template <class T>
void launch_compress_backward(const Geo& g, const T* x, const T* w, const T* p, const float* dy,
                              T* dx, float* dw, float* dp, float* scratch_wt, float* scratch_sum,
                              cudaStream_t s) {
  if (dx) {
    if (g.N > 0) {
      transpose_w_kernel<T><<<grid1(std::int64_t(g.G) * g.l * g.D * g.D, 256), 256, 0, s>>>(
          g, w, scratch_wt);
      check_launch("transpose_w_kernel");
    }
    const dim3 grid(unsigned(g.T), unsigned(g.G), unsigned(g.B));
    compress_dx_kernel<T><<<grid, 128, 0, s>>>(g, scratch_wt, dy, dx);
    check_launch("compress_dx_kernel");
  }
  if (g.N == 0) return;
  if (dp) {
    dy_sum_kernel<<<grid1(g.G * g.D, 128), 128, 0, s>>>(g, dy, scratch_sum);
    check_launch("dy_sum_kernel");
    compress_dp_kernel<T><<<grid1(std::int64_t(g.G) * g.l * g.D * 32, 256), 256, 0, s>>>(
        g, w, scratch_sum, dp);
    check_launch("compress_dp_kernel");
  }
  if (dw) {
    const dim3 grid(unsigned((g.l * g.D + DW_ROWS - 1) / DW_ROWS), unsigned(g.G));
    compress_dw_kernel<T><<<grid, 128, 0, s>>>(g, x, p, dy, dw);
    check_launch("compress_dw_kernel");
  }
}

#define NSA_INSTANTIATE(T)                                                                    \
  template void launch_compress_forward<T>(const Geo&, const T*, const T*, const T*,         \
                                           const float2*, float*, cudaStream_t);            \
  template void launch_compress_backward<T>(const Geo&, const T*, const T*, const T*,        \
                                            const float*, T*, float*, float*, float*, float*, \
                                            cudaStream_t);
NSA_INSTANTIATE(float)
NSA_INSTANTIATE(bf16)
#undef NSA_INSTANTIATE

}  // namespace nsatron::nsa::cuda::detail
