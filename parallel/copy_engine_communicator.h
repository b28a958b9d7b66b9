// Transfers on the GPUs' copy engines between ranks of one host, for two roles:
//   - the pipeline's point-to-point messages (parallel.pp_transport = "copy_engine", or "auto"
//     where every pipeline neighbour is on this host and reachable; docs/parallel.md,
//     "Pipeline transfers"): sends and receives of device tensors between neighbouring ranks
//     with no kernel and no host wait; every collective (and any transfer to a rank that is not
//     a neighbour) goes to the group's NCCL communicator;
//   - the tensor-parallel sums (parallel.tp_transport, "Tensor-parallel sums" there): each
//     fp32 or bf16 all-reduce (ReduceOp::Sum, up to one slot) copies this rank's tensor into a
//     slot of every other rank of the group, and one kernel then adds the group's tensors in
//     rank order (cuda::sum_in_order: the same additions, so the same bits, on every rank; for
//     two ranks a + b, the bits of NCCL's sum); other all-reduces and collectives go to NCCL.
//
// Why: an NCCL send, receive or all-reduce is a kernel that occupies SMs from its launch until
// its transfer is done. Blocking calls on the compute stream stall it for the peer; transfers
// on other streams hold SMs the compute kernels need (measured, docs/performance.md: both cost
// the interleaved schedule, and a tensor-parallel rank's weight-gradient products ran 60%
// slower beside NCCL's sums). A copy engine moves the bytes with no SM at all, and flags in GPU
// memory, written and waited for by stream memory operations (cuStreamWriteValue32 /
// cuStreamWaitValue32, through cudaGetDriverEntryPointByVersion: the driver library is not
// linked), order the transfers with no host involvement. A sum's add is a short
// memory-bound kernel on a stream of its own, beside the compute stream's work.
//
// Layout: for each linked peer p (pipeline: the previous and the next rank of the ring, one for
// two ranks; sums: every other rank of the group) this rank owns one device allocation, opened
// by p through CUDA IPC:
//   S receive slots of slot_bytes each  p's copy engine writes its messages there
//   full[S]  (uint32)                   p writes u + 1 after the u-th use of slot s
//   empty[S] (uint32)                   p writes u + 1 after it has consumed the u-th message
//                                       this rank put in p's slot s
// Message k from this rank to p (its k-th message to p: a start_send, or its part of a sum)
// takes slot s = k % S for the u = k / S-th time. Send (a non-blocking copy stream, after an
// event on the compute stream): wait until this rank's empty_p[s] >= u (p consumed the slot's
// previous message), copy the tensor into p's slot s, write u + 1 into p's full[s]. Receive (on
// the compute stream, at wait()): wait until full[s] >= u + 1, copy slot s into the tensor,
// write u + 1 into p's empty[s]. A sum (on its own stream, sums_): after this rank's copies have
// read the tensor and every peer's message is in its slot, the add over the tensor and the
// slots, then u + 1 into each peer's empty[s]; wait_all() makes the compute stream wait for it.
// A flag write follows the copy before it on its stream, with the memory barrier
// cuStreamWriteValue32 puts before every write (no _NO_MEMORY_BARRIER flag), so the receiver
// sees the data before the flag. Messages between two ranks match in the order their calls
// start, as the contract asks.
//
// wait() on a send makes the compute stream wait for its copy (the caller may then reuse or
// free the tensor). The pipeline waits for a send at its next sending step, a micro-batch's
// computation later, when the copy is long done, unless the copy waited for a slot: S must
// exceed the messages one rank receives ahead of their use (the caller sizes it from the
// schedule: copy_engine_slots in core/comm/pipeline_schedule.h; the sums need 2: at most one is
// started before wait_all). A copy waiting for a slot delays only its own stream until then.
//
// Bits: the transfers copy bytes; every pipeline result is the same as with NCCL's send and
// recv, every sum the same on all ranks (and NCCL's for two ranks).
// Watchdog: each receive's wait, each send's copy and each sum are watched until their events
// complete (a dead peer never writes the flag: the rank ends after parallel.comm_timeout_s).
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
  enum class Role {
    PipelineMessages,  // start_send / start_recv to the ring's neighbours
    TensorSums,        // all-reduces (Sum, fp32 / bf16, up to slot_bytes) with every other rank
                       // (its sends and receives go to inner, as its other collectives)
  };
  // The group of `host` (an MPI group: the handles and the verdict travel over it) with
  // `inner` (the same ranks on the GPU: NCCL) for everything the role does not move;
  // `slots` receive slots of `slot_bytes` per linked peer (device memory).
  // Collective over `host`. Returns null on every rank alike when some rank cannot reach its
  // peers' memory (another host, no peer access, devices hidden from each other), with the
  // first reason in *why; throws std::runtime_error when a CUDA call fails otherwise.
  static std::shared_ptr<CopyEngineCommunicator> create(Communicator& host, std::shared_ptr<Communicator> inner,
                                                        std::size_t slot_bytes, int slots, std::string* why,
                                                        Role role = Role::PipelineMessages);
  ~CopyEngineCommunicator() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::string backend() const override { return "copy_engine+" + inner_->backend(); }
  bool supports(DType dtype, Device device) const override { return inner_->supports(dtype, device); }
  bool posts_ahead() const override { return role_ == Role::PipelineMessages; }

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
  struct Link;     // one linked peer: its memory, this rank's, the counters
  struct Pending;  // a started transfer not yet waited for
  CopyEngineCommunicator(std::shared_ptr<Communicator> inner, std::size_t slot_bytes, int slots, int device, Role role);
  Link* link_to(int peer);  // null: not linked, or Role::TensorSums (its transfers go to inner_)
  void check_fits(const Tensor& t, const char* op) const;
  struct StartedSum;  // a sum's tensor, its inputs and the peers' slots
  bool sums_here(const Tensor& t, ReduceOp op) const;  // an all-reduce this role moves itself
  // A sum's copies and its add on sums_ (in at most max_blocks blocks, 0: no bound); the add
  // and the slots handed back.
  void start_sum(Tensor& t, int max_blocks);
  void add_sum(StartedSum& sum, int max_blocks);
  // This rank's next message to link's peer on the link's copy stream (after ready_).
  void copy_to_peer(Link* link, const Tensor& t, const char* what);

  std::shared_ptr<Communicator> inner_;
  std::size_t slot_bytes_;
  int slots_;
  int device_;
  bool established_ = false;  // every rank opened its neighbours' memory
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<std::unique_ptr<Pending>> pending_;
  Request next_request_ = 0;
  CUevent_st* ready_ = nullptr;  // on the compute stream, before a send's copy
  Role role_;
  // The sums (Role::TensorSums): their stream, an event after the last one's add, and the
  // sums started since wait_all (their tensors kept allocated until then).
  CUstream_st* sums_ = nullptr;
  CUevent_st* summed_ = nullptr;
  std::vector<StartedSum> summing_;
  // The adds beside the compute stream take at most this many blocks per SM (grid-stride), so
  // that the compute kernels' blocks find SMs between theirs (measured on 2 H200s, tp2 pairs:
  // 8192 blocks 853 ms a step, 4 per SM 836, 1 per SM 850; docs/performance.md). A blocking
  // all_reduce, waited for at once, takes the whole grid.
  static constexpr int kSumBlocksPerSm = 4;
  int sum_blocks_ = 0;
};

}  // namespace nsatron::parallel
#endif  // NSATRON_WITH_NCCL
