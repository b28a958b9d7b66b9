// Built without CUDA: every CUDA entry point says so.
#include <cstring>
#include <stdexcept>

#include "core/device/device.h"

namespace nsatron {

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_summary() { return "this build has no CUDA (NSATRON_CUDA=OFF)"; }
std::int64_t cuda_l2_cache_bytes() { return 0; }
std::int64_t cuda_block_shared_memory_optin_bytes() { return 0; }
void* cuda_alloc(std::size_t) { throw std::runtime_error("this build of nsatron has no CUDA"); }
void cuda_free(void*) {}
void cuda_release_cached() {}
void* create_event() { throw std::runtime_error("this build of nsatron has no CUDA"); }
void record_event(void*, void*) {}
double event_elapsed_ms(void*, void*) { return 0.0; }
void destroy_event(void*) {}
void memcpy_any(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  if (kind != CopyKind::HostToHost) throw std::runtime_error("this build of nsatron has no CUDA");
  if (bytes) std::memcpy(dst, src, bytes);
}
void memset_device(void*, int, std::size_t) { throw std::runtime_error("this build of nsatron has no CUDA"); }
void cuda_synchronize() {}
void copy_to_device_async(void*, const void*, std::size_t) { throw std::runtime_error("this build of nsatron has no CUDA"); }

}  // namespace nsatron
