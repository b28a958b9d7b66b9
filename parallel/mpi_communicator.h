// The MPI backend of Communicator: CPU tensors, fp32 and fp64 (MPI_FLOAT, MPI_DOUBLE), blocking
// calls (and MPI_Iallreduce for start_all_reduce, MPI_Isend / MPI_Irecv for start_send /
// start_recv) on an MPI communicator this object owns (a duplicate or a split of MPI_COMM_WORLD).
// Errors return to us (MPI_ERRORS_RETURN on the communicator) and throw std::runtime_error
// "MPI_Allreduce on the dp group (rank 1 of 2) failed: <MPI's error text>".
// Messages longer than INT_MAX elements are sent in pieces (all_reduce, broadcast, send,
// recv, send_recv: each half cut the same way as send and recv cut it, so that they pair);
// all_gather and reduce_scatter take blocks of up to INT_MAX elements. send_recv is
// MPI_Sendrecv (MPI_Send or MPI_Recv for the pieces where only one half has data left).
#pragma once
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "core/comm/communicator.h"

namespace nsatron::parallel {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor, unless MPI is finalized by then).
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;

  // A duplicate of MPI_COMM_WORLD. MPI must be initialised.
  static std::unique_ptr<MpiCommunicator> world(const std::string& name = "world");
  // The group of this communicator's ranks that pass the same `color`, ordered by `key`
  // (MPI_Comm_split). Collective over this communicator.
  std::unique_ptr<MpiCommunicator> split(int color, int key, const std::string& name) const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "mpi"; }
  bool supports(DType dtype, Device device) const override {
    return device == Device::CPU && (dtype == DType::F32 || dtype == DType::F64);
  }
  MPI_Comm handle() const { return comm_; }
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
  void do_start_all_reduce(Tensor& t, ReduceOp op) override;  // MPI_Iallreduce (pieces as all_reduce)
  void do_wait_all() override;                                 // MPI_Waitall
  Request do_start_send(const Tensor& t, int peer) override;   // MPI_Isend (pieces as send)
  Request do_start_recv(Tensor& t, int peer) override;         // MPI_Irecv (pieces as recv)
  void do_wait(Request request) override;                      // MPI_Waitall of its pieces

 private:
  void check(int code, const char* what) const;
  // Throws unless `status` reports n elements of `dtype` received from `peer`.
  void check_count(const MPI_Status& status, DType dtype, int n, int peer, const char* op) const;
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> pending_;  // started all-reduces, until wait_all
  // A started send or recv, until waited for: its pieces' requests and (recv) their counts.
  struct PointToPoint {
    std::vector<MPI_Request> requests;
    std::vector<int> counts;  // recv: the elements each piece expects (send: empty)
    DType dtype = DType::F32;
    int peer = 0;
  };
  // Calls fn(piece pointer, piece count) for each piece of at most INT_MAX elements of t.
  template <typename Fn>
  static void for_pieces(const Tensor& t, Fn fn);
  std::map<Request, PointToPoint> started_;
  Request next_request_ = 0;
};

}  // namespace nsatron::parallel
