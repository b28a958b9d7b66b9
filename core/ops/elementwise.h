// Elementwise helpers for the residual stream and gradient sums.
//   this header          - the math, the Tensor-level entry points
//   elementwise.cpp      - the entry points
//   cpu/elementwise.cpp  - the CPU loops (OpenMP)
//   cuda/elementwise.cu  - the CUDA kernels (fp32 or bf16)
//
// add:        out = a + b           (residual: h = x + f(x)); out may be a or b
//             backward: da = db = dout (the same tensor serves both; nothing to compute)
// add_:       acc += x              (a gradient arriving by a second path: residual branches,
//                                    a tensor used twice)
// cast:       dst = src converted to dst's dtype (round to nearest even into bf16), e.g. the
//             bf16 compute copy of fp32 master weights; same numel and device
// split_columns: packed [R, W] with W = sum_k w_k, parts[k] [R, w_k]:
//             parts[k][r, j] = packed[r, o_k + j], o_k = w_0 + ... + w_{k-1};
//             backward: join_columns of the parts' gradients
// join_columns: the inverse, packed[r, o_k + j] = parts[k][r, j]; backward: split_columns.
//             Grouped and padded (PackedColumns): packed rows may hold the parts' columns `groups`
//             times (group width W_g = sum_k w_k) and end in pad columns up to a pitch
//             P >= groups * W_g, packed [R, P], parts[k] [R, groups * w_k]:
//               parts[k][r, g * w_k + j] = packed[r, g * W_g + o_k + j]
//             e.g. the fused attention projection [tokens, G * group width padded to a multiple
//             of 64] into the attention core's inputs [tokens, G * part width]. The pad columns
//             [groups * W_g, P) are not read; the join writes zeros there with zero_pad, else
//             leaves them untouched.
//             Both are copies (any dtype, bits unchanged), one pass over the bytes: on CUDA one
//             kernel for all the parts, in the widest unit (up to 16 bytes) that every width,
//             offset, pitch and address allows.
// regroup_rows: the rows of a matrix in `groups` groups of parts (group-major: part k of group
//             g at rows g * W + o_k, W = sum_k w_k, o_k = w_0 + ... + w_{k-1}) and the same rows
//             part by part (part-major: part k of group g at rows groups * o_k + g * w_k):
//               to_part_major: out[groups * o_k + g * w_k + j] = in[g * W + o_k + j]
//               else the inverse, out[g * W + o_k + j] = in[groups * o_k + g * w_k + j]
//             e.g. the fused attention projection's weight rows (core/model/model.h) reordered
//             so that each part of all groups is one column range of the product's rows. in and
//             out have at least groups * W rows of the same shape; rows from there on are
//             neither read nor written. A copy (any dtype, bits unchanged); on CUDA one kernel.
// zero_columns: x [R, P]: columns [begin, end) of every row set to zero, the rest untouched.
// sum_in_order (CUDA only): out = x_0 + x_1 + ... + x_{k-1}, left to right in fp32, rounded once
//             into the dtype (for k = 2 the bits of add). The tensor-parallel sums on the copy
//             engines (parallel/copy_engine_communicator.h): every rank adds the same inputs in
//             rank order, so all of them hold the same bits; out may be one of the inputs.
// Deterministic: elementwise.
#pragma once
struct CUstream_st;  // cudaStream_t, without the CUDA headers

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/tensor/tensor.h"
#include "core/util/host_device.h"

