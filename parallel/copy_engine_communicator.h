// The pipeline's point-to-point transfers on the GPUs' copy engines (parallel.pp_transport =
// "copy_engine", or "auto" where every pipeline neighbour is on this host and reachable; see
// docs/parallel.md, "Pipeline transfers"). A Communicator that sends and receives device
// tensors between neighbouring ranks of one host with no kernel and no host wait, and passes
// every collective (and any transfer to a rank that is not a neighbour) to the group's NCCL
// communicator.
//
// Why: an NCCL send or receive is a kernel that occupies SMs from its launch until the peer
// reaches the matching call. Blocking calls on the compute stream stall it for the peer;
// receives posted ahead on other streams hold SMs the compute kernels need (measured,
// docs/performance.md: both cost the interleaved schedule). A copy engine moves the bytes with
// no SM at all, and flags in GPU memory, written and waited for by stream memory operations
// (cuStreamWriteValue32 / cuStreamWaitValue32, through cudaGetDriverEntryPointByVersion: the
// driver library is not linked), order the transfers with no host involvement.
//
// Layout: for each neighbour p (the previous and the next rank of the ring; one for two ranks)
// this rank owns one device allocation, opened by p through CUDA IPC:
//   S receive slots of slot_bytes each  p's copy engine writes its messages there
//   full[S]  (uint32)                   p writes u + 1 after the u-th use of slot s
//   empty[S] (uint32)                   p writes u + 1 after it has consumed the u-th message
//                                       this rank put in p's slot s
// Message k from this rank to p (its k-th start_send to p) takes slot s = k % S for the
// u = k / S-th time. Send (a non-blocking copy stream, after an event on the compute
// stream): wait until this rank's empty_p[s] >= u (p consumed the slot's previous message),
// copy the tensor into p's slot s, write u + 1 into p's full[s]. Receive (on the compute
// stream, at wait()): wait until full[s] >= u + 1, copy slot s into the tensor, write u + 1
// into p's empty[s]. A flag write follows the copy before it on its stream, with the memory
// barrier cuStreamWriteValue32 puts before every write (no _NO_MEMORY_BARRIER flag), so the
// receiver sees the data before the flag. Messages between two ranks match in the order their
// calls start, as the contract asks.
//
// wait() on a send makes the compute stream wait for its copy (the caller may then reuse or
// free the tensor). The pipeline waits for a send at its next sending step, a micro-batch's
// computation later, when the copy is long done, unless the copy waited for a slot: S must
// exceed the messages one rank receives ahead of their use (the caller sizes it from the
// schedule: copy_engine_slots in core/comm/pipeline_schedule.h). A copy waiting for a slot
// delays only its own stream until then.
//
// Bits: the transfers copy bytes; every result is the same as with NCCL's send and recv.
// Watchdog: each receive's wait and each send's copy are watched until their events complete
// (a dead peer never writes the flag: the rank ends after parallel.comm_timeout_s).
#pragma once
#if NSATRON_WITH_NCCL
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"

struct CUstream_st;
struct CUevent_st;

namespace nsatron::parallel {

class CopyEngineCommunicator final : public Communicator {
 public:
  // The group of `host` (an MPI group: the handles and the verdict travel over it) with
  // `inner` (the same ranks on the GPU: NCCL) for everything but the neighbours' transfers;
  // `slots` receive slots of `slot_bytes` per neighbour (device memory).
  // Collective over `host`. Returns null on every rank alike when some rank cannot reach its
  // neighbours' memory (another host, no peer access, devices hidden from each other), with
  // the first reason in *why; throws std::runtime_error when a CUDA call fails otherwise.
  static std::shared_ptr<CopyEngineCommunicator> create(Communicator& host, std::shared_ptr<Communicator> inner,
                                                        std::size_t slot_bytes, int slots, std::string* why);
  ~CopyEngineCommunicator() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::string backend() const override { return "copy_engine+" + inner_->backend(); }
  bool supports(DType dtype, Device device) const override { return inner_->supports(dtype, device); }
  bool posts_ahead() const override { return true; }

 protected:
  void do_all_reduce(Tensor& t, ReduceOp op) override;
  void do_all_gather(const Tensor& in, Tensor& out, bool in_place) override;
  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  void do_broadcast(Tensor& t, int root) override;
  void do_send(const Tensor& t, int peer) override;
  void do_recv(Tensor& t, int peer) override;
  void do_send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) override;
  void do_barrier() override;
  void do_start_all_reduce(Tensor& t, ReduceOp op) override;
  void do_wait_all() override;
  Request do_start_send(const Tensor& t, int peer) override;
  Request do_start_recv(Tensor& t, int peer) override;
  void do_wait(Request request) override;

 private:
  struct Link;     // one neighbour: its memory, this rank's, the counters
  struct Pending;  // a started transfer not yet waited for
  CopyEngineCommunicator(std::shared_ptr<Communicator> inner, std::size_t slot_bytes, int slots, int device);
  Link* link_to(int peer);  // null: not a neighbour (its transfers go to inner_)
  void check_fits(const Tensor& t, const char* op) const;

  std::shared_ptr<Communicator> inner_;
  std::size_t slot_bytes_;
  int slots_;
  int device_;
  bool established_ = false;  // every rank opened its neighbours' memory
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<std::unique_ptr<Pending>> pending_;
  Request next_request_ = 0;
  CUevent_st* ready_ = nullptr;  // on the compute stream, before a send's copy
};

}  // namespace nsatron::parallel
#endif  // NSATRON_WITH_NCCL
