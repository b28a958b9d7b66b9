// CPU softmax cross entropy: one row at a time (max, sum of exponentials in fp64, log), rows
// in parallel; the per-row losses are kept in an [N] fp64 vector and summed in row order.
// The vocabulary-slice ops: the same per-row loops over a slice, fp64 row results.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/ops/cross_entropy.h"

namespace nsatron::cpu {

namespace {
// log sum_v exp(z_v), in fp64.
template <class T> double row_lse(const T* z, std::int64_t V) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t v = 0; v < V; ++v) m = std::max(m, double(z[v]));
  if (!std::isfinite(m)) return m;  // all -inf (or a +inf / NaN): let it show
  double s = 0.0;
  for (std::int64_t v = 0; v < V; ++v) s += std::exp(double(z[v]) - m);
  return m + std::log(s);
}

template <class T>
void row_grad(T* dz, const T* z, double lse, std::int32_t target, std::int64_t V, double scale) {
  for (std::int64_t v = 0; v < V; ++v) {
    const double p = std::exp(double(z[v]) - lse);
    dz[v] = T(scale * (p - (v == target ? 1.0 : 0.0)));
  }
}

double ordered_sum(const std::vector<double>& xs) {
  double s = 0.0;
  for (double x : xs) s += x;
  return s;
}
}  // namespace

void check_targets(const std::int32_t* targets, std::int64_t N, std::int64_t V,
                   std::int32_t ignore_index, const char* what) {
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int32_t t = targets[n];
    if (t != ignore_index && (t < 0 || t >= V))
      throw std::invalid_argument(std::string(what) + ": target " + std::to_string(t) +
                                  " at position " + std::to_string(n) +
                                  " is neither ignore_index (" + std::to_string(ignore_index) +
                                  ") nor in [0, " + std::to_string(V) + ")");
  }
}

template <class T>
double cross_entropy_forward(T* lse, const T* logits, const std::int32_t* targets, std::int64_t N,
                             std::int64_t V, std::int32_t ignore_index) {
  check_targets(targets, N, V, ignore_index, "cross_entropy_forward");
  std::vector<double> row_loss(std::size_t(N), 0.0);
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * V;
    const double l = row_lse(z, V);
    lse[n] = T(l);
    if (targets[n] != ignore_index) row_loss[std::size_t(n)] = l - double(z[targets[n]]);
  }
  return ordered_sum(row_loss);
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse,
                            const std::int32_t* targets, std::int64_t N, std::int64_t V,
                            std::int32_t ignore_index, double scale) {
  check_targets(targets, N, V, ignore_index, "cross_entropy_backward");
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    T* dz = dlogits + n * V;
    if (targets[n] == ignore_index) {
      for (std::int64_t v = 0; v < V; ++v) dz[v] = T(0);
    } else {
      row_grad(dz, logits + n * V, double(lse[n]), targets[n], V, scale);
    }
  }
}

template <class T>
double cross_entropy_fused(T* logits, const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int32_t ignore_index, double scale) {
  check_targets(targets, N, V, ignore_index, "cross_entropy_fused");
  std::vector<double> row_loss(std::size_t(N), 0.0);
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    T* z = logits + n * V;
    if (targets[n] == ignore_index) {
      for (std::int64_t v = 0; v < V; ++v) z[v] = T(0);
      continue;
    }
    // Round lse as the unfused path stores it, so both give the same bits.
    const double exact = row_lse(z, V);
    row_loss[std::size_t(n)] = exact - double(z[targets[n]]);
    const double l = double(T(exact));
    row_grad(z, z, l, targets[n], V, scale);
  }
  return ordered_sum(row_loss);
}

namespace {
// Slice ops: a target is ignore_index, or >= 0 and (vocab_size > 0) < vocab_size.
void check_slice_targets(const std::int32_t* targets, std::int64_t N, std::int64_t vocab_size,
                         std::int32_t ignore_index, const char* what) {
  if (vocab_size > 0) return check_targets(targets, N, vocab_size, ignore_index, what);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int32_t t = targets[n];
    if (t != ignore_index && t < 0)
      throw std::invalid_argument(std::string(what) + ": target " + std::to_string(t) +
                                  " at position " + std::to_string(n) +
                                  " is neither ignore_index (" + std::to_string(ignore_index) +
                                  ") nor a vocabulary id (>= 0)");
  }
}
// The column of target t in the slice [vocab_start, vocab_start + V), or -1.
inline std::int64_t slice_column(std::int32_t t, std::int32_t ignore_index,
                                 std::int64_t vocab_start, std::int64_t V) {
  if (t == ignore_index) return -1;
  const std::int64_t c = std::int64_t(t) - vocab_start;
  return c >= 0 && c < V ? c : -1;
}
}  // namespace

