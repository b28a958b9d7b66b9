// NSATRON_HD: a small function callable from host code and, compiled by nvcc, from device code
// (plain inline C++ elsewhere), for index arithmetic shared by a CPU loop and a CUDA kernel.
#pragma once

#ifdef __CUDACC__
#define NSATRON_HD __host__ __device__ __forceinline__
#else
#define NSATRON_HD inline
#endif
