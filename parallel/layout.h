// Where a rank sits in the TP x DP x PP grid (DESIGN.md "Key contracts"):
//
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank),   world = tp * dp * pp
//
// TP ranks are neighbours (consecutive ranks, one node, the fastest links), then DP, then PP
// outermost. The groups of a rank:
//   TP group: the tp ranks with its (dp_rank, pp_rank)  - consecutive ranks
//   DP group: the dp ranks with its (tp_rank, pp_rank)  - stride tp
//   PP group: the pp ranks with its (tp_rank, dp_rank)  - stride tp * dp
// Each group lists its ranks by ascending group rank, which equals the rank's coordinate
// (tp_rank in its TP group, dp_rank in its DP group, pp_rank in its PP group).
#pragma once
#include <string>
#include <vector>

namespace nsatron::parallel {

struct ParallelLayout {
  int world = 1;
  int tp = 1, pp = 1, dp = 1;
  int rank = 0;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;

  // The layout of `rank` in a world of `world` ranks with tp and pp given: dp = world / (tp*pp).
  // Throws UserError unless world, tp, pp >= 1, tp * pp divides world and 0 <= rank < world.
  static ParallelLayout make(int world, int tp, int pp, int rank);

  // The rank at the given coordinates (each in range).
  int rank_of(int tp_rank, int dp_rank, int pp_rank) const;
  // Global ranks of this rank's groups, by ascending group rank.
  std::vector<int> tp_group() const;
  std::vector<int> dp_group() const;
  std::vector<int> pp_group() const;
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }

  // "tp=2 pp=1 dp=4" (also what checkpoints record as the writing layout).
  std::string describe() const;
  // "rank 5 (tp 1, dp 2, pp 0)".
  std::string describe_rank() const;
};

}  // namespace nsatron::parallel
