// Host side of core/ops/cuda/common.cuh: the scratch workspace and the bad-id record.
#include <string>
#include <vector>

#include "core/ops/cross_entropy.h"
#include "core/ops/cuda/common.cuh"
#include "core/ops/embedding.h"

namespace nsatron::cuda_detail {

void* workspace(std::size_t bytes) {
  struct Buf {
    void* p = nullptr;
    std::size_t bytes = 0;
  };
  thread_local std::vector<Buf> per_device;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (per_device.size() <= std::size_t(dev)) per_device.resize(std::size_t(dev) + 1);
  Buf& b = per_device[std::size_t(dev)];
  if (bytes > b.bytes) {
    if (b.p) {
      // Kernels queued earlier may still read the old buffer.
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaFree(b.p));
      b.p = nullptr;
      b.bytes = 0;
    }
    std::size_t want = bytes < (std::size_t(1) << 20) ? (std::size_t(1) << 20) : bytes;
    want = (want + 255) / 256 * 256;
    CUDA_CHECK(cudaMalloc(&b.p, want));
    b.bytes = want;
  }
  return b.p;
}

IdError* id_error_slot() {
  thread_local std::vector<IdError*> per_device;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (per_device.size() <= std::size_t(dev)) per_device.resize(std::size_t(dev) + 1, nullptr);
  IdError*& e = per_device[std::size_t(dev)];
  if (!e) {
    CUDA_CHECK(cudaMalloc(&e, sizeof(IdError)));
    CUDA_CHECK(cudaMemset(e, 0, sizeof(IdError)));
  }
  return e;
}

}  // namespace nsatron::cuda_detail

namespace nsatron::cuda {

void check_id_errors() {
  using namespace cuda_detail;
  IdError* slot = id_error_slot();
  IdError e{};
  CUDA_CHECK(cudaMemcpy(&e, slot, sizeof(IdError), cudaMemcpyDeviceToHost));
  if (!e.flag) return;
  CUDA_CHECK(cudaMemset(slot, 0, sizeof(IdError)));
  const char* names[] = {"?",
                         "embedding_forward",
                         "embedding_backward",
                         "cross_entropy_forward",
                         "cross_entropy_backward",
                         "cross_entropy_fused",
                         "cross_entropy_slice_stats",
                         "cross_entropy_slice_grad"};
  const char* op = (e.op >= 1 && e.op <= kCrossEntropySliceGrad) ? names[e.op] : names[0];
  const bool ce = e.op >= kCrossEntropyForward;
  if (e.limit <= 0)  // a slice op that does not know the vocabulary's size: a negative id
    throw std::invalid_argument(std::string(op) + ": target " + std::to_string(e.value) +
                                " at position " + std::to_string(e.position) +
                                " is neither ignore_index nor a vocabulary id (>= 0)");
  throw std::invalid_argument(std::string(op) + ": " + (ce ? "target " : "token id ") +
                              std::to_string(e.value) + " at position " +
                              std::to_string(e.position) + " is outside " +
                              (ce ? "ignore_index and " : "the vocabulary ") + "[0, " +
                              std::to_string(e.limit) + ")");
}

}  // namespace nsatron::cuda
