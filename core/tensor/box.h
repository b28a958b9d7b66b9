// Blocks of row-major tensors: the part of a tensor of shape `full_shape` that starts at index
// `offset` and has shape `box`, copied out of (extract_box) or into (insert_box) a dense
// row-major buffer of the block. Tensor-parallel parameters are such blocks of their global
// tensors (core/model/params.h); checkpoints assemble and cut them.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/tensor/tensor.h"

namespace nsatron {

// Copies the block at `offset` of shape `box` out of a row-major tensor of shape `full_shape`
// into a dense row-major buffer (and back, with insert_box).
template <class T>
void extract_box(const T* full, const Shape& full_shape, const Shape& offset, const Shape& box, T* out);
template <class T>
void insert_box(T* full, const Shape& full_shape, const Shape& offset, const Shape& box, const T* in);

namespace detail {
// Calls copy(full_index, box_index, n) for each contiguous run of the block (a run along the
// last dimension).
template <class F>
void for_each_box_run(const Shape& full_shape, const Shape& offset, const Shape& box, F&& copy) {
  const std::size_t r = box.size();
  if (r == 0) return copy(std::int64_t(0), std::int64_t(0), std::int64_t(1));
  const std::int64_t run = box[r - 1];
  std::int64_t outer = 1;
  for (std::size_t d = 0; d + 1 < r; ++d) outer *= box[d];
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t rest = o, at_full = 0, stride = 1;
    for (std::size_t d = r - 1; d-- > 0;) {  // the block index of o, dimension by dimension
      stride *= full_shape[d + 1];
      at_full += (offset[d] + rest % box[d]) * stride;
      rest /= box[d];
    }
    copy(at_full + offset[r - 1], o * run, run);
  }
}
}  // namespace detail

template <class T>
void extract_box(const T* full, const Shape& full_shape, const Shape& offset, const Shape& box, T* out) {
  detail::for_each_box_run(full_shape, offset, box, [&](std::int64_t f, std::int64_t b, std::int64_t n) {
    std::copy(full + f, full + f + n, out + b);
  });
}
template <class T>
void insert_box(T* full, const Shape& full_shape, const Shape& offset, const Shape& box, const T* in) {
  detail::for_each_box_run(full_shape, offset, box, [&](std::int64_t f, std::int64_t b, std::int64_t n) {
    std::copy(in + b, in + b + n, full + f);
  });
}

}  // namespace nsatron
