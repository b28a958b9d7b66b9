// Kernel choices (nsa/cuda/selection_loop.h) forced for a scope, their defaults after: the
// tests of the NSA core and of dense attention run the alternative kernels and schedules this
// way.
//   RowForwardScope: the window's forward at padded D = 128 (RowForward: the 64-row kernel or
//     the warp-specialised one with 128-key tiles);
//   LoopScope: the selection row side's loop (SelectionRowLoop);
//   LateIssueScope: the row kernels' barriers per key tile (row_late_issue_bytes);
//   FusedPipelineScope: the fused compression + selection kernel's pipelined pass 1;
//   KeySideStreamsScope: the backward's key sides on 1, 2 or 3 streams.
#pragma once
#include <cstdint>

#include "nsa/cuda/selection_loop.h"

namespace nsatron::nsa::test {

template <class Setting, void (*kSet)(Setting), Setting kDefault>
struct SettingScope {
  explicit SettingScope(Setting s) { kSet(s); }
  ~SettingScope() { kSet(kDefault); }
  SettingScope(const SettingScope&) = delete;
  SettingScope& operator=(const SettingScope&) = delete;
};
using RowForwardScope = SettingScope<cuda::RowForward, cuda::set_row_forward, cuda::RowForward::kAuto>;
using LoopScope =
    SettingScope<cuda::SelectionRowLoop, cuda::set_selection_row_loop, cuda::SelectionRowLoop::kAuto>;
using LateIssueScope = SettingScope<std::int64_t, cuda::set_row_late_issue_bytes, cuda::kRowLateAlways>;
using FusedPipelineScope = SettingScope<bool, cuda::set_cmp_select_pipeline, true>;
using KeySideStreamsScope = SettingScope<int, cuda::set_key_side_streams, 2>;

}  // namespace nsatron::nsa::test
