#include "core/ops/cross_entropy.h"

#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

std::int64_t count_targets(std::span<const std::int32_t> targets, std::int32_t ignore_index) {
  std::int64_t n = 0;
  for (std::int32_t t : targets) n += t != ignore_index;
  return n;
}

namespace {
// Returns V; checks the logits against the targets.
std::int64_t check_logits(const std::string& op, const Tensor& logits,
                          std::span<const std::int32_t> targets) {
  const std::int64_t V = last_dim(op, logits, "logits");
  require(V > 0, op, "the vocabulary must not be empty, got " + logits.describe());
  require(rows_of(logits) == std::int64_t(targets.size()), op,
          "logits " + logits.describe() + " have " + std::to_string(rows_of(logits)) +
              " rows but there are " + std::to_string(targets.size()) + " targets");
  return V;
}
void check_options(const std::string& op, const CrossEntropyOptions& opt) {
  require(opt.denominator >= 0, op, "the denominator must be >= 0 (0: count the targets)");
}
double denominator(std::span<const std::int32_t> targets, const CrossEntropyOptions& opt) {
  return opt.denominator > 0 ? opt.denominator : double(count_targets(targets, opt.ignore_index));
}
template <class T> void write_loss(const Tensor& loss, double value, bool accumulate) {
  T* p = loss.data<T>();
  *p = accumulate ? T(double(*p) + value) : T(value);
}
}  // namespace

void cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets,
                           Tensor& loss, Tensor& lse, const CrossEntropyOptions& opt) {
  const std::string op = "cross_entropy_forward";
  if (logits.device() == Device::CUDA) {
    all_on_cuda(op, {&logits, &loss, &lse});
    cuda_compute_dtype(op, logits);
    require_f32(op, loss, "loss");
    require_f32(op, lse, "lse");
  } else {
    same_dtype_device(op, {&logits, &loss, &lse});
  }
  const std::int64_t V = check_logits(op, logits, targets);
  check_options(op, opt);
  require(loss.numel() == 1, op, "loss must have one element, got " + loss.describe());
  require(lse.numel() == rows_of(logits), op,
          "lse must hold one value per row, got " + lse.describe());
  if (logits.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::cross_entropy_forward(logits.dtype(), loss.data<float>(), lse.data<float>(),
                                logits.raw(), targets.data(), rows_of(logits), V,
                                opt.ignore_index, opt.denominator, opt.accumulate_loss);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, logits, [&](auto tag) {
    using T = decltype(tag);
    const double sum = cpu::cross_entropy_forward<T>(lse.data<T>(), logits.data<T>(),
                                                     targets.data(), rows_of(logits), V,
                                                     opt.ignore_index);
    const double d = denominator(targets, opt);
    write_loss<T>(loss, d > 0 ? sum / d : 0.0, opt.accumulate_loss);
  });
}

void cross_entropy_backward(const Tensor& logits, std::span<const std::int32_t> targets,
                            const Tensor& lse, double dloss, Tensor& dlogits,
                            const CrossEntropyOptions& opt) {
  const std::string op = "cross_entropy_backward";
  if (logits.device() == Device::CUDA) {
    same_dtype_device(op, {&logits, &dlogits});
    all_on_cuda(op, {&lse});
    cuda_compute_dtype(op, logits);
    require_f32(op, lse, "lse");
  } else {
    same_dtype_device(op, {&logits, &lse, &dlogits});
  }
  const std::int64_t V = check_logits(op, logits, targets);
  check_options(op, opt);
  require(lse.numel() == rows_of(logits), op,
          "lse must hold one value per row, got " + lse.describe());
  require(dlogits.shape() == logits.shape(), op,
          "dlogits must have the shape of " + logits.describe() + ", got " + dlogits.describe());
  if (logits.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::cross_entropy_backward(logits.dtype(), dlogits.raw(), logits.raw(), lse.data<float>(),
                                 targets.data(), rows_of(logits), V, opt.ignore_index, dloss,
                                 opt.denominator);
    return;
#else
    no_cuda(op);
#endif
  }
  const double d = denominator(targets, opt);
  const double scale = d > 0 ? dloss / d : 0.0;
  dispatch_cpu(op, logits, [&](auto tag) {
    using T = decltype(tag);
    cpu::cross_entropy_backward<T>(dlogits.data<T>(), logits.data<T>(), lse.data<T>(),
                                   targets.data(), rows_of(logits), V, opt.ignore_index, scale);
  });
}

