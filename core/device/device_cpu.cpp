#include "core/device/device.h"

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

}  // namespace nsatron
