// Learning-rate schedule: linear warmup from 0, then a decay from optim.lr to optim.min_lr.
//
// For step s = 0, 1, ... (the update about to be applied), W = warmup_steps, S = steps:
//   s < W:   lr * (s + 1) / W
//   else:    p = (s - W) / max(1, S - W)      (0 at the first decayed step, -> 1 at the end)
//            cosine:   min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2
//            linear:   lr - (lr - min_lr) * p
//            constant: lr
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "core/config/config.h"

namespace nsatron {

inline double learning_rate(const OptimConfig& o, std::int64_t total_steps, std::int64_t step) {
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const double p = double(step - o.warmup_steps) / double(std::max<std::int64_t>(1, total_steps - o.warmup_steps));
  if (o.decay == "cosine") return o.min_lr + (o.lr - o.min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
  if (o.decay == "linear") return o.lr - (o.lr - o.min_lr) * p;
  return o.lr;
}

}  // namespace nsatron