void cross_entropy_fused(Tensor& logits, std::span<const std::int32_t> targets, Tensor& loss,
                         double dloss, const CrossEntropyOptions& opt) {
  const std::string op = "cross_entropy_fused";
  if (logits.device() == Device::CUDA) {
    all_on_cuda(op, {&logits, &loss});
    cuda_compute_dtype(op, logits);
    require_f32(op, loss, "loss");
  } else {
    same_dtype_device(op, {&logits, &loss});
  }
  const std::int64_t V = check_logits(op, logits, targets);
  check_options(op, opt);
  require(loss.numel() == 1, op, "loss must have one element, got " + loss.describe());
  if (logits.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::cross_entropy_fused(logits.dtype(), logits.raw(), loss.data<float>(), targets.data(),
                              rows_of(logits), V, opt.ignore_index, dloss, opt.denominator,
                              opt.accumulate_loss);
    return;
#else
    no_cuda(op);
#endif
  }
  const double d = denominator(targets, opt);
  const double scale = d > 0 ? dloss / d : 0.0;
  dispatch_cpu(op, logits, [&](auto tag) {
    using T = decltype(tag);
    const double sum = cpu::cross_entropy_fused<T>(logits.data<T>(), targets.data(),
                                                   rows_of(logits), V, opt.ignore_index, scale);
    write_loss<T>(loss, d > 0 ? sum / d : 0.0, opt.accumulate_loss);
  });
}

// ---- vocabulary slices ---------------------------------------------------------------------

namespace {
// The logits of a slice op: CPU fp32/fp64 or CUDA fp32/bf16; returns V_r.
std::int64_t check_slice_logits(const std::string& op, const Tensor& logits) {
  const std::int64_t V = last_dim(op, logits, "logits");
  require(V > 0, op, "the vocabulary slice must not be empty, got " + logits.describe());
  if (logits.device() == Device::CUDA) {
    cuda_compute_dtype(op, logits);
  } else {
    require(logits.dtype() == DType::F32 || logits.dtype() == DType::F64, op,
            "on the CPU the logits are fp32 or fp64, got " + logits.describe());
  }
  return V;
}
// An fp64 tensor of `numel` elements on the logits' device.
void check_f64(const std::string& op, const Tensor& logits, const Tensor& t, const char* name,
               std::int64_t numel, const char* size_says) {
  require(t.dtype() == DType::F64 && t.device() == logits.device(), op,
          std::string(name) + " must be fp64 on the device of " + logits.describe() + ", got " +
              t.describe());
  require(t.numel() == numel, op,
          std::string(name) + " must hold " + size_says + " (" + std::to_string(numel) +
              "), got " + t.describe());
}
void check_slice_targets(const std::string& op, const Tensor& logits,
                         std::span<const std::int32_t> targets, std::int64_t vocab_start,
                         std::int64_t vocab_size) {
  const std::int64_t V = logits.dim(-1);
  require(rows_of(logits) == std::int64_t(targets.size()), op,
          "logits " + logits.describe() + " have " + std::to_string(rows_of(logits)) +
              " rows but there are " + std::to_string(targets.size()) + " targets");
  require(vocab_start >= 0, op, "vocab_start must be >= 0, got " + std::to_string(vocab_start));
  require(vocab_size >= 0, op, "vocab_size must be >= 0 (0: not given)");
  require(vocab_size == 0 || vocab_start + V <= vocab_size, op,
          "the slice [" + std::to_string(vocab_start) + ", " + std::to_string(vocab_start + V) +
              ") of " + logits.describe() + " exceeds the vocabulary of " +
              std::to_string(vocab_size));
}
}  // namespace

