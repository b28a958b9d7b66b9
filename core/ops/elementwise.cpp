#include "core/ops/elementwise.h"

#include "core/ops/op_util.h"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace nsatron {

using namespace ops_detail;

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const std::string op = "add";
  same_dtype_device(op, {&a, &b, &out});
  require(a.shape() == b.shape() && a.shape() == out.shape(), op,
          "shapes differ: " + a.describe() + " + " + b.describe() + " -> " + out.describe());
  if (a.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, a);
    cuda::add(a.dtype(), out.raw(), a.raw(), b.raw(), a.numel());
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::add<T>(out.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

void add_(Tensor& acc, const Tensor& x) {
  const std::string op = "add_";
  same_dtype_device(op, {&acc, &x});
  require(acc.shape() == x.shape(), op, "shapes differ: " + acc.describe() + " += " + x.describe());
  if (acc.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, acc);
    cuda::add_(acc.dtype(), acc.raw(), x.raw(), acc.numel());
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, acc, [&](auto tag) {
    using T = decltype(tag);
    cpu::add_<T>(acc.data<T>(), x.data<T>(), acc.numel());
  });
}

namespace {
// Checks packed [R, P] against the parts [R, groups * w_k] (P = groups * sum w_k, or the padded
// pitch) and runs the copy: part k of group g is entry g * parts.size() + k of the raw form.
void copy_columns(const std::string& op, const Tensor& packed, std::span<const Tensor* const> parts,
                  const PackedColumns& layout, bool to_parts) {
  require(packed.ndim() == 2, op, "packed must be 2-D [R, W], got " + packed.describe());
  require(!parts.empty() && parts.size() <= std::size_t(kMaxColumnParts), op,
          "between 1 and " + std::to_string(kMaxColumnParts) + " parts, got " + std::to_string(parts.size()));
  const std::int64_t G = layout.groups;
  require(G >= 1, op, "at least one group, got " + std::to_string(G));
  const std::int64_t R = packed.dim(0);
  const std::size_t e = dtype_size(packed.dtype());
  std::int64_t group_width = 0;
  for (const Tensor* t : parts) {
    same_dtype_device(op, {&packed, t});
    require(t->ndim() == 2 && t->dim(0) == R && t->dim(1) % G == 0, op,
            "each part must be 2-D [" + std::to_string(R) + ", " + std::to_string(G) + " * w], got " +
                t->describe());
    group_width += t->dim(1) / G;
  }
  const std::int64_t used = G * group_width, pitch = layout.pitch == 0 ? used : layout.pitch;
  if (layout.pitch == 0)
    require(used == packed.dim(1), op,
            "the parts' widths sum to " + std::to_string(used) + ", packed " + packed.describe() + " has " +
                std::to_string(packed.dim(1)) + " columns");
  else
    require(pitch >= used && packed.dim(1) == pitch, op,
            "packed " + packed.describe() + " must have pitch = " + std::to_string(pitch) +
                " columns, at least the parts' " + std::to_string(used));
  if (R == 0 || pitch == 0) return;
  // The raw form takes at most kMaxColumnParts (group, part) pairs: whole groups at a time, each
  // batch's columns from its first group's (packed shifted there; the pad zeroed by the last).
  const std::int64_t per_batch = std::max<std::int64_t>(1, kMaxColumnParts / std::int64_t(parts.size()));
  for (std::int64_t g0 = 0; g0 < G; g0 += per_batch) {
    const std::int64_t g1 = std::min(G, g0 + per_batch);
    ColumnParts cp;
    for (std::int64_t g = g0; g < g1; ++g) {
      std::int64_t col = (g - g0) * group_width;
      for (const Tensor* t : parts) {
        const std::size_t row_bytes = std::size_t(t->dim(1) / G) * e;
        cp.ptr[cp.count] = static_cast<char*>(t->raw()) + std::size_t(g) * row_bytes;
        cp.row_bytes[cp.count] = row_bytes;
        cp.offset[cp.count] = std::size_t(col) * e;
        cp.part_pitch[cp.count] = std::size_t(t->dim(1)) * e;
        ++cp.count;
        col += t->dim(1) / G;
      }
    }
    if (layout.zero_pad && !to_parts && g1 == G) cp.zero_end = std::size_t(pitch - g0 * group_width) * e;
    char* base = static_cast<char*>(packed.raw()) + std::size_t(g0 * group_width) * e;
    if (packed.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
      cuda::copy_columns(base, std::size_t(pitch) * e, cp, R, to_parts);
      continue;
#else
      no_cuda(op);
#endif
    }
    cpu::copy_columns(base, std::size_t(pitch) * e, cp, R, to_parts);
  }
}
}  // namespace

