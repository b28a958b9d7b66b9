// Error checks for CUDA runtime and cuBLAS calls (CUDA builds only).
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define CUDA_CHECK(expr)                                                                 \
  do {                                                                                   \
    cudaError_t err_ = (expr);                                                           \
    if (err_ != cudaSuccess)                                                             \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                               ": " #expr ": " + cudaGetErrorString(err_));             \
  } while (0)