void cross_entropy_slice_stats(const Tensor& logits, std::span<const std::int32_t> targets,
                               std::int64_t vocab_start, std::int32_t ignore_index, Tensor& stats,
                               std::int64_t vocab_size) {
  const std::string op = "cross_entropy_slice_stats";
  const std::int64_t V = check_slice_logits(op, logits), N = rows_of(logits);
  check_slice_targets(op, logits, targets, vocab_start, vocab_size);
  check_f64(op, logits, stats, "stats", 3 * N, "three values per row");
  if (logits.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::cross_entropy_slice_stats(logits.dtype(), stats.data<double>(), logits.raw(),
                                    targets.data(), N, V, vocab_start, ignore_index, vocab_size);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, logits, [&](auto tag) {
    using T = decltype(tag);
    cpu::cross_entropy_slice_stats<T>(stats.data<double>(), logits.data<T>(), targets.data(), N,
                                      V, vocab_start, ignore_index, vocab_size);
  });
}

void cross_entropy_slice_combine(const Tensor& gathered, Tensor& row_max, Tensor& sums) {
  const std::string op = "cross_entropy_slice_combine";
  const std::int64_t N = row_max.numel();
  check_f64(op, gathered, gathered, "gathered", gathered.numel(), "the slices' statistics");
  check_f64(op, gathered, row_max, "row_max", N, "one value per row");
  check_f64(op, gathered, sums, "sums", 2 * N, "two values per row");
  require(N > 0 ? gathered.numel() % (3 * N) == 0 && gathered.numel() > 0 : gathered.numel() == 0, op,
          "gathered must hold P >= 1 slices' statistics of 3 x " + std::to_string(N) +
              " values, got " + gathered.describe());
  const std::int64_t parts = N > 0 ? gathered.numel() / (3 * N) : 0;
  if (gathered.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::cross_entropy_slice_combine(row_max.data<double>(), sums.data<double>(),
                                      gathered.data<double>(), N, parts);
    return;
#else
    no_cuda(op);
#endif
  }
  cpu::cross_entropy_slice_combine(row_max.data<double>(), sums.data<double>(),
                                   gathered.data<double>(), N, parts);
}

void cross_entropy_slice_grad(Tensor& logits, std::span<const std::int32_t> targets,
                              std::int64_t vocab_start, std::int32_t ignore_index,
                              const Tensor& row_max, const Tensor& sums, double scale,
                              Tensor& row_loss) {
  const std::string op = "cross_entropy_slice_grad";
  const std::int64_t V = check_slice_logits(op, logits), N = rows_of(logits);
  check_slice_targets(op, logits, targets, vocab_start, 0);
  check_f64(op, logits, row_max, "row_max", N, "one value per row");
  check_f64(op, logits, sums, "sums", 2 * N, "two values per row");
  check_f64(op, logits, row_loss, "row_loss", N, "one value per row");
  if (logits.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::cross_entropy_slice_grad(logits.dtype(), logits.raw(), row_loss.data<double>(),
                                   targets.data(), N, V, vocab_start, ignore_index,
                                   row_max.data<double>(), sums.data<double>(), scale);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, logits, [&](auto tag) {
    using T = decltype(tag);
    cpu::cross_entropy_slice_grad<T>(logits.data<T>(), row_loss.data<double>(), targets.data(),
                                     N, V, vocab_start, ignore_index, row_max.data<double>(),
                                     sums.data<double>(), scale);
  });
}

void cross_entropy_slice_loss(const Tensor& row_loss, double denominator, Tensor& loss) {
  const std::string op = "cross_entropy_slice_loss";
  check_f64(op, row_loss, row_loss, "row_loss", row_loss.numel(), "the row losses");
  check_f64(op, row_loss, loss, "loss", 1, "one value");
  if (row_loss.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::cross_entropy_slice_loss(loss.data<double>(), row_loss.data<double>(), row_loss.numel(), denominator);
    return;
#else
    no_cuda(op);
#endif
  }
  cpu::cross_entropy_slice_loss(loss.data<double>(), row_loss.data<double>(), row_loss.numel(), denominator);
}

}  // namespace nsatron
