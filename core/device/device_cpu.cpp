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
