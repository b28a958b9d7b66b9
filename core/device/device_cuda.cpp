// CUDA runtime side of core/device/device.h. Links cudart only (never the driver stub), so
// the binary starts on machines without a GPU driver.
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>
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

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {
// An attribute of the current device; 0 without a device.
std::int64_t current_device_attribute(cudaDeviceAttr attribute) {
  if (!cuda_available()) return 0;
  int dev = 0, value = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, dev));
  return value;
}
}  // namespace

std::int64_t cuda_l2_cache_bytes() { return current_device_attribute(cudaDevAttrL2CacheSize); }

std::int64_t cuda_block_shared_memory_optin_bytes() {
  return current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
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

// A caching allocator: freed blocks are kept by size and handed out again, since
// cudaMalloc/cudaFree synchronise the device and cost far more than a training step's
// hundreds of activation allocations can afford. Sizes are rounded up (to 512 bytes, and to
// 1/8 of the next power of two above 1 MiB) so blocks are reused across slightly different
// shapes. All kernels run on the default stream, in order, so a block freed by the host can
// be reused by later work at once; the one exception, an all-reduce started on a
// communicator's own stream (Communicator::start_all_reduce), keeps its tensor allocated
// until the compute stream has waited for it. When cudaMalloc fails, the cache is released
// and the allocation retried.
namespace {
struct BlockCache {
  std::mutex mutex;
  std::map<std::size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks
  std::map<void*, std::size_t> sizes;                      // live and cached blocks
  void release_all() {
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) {
        cudaFree(p);
        sizes.erase(p);
      }
    free_blocks.clear();
  }
};
BlockCache& cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: frees at exit would race the driver
  return *c;
}
std::size_t round_size(std::size_t bytes) {
  if (bytes <= (1u << 20)) return (bytes + 511) / 512 * 512;
  std::size_t p = 1u << 20;
  while (p < bytes) p <<= 1;
  const std::size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}
}  // namespace

void* cuda_alloc(std::size_t bytes) {
  if (!cuda_available()) throw std::runtime_error("cuda_alloc: no CUDA device on this machine");
  if (bytes == 0) return nullptr;
  const std::size_t size = round_size(bytes);
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (auto it = c.free_blocks.find(size); it != c.free_blocks.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) {
    cudaGetLastError();
    c.release_all();
    CUDA_CHECK(cudaMalloc(&p, size));
  }
  c.sizes[p] = size;
  return p;
}
void cuda_free(void* p) {
  if (!p) return;
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.sizes.find(p);
  if (it == c.sizes.end()) {
    cudaFree(p);
    return;
  }
  c.free_blocks[it->second].push_back(p);
}
void cuda_release_cached() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.release_all();
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
void copy_to_device_async(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  constexpr std::size_t kStagingSlots = 8;
  struct Slot {
    void* host = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t sent = nullptr;  // recorded after the copy that last used the slot
  };
  struct Ring {
    Slot slots[kStagingSlots];
    std::size_t next = 0;
  };
  thread_local std::vector<Ring> per_device;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (per_device.size() <= std::size_t(dev)) per_device.resize(std::size_t(dev) + 1);
  Ring& ring = per_device[std::size_t(dev)];
  Slot& s = ring.slots[ring.next++ % kStagingSlots];
  if (s.sent) CUDA_CHECK(cudaEventSynchronize(s.sent));
  if (s.bytes < bytes) {
    if (s.host) CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr;
    s.bytes = 0;
    CUDA_CHECK(cudaMallocHost(&s.host, bytes));
    s.bytes = bytes;
  }
  if (!s.sent) CUDA_CHECK(cudaEventCreateWithFlags(&s.sent, cudaEventDisableTiming));
  std::memcpy(s.host, src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, 0));
  CUDA_CHECK(cudaEventRecord(s.sent, 0));
}
void memset_device(void* dst, int value, std::size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemset(dst, value, bytes));
}
void cuda_synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

void* create_event() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
void record_event(void* event, void* stream) {
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}
double event_elapsed_ms(void* start, void* stop) {
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop)));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)));
  return ms;
}
void destroy_event(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

}  // namespace nsatron
