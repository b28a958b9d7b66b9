// The NCCL backend of Communicator: CUDA tensors, fp32, fp64 and bf16, on the GPU this rank
// was bound to (gpu_binding.h: one rank per GPU). Built when CMake finds NCCL in a CUDA build
// (NSATRON_WITH_NCCL); without it this header declares nothing and make_device_groups
// (process_groups.h) refuses with a UserError.
//
// Stream: every call is enqueued on the legacy default CUDA stream, the stream every kernel
// and copy of this project uses, so a collective runs after the kernels that wrote its input
// and before those that read its output, with no event or synchronisation by the caller. The
// calls return once the work is enqueued (NCCL is asynchronous to the host); reading a result
// on the host goes through a copy (Tensor::to, to_vector: cudaMemcpy on that stream), which
// waits for it. barrier() alone waits: a one-element all-reduce, then a stream
// synchronisation.
//
// Numerics: NCCL's ring and tree algorithms reduce each element once, on one rank, in an
// order fixed by the group size, the message size and the topology, and distribute that
// result, so a reduction gives the same bits on every rank (Communicator's contract) and, on
// the same machines with the same NCCL, from run to run. (NVLink SHARP, NVLS, reduces in the
// switch and is left to the machine's settings: nothing here enables it, and nothing here
// sets NCCL environment variables.)
//
// Point to point: send/recv are ncclSend/ncclRecv (in order between two ranks, no tags);
// send_recv is both in one ncclGroupStart/ncclGroupEnd, so an exchange between two ranks or
// around a ring cannot deadlock at any size. A send_recv with itself is a device copy.
//
// Overlap (start_all_reduce / wait_all: parallel.overlap_grad_reduce, and tensor parallelism's
// sums, parallel.tp_overlap): a started all-reduce runs on this communicator's own
// non-blocking CUDA stream of the highest priority, after an event recorded on the
// compute stream when it is started (so it reads the gradients the kernels enqueued before
// wrote), concurrently with the kernels enqueued after it; wait_all() makes the compute stream
// wait for an event recorded after the last of them. The same NCCL call on the same buffer:
// the same bits as the blocking all_reduce. The host never waits.
//
// Errors: a failed NCCL call throws std::runtime_error
//   "NCCL ncclAllReduce on the dp group (rank 1 of 2) failed: <error string> (<last error>)".
// An error NCCL finds later, on the device or in its proxy (a lost peer), shows in the next
// barrier(), which checks ncclCommGetAsyncError, and, while the communication watchdog is
// armed (core/comm/watchdog.h), within its poll period: the watchdog polls
// ncclCommGetAsyncError, watches every enqueued operation until its CUDA event completes, and
// on an error or a timeout calls ncclCommAbort on this communicator before the rank exits.
// ncclCommInitRank is watched too: a peer that never joins ends the rank after the timeout.
//
// Lifetime: the destructor calls ncclCommDestroy, which may wait for the group's other ranks
// on this node: destroy the communicators of one process in the same order on every rank
// (a ProcessGroups' members are, in reverse order of declaration).
#pragma once
#if NSATRON_WITH_NCCL
#include <memory>
#include <string>

#include "core/comm/communicator.h"

struct ncclComm;  // nccl.h's ncclComm_t is `struct ncclComm*`; only the .cpp includes nccl.h
struct CUstream_st;  // cudaStream_t, cudaEvent_t (only the .cpp includes the CUDA headers)
struct CUevent_st;

namespace nsatron::parallel {

class NcclCommunicator final : public Communicator {
 public:
  // The NCCL communicator of the ranks of `bootstrap`, ranked as in it. Collective over
  // `bootstrap`: a communicator of exactly these ranks that takes fp64 on the CPU (the group's
  // MpiCommunicator), which carries the 128-byte ncclUniqueId from its rank 0 to the others.
  // The communicator lives on the current CUDA device (cudaGetDevice: bind_local_gpu first);
  // the ranks of a group must be on different devices. Throws std::runtime_error when NCCL
  // fails (naming `name`, the rank and the call).
  static std::shared_ptr<NcclCommunicator> create(Communicator& bootstrap, const std::string& name);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "nccl"; }
  bool supports(DType dtype, Device device) const override {
    return device == Device::CUDA && (dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16);
  }
  // The CUDA device this communicator runs on.
  int device() const { return device_; }

 protected:
  void do_all_reduce(Tensor& t, ReduceOp op) override;
  void do_all_gather(const Tensor& in, Tensor& out, bool in_place) override;
  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  void do_broadcast(Tensor& t, int root) override;
  void do_send(const Tensor& t, int peer) override;
  void do_recv(Tensor& t, int peer) override;
  void do_send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) override;
  void do_barrier() override;
  void do_start_all_reduce(Tensor& t, ReduceOp op) override;  // on the overlap stream
  void do_wait_all() override;  // the compute stream waits for the overlap stream

 private:
  NcclCommunicator(ncclComm* comm, std::string name, int rank, int size, int device);
  // Throws unless `code` (an ncclResult_t) is ncclSuccess.
  void check(int code, const char* what) const;
  // While the watchdog is armed: a watch on the operation just enqueued on `stream`, finished
  // when an event recorded after it completes.
  void watch_enqueued(const char* op, CUstream_st* stream);
  ncclComm* comm_;
  std::string name_;
  int rank_, size_, device_;
  Tensor barrier_flag_;  // one fp32 on the device, all-reduced by barrier()
  CUstream_st* overlap_stream_ = nullptr;  // started all-reduces (non-blocking stream)
  CUevent_st* started_ = nullptr;          // on the compute stream, before a started all-reduce
  CUevent_st* finished_ = nullptr;         // on the overlap stream, at wait_all
  bool pending_ = false;                   // started all-reduces not waited for
  std::uint64_t monitor_ = 0;              // the watchdog's monitor of this communicator
};

}  // namespace nsatron::parallel
#endif  // NSATRON_WITH_NCCL
