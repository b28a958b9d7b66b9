#include "parallel/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "core/util/error.h"

namespace nsatron::parallel {

namespace {

MPI_Datatype mpi_type(DType t) { return t == DType::F64 ? MPI_DOUBLE : MPI_FLOAT; }
MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }
constexpr std::int64_t kMaxCount = INT_MAX;

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, std::size_t(len));
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::world(const std::string& name) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  NSA_CHECK(initialized, "MpiCommunicator::world: MPI is not initialised");
  MPI_Comm dup = MPI_COMM_NULL;
  const int code = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  if (code != MPI_SUCCESS) throw std::runtime_error("MPI_Comm_dup of MPI_COMM_WORLD failed: " + error_text(code));
  return std::make_unique<MpiCommunicator>(dup, name);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key, const std::string& name) const {
  MPI_Comm out = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
  return std::make_unique<MpiCommunicator>(out, name);
}

void MpiCommunicator::check(int code, const char* what) const {
  if (code == MPI_SUCCESS) return;
  throw std::runtime_error(std::string(what) + " on the " + name_ + " group (rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_) + ") failed: " + error_text(code));
}

void MpiCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  char* p = static_cast<char*>(t.raw());
  const std::size_t esize = dtype_size(t.dtype());
  for (std::int64_t at = 0; at < t.numel(); at += kMaxCount) {
    const int n = int(std::min(kMaxCount, t.numel() - at));
    check(MPI_Allreduce(MPI_IN_PLACE, p + std::size_t(at) * esize, n, mpi_type(t.dtype()), mpi_op(op), comm_),
          "MPI_Allreduce");
  }
}

void MpiCommunicator::do_start_all_reduce(Tensor& t, ReduceOp op) {
  char* p = static_cast<char*>(t.raw());
  const std::size_t esize = dtype_size(t.dtype());
  for (std::int64_t at = 0; at < t.numel(); at += kMaxCount) {
    const int n = int(std::min(kMaxCount, t.numel() - at));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, p + std::size_t(at) * esize, n, mpi_type(t.dtype()), mpi_op(op), comm_,
                         &request),
          "MPI_Iallreduce");
    pending_.push_back(request);
  }
}

void MpiCommunicator::do_wait_all() {
  if (pending_.empty()) return;
  std::vector<MPI_Request> requests;
  requests.swap(pending_);
  check(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (of MPI_Iallreduce)");
}

template <typename Fn>
void MpiCommunicator::for_pieces(const Tensor& t, Fn fn) {
  char* p = static_cast<char*>(t.raw());
  const std::size_t esize = dtype_size(t.dtype());
  for (std::int64_t at = 0; at < t.numel(); at += kMaxCount)
    fn(p + std::size_t(at) * esize, int(std::min(kMaxCount, t.numel() - at)));
}

Communicator::Request MpiCommunicator::do_start_send(const Tensor& t, int peer) {
  PointToPoint started{{}, {}, t.dtype(), peer};
  for_pieces(t, [&](char* p, int n) {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Isend(p, n, mpi_type(t.dtype()), peer, 0, comm_, &request), "MPI_Isend");
    started.requests.push_back(request);
  });
  started_.emplace(next_request_, std::move(started));
  return next_request_++;
}

Communicator::Request MpiCommunicator::do_start_recv(Tensor& t, int peer) {
  PointToPoint started{{}, {}, t.dtype(), peer};
  for_pieces(t, [&](char* p, int n) {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Irecv(p, n, mpi_type(t.dtype()), peer, 0, comm_, &request), "MPI_Irecv");
    started.requests.push_back(request);
    started.counts.push_back(n);
  });
  started_.emplace(next_request_, std::move(started));
  return next_request_++;
}

void MpiCommunicator::do_wait(Request request) {
  const auto it = started_.find(request);
  NSA_CHECK(it != started_.end(), name_, ".wait: request ", request, " was not started or was waited for already");
  PointToPoint started = std::move(it->second);
  started_.erase(it);
  std::vector<MPI_Status> statuses(started.requests.size());
  check(MPI_Waitall(int(started.requests.size()), started.requests.data(), statuses.data()),
        "MPI_Waitall (of MPI_Isend / MPI_Irecv)");
  for (std::size_t i = 0; i < started.counts.size(); ++i)
    check_count(statuses[i], started.dtype, started.counts[i], started.peer, "start_recv");
}

