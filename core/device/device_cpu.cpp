#include "core/device/device.h"

#include <atomic>
#include <cstring>
#include <cstdlib>
#include <new>

namespace nsatron {

void* cpu_alloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  return p;
}
void cpu_free(void* p) { std::free(p); }

namespace {
void copy_rows_cpu(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t row_bytes,
                   std::size_t rows) {
#pragma omp parallel for schedule(static) if (rows * row_bytes > (1u << 16))
  for (std::size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
}
}  // namespace

void copy_rows(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t row_bytes,
               std::size_t rows, Device device) {
  if (rows == 0 || row_bytes == 0) return;
  if (device == Device::CPU) return copy_rows_cpu(dst, dst_pitch, src, src_pitch, row_bytes, rows);
  copy_rows_device(dst, dst_pitch, src, src_pitch, row_bytes, rows);
}

namespace {
struct Counter {
  std::atomic<std::size_t> current{0}, peak{0};
};
Counter& counter(Device d) {
  static Counter counters[2];
  return counters[d == Device::CPU ? 0 : 1];
}
}  // namespace

void note_alloc(Device device, std::size_t bytes) {
  Counter& c = counter(device);
  std::size_t now = c.current.fetch_add(bytes) + bytes;
  std::size_t seen = c.peak.load();
  while (now > seen && !c.peak.compare_exchange_weak(seen, now)) {
  }
}
void note_free(Device device, std::size_t bytes) { counter(device).current.fetch_sub(bytes); }
MemoryStats memory_stats(Device device) {
  Counter& c = counter(device);
  return {c.current.load(), c.peak.load()};
}
void reset_peak_memory(Device device) {
  Counter& c = counter(device);
  c.peak.store(c.current.load());
}

}  // namespace nsatron
