// For GPU tests under mpirun: whether this job can run on GPUs, decided by all ranks together.
#pragma once
#include <string>

#include "core/comm/communicator.h"
#include "core/util/error.h"
#include "parallel/gpu_binding.h"

namespace nsatron::parallel {

// Binds this rank's GPU and says why the job cannot be tested on GPUs ("" when it can): no
// GPU for every rank, or no NCCL for a job of several ranks. The same answer on every rank
// (collective over `host`), so that no rank waits in a collective that another skipped.
inline std::string gpu_skip_reason(Communicator& host) {
  std::string why;
  try {
    bind_local_gpu(host);
  } catch (const UserError& e) {
    why = e.what();
  }
#if !NSATRON_WITH_NCCL
  if (why.empty() && host.size() > 1) why = "this build has no NCCL";
#endif
  if (all_reduce_value(host, why.empty() ? 0.0 : 1.0, ReduceOp::Max) > 0.0)
    return why.empty() ? std::string("another rank cannot use a GPU") : why;
  return "";
}

}  // namespace nsatron::parallel
