// Forces the row kernels' forward at padded D = 128 (nsa/cuda/selection_loop.h, RowForward) for
// a scope, RowForward::kAuto after: the tests of the NSA core and of dense attention run the
// warp-specialised forwards this way.
#pragma once
#include "nsa/cuda/selection_loop.h"

namespace nsatron::nsa::test {

struct RowForwardScope {
  explicit RowForwardScope(cuda::RowForward r) { cuda::set_row_forward(r); }
  ~RowForwardScope() { cuda::set_row_forward(cuda::RowForward::kAuto); }
  RowForwardScope(const RowForwardScope&) = delete;
  RowForwardScope& operator=(const RowForwardScope&) = delete;
};

}  // namespace nsatron::nsa::test
