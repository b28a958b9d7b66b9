// CUDA elementwise helpers (see elementwise.h): grid-stride loops over 16-byte vectors, the
// tail (and unaligned buffers) element by element. fp32 arithmetic, one rounding per output.
#include <algorithm>
#include <string>

#include "core/ops/cuda/common.cuh"
#include "core/ops/elementwise.h"

namespace nsatron::cuda {

using namespace cuda_detail;

namespace {

// Calls f(U{}) for the widest unit U (16, 8, 4, 2 or 1 bytes) that divides `a` (the OR of the
// addresses, sizes and offsets a copy or fill touches): copy_columns, regroup_rows, zero_columns.
template <class F> void with_widest_unit(std::uintptr_t a, F&& f) {
  if (a % 16 == 0) return f(uint4{});
  if (a % 8 == 0) return f(std::uint64_t{});
  if (a % 4 == 0) return f(std::uint32_t{});
  if (a % 2 == 0) return f(std::uint16_t{});
  f(std::uint8_t{});
}

// out = a + b over elements [0, n); out may be a or b (each element read, then written, by
// one thread).
template <class T, int V>
__global__ void add_kernel(T* out, const T* a, const T* b, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x * V;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += stride) {
    float av[V], bv[V], o[V];
    load<T, V>(a + i, av);
    load<T, V>(b + i, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = av[k] + bv[k];
    store<T, V>(out + i, o);
  }
}

template <class T> void add_impl(T* out, const T* a, const T* b, std::int64_t n) {
  if (n == 0) return;
  constexpr int V = kVec<T>;
  constexpr int threads = 256;
  std::int64_t done = 0;
  if (aligned16(out) && aligned16(a) && aligned16(b) && n >= V) {
    const std::int64_t nv = n / V * V;
    add_kernel<T, V><<<grid_for(nv / V, threads, 8192), threads>>>(out, a, b, nv);
    check_launch("add");
    done = nv;
  }
  if (done < n) {
    add_kernel<T, 1><<<grid_for(n - done, threads, 8192), threads>>>(out + done, a + done,
                                                                      b + done, n - done);
    check_launch("add");
  }
}

// out = in[0] + ... + in[count - 1] over elements [0, n), left to right in fp32; out may be one
// of the inputs (each element read, then written, by one thread).
template <class T> struct SumInputs {
  const T* p[kMaxSumInputs];
  int count;
};
template <class T, int V>
__global__ void sum_in_order_kernel(T* out, const SumInputs<T> in, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x * V;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n; i += stride) {
    float acc[V], x[V];
    load<T, V>(in.p[0] + i, acc);
#pragma unroll
    for (int k = 1; k < kMaxSumInputs; ++k) {  // unrolled: the pointers read from the parameters
      if (k >= in.count) break;
      load<T, V>(in.p[k] + i, x);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += x[j];
    }
    store<T, V>(out + i, acc);
  }
}

template <class T>
void sum_in_order_impl(T* out, SumInputs<T> in, std::int64_t n, cudaStream_t stream, int max_blocks) {
  if (n == 0) return;
  constexpr int V = kVec<T>;
  constexpr int threads = 256;
  bool aligned = aligned16(out);
  for (int k = 0; k < in.count; ++k) aligned = aligned && aligned16(in.p[k]);
  std::int64_t done = 0;
  if (aligned && n >= V) {
    const std::int64_t nv = n / V * V;
    sum_in_order_kernel<T, V><<<grid_for(nv / V, threads, max_blocks), threads, 0, stream>>>(out, in, nv);
    check_launch("sum_in_order");
    done = nv;
  }
  if (done < n) {
    for (int k = 0; k < in.count; ++k) in.p[k] += done;
    sum_in_order_kernel<T, 1><<<grid_for(n - done, threads, max_blocks), threads, 0, stream>>>(out + done, in, n - done);
    check_launch("sum_in_order");
  }
}

template <class S, class D>
__global__ void cast_kernel(D* out, const S* in, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f<D>(to_f(in[i]));
}

// The parts of copy_columns in units of U: part k is columns [offset[k], offset[k] + width[k])
// of the packed rows (`pitch` units each, the first `used` of them covered by the parts, in
// order), row r of part k at ptr[k] + r * part_pitch[k]. 64 parts: 1.3 KB of parameters.
template <class U> struct UnitParts {
  U* ptr[kMaxColumnParts];
  int offset[kMaxColumnParts];
  int width[kMaxColumnParts];
  int part_pitch[kMaxColumnParts];
  int count;
  int pitch;
  int used;
  int zero_end;  // the join writes zeros into columns [used, zero_end) (<= used: none)
};

// Each block copies kRows rows at a time (grid-stride over row groups), each thread a column
// unit of those rows: the loads of the kRows rows are issued before their stores. A thread's
// columns ascend, so its search for the part of a column goes on from the previous one.
constexpr int kColumnRows = 4;
template <class U, bool kToParts>
__global__ void copy_columns_kernel(U* packed, const UnitParts<U> p, std::int64_t R) {
  for (std::int64_t r0 = std::int64_t(blockIdx.x) * kColumnRows; r0 < R; r0 += std::int64_t(gridDim.x) * kColumnRows) {
    int k = 0;
    if (!kToParts)
      for (int c = p.used + threadIdx.x; c < p.zero_end; c += blockDim.x)
#pragma unroll
        for (int i = 0; i < kColumnRows; ++i)
          if (r0 + i < R) packed[(r0 + i) * p.pitch + c] = U{};
    for (int c = threadIdx.x; c < p.used; c += blockDim.x) {
      while (c >= p.offset[k] + p.width[k]) ++k;  // parts are contiguous, in order; zero widths skipped
      const int j = c - p.offset[k], pp = p.part_pitch[k];
      U* part = p.ptr[k];
      U v[kColumnRows];
#pragma unroll
      for (int i = 0; i < kColumnRows; ++i)
        if (r0 + i < R) v[i] = kToParts ? packed[(r0 + i) * p.pitch + c] : part[(r0 + i) * pp + j];
#pragma unroll
      for (int i = 0; i < kColumnRows; ++i)
        if (r0 + i < R) (kToParts ? part[(r0 + i) * pp + j] : packed[(r0 + i) * p.pitch + c]) = v[i];
    }
  }
}

template <class U>
void copy_columns_as(void* packed, std::size_t pitch, const ColumnParts& parts, std::int64_t R, bool to_parts) {
  UnitParts<U> p{};
  p.count = parts.count;
  p.pitch = int(pitch / sizeof(U));
  for (int k = 0; k < parts.count; ++k) {
    p.ptr[k] = static_cast<U*>(parts.ptr[k]);
    p.offset[k] = int(parts.offset[k] / sizeof(U));
    p.width[k] = int(parts.row_bytes[k] / sizeof(U));
    p.part_pitch[k] = int(parts.part_pitch[k] / sizeof(U));
    p.used = p.offset[k] + p.width[k];
  }
  p.zero_end = int(parts.zero_end / sizeof(U));
  const int threads = row_threads(p.used);
  const unsigned blocks = grid_for((R + kColumnRows - 1) / kColumnRows, 1, 1 << 20);
  if (to_parts)
    copy_columns_kernel<U, true><<<blocks, threads>>>(static_cast<U*>(packed), p, R);
  else
    copy_columns_kernel<U, false><<<blocks, threads>>>(static_cast<U*>(packed), p, R);
  check_launch(to_parts ? "split_columns" : "join_columns");
}

// regroup_rows in units of U: part-major row r of per_row units each, its group-major row from
// RowParts (a few integer steps per unit: the copy is of weight-sized matrices).
template <class U>
__global__ void regroup_rows_kernel(const U* __restrict__ in, U* __restrict__ out, std::int64_t per_row,
                                    std::int64_t total, const RowParts parts, bool to_part_major) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t r = i / per_row, c = i - r * per_row, gm = parts.group_major(r);
    const std::int64_t from = to_part_major ? gm : r, to = to_part_major ? r : gm;
    out[to * per_row + c] = in[from * per_row + c];
  }
}

