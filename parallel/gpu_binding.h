// Which GPU a rank runs on: one rank per GPU, the ranks of a node taking its devices in rank
// order (local rank i -> CUDA device i).
//
//   int device = bind_local_gpu(*world);   // first thing after MPI_Init, before any CUDA work
//
// The local rank is the rank's index among the ranks of its node (MPI_Comm_split_type
// MPI_COMM_TYPE_SHARED over `world`, ordered by world rank). When every rank of a node sees
// exactly one device and those devices differ (the launcher gave each rank its own GPU, e.g.
// CUDA_VISIBLE_DEVICES per rank or `srun --gpus-per-task=1`), each rank takes its device 0.
#pragma once
#include "core/comm/communicator.h"

namespace nsatron::parallel {

// Binds this process to its GPU (cudaSetDevice) and returns the device index. Collective over
// `world` (an MpiCommunicator, or any group of one). Call it before any other CUDA call of the
// process (it decides which device gets the process's context). Throws UserError, on every
// rank of the node alike, when the build has no CUDA, the node has no CUDA device, or it has
// fewer devices than ranks ("4 ranks on this node but 2 CUDA devices: one rank per GPU").
int bind_local_gpu(Communicator& world);

}  // namespace nsatron::parallel
