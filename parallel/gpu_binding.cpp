#include "parallel/gpu_binding.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/util/error.h"
#include "parallel/mpi_communicator.h"

#if NSATRON_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nsatron::parallel {

#if !NSATRON_WITH_CUDA

int bind_local_gpu(Communicator&) {
  throw UserError("bind_local_gpu: this build has no CUDA (configured with NSATRON_CUDA=OFF or without nvcc)");
}

#else

namespace {

// The ranks of this node (MPI_COMM_TYPE_SHARED), freed at scope exit.
struct NodeComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  ~NodeComm() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  // Every node rank's `n` bytes at `mine`, by node rank.
  std::vector<unsigned char> all_gather(const void* mine, int n) const {
    std::vector<unsigned char> all(std::size_t(n) * std::size_t(size));
    if (comm == MPI_COMM_NULL) {
      std::memcpy(all.data(), mine, std::size_t(n));
    } else if (const int code = MPI_Allgather(mine, n, MPI_BYTE, all.data(), n, MPI_BYTE, comm);
               code != MPI_SUCCESS) {
      throw std::runtime_error("bind_local_gpu: MPI_Allgather over the ranks of this node failed (code " +
                               std::to_string(code) + ")");
    }
    return all;
  }
};

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "unknown host";
  return name;
}

}  // namespace

int bind_local_gpu(Communicator& world) {
  NodeComm node;
  if (world.size() > 1) {
    auto* mpi = dynamic_cast<MpiCommunicator*>(&world);
    NSA_CHECK(mpi != nullptr, "bind_local_gpu: the ", world.name(), " communicator is ", world.backend(),
              ", not MPI: the ranks of a node are found through MPI");
    const int code = MPI_Comm_split_type(mpi->handle(), MPI_COMM_TYPE_SHARED, mpi->rank(), MPI_INFO_NULL, &node.comm);
    if (code != MPI_SUCCESS)
      throw std::runtime_error("bind_local_gpu: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) on the " + world.name() +
                               " group failed (code " + std::to_string(code) + ")");
    MPI_Comm_rank(node.comm, &node.rank);
    MPI_Comm_size(node.comm, &node.size);
  }

  // How many devices each rank of the node sees (0 without a driver or device). Every rank
  // decides from the same numbers, so all of them bind or all of them throw.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  std::vector<int> counts(std::size_t(node.size));
  {
    const auto bytes = node.all_gather(&count, int(sizeof(int)));
    std::memcpy(counts.data(), bytes.data(), bytes.size());
  }
  const int fewest = *std::min_element(counts.begin(), counts.end());
  const int most = *std::max_element(counts.begin(), counts.end());
  const std::string ranks = std::to_string(node.size) + (node.size == 1 ? " rank" : " ranks") + " on this node (" +
                            host_name() + ")";
  if (fewest == 0)
    throw UserError("bind_local_gpu: " + ranks + " but " +
                    (most == 0 ? "no CUDA device" : "a rank sees no CUDA device") +
                    " (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)");

  int device = -1;
  if (fewest >= node.size) {
    device = node.rank;
  } else if (most == 1) {
    // Each rank sees one device: fine when they are different GPUs (compare their UUIDs).
    // (A rank that cannot read its UUID sends zeros: no throw before the collective.)
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
      cudaGetLastError();
      std::memset(p.uuid.bytes, 0, sizeof(p.uuid.bytes));
    }
    const auto ids = node.all_gather(p.uuid.bytes, int(sizeof(p.uuid.bytes)));
    std::set<std::string> distinct;
    for (int r = 0; r < node.size; ++r)
      distinct.insert(std::string(reinterpret_cast<const char*>(ids.data()) + std::size_t(r) * sizeof(p.uuid.bytes),
                                  sizeof(p.uuid.bytes)));
    if (int(distinct.size()) == node.size) device = 0;
  }
  if (device < 0)
    throw UserError("bind_local_gpu: " + ranks + " but " + std::to_string(fewest) +
                    (fewest == 1 ? " CUDA device" : " CUDA devices") +
                    ": one rank per GPU (start at most that many ranks per node)");

  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    throw std::runtime_error("bind_local_gpu: cudaSetDevice(" + std::to_string(device) + ") failed: " +
                             cudaGetErrorString(e));
  return device;
}

#endif  // NSATRON_WITH_CUDA

}  // namespace nsatron::parallel
