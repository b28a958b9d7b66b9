#include "core/comm/communicator.h"

#include "core/comm/watchdog.h"
#include "core/util/error.h"

namespace nsatron::parallel {

void Communicator::check_tensor(const Tensor& t, const char* op) const {
  NSA_CHECK(t.defined(), name(), ".", op, ": undefined tensor");
  NSA_CHECK(supports(t.dtype(), t.device()), name(), ".", op, ": the ", backend(), " backend does not take ",
            t.describe());
}

void Communicator::check_none_started(const char* op) const {
  NSA_CHECK(started_ == 0, name(), ".", op, ": called while ", started_,
            " started all-reduce(s) wait for wait_all() (no other call comes between a start and wait_all)");
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  check_none_started("all_reduce");
  check_tensor(t, "all_reduce");
  const Watchdog::Scope watch(name(), "all_reduce", rank(), size());
  if (t.numel() > 0) do_all_reduce(t, op);
}

void Communicator::start_all_reduce(Tensor& t, ReduceOp op) {
  check_tensor(t, "start_all_reduce");
  const Watchdog::Scope watch(name(), "start_all_reduce", rank(), size());
  if (t.numel() > 0) do_start_all_reduce(t, op);
  ++started_;
}

void Communicator::wait_all() {
  const Watchdog::Scope watch(name(), "wait_all", rank(), size());
  do_wait_all();
  started_ = 0;
}

void Communicator::all_gather(const Tensor& in, Tensor& out) {
  check_none_started("all_gather");
  check_tensor(in, "all_gather");
  check_tensor(out, "all_gather");
  NSA_CHECK(in.dtype() == out.dtype() && in.device() == out.device(), name(), ".all_gather: ", in.describe(),
            " into ", out.describe());
  NSA_CHECK(out.numel() == std::int64_t(size()) * in.numel(), name(), ".all_gather: out has ", out.numel(),
            " elements, expected ", size(), " x ", in.numel());
  const std::size_t block = in.nbytes();
  const bool in_place = static_cast<const char*>(in.raw()) == static_cast<const char*>(out.raw()) + block * std::size_t(rank());
  if (!in_place && block > 0) {
    const char* a = static_cast<const char*>(in.raw());
    const char* b = static_cast<const char*>(out.raw());
    NSA_CHECK(a + block <= b || b + out.nbytes() <= a, name(), ".all_gather: in overlaps out other than as this rank's block");
  }
  const Watchdog::Scope watch(name(), "all_gather", rank(), size());
  if (in.numel() > 0) do_all_gather(in, out, in_place);
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  check_none_started("reduce_scatter");
  check_tensor(in, "reduce_scatter");
  check_tensor(out, "reduce_scatter");
  NSA_CHECK(in.dtype() == out.dtype() && in.device() == out.device(), name(), ".reduce_scatter: ", in.describe(),
            " into ", out.describe());
  NSA_CHECK(in.numel() == std::int64_t(size()) * out.numel(), name(), ".reduce_scatter: in has ", in.numel(),
            " elements, expected ", size(), " x ", out.numel());
  const char* a = static_cast<const char*>(in.raw());
  const char* b = static_cast<const char*>(out.raw());
  NSA_CHECK(out.numel() == 0 || a + in.nbytes() <= b || b + out.nbytes() <= a, name(),
            ".reduce_scatter: in and out overlap");
  const Watchdog::Scope watch(name(), "reduce_scatter", rank(), size());
  if (out.numel() > 0) do_reduce_scatter(in, out, op);
}

void Communicator::broadcast(Tensor& t, int root) {
  check_none_started("broadcast");
  check_tensor(t, "broadcast");
  NSA_CHECK(root >= 0 && root < size(), name(), ".broadcast: root ", root, " outside a group of ", size());
  const Watchdog::Scope watch(name(), "broadcast", rank(), size());
  if (t.numel() > 0) do_broadcast(t, root);
}

void Communicator::check_peer(int peer, const char* op) const {
  NSA_CHECK(peer >= 0 && peer < size() && peer != rank(), name(), ".", op, ": peer ", peer, " at rank ", rank(),
            " of ", size());
}

void Communicator::send(const Tensor& t, int peer) {
  check_none_started("send");
  check_tensor(t, "send");
  check_peer(peer, "send");
  const Watchdog::Scope watch(name(), "send", rank(), size());
  if (t.numel() > 0) do_send(t, peer);
}

void Communicator::recv(Tensor& t, int peer) {
  check_none_started("recv");
  check_tensor(t, "recv");
  check_peer(peer, "recv");
  const Watchdog::Scope watch(name(), "recv", rank(), size());
  if (t.numel() > 0) do_recv(t, peer);
}

Communicator::Request Communicator::start_send(const Tensor& t, int peer) {
  check_none_started("start_send");
  check_tensor(t, "start_send");
  check_peer(peer, "start_send");
  const Watchdog::Scope watch(name(), "start_send", rank(), size());
  return t.numel() > 0 ? do_start_send(t, peer) : kDone;
}

Communicator::Request Communicator::start_recv(Tensor& t, int peer) {
  check_none_started("start_recv");
  check_tensor(t, "start_recv");
  check_peer(peer, "start_recv");
  const Watchdog::Scope watch(name(), "start_recv", rank(), size());
  return t.numel() > 0 ? do_start_recv(t, peer) : kDone;
}

void Communicator::wait(Request request) {
  const Watchdog::Scope watch(name(), "wait", rank(), size());
  if (request != kDone) do_wait(request);
}

void Communicator::send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) {
  check_none_started("send_recv");
  check_tensor(send, "send_recv");
  check_tensor(recv, "send_recv");
  NSA_CHECK(send_peer >= 0 && send_peer < size() && recv_peer >= 0 && recv_peer < size(), name(),
            ".send_recv: peers ", send_peer, " and ", recv_peer, " at rank ", rank(), " of ", size());
  NSA_CHECK((send_peer == rank()) == (recv_peer == rank()), name(), ".send_recv: rank ", rank(), " sends to ",
            send_peer, " and receives from ", recv_peer, " (itself only for both)");
  if (send_peer == rank())
    NSA_CHECK(send.dtype() == recv.dtype() && send.numel() == recv.numel(), name(), ".send_recv to itself: ",
              send.describe(), " into ", recv.describe());
  const char* a = static_cast<const char*>(send.raw());
  const char* b = static_cast<const char*>(recv.raw());
  NSA_CHECK(send.numel() == 0 || recv.numel() == 0 || a + send.nbytes() <= b || b + recv.nbytes() <= a, name(),
            ".send_recv: send and recv overlap");
  const Watchdog::Scope watch(name(), "send_recv", rank(), size());
  if (send.numel() > 0 || recv.numel() > 0) do_send_recv(send, send_peer, recv, recv_peer);
}

