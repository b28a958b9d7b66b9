// CUDA runtime side of core/device/device.h. Links cudart only (never the driver stub), so
// the binary starts on machines without a GPU driver.
#include <cuda_runtime.h>

#include <cstring>
#include <sstream>

#include "core/device/device.h"
#include "core/device/cuda_check.h"

namespace nsatron {

bool cuda_available() {
  static const bool available = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return available;
}

std::string cuda_device_summary() {
  if (!cuda_available()) return "no CUDA device";
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  std::ostringstream os;
  os << p.name << " (sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, "
     << double(p.totalGlobalMem) / (1024.0 * 1024 * 1024) << " GiB)";
  return os.str();
}

void* cuda_alloc(std::size_t bytes) {
  if (!cuda_available()) throw std::runtime_error("cuda_alloc: no CUDA device on this machine");
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void cuda_free(void* p) {
  if (p) cudaFree(p);
}

void memcpy_any(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  if (kind == CopyKind::HostToHost) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyDeviceToDevice;
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, k));
}
void memset_device(void* dst, int value, std::size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemset(dst, value, bytes));
}
void cuda_synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

void copy_rows_device(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t row_bytes, std::size_t rows) {
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, 0));
}

}  // namespace nsatron
