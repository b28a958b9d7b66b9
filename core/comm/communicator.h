// Communicator: the collectives and point-to-point transfers of one process group (the world,
// or a TP/DP/PP group, see parallel/layout.h), behind one interface with several backends:
//   SingleCommunicator  (core/comm/single_communicator.h)  a group of one: every call is a
//                                                          no-op copy
//   MpiCommunicator     (parallel/mpi_communicator.h)      MPI, CPU tensors (fp32, fp64)
//   NcclCommunicator    (parallel/nccl_communicator.h)     NCCL, CUDA tensors (fp32, fp64,
//                                                          bf16), in CUDA builds that found NCCL
// The interface lives in core/ (the ground floor, docs/architecture.md "Layers") so that the
// model can take a group for tensor parallelism without depending on MPI or NCCL; it keeps the
// namespace nsatron::parallel of the backends in parallel/.
//
// Contract of every call, whatever the backend:
//   - It is collective over the group (send/recv/send_recv: over the peers): every rank of the
//     group makes the same calls in the same order, with tensors of the same dtype and element
//     count.
//   - Tensors are contiguous (every Tensor is), of a dtype and device the backend takes
//     (supports()). They are read and written in place; nothing is allocated behind the caller.
//   - Results are the same bits on every rank of the group: a reduced element is computed once
//     and distributed (MPI's and NCCL's algorithms do this), or computed by every rank from the
//     same values in the same order (the copy-engine sums, parallel/copy_engine_communicator.h);
//     a backend that did neither would let data-parallel replicas drift apart. For a fixed
//     group size, message size and backend, results are the same bits from run to run.
//   - A failure (a lost peer, a transport error) throws std::runtime_error naming the group, the
//     rank and the operation. The run cannot continue after one: the caller aborts the job.
//
// The public calls check their arguments (an argument error is a bug in nsatron and throws
// std::logic_error) and delegate to the backend's do_* members.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace nsatron::parallel {

enum class ReduceOp { Sum, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // This rank's index in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name for messages ("world", "tp", "dp", "pp").
  virtual const std::string& name() const = 0;
  // "single", "mpi", "nccl".
  virtual std::string backend() const = 0;
  // Whether tensors of this dtype on this device can be passed.
  virtual bool supports(DType dtype, Device device) const = 0;

