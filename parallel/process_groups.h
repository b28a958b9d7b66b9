// The communicators of one rank: the world and its TP, DP and PP groups (layout.h).
//
//   ProcessGroups g = make_process_groups(Backend::Mpi, cfg.parallel.tp, cfg.parallel.pp);
//   g.dp->all_reduce(grads);          // over the ranks holding the same shard of the model
//
// A group of one rank gets a SingleCommunicator whatever the backend, so a dp = 1 run never
// communicates over DP, and its numerics are those of a single process.
// On GPUs, make_device_groups adds NCCL communicators of the same groups for device tensors
// (gradients, activations); the CPU ones keep carrying control values: flags, losses,
// checkpoint paths.
#pragma once
#include <memory>

#include "core/comm/communicator.h"
#include "parallel/layout.h"

namespace nsatron::parallel {

enum class Backend {
  Single,  // one process, no MPI (world of 1)
  Mpi,     // MPI must be initialised; the world is MPI_COMM_WORLD
};

struct ProcessGroups {
  ParallelLayout layout;
  std::shared_ptr<Communicator> world, tp, dp, pp;
  // The tied embedding's group: with pp > 1, on the first stage (pp_rank 0) and the last
  // (pp_rank pp - 1), the 2 ranks of those two stages with this rank's (tp_rank, dp_rank),
  // the first stage as its rank 0. Both stages hold the token embedding (the first to embed,
  // the last as the LM head), so its gradient is all-reduced over this group. On a middle
  // stage, or with pp == 1, a group of one (SingleCommunicator "embedding").
  std::shared_ptr<Communicator> embedding;
};

// This rank's groups for tp and pp (dp = world / (tp * pp)). Single: a world of one, so tp = pp
// = 1 (else UserError). Mpi: collective over MPI_COMM_WORLD; UserError when tp * pp does not
// divide its size.
ProcessGroups make_process_groups(Backend backend, int tp, int pp);

// The same groups for CUDA tensors: the same layout, and for each group (world, tp, dp, pp,
// embedding) of more than one rank an NcclCommunicator (nccl_communicator.h) of the same name
// and ranks, bootstrapped over `host`'s communicator of that group; a group of one gets a
// SingleCommunicator. Bind the GPU first (bind_local_gpu, gpu_binding.h).
//   ProcessGroups host = make_process_groups(Backend::Mpi, tp, pp);
//   ProcessGroups dev = make_device_groups(host);
// Collective over the world: every rank creates its groups in the order world, tp, dp, pp,
// embedding (skipping those of one rank, which every rank of such a group does alike), so a
// group's initialisation never waits on a rank busy with another. The result does not refer
// to `host` (which keeps carrying the control values); destroy it at the same point on every
// rank (see nccl_communicator.h, Lifetime). Throws UserError when a group of more than one
// rank needs NCCL and the build has none (a world of one needs none).
// `which` leaves out groups the caller does not use (each NCCL communicator holds buffers on
// the GPU and a proxy thread); those keep the host's communicator, which refuses CUDA tensors
// by name. The choice must be the same on every rank.
struct DeviceGroupSet {
  bool world = true, tp = true, dp = true, pp = true, embedding = true;
};
ProcessGroups make_device_groups(const ProcessGroups& host, const DeviceGroupSet& which = {});

}  // namespace nsatron::parallel
