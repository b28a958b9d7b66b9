// Device memory and discovery. The CPU side is always there; the CUDA side is compiled only
// when the build has CUDA (NSATRON_WITH_CUDA) and otherwise reports "no CUDA".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor/dtype.h"

namespace nsatron {

// True when this build has CUDA and at least one device answers.
bool cuda_available();
// The number of CUDA devices this process sees (0 without CUDA).
int cuda_device_count();
// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)" or why there is none.
std::string cuda_device_summary();
std::int64_t cuda_l2_cache_bytes();  // the current device's L2 cache; 0 without a device
// The current device's opt-in shared memory of one block (a kernel's maximum dynamic shared
// memory may be raised up to it, less its static shared memory); 0 without a device.
std::int64_t cuda_block_shared_memory_optin_bytes();

void* cpu_alloc(std::size_t bytes);  // 64-byte aligned, throws std::bad_alloc
void cpu_free(void* p);
void* cuda_alloc(std::size_t bytes);  // throws when the build or machine has no CUDA
void cuda_free(void* p);     // keeps the block for reuse (a caching allocator)
void cuda_release_cached();  // returns the cached blocks to the driver

enum class CopyKind { HostToHost, HostToDevice, DeviceToHost, DeviceToDevice };
void memcpy_any(void* dst, const void* src, std::size_t bytes, CopyKind kind);
void memset_device(void* dst, int value, std::size_t bytes);
// Host to device, queued on the default stream without waiting for the device (a plain
// cudaMemcpy from pageable memory first waits for all queued work): the bytes are copied into
// a pinned staging buffer, one of a per-device ring of 8, and sent from there.
// Returns once `src` may be reused; waits only if the copy that last used its slot (that many
// copies ago) has not run yet. For the token ids of each micro-batch.
void copy_to_device_async(void* dst, const void* src, std::size_t bytes);
void cuda_synchronize();

// CUDA events, for timing (op_timer); opaque handles. record_event records on `stream` (a
// cudaStream_t; nullptr: the default stream, the one every kernel of this project runs on).
void* create_event();
void record_event(void* event, void* stream = nullptr);
double event_elapsed_ms(void* start, void* stop);  // waits for stop
void destroy_event(void* event);

// Bytes held by live Tensor storage on a device, and the peak since the last reset. Used to
// report activation memory (the peak minus what parameters and optimizer state hold).
struct MemoryStats {
  std::size_t current = 0;
  std::size_t peak = 0;
};
MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
void note_alloc(Device device, std::size_t bytes);
void note_free(Device device, std::size_t bytes);

}  // namespace nsatron