void split_columns(const Tensor& packed, std::span<Tensor* const> parts, const PackedColumns& layout) {
  std::vector<const Tensor*> ps(parts.begin(), parts.end());
  copy_columns("split_columns", packed, ps, layout, true);
}

void join_columns(std::span<const Tensor* const> parts, Tensor& packed, const PackedColumns& layout) {
  copy_columns("join_columns", packed, parts, layout, false);
}

void regroup_rows(const Tensor& in, Tensor& out, std::span<const std::int64_t> part_rows, std::int64_t groups,
                  bool to_part_major) {
  const std::string op = "regroup_rows";
  require(in.defined() && out.defined() && in.ndim() >= 1 && out.ndim() >= 1, op, "in and out must have rows");
  same_dtype_device(op, {&in, &out});
  require(!part_rows.empty() && part_rows.size() <= std::size_t(kMaxColumnParts) && groups >= 1, op,
          "between 1 and " + std::to_string(kMaxColumnParts) + " parts and at least one group, got " +
              std::to_string(part_rows.size()) + " parts, " + std::to_string(groups) + " groups");
  RowParts rp;
  rp.groups = groups;
  for (std::int64_t w : part_rows) {
    require(w >= 0, op, "a part's row count is negative: " + std::to_string(w));
    rp.rows[rp.count++] = w;
  }
  const std::int64_t R = groups * rp.total();
  require(in.dim(0) >= R && out.dim(0) >= R && (in.dim(0) == 0 || out.dim(0) == 0 ||
                                                 in.numel() / in.dim(0) == out.numel() / out.dim(0)),
          op, "in " + in.describe() + " and out " + out.describe() + " need " + std::to_string(R) +
                  " rows of the same size");
  if (R == 0 || in.numel() == 0) return;
  const std::size_t row_bytes = in.nbytes() / std::size_t(in.dim(0));
  if (in.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::regroup_rows(in.raw(), out.raw(), row_bytes, rp, to_part_major);
    return;
#else
    no_cuda(op);
#endif
  }
  cpu::regroup_rows(in.raw(), out.raw(), row_bytes, rp, to_part_major);
}

void zero_columns(Tensor& x, std::int64_t begin, std::int64_t end) {
  const std::string op = "zero_columns";
  require(x.defined() && x.ndim() == 2, op, "x must be 2-D [R, P], got " + x.describe());
  require(0 <= begin && begin <= end && end <= x.dim(1), op,
          "columns [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside " + x.describe());
  if (begin == end || x.dim(0) == 0) return;
  const std::size_t e = dtype_size(x.dtype()), pitch = std::size_t(x.dim(1)) * e;
  if (x.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::zero_columns(x.raw(), pitch, std::size_t(begin) * e, std::size_t(end) * e, x.dim(0));
    return;
#else
    no_cuda(op);
#endif
  }
  cpu::zero_columns(x.raw(), pitch, std::size_t(begin) * e, std::size_t(end) * e, x.dim(0));
}

void cast(const Tensor& src, Tensor& dst) {
  const std::string op = "cast";
  require(src.numel() == dst.numel() && src.device() == dst.device(), op,
          "cannot cast " + src.describe() + " into " + dst.describe());
  if (src.dtype() == dst.dtype()) {
    dst.copy_from(src);
    return;
  }
  if (src.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::cast(src.dtype(), src.raw(), dst.dtype(), dst.raw(), src.numel());
    return;
#else
    no_cuda(op);
#endif
  }
  auto convert = [&](auto src_tag, auto dst_tag) {
    using S = decltype(src_tag);
    using D = decltype(dst_tag);
    const S* in = src.data<S>();
    D* out = dst.data<D>();
    const std::int64_t n = src.numel();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<D, double> && std::is_same_v<S, float>) out[i] = double(in[i]);
      else if constexpr (std::is_same_v<D, double>) out[i] = double(float(in[i]));
      else out[i] = D(float(in[i]));  // fp64 -> bf16 goes through fp32 (rounded twice)
    }
  };
  auto with_dst = [&](auto src_tag) {
    switch (dst.dtype()) {
      case DType::F32: return convert(src_tag, float{});
      case DType::F64: return convert(src_tag, double{});
      case DType::BF16: return convert(src_tag, bf16{});
    }
  };
  switch (src.dtype()) {
    case DType::F32: return with_dst(float{});
    case DType::F64: return with_dst(double{});
    case DType::BF16: return with_dst(bf16{});
  }
}

}  // namespace nsatron
