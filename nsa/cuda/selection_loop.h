// Which loop the selection branch's row side runs on CUDA (bf16, tensor cores). Plain C++:
// the trainer's log names the choice without the CUDA headers.
//
//   union     (nsa/cuda/attention_tc.cuh, row_kernel): a block of 64 rows owns 64 / h
//             consecutive positions x the h heads of a group and streams the union of those
//             positions' selected blocks; a row skips the keys it did not choose, but the
//             block's products cover the whole union (the wgmma products are block-wide). At
//             h = 16 the union of 4 positions' blocks is ~2.4x the pairs they chose (T = 8192,
//             random selections), at h = 1 (64 positions) ~7-10x.
//   inverted  (nsa/cuda/select_inv.cuh): per selected block, the rows that chose it (the
//             inverse index the key side uses), 64 at a time: no union, but each row's result
//             comes in n partial softmax states (o, lse per slot of its selection row, fp32)
//             written to memory and merged per row in slot order (a fixed order: deterministic).
//             The partials cost n x the output in traffic, which pays where the union is large
//             (small h).
// (A third, gathered rows: each tile against only the rows that chose it, their state kept in
// shared memory, measured slower than the union at every h, one block per SM: docs/
// performance.md, twenty-fifth session.)
// auto takes the inverted loop where h <= kInvertedMaxHeads, T >= kInvertedMinT, l' is between
// 64 and kInvertedMaxSelBlock (whole 64-key tiles, held in shared memory), and one (b, g) pair's
// partial states fit kInvertedMaxPairBytes: measured on an H100 at l' = 64 with bench_nsa_gpu
// --sel-loop both (docs/performance.md, "the inverted selection loop"; random inputs, whose
// neighbouring positions choose unrelated blocks): the inverted loop was faster at h = 1, 2, 4
// from T = 16384 on (64k, h = 1: 560 -> 367 ms fwd + bwd), slower at T = 8192 and at h >= 8
// below 64k (paper 8192, h = 16: 14.2 -> 18.9 ms; 125M: 4.6 -> 6.6). Remeasured on an H200 after
// the union's later changes (2026-11-28, "twentieth session"): inverted faster at h = 6 (64k
// 169.4 -> 157.4 ms, 32k 60.6 -> 58.7), slower at h = 8 (64k 148.5 / 149.8, 32k 52.4 / 56.9)
// and h = 16 (64k 108.5 / 130.2): the bound is h <= 6. The CUDA code also keeps
// the union where the device's shared memory cannot hold the inverted loop's tiles.
// Tests and benchmarks force either loop with set_selection_row_loop (process-wide; the
// default is auto). Either loop computes the same function within the parity bounds; their
// bits differ.
#pragma once
#include <algorithm>
#include <atomic>
#include <limits>
#include <cstdint>
#include <string>

#include "nsa/nsa.h"