void MpiCommunicator::do_all_gather(const Tensor& in, Tensor& out, bool in_place) {
  NSA_CHECK(in.numel() <= kMaxCount, name_, ".all_gather: blocks of more than INT_MAX elements");
  const int n = int(in.numel());
  check(MPI_Allgather(in_place ? MPI_IN_PLACE : in.raw(), n, mpi_type(in.dtype()), out.raw(), n, mpi_type(out.dtype()),
                      comm_),
        "MPI_Allgather");
}

void MpiCommunicator::do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  NSA_CHECK(out.numel() <= kMaxCount, name_, ".reduce_scatter: blocks of more than INT_MAX elements");
  check(MPI_Reduce_scatter_block(in.raw(), out.raw(), int(out.numel()), mpi_type(in.dtype()), mpi_op(op), comm_),
        "MPI_Reduce_scatter_block");
}

void MpiCommunicator::do_broadcast(Tensor& t, int root) {
  char* p = static_cast<char*>(t.raw());
  const std::size_t esize = dtype_size(t.dtype());
  for (std::int64_t at = 0; at < t.numel(); at += kMaxCount) {
    const int n = int(std::min(kMaxCount, t.numel() - at));
    check(MPI_Bcast(p + std::size_t(at) * esize, n, mpi_type(t.dtype()), root, comm_), "MPI_Bcast");
  }
}

void MpiCommunicator::do_send(const Tensor& t, int peer) {
  const char* p = static_cast<const char*>(t.raw());
  const std::size_t esize = dtype_size(t.dtype());
  for (std::int64_t at = 0; at < t.numel(); at += kMaxCount) {
    const int n = int(std::min(kMaxCount, t.numel() - at));
    check(MPI_Send(p + std::size_t(at) * esize, n, mpi_type(t.dtype()), peer, 0, comm_), "MPI_Send");
  }
}

void MpiCommunicator::do_recv(Tensor& t, int peer) {
  char* p = static_cast<char*>(t.raw());
  const std::size_t esize = dtype_size(t.dtype());
  for (std::int64_t at = 0; at < t.numel(); at += kMaxCount) {
    const int n = int(std::min(kMaxCount, t.numel() - at));
    MPI_Status status;
    check(MPI_Recv(p + std::size_t(at) * esize, n, mpi_type(t.dtype()), peer, 0, comm_, &status), "MPI_Recv");
    check_count(status, t.dtype(), n, peer, "recv");
  }
}

void MpiCommunicator::do_send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) {
  const char* s = static_cast<const char*>(send.raw());
  char* r = static_cast<char*>(recv.raw());
  const std::size_t s_esize = dtype_size(send.dtype()), r_esize = dtype_size(recv.dtype());
  // Piece k of each half is piece k of the matching send / recv (the same cuts at INT_MAX).
  for (std::int64_t at = 0; at < std::max(send.numel(), recv.numel()); at += kMaxCount) {
    const int ns = int(std::clamp(send.numel() - at, std::int64_t(0), kMaxCount));
    const int nr = int(std::clamp(recv.numel() - at, std::int64_t(0), kMaxCount));
    MPI_Status status;
    if (ns > 0 && nr > 0) {
      check(MPI_Sendrecv(s + std::size_t(at) * s_esize, ns, mpi_type(send.dtype()), send_peer, 0,
                         r + std::size_t(at) * r_esize, nr, mpi_type(recv.dtype()), recv_peer, 0, comm_, &status),
            "MPI_Sendrecv");
      check_count(status, recv.dtype(), nr, recv_peer, "send_recv");
    } else if (ns > 0) {
      check(MPI_Send(s + std::size_t(at) * s_esize, ns, mpi_type(send.dtype()), send_peer, 0, comm_), "MPI_Send");
    } else {
      check(MPI_Recv(r + std::size_t(at) * r_esize, nr, mpi_type(recv.dtype()), recv_peer, 0, comm_, &status),
            "MPI_Recv");
      check_count(status, recv.dtype(), nr, recv_peer, "send_recv");
    }
  }
}

void MpiCommunicator::check_count(const MPI_Status& status, DType dtype, int n, int peer, const char* op) const {
  int got = 0;
  MPI_Get_count(&status, mpi_type(dtype), &got);
  if (got != n)
    throw std::runtime_error(name_ + "." + op + " from rank " + std::to_string(peer) + ": expected " +
                             std::to_string(n) + " elements, got " + std::to_string(got));
}

void MpiCommunicator::do_barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

}  // namespace nsatron::parallel
