// CPU elementwise helpers.
#include <cstring>

#include "core/ops/elementwise.h"

namespace nsatron::cpu {

template <class T> void add(T* out, const T* a, const T* b, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T> void add_(T* acc, const T* x, std::int64_t n) {
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
}

void copy_columns(void* packed, std::size_t pitch, const ColumnParts& parts, std::int64_t R, bool to_parts) {
  char* base = static_cast<char*>(packed);
#pragma omp parallel for schedule(static) if (std::size_t(R) * pitch > (1u << 16))
  for (std::int64_t r = 0; r < R; ++r) {
    char* row = base + std::size_t(r) * pitch;
    for (int k = 0; k < parts.count; ++k) {
      if (parts.row_bytes[k] == 0) continue;
      char* part = static_cast<char*>(parts.ptr[k]) + std::size_t(r) * parts.part_pitch[k];
      if (to_parts)
        std::memcpy(part, row + parts.offset[k], parts.row_bytes[k]);
      else
        std::memcpy(row + parts.offset[k], part, parts.row_bytes[k]);
    }
    if (!to_parts && parts.count > 0) {
      const std::size_t end = parts.offset[parts.count - 1] + parts.row_bytes[parts.count - 1];
      if (parts.zero_end > end) std::memset(row + end, 0, parts.zero_end - end);
    }
  }
}

void regroup_rows(const void* in, void* out, std::size_t row_bytes, const RowParts& parts, bool to_part_major) {
  const std::int64_t R = parts.groups * parts.total();
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
#pragma omp parallel for schedule(static) if (std::size_t(R) * row_bytes > (1u << 16))
  for (std::int64_t r = 0; r < R; ++r) {  // r: the part-major row
    const std::int64_t gm = parts.group_major(r);
    const std::int64_t from = to_part_major ? gm : r, to = to_part_major ? r : gm;
    std::memcpy(dst + std::size_t(to) * row_bytes, src + std::size_t(from) * row_bytes, row_bytes);
  }
}

void zero_columns(void* x, std::size_t pitch, std::size_t begin, std::size_t end, std::int64_t R) {
  char* p = static_cast<char*>(x);
  for (std::int64_t r = 0; r < R; ++r) std::memset(p + std::size_t(r) * pitch + begin, 0, end - begin);
}

template void add<float>(float*, const float*, const float*, std::int64_t);
template void add<double>(double*, const double*, const double*, std::int64_t);
template void add_<float>(float*, const float*, std::int64_t);
template void add_<double>(double*, const double*, std::int64_t);

}  // namespace nsatron::cpu