namespace nsatron::nsa::cuda {

enum class SelectionRowLoop : int { kAuto = 0, kUnion = 1, kInverted = 2 };

// Auto takes the inverted loop up to this many heads per group, from this sequence length.
constexpr std::int64_t kInvertedMaxHeads = 6;
constexpr std::int64_t kInvertedMinT = 16384;
// Largest selection block (l') the inverted loop holds in shared memory (4 tiles of 64 keys).
constexpr std::int64_t kInvertedMaxSelBlock = 256;
// Auto's bound on one (b, g) pair's partial states, T h n (D + 1) fp32 (the smallest pass).
constexpr std::int64_t kInvertedMaxPairBytes = std::int64_t(4) << 30;
// (launch_slc_inverted's passes are sized by the same count.)
inline std::int64_t inverted_pair_bytes(std::int64_t T, std::int64_t h, std::int64_t n, std::int64_t D) {
  return T * h * n * (D + 1) * 4;
}
inline std::int64_t inverted_pair_bytes(const NsaDims& dims) {
  return inverted_pair_bytes(dims.T, dims.heads_per_group(), dims.sel_count, dims.D);
}

inline std::atomic<int>& selection_row_loop_setting() {
  static std::atomic<int> v{int(SelectionRowLoop::kAuto)};
  return v;
}
inline void set_selection_row_loop(SelectionRowLoop loop) { selection_row_loop_setting().store(int(loop)); }
inline SelectionRowLoop selection_row_loop() { return SelectionRowLoop(selection_row_loop_setting().load()); }

// Bytes of partial states the inverted loop runs at a time (its (b, g) pairs go in passes of
// as many as fit, at least one, so a pass takes max(this, one pair's bytes)): 1 GiB by default;
// tests set it small to run several passes.
inline std::atomic<std::int64_t>& inverted_pass_bytes_setting() {
  static std::atomic<std::int64_t> v{std::int64_t(1) << 30};
  return v;
}
inline void set_inverted_pass_bytes(std::int64_t bytes) { inverted_pass_bytes_setting().store(bytes); }
inline std::int64_t inverted_pass_bytes() { return inverted_pass_bytes_setting().load(); }

// Whether the bf16 selection row side of `dims` runs the inverted loop under the current
// setting (the CUDA code then also checks the device's shared memory).
inline bool selection_inverted(const NsaDims& dims) {
  if (dims.sel_block > kInvertedMaxSelBlock) return false;
  switch (selection_row_loop()) {
    case SelectionRowLoop::kUnion: return false;
    case SelectionRowLoop::kInverted: return true;
    default:
      return dims.heads_per_group() <= kInvertedMaxHeads && dims.T >= kInvertedMinT && dims.sel_block >= 64 &&
             inverted_pair_bytes(dims) <= kInvertedMaxPairBytes;
  }
}
// The row kernels' schedule (nsa/cuda/attention_tc.cuh, row_late_issue): the two-stage row
// kernels run one block barrier per key tile (the next tile issued after it) where the keys and
// values their resident blocks stream take at most this many bytes, two barriers (a longer
// prefetch) above. The default, the largest value: one barrier everywhere (measured on an H200,
// docs/performance.md, 2026-11-29: at T = 65536 one barrier -7% on the selection and
// compression row backward, the NSA layer -2%, the own dense kernel -2%, at 32768 -2 to -4%,
// where the former default, half the L2, took two; the fourth session had measured two faster
// at 64k on an H100, +2% for one, before the backward's deferred dq product and its third key
// stage). -1: half the device's L2. The same bits either way; tests set 0 (never) and the
// largest value (always) to compare the two.
constexpr std::int64_t kRowLateAlways = std::numeric_limits<std::int64_t>::max();
inline std::atomic<std::int64_t>& row_late_issue_bytes_setting() {
  static std::atomic<std::int64_t> v{kRowLateAlways};
  return v;
}
inline void set_row_late_issue_bytes(std::int64_t bytes) { row_late_issue_bytes_setting().store(bytes); }
inline std::int64_t row_late_issue_bytes() { return row_late_issue_bytes_setting().load(); }

// The fused compression + selection kernel's pipelined pass 1 (nsa/cuda/select_tc.cuh,
// cmp_select_pipelined: padded D = 128, 8 or 16 heads per group): on by default; tests turn it
// off to compare the two schedules' bits (the same).
inline std::atomic<bool>& cmp_select_pipeline_setting() {
  static std::atomic<bool> v{true};
  return v;
}
inline void set_cmp_select_pipeline(bool on) { cmp_select_pipeline_setting().store(on); }
inline bool cmp_select_pipeline() { return cmp_select_pipeline_setting().load(); }

// The window branch's forward at padded D = 128 (bf16; so also the own dense kernel's): the
// 64-row kernel (tc::row_kernel, the selection's forward at every h too) or the warp-specialised
// kernel with 128-key tiles (nsa/cuda/row_ws.cuh: 128 rows per block, a producer warpgroup and
// two consumers; sm_90a builds on compute capability 9.0). kAuto takes the latter where the
// keys and values one (batch, group)'s row blocks stream through the window (min(w, T) keys of
// padded D = 128 in bf16) exceed half the L2: measured on an H200 (60 MB of L2;
// docs/performance.md, 2026-11-29, twenty-second session) for the own dense kernel's forward,
// 64-row / 128-key: T = 8192 2.46 / 2.63 ms, 16384 10.7-11.0 / 10.9-11.3, 32768 41.2-41.8 /
// 42.7-42.8 (8-17 MB: kept in the L2), 65536 166.9-172.8 / 160.9-166.5 (34 MB). The NSA window
// (w = 512) stays with the 64-row kernel (its 128-key tiles half outside the window: 67.0 against
// 65.8 ms at 64k). The threshold follows the device's L2 (T above ~49-51k on an H100, ~59-61k on
// an H200), so the forward's bits near it differ by device type (the two kernels' tiles start at
// different keys). Tests and bench_nsa_gpu (--row-fwd) force either. (A third choice, the same
// kernel with 64-key tiles for the selection and the window, was dropped on 2026-11-29: the
// 64-row kernel had been faster at every h since the twenty-first session.)
enum class RowForward { kAuto, kPlain, kWideWindow };
inline std::atomic<RowForward>& row_forward_setting() {
  static std::atomic<RowForward> v{RowForward::kAuto};
  return v;
}
inline void set_row_forward(RowForward r) { row_forward_setting().store(r); }
// Whether the window's keys and values of one (batch, group) exceed half of an L2 of l2_bytes
// (0: unknown, taken as no).
inline bool window_past_half_l2(std::int64_t w, std::int64_t T, std::int64_t l2_bytes) {
  return l2_bytes > 0 && std::min(w, T) * 128 * 2 * 2 > l2_bytes / 2;
}
// Whether the setting takes the 128-key warp-specialised kernel for the window's forward
// (past_half_l2: window_past_half_l2), the device permitting.
inline bool window_forward_wide(bool past_half_l2) {
  switch (row_forward_setting().load()) {
    case RowForward::kPlain: return false;
    case RowForward::kWideWindow: return true;
    default: return past_half_l2;
  }
}

// The backward's key sides on several CUDA streams (nsa_backward): the three are independent
// (each reads the row side's results and writes its own gradients), and each alone leaves SMs
// idle in its last wave (docs/performance.md, twenty-sixth session: a block alone on an SM runs
// little faster than three together), which the other kernels' blocks fill. 1: the three in
// turn on the caller's stream; 2 (the default, measured: the 125M backward -9%, twenty-seventh
// session): the window's on a second stream beside the selection's and the compression's; 3:
// the compression's key side and its backward products on a third stream too (measured slower
// than 2: the 125M backward 2.40 against 2.36 ms, twenty-eighth session; a benchmark variant).
// The same kernels on the same inputs: the same bits at every count; tests compare them,
// benchmarks measure them. (A branch goes beside only where its gradients are outputs of their
// own, not the workspace's scratch.)
inline std::atomic<int>& key_side_streams_setting() {
  static std::atomic<int> v{2};
  return v;
}
inline void set_key_side_streams(int n) { key_side_streams_setting().store(n); }
inline int key_side_streams() { return key_side_streams_setting().load(); }

// For the run log: whether a window of w keys over T positions at head dimension D takes the
// 128-key kernel (padded D = 128 only), and that kernel's name.
inline bool window_forward_wide_at(std::int64_t D, std::int64_t w, std::int64_t T, std::int64_t l2_bytes) {
  return D > 64 && window_forward_wide(window_past_half_l2(w, T, l2_bytes));
}
inline constexpr const char* kWideForwardName = "forward warp-specialised, 128-key tiles (nsa/cuda/row_ws.cuh, on sm_90a)";

// The loop's name for the run log (l2_bytes: the device's L2, 0 unknown).
inline std::string selection_loop_name(const NsaDims& dims, std::int64_t l2_bytes) {
  return std::string(selection_inverted(dims) ? "inverted loop (per selected block, partials merged in slot order)"
                                              : "union of the blocks of 64 / h positions") +
         (window_forward_wide_at(dims.D, dims.window, dims.T, l2_bytes) ? std::string("; window ") + kWideForwardName
                                                                         : std::string());
}
// The own dense kernel's forward for the run log (T, D: the model's sequence length and
// head dimension; bf16: the tensor-core kernels, else the fp32 ones).
inline std::string dense_kernel_name(std::int64_t T, std::int64_t D, std::int64_t l2_bytes, bool bf16) {
  if (!bf16) return "fp32 kernels";
  return window_forward_wide_at(D, T, T, l2_bytes) ? kWideForwardName : "forward by 64-key tiles";
}

}  // namespace nsatron::nsa::cuda
