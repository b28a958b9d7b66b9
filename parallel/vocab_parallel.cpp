#include "parallel/vocab_parallel.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace nsatron::parallel {

namespace {

template <class T>
double run(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets, double dloss,
           const VocabParallelCE& opt) {
  const std::int64_t N = logits.dim(0), V = logits.dim(1);
  T* z = logits.data<T>();
  auto owned = [&](std::int64_t n) {
    const std::int64_t t = targets[std::size_t(n)];
    return t != opt.ignore_index && t >= opt.vocab_start && t < opt.vocab_start + V;
  };
  // Row maxima, then partial sums of exponentials and the owned target logits, in fp64.
  Tensor max = Tensor::empty({N}, DType::F64), sums = Tensor::empty({2 * N}, DType::F64);
  double* m = max.data<double>();
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    double best = -std::numeric_limits<double>::infinity();
    for (std::int64_t v = 0; v < V; ++v) best = std::max(best, double(z[n * V + v]));
    m[n] = best;
  }
  tp.all_reduce(max, ReduceOp::Max);
  double* s = sums.data<double>();
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    double acc = 0;
    for (std::int64_t v = 0; v < V; ++v) acc += std::exp(double(z[n * V + v]) - m[n]);
    s[n] = acc;
    s[N + n] = owned(n) ? double(z[n * V + (targets[std::size_t(n)] - opt.vocab_start)]) : 0.0;
  }
  tp.all_reduce(sums, ReduceOp::Sum);

  std::int64_t counted = 0;
  for (std::int64_t n = 0; n < N; ++n) counted += targets[std::size_t(n)] != opt.ignore_index;
  const double D = opt.denominator > 0 ? opt.denominator : double(counted);
  const double scale = D > 0 ? dloss / D : 0.0;
  double loss = 0;
  for (std::int64_t n = 0; n < N; ++n)
    if (targets[std::size_t(n)] != opt.ignore_index) loss += std::log(s[n]) + m[n] - s[N + n];
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    T* row = z + n * V;
    if (targets[std::size_t(n)] == opt.ignore_index) {
      for (std::int64_t v = 0; v < V; ++v) row[v] = T(0);
      continue;
    }
    for (std::int64_t v = 0; v < V; ++v) row[v] = T(scale * std::exp(double(row[v]) - m[n]) / s[n]);
    if (owned(n)) row[targets[std::size_t(n)] - opt.vocab_start] -= T(scale);
  }
  return D > 0 ? loss / D : 0.0;
}

}  // namespace

double vocab_parallel_cross_entropy(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                    double dloss, const VocabParallelCE& opt) {
  if (!logits.is_cpu() || logits.ndim() != 2 || std::int64_t(targets.size()) != logits.dim(0))
    throw std::invalid_argument("vocab_parallel_cross_entropy: logits must be a CPU [N, V_r] tensor with N targets, got " +
                                logits.describe());
  if (logits.dtype() == DType::F32) return run<float>(tp, logits, targets, dloss, opt);
  if (logits.dtype() == DType::F64) return run<double>(tp, logits, targets, dloss, opt);
  throw std::invalid_argument("vocab_parallel_cross_entropy: fp32 or fp64 logits, got " + logits.describe());
}

}  // namespace nsatron::parallel
