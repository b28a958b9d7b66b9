// The communicators of one rank: the world and its TP, DP and PP groups (layout.h).
//
//   ProcessGroups g = make_process_groups(Backend::Mpi, cfg.parallel.tp, cfg.parallel.pp);
//   g.dp->all_reduce(grads);          // over the ranks holding the same shard of the model
//
// A group of one rank gets a SingleCommunicator whatever the backend, so a dp = 1 run never
// communicates over DP, and its numerics are those of a single process.
// (The GPU issue adds device communicators (NCCL) for the same groups beside these CPU ones;
// the CPU ones keep carrying control values: flags, losses, checkpoint paths.)
#pragma once
#include <memory>

#include "parallel/communicator.h"
#include "parallel/layout.h"

namespace nsatron::parallel {

enum class Backend {
  Single,  // one process, no MPI (world of 1)
  Mpi,     // MPI must be initialised; the world is MPI_COMM_WORLD
};

struct ProcessGroups {
  ParallelLayout layout;
  std::shared_ptr<Communicator> world, tp, dp, pp;
};

// This rank's groups for tp and pp (dp = world / (tp * pp)). Single: a world of one, so tp = pp
// = 1 (else UserError). Mpi: collective over MPI_COMM_WORLD; UserError when tp * pp does not
// divide its size.
ProcessGroups make_process_groups(Backend backend, int tp, int pp);

}  // namespace nsatron::parallel