void Communicator::barrier() {
  check_none_started("barrier");
  const Watchdog::Scope watch(name(), "barrier", rank(), size());
  do_barrier();
}

namespace {

// The values travel as fp64 tensors on the CPU; a communicator that takes only device tensors
// (NCCL) gets a copy on the GPU, and the result comes back (the copy to the host waits for
// the collective).
bool needs_device(const Communicator& comm) {
  if (comm.supports(DType::F64, Device::CPU)) return false;
  NSA_CHECK(comm.supports(DType::F64, Device::CUDA), comm.name(), ": the ", comm.backend(),
            " backend takes fp64 neither on the CPU nor on CUDA");
  return true;
}
Tensor to_comm(const Communicator& comm, const Tensor& host) {
  return needs_device(comm) ? host.to(Device::CUDA) : host;
}
Tensor to_host(const Tensor& t) { return t.is_cpu() ? t : t.to(Device::CPU); }

}  // namespace

double all_reduce_value(Communicator& comm, double value, ReduceOp op) {
  Tensor t = to_comm(comm, Tensor::from_vector({value}, {1}, DType::F64));
  comm.all_reduce(t, op);
  return to_host(t).data<double>()[0];
}

std::vector<double> all_gather_values(Communicator& comm, const std::vector<double>& values) {
  const std::int64_t n = std::int64_t(values.size());
  const Device device = needs_device(comm) ? Device::CUDA : Device::CPU;
  Tensor in = to_comm(comm, Tensor::from_vector(values, {n}, DType::F64));
  Tensor out = Tensor::empty({n * comm.size()}, DType::F64, device);
  comm.all_gather(in, out);
  const Tensor host = to_host(out);
  const double* p = host.data<double>();
  return std::vector<double>(p, p + host.numel());
}

std::string broadcast_string(Communicator& comm, const std::string& text, int root) {
  Tensor len = to_comm(comm, Tensor::from_vector({double(text.size())}, {1}, DType::F64));
  comm.broadcast(len, root);
  const std::int64_t n = std::int64_t(to_host(len).data<double>()[0]);
  Tensor chars = Tensor::zeros({n}, DType::F64);
  if (comm.rank() == root)
    for (std::int64_t i = 0; i < n; ++i) chars.data<double>()[i] = double(static_cast<unsigned char>(text[std::size_t(i)]));
  chars = to_comm(comm, chars);
  comm.broadcast(chars, root);
  const Tensor got = to_host(chars);
  std::string out(std::size_t(n), '\0');
  for (std::int64_t i = 0; i < n; ++i) out[std::size_t(i)] = char(static_cast<unsigned char>(got.data<double>()[i]));
  return out;
}

}  // namespace nsatron::parallel