template <class U>
void regroup_rows_as(const void* in, void* out, std::size_t row_bytes, const RowParts& parts, bool to_part_major) {
  const std::int64_t per_row = std::int64_t(row_bytes / sizeof(U)), total = per_row * parts.groups * parts.total();
  regroup_rows_kernel<U><<<grid_for(total, 256, 8192), 256>>>(static_cast<const U*>(in), static_cast<U*>(out),
                                                              per_row, total, parts, to_part_major);
  check_launch("regroup_rows");
}

// zero_columns in units of U: units [begin, begin + width) of each row of pitch units.
template <class U>
__global__ void zero_columns_kernel(U* x, std::int64_t pitch, std::int64_t begin, std::int64_t width, std::int64_t total) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t r = i / width;
    x[r * pitch + begin + (i - r * width)] = U{};
  }
}

template <class U>
void zero_columns_as(void* x, std::size_t pitch, std::size_t begin, std::size_t end, std::int64_t R) {
  const std::int64_t width = std::int64_t((end - begin) / sizeof(U)), total = width * R;
  zero_columns_kernel<U><<<grid_for(total, 256, 8192), 256>>>(static_cast<U*>(x), std::int64_t(pitch / sizeof(U)),
                                                              std::int64_t(begin / sizeof(U)), width, total);
  check_launch("zero_columns");
}

}  // namespace

