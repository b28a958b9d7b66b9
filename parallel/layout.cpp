#include "parallel/layout.h"

#include "core/util/error.h"

namespace nsatron::parallel {

ParallelLayout ParallelLayout::make(int world, int tp, int pp, int rank) {
  auto n = [](int x) { return std::to_string(x); };
  if (world < 1) throw UserError("the world size must be at least 1, got " + n(world));
  if (tp < 1 || pp < 1) throw UserError("parallel.tp and parallel.pp must be at least 1, got tp = " + n(tp) + ", pp = " + n(pp));
  if (world % (tp * pp) != 0)
    throw UserError("the world size " + n(world) + " is not a multiple of parallel.tp * parallel.pp = " + n(tp) +
                    " * " + n(pp));
  if (rank < 0 || rank >= world) throw UserError("rank " + n(rank) + " is outside the world of " + n(world));
  ParallelLayout l;
  l.world = world;
  l.tp = tp;
  l.pp = pp;
  l.dp = world / (tp * pp);
  l.rank = rank;
  l.tp_rank = rank % tp;
  l.dp_rank = (rank / tp) % l.dp;
  l.pp_rank = rank / (tp * l.dp);
  return l;
}

int ParallelLayout::rank_of(int t, int d, int p) const {
  NSA_CHECK(t >= 0 && t < tp && d >= 0 && d < dp && p >= 0 && p < pp, "coordinates (", t, ", ", d, ", ", p,
            ") outside ", describe());
  return t + tp * (d + dp * p);
}

std::vector<int> ParallelLayout::tp_group() const {
  std::vector<int> r;
  for (int t = 0; t < tp; ++t) r.push_back(rank_of(t, dp_rank, pp_rank));
  return r;
}

std::vector<int> ParallelLayout::dp_group() const {
  std::vector<int> r;
  for (int d = 0; d < dp; ++d) r.push_back(rank_of(tp_rank, d, pp_rank));
  return r;
}

std::vector<int> ParallelLayout::pp_group() const {
  std::vector<int> r;
  for (int p = 0; p < pp; ++p) r.push_back(rank_of(tp_rank, dp_rank, p));
  return r;
}

std::string ParallelLayout::describe() const {
  return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp);
}

std::string ParallelLayout::describe_rank() const {
  return "rank " + std::to_string(rank) + " (tp " + std::to_string(tp_rank) + ", dp " + std::to_string(dp_rank) +
         ", pp " + std::to_string(pp_rank) + ")";
}

}  // namespace nsatron::parallel