  // t = op over the group of every rank's t (elementwise).
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  // out = the concatenation of every rank's `in`, by rank: out.numel() == size() * in.numel(),
  // rank r's block at [r n, (r+1) n). In place when `in` is out's block of this rank (a view
  // of out at offset rank() * n).
  void all_gather(const Tensor& in, Tensor& out);
  // out = block rank() of (op over the group of every rank's `in`): in.numel() ==
  // size() * out.numel(); in and out do not overlap.
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::Sum);
  // t = root's t.
  void broadcast(Tensor& t, int root);
  // To / from group rank `peer` (not this rank). Messages between two ranks arrive in the
  // order they were sent (no tags: NCCL has none).
  void send(const Tensor& t, int peer);
  void recv(Tensor& t, int peer);
  // Sends `send` to group rank send_peer and receives `recv` from recv_peer, both at once: it
  // cannot deadlock when two ranks exchange against each other (each calling send_recv with
  // the other as both peers), nor around a ring (send to the next, receive from the previous),
  // whatever the message size (a send then a recv would, once messages are too large for MPI
  // to buffer). The send half is matched by send_peer's recv (or the receive half of its
  // send_recv), in order with every other message from this rank to it; likewise the receive
  // half. The peers may differ. A peer equal to rank() is allowed only when both are (a local
  // copy: the only exchange in a group of one); send and recv do not overlap. An empty tensor
  // sends or receives nothing (as send and recv, so either half may pair with a plain call).
  void send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer);
  void barrier();

  // Non-blocking all_reduce: starts t = op over the group of every rank's t; the result is
  // there after wait_all(), and until then the caller neither reads nor writes t and keeps
  // it allocated. Started all-reduces are collective calls like the others (every rank starts
  // the same ones in the same order), and no other call on this communicator comes between a
  // start and wait_all() (a std::logic_error otherwise). The MPI backend posts
  // MPI_Iallreduce; NCCL enqueues it on the communicator's own stream after an event on the
  // compute stream, and wait_all() makes the compute stream wait for it; a backend may also
  // run the blocking call at once.
  void start_all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  // Waits for every all-reduce started since the last wait_all() (none: returns at once).
  void wait_all();

  // Non-blocking send and recv: start_send / start_recv begin the transfer of send / recv (the
  // same arguments and pairing as send and recv: a start_send pairs with the peer's recv,
  // start_recv or either half of its send_recv, in order with every other message between the
  // two ranks, counted from when each call starts) and return a request; wait(request)
  // completes it. Until then the caller neither writes t (send) nor reads or writes it (recv),
  // and keeps it allocated. Every request is waited for exactly once, in any order; no tags
  // (NCCL has none): messages between two ranks match in the order their calls start. The MPI
  // backend posts MPI_Isend / MPI_Irecv (posts_ahead() is true); the others run the blocking
  // send or recv at start time and wait returns at once (kDone): a caller that starts a
  // receive ahead of the send its peer starts later must check posts_ahead() first, since
  // there the early blocking receive could wait forever (parallel/pipeline.cpp does).
  using Request = std::int64_t;
  static constexpr Request kDone = -1;
  Request start_send(const Tensor& t, int peer);
  Request start_recv(Tensor& t, int peer);
  void wait(Request request);
  // Whether start_send / start_recv return before the transfer is done (MPI).
  virtual bool posts_ahead() const { return false; }

 protected:
  virtual void do_all_reduce(Tensor& t, ReduceOp op) = 0;
  // in_place: `in` is out's block of this rank.
  virtual void do_all_gather(const Tensor& in, Tensor& out, bool in_place) = 0;
  virtual void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  virtual void do_broadcast(Tensor& t, int root) = 0;
  virtual void do_send(const Tensor& t, int peer) = 0;
  virtual void do_recv(Tensor& t, int peer) = 0;
  // At least one of send and recv is non-empty; an empty one is no message. Both peers are
  // rank() (then send and recv have the same dtype and count) or neither is.
  virtual void do_send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) = 0;
  virtual void do_barrier() = 0;
  // Defaults: the blocking all-reduce, nothing to wait for.
  virtual void do_start_all_reduce(Tensor& t, ReduceOp op) { do_all_reduce(t, op); }
  virtual void do_wait_all() {}
  // Defaults: the blocking send and recv, nothing to wait for (kDone). A backend that posts
  // them overrides all three, and posts_ahead().
  virtual Request do_start_send(const Tensor& t, int peer) {
    do_send(t, peer);
    return kDone;
  }
  virtual Request do_start_recv(Tensor& t, int peer) {
    do_recv(t, peer);
    return kDone;
  }
  virtual void do_wait(Request) {}

 private:
  void check_tensor(const Tensor& t, const char* op) const;
  void check_peer(int peer, const char* op) const;
  // start_all_reduce's rule, enforced: any other call while a started all-reduce waits for
  // wait_all() is a std::logic_error naming the group and the call.
  void check_none_started(const char* op) const;
  std::int64_t started_ = 0;  // all-reduces started since the last wait_all()
};

// ---- small host values, for control (flags, losses, paths) ------------------------------------
// These go through fp64 tensors on the CPU, or through the GPU for a communicator that takes
// only device tensors (NCCL); control values usually travel over the MPI groups.

// op over the group of every rank's `value`.
double all_reduce_value(Communicator& comm, double value, ReduceOp op = ReduceOp::Sum);
// Every rank's values, by rank (each rank passes the same number of values).
std::vector<double> all_gather_values(Communicator& comm, const std::vector<double>& values);
// Root's text on every rank.
std::string broadcast_string(Communicator& comm, const std::string& text, int root);

}  // namespace nsatron::parallel