namespace nsatron {

// a, b, out: one shape, dtype and device.
void add(const Tensor& a, const Tensor& b, Tensor& out);
// acc += x; same shape, dtype and device.
void add_(Tensor& acc, const Tensor& x);
// dst = src with dst's dtype; same numel and device (any of fp32, fp64, bf16 on the CPU;
// fp32 and bf16 on CUDA).
void cast(const Tensor& src, Tensor& dst);
// packed [R, W] and parts[k] [R, w_k] with sum_k w_k = W; one dtype and device; at most
// kMaxColumnParts parts (any number of groups: the raw form below takes at most kMaxColumnParts
// (group, part) pairs a call, so the entry points run whole groups at a time).
constexpr int kMaxColumnParts = 64;
struct PackedColumns {
  std::int64_t groups = 1;  // the parts' columns repeat this many times per packed row
  std::int64_t pitch = 0;   // packed's columns (pad included), 0: exactly groups * sum_k w_k
  bool zero_pad = false;    // join_columns: zeros into the pad columns (split_columns: ignored)
};
void split_columns(const Tensor& packed, std::span<Tensor* const> parts, const PackedColumns& layout = {});
void join_columns(std::span<const Tensor* const> parts, Tensor& packed, const PackedColumns& layout = {});
// part_rows: the w_k (at most kMaxColumnParts of them); in, out: [>= groups * W, ...].
void regroup_rows(const Tensor& in, Tensor& out, std::span<const std::int64_t> part_rows, std::int64_t groups,
                  bool to_part_major);
void zero_columns(Tensor& x, std::int64_t begin, std::int64_t end);

// The raw form of both, shared by the CPU and CUDA sides: `count` parts of row_bytes[k] bytes
// per row, at byte offsets offset[k] (ascending, contiguous from 0) of packed rows of `pitch`
// bytes (pitch >= the parts' total, the rest of a row untouched); row r of part k starts at
// ptr[k] + r * part_pitch[k] (part_pitch[k] >= row_bytes[k]). The join (!to_parts) also
// writes zeros into bytes [the parts' end, zero_end) of each packed row (zero_end 0: none). A grouped split lists part k of
// group g as an entry of its own: ptr = parts[k] + g * row_bytes, part_pitch = groups * row_bytes.
struct ColumnParts {
  void* ptr[kMaxColumnParts];
  std::size_t row_bytes[kMaxColumnParts];
  std::size_t offset[kMaxColumnParts];
  std::size_t part_pitch[kMaxColumnParts];
  int count = 0;
  std::size_t zero_end = 0;
};

// The raw form of regroup_rows: count parts of rows[k] rows each, in `groups` groups.
struct RowParts {
  std::int64_t rows[kMaxColumnParts];
  int count = 0;
  std::int64_t groups = 1;
  // The group-major row of part-major row r (r < groups * the parts' rows).
  NSATRON_HD std::int64_t group_major(std::int64_t r) const {
    std::int64_t first = 0, width = 0;  // part k's first part-major row and the parts' rows before it
    for (int k = 0; k < count; ++k) {
      const std::int64_t span = groups * rows[k];
      if (r < first + span) {
        const std::int64_t g = (r - first) / rows[k];
        return g * total() + width + (r - first - g * rows[k]);
      }
      first += span;
      width += rows[k];
    }
    return -1;
  }
  NSATRON_HD std::int64_t total() const {  // W
    std::int64_t w = 0;
    for (int k = 0; k < count; ++k) w += rows[k];
    return w;
  }
};

namespace cpu {
// out may alias a or b.
template <class T> void add(T* out, const T* a, const T* b, std::int64_t n);
template <class T> void add_(T* acc, const T* x, std::int64_t n);
// to_parts: packed -> parts (split_columns), else parts -> packed (join_columns).
void copy_columns(void* packed, std::size_t pitch, const ColumnParts& parts, std::int64_t R, bool to_parts);
// Rows of row_bytes bytes; to_part_major: in group-major, out part-major (else the inverse).
void regroup_rows(const void* in, void* out, std::size_t row_bytes, const RowParts& parts, bool to_part_major);
// x rows of pitch bytes: bytes [begin, end) of each of its R rows zeroed.
void zero_columns(void* x, std::size_t pitch, std::size_t begin, std::size_t end, std::int64_t R);
}  // namespace cpu

namespace cuda {
// Device pointers of dtype `dt` (fp32 or bf16; the sum in fp32, rounded once), default stream.
void add(DType dt, void* out, const void* a, const void* b, std::int64_t n);  // out may be a or b
void add_(DType dt, void* acc, const void* x, std::int64_t n);
void cast(DType src_dt, const void* src, DType dst_dt, void* dst, std::int64_t n);
// Same contract as cpu::copy_columns, device pointers, one kernel.
void copy_columns(void* packed, std::size_t pitch, const ColumnParts& parts, std::int64_t R, bool to_parts);
// Same contracts as cpu::regroup_rows and cpu::zero_columns, device pointers.
void regroup_rows(const void* in, void* out, std::size_t row_bytes, const RowParts& parts, bool to_part_major);
void zero_columns(void* x, std::size_t pitch, std::size_t begin, std::size_t end, std::int64_t R);
// out = inputs[0] + ... + inputs[count - 1] over n elements of dtype dt (fp32 or bf16), in that
// order in fp32, one rounding; 1 <= count <= kMaxSumInputs; out may be one of the inputs; on
// `stream` (null: the default stream), in at most max_blocks blocks of 256 threads (0: as many
// as the size asks, up to 8192; a kernel beside others takes fewer, so as not to hold every SM).
constexpr int kMaxSumInputs = 8;
void sum_in_order(DType dt, void* out, std::span<const void* const> inputs, std::int64_t n,
                  CUstream_st* stream = nullptr, int max_blocks = 0);
}  // namespace cuda

}  // namespace nsatron
