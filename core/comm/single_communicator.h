// A group of one rank (a single-process run, or a TP/PP/DP group of size 1 in a larger world):
// all_reduce and broadcast leave the tensor as it is, all_gather and reduce_scatter copy `in`
// to `out` (nothing when in place), barrier returns. Takes any dtype on any device. send and
// recv have no peer to talk to (the argument checks refuse them); send_recv with both peers 0
// (itself) copies send into recv.
#pragma once
#include "core/comm/communicator.h"

namespace nsatron::parallel {

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(std::string name = "world") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "single"; }
  bool supports(DType, Device) const override { return true; }

 protected:
  void do_all_reduce(Tensor&, ReduceOp) override {}
  void do_all_gather(const Tensor& in, Tensor& out, bool in_place) override {
    if (!in_place) out.copy_from(in);
  }
  void do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp) override {
    if (in.raw() != out.raw()) out.copy_from(in);
  }
  void do_broadcast(Tensor&, int) override {}
  void do_send(const Tensor&, int) override {}
  void do_recv(Tensor&, int) override {}
  void do_send_recv(const Tensor& send, int, Tensor& recv, int) override { recv.copy_from(send); }
  void do_barrier() override {}

 private:
  std::string name_;
};

}  // namespace nsatron::parallel