void regroup_rows(const void* in, void* out, std::size_t row_bytes, const RowParts& parts, bool to_part_major) {
  if (row_bytes == 0 || parts.groups * parts.total() == 0) return;
  // The widest unit that divides the rows and both addresses.
  const std::uintptr_t a =
      reinterpret_cast<std::uintptr_t>(in) | reinterpret_cast<std::uintptr_t>(out) | std::uintptr_t(row_bytes);
  with_widest_unit(a, [&](auto unit) { regroup_rows_as<decltype(unit)>(in, out, row_bytes, parts, to_part_major); });
}

void zero_columns(void* x, std::size_t pitch, std::size_t begin, std::size_t end, std::int64_t R) {
  if (R == 0 || end <= begin) return;
  // The widest unit that divides the address, the pitch and both ends (a 2-D memset of the
  // model's 56-byte pad columns took 0.025 ms per call; docs/performance.md, thirteenth session).
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(x) | pitch | begin | end;
  with_widest_unit(a, [&](auto unit) { zero_columns_as<decltype(unit)>(x, pitch, begin, end, R); });
}

void copy_columns(void* packed, std::size_t pitch, const ColumnParts& parts, std::int64_t R, bool to_parts) {
  if (R == 0 || pitch == 0 || parts.count == 0) return;
  if (parts.count > kMaxColumnParts)
    throw std::invalid_argument("split_columns / join_columns (cuda): more than " +
                                std::to_string(kMaxColumnParts) + " parts");
  // The widest unit that divides every address, width, offset and pitch.
  std::uintptr_t a = reinterpret_cast<std::uintptr_t>(packed) | std::uintptr_t(pitch) | parts.zero_end;
  std::size_t widest = pitch;
  for (int k = 0; k < parts.count; ++k) {
    widest = std::max(widest, parts.part_pitch[k]);
    if (parts.row_bytes[k])
      a |= reinterpret_cast<std::uintptr_t>(parts.ptr[k]) | parts.row_bytes[k] | parts.offset[k] |
           parts.part_pitch[k];
  }
  if (widest > std::size_t(0x7fffffff))
    throw std::invalid_argument("split_columns / join_columns (cuda): rows too wide");
  with_widest_unit(a, [&](auto unit) { copy_columns_as<decltype(unit)>(packed, pitch, parts, R, to_parts); });
}

void cast(DType src_dt, const void* src, DType dst_dt, void* dst, std::int64_t n) {
  if (n == 0) return;
  dispatch(src_dt, "cast", [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch(dst_dt, "cast", [&](auto d_tag) {
      using D = decltype(d_tag);
      cast_kernel<S, D><<<grid_for(n, 256, 8192), 256>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
      check_launch("cast");
    });
  });
}

void add(DType dt, void* out, const void* a, const void* b, std::int64_t n) {
  dispatch(dt, "add", [&](auto tag) {
    using T = decltype(tag);
    add_impl<T>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
}

void add_(DType dt, void* acc, const void* x, std::int64_t n) {
  dispatch(dt, "add_", [&](auto tag) {
    using T = decltype(tag);
    add_impl<T>(static_cast<T*>(acc), static_cast<const T*>(acc), static_cast<const T*>(x), n);
  });
}

void sum_in_order(DType dt, void* out, std::span<const void* const> inputs, std::int64_t n, CUstream_st* stream,
                  int max_blocks) {
  if (inputs.empty() || inputs.size() > std::size_t(kMaxSumInputs))
    throw std::invalid_argument("sum_in_order: " + std::to_string(inputs.size()) + " inputs (1 to " +
                                std::to_string(kMaxSumInputs) + ")");
  dispatch(dt, "sum_in_order", [&](auto tag) {
    using T = decltype(tag);
    SumInputs<T> in{};
    in.count = int(inputs.size());
    for (int k = 0; k < in.count; ++k) in.p[k] = static_cast<const T*>(inputs[std::size_t(k)]);
    sum_in_order_impl<T>(static_cast<T*>(out), in, n, stream, max_blocks > 0 ? max_blocks : 8192);
  });
}

}  // namespace nsatron::cuda