template <class T>
void cross_entropy_slice_stats(double* stats, const T* logits, const std::int32_t* targets,
                               std::int64_t N, std::int64_t V, std::int64_t vocab_start,
                               std::int32_t ignore_index, std::int64_t vocab_size) {
  check_slice_targets(targets, N, vocab_size, ignore_index, "cross_entropy_slice_stats");
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * V;
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t v = 0; v < V; ++v) m = std::max(m, double(z[v]));
    double s = 0.0;
    if (m != -std::numeric_limits<double>::infinity())
      for (std::int64_t v = 0; v < V; ++v) s += std::exp(double(z[v]) - m);
    stats[n] = m;
    stats[N + n] = s;
    const std::int64_t c = slice_column(targets[n], ignore_index, vocab_start, V);
    stats[2 * N + n] = c >= 0 ? double(z[c]) : 0.0;
  }
}

void cross_entropy_slice_combine(double* row_max, double* sums, const double* gathered,
                                 std::int64_t N, std::int64_t parts) {
  for (std::int64_t n = 0; n < N; ++n) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t r = 0; r < parts; ++r) m = std::max(m, gathered[r * 3 * N + n]);
    double s = 0.0, zt = 0.0;
    for (std::int64_t r = 0; r < parts; ++r) {
      const double* part = gathered + r * 3 * N;
      if (part[n] != -std::numeric_limits<double>::infinity()) s += part[N + n] * std::exp(part[n] - m);
      zt += part[2 * N + n];
    }
    row_max[n] = m;
    sums[n] = s;
    sums[N + n] = zt;
  }
}

template <class T>
void cross_entropy_slice_grad(T* logits, double* row_loss, const std::int32_t* targets,
                              std::int64_t N, std::int64_t V, std::int64_t vocab_start,
                              std::int32_t ignore_index, const double* row_max,
                              const double* sums, double scale) {
  check_slice_targets(targets, N, 0, ignore_index, "cross_entropy_slice_grad");
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    T* z = logits + n * V;
    if (targets[n] == ignore_index) {
      row_loss[n] = 0.0;
      for (std::int64_t v = 0; v < V; ++v) z[v] = T(0);
      continue;
    }
    const double m = row_max[n], s = sums[n];
    row_loss[n] = std::log(s) + m - sums[N + n];
    const std::int64_t c = slice_column(targets[n], ignore_index, vocab_start, V);
    for (std::int64_t v = 0; v < V; ++v) {
      const double p = std::exp(double(z[v]) - m) / s;
      z[v] = T(scale * (v == c ? p - 1.0 : p));
    }
  }
}

void cross_entropy_slice_loss(double* loss, const double* row_loss, std::int64_t N, double denominator) {
  double s = 0.0;
  for (std::int64_t n = 0; n < N; ++n) s += row_loss[n];  // row order
  *loss += denominator > 0 ? s / denominator : 0.0;
}

#define NSATRON_INSTANTIATE(T)                                                                   \
  template double cross_entropy_forward<T>(T*, const T*, const std::int32_t*, std::int64_t,     \
                                           std::int64_t, std::int32_t);                         \
  template void cross_entropy_backward<T>(T*, const T*, const T*, const std::int32_t*,          \
                                          std::int64_t, std::int64_t, std::int32_t, double);    \
  template double cross_entropy_fused<T>(T*, const std::int32_t*, std::int64_t, std::int64_t,  \
                                         std::int32_t, double);                                 \
  template void cross_entropy_slice_stats<T>(double*, const T*, const std::int32_t*,            \
                                             std::int64_t, std::int64_t, std::int64_t,          \
                                             std::int32_t, std::int64_t);                       \
  template void cross_entropy_slice_grad<T>(T*, double*, const std::int32_t*, std::int64_t,     \
                                            std::int64_t, std::int64_t, std::int32_t,           \
                                            const double*, const double*, double);
NSATRON_INSTANTIATE(float)
NSATRON_INSTANTIATE(double)
#undef NSATRON_INSTANTIATE

}  // namespace nsatron::cpu
