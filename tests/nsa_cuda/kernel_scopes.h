// Kernel choices (nsa/cuda/selection_loop.h) forced for a scope, their kAuto after: the tests
// of the NSA core and of dense attention run the alternative kernels this way.
//   RowForwardScope: the row kernels' forward at padded D = 128 (RowForward: the
//     warp-specialised forwards);
//   DenseDqScope: where the own dense kernel's backward computes dq (DenseDq: the key side).
#pragma once
#include "nsa/cuda/selection_loop.h"

namespace nsatron::nsa::test {

template <class Setting, void (*kSet)(Setting)>
struct SettingScope {
  explicit SettingScope(Setting s) { kSet(s); }
  ~SettingScope() { kSet(Setting::kAuto); }
  SettingScope(const SettingScope&) = delete;
  SettingScope& operator=(const SettingScope&) = delete;
};
using RowForwardScope = SettingScope<cuda::RowForward, cuda::set_row_forward>;
using DenseDqScope = SettingScope<cuda::DenseDq, cuda::set_dense_dq>;

}  // namespace nsatron::nsa::test
