#include "parallel/process_groups.h"

#include "core/comm/single_communicator.h"
#include "core/util/error.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"

namespace nsatron::parallel {

ProcessGroups make_process_groups(Backend backend, int tp, int pp) {
  ProcessGroups g;
  if (backend == Backend::Single) {
    g.layout = ParallelLayout::make(1, tp, pp, 0);
    g.world = std::make_shared<SingleCommunicator>("world");
    g.tp = std::make_shared<SingleCommunicator>("tp");
    g.dp = std::make_shared<SingleCommunicator>("dp");
    g.pp = std::make_shared<SingleCommunicator>("pp");
    g.embedding = std::make_shared<SingleCommunicator>("embedding");
    return g;
  }
  std::shared_ptr<MpiCommunicator> world = MpiCommunicator::world("world");
  g.layout = ParallelLayout::make(world->size(), tp, pp, world->rank());
  const ParallelLayout& l = g.layout;
  // MPI_Comm_split is collective over the world: every rank makes the four calls, in the same
  // order, even where its own group has one rank (that communicator is then dropped).
  auto group = [&](int color, int key, int size, const char* name) -> std::shared_ptr<Communicator> {
    std::shared_ptr<MpiCommunicator> c = world->split(color, key, name);
    if (size == 1) return std::make_shared<SingleCommunicator>(name);
    return c;
  };
  g.tp = group(l.dp_rank + l.dp * l.pp_rank, l.tp_rank, l.tp, "tp");
  g.dp = group(l.tp_rank + l.tp * l.pp_rank, l.dp_rank, l.dp, "dp");
  g.pp = group(l.tp_rank + l.tp * l.dp_rank, l.pp_rank, l.pp, "pp");
  // Embedding: colours [0, tp * dp) pair the first and last stage of each pipeline (key
  // pp_rank: the first stage is rank 0); every other rank takes a colour of its own.
  const bool tied = l.pp > 1 && (l.first_stage() || l.last_stage());
  g.embedding = group(tied ? l.tp_rank + l.tp * l.dp_rank : l.tp * l.dp + l.rank, l.pp_rank, tied ? 2 : 1, "embedding");
  g.world = world->size() == 1 ? std::shared_ptr<Communicator>(std::make_shared<SingleCommunicator>("world"))
                               : std::shared_ptr<Communicator>(world);
  return g;
}

ProcessGroups make_device_groups(const ProcessGroups& host, const DeviceGroupSet& which) {
  ProcessGroups g;
  g.layout = host.layout;
  // In this order on every rank (see the header); each create is collective over its group only.
  auto device_group = [](const std::shared_ptr<Communicator>& h) -> std::shared_ptr<Communicator> {
    NSA_CHECK(h != nullptr, "make_device_groups: a host group is missing");
    if (h->size() == 1) return std::make_shared<SingleCommunicator>(h->name());
#if NSATRON_WITH_NCCL
    return NcclCommunicator::create(*h, h->name());
#else
    throw UserError("this build has no NCCL: the " + std::to_string(h->size()) + "-rank " + h->name() +
                    " group needs it on GPUs (configure a CUDA build where NCCL is found: nccl.h and libnccl, "
                    "in the CUDA toolkit or under -DNCCL_ROOT=...)");
#endif
  };
  g.world = which.world ? device_group(host.world) : host.world;
  g.tp = which.tp ? device_group(host.tp) : host.tp;
  g.dp = which.dp ? device_group(host.dp) : host.dp;
  g.pp = which.pp ? device_group(host.pp) : host.pp;
  g.embedding = which.embedding ? device_group(host.embedding) : host.embedding;
  return g;
}

}  // namespace nsatron::parallel
