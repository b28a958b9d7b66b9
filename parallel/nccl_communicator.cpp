#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "core/comm/watchdog.h"
#include "core/util/error.h"
#include "core/util/op_timer.h"
#include "parallel/cuda_watch.h"

namespace nsatron::parallel {

namespace {

// The legacy default stream: what every kernel and copy of this project runs on (the
// project is not built with per-thread default streams, nor is NCCL, so 0 means the same
// stream to both).
const cudaStream_t kStream = nullptr;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
  }
  return ncclFloat32;
}
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

std::string where(const std::string& name, int rank, int size) {
  return "the " + name + " group (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
}

// Throws "NCCL <context> the <name> group (rank r of n): <call> failed: <CUDA's text>" unless
// e is cudaSuccess (the message is built only then).
void check_cuda(cudaError_t e, const char* context, const std::string& name, int rank, int size, const char* call) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("NCCL ") + context + " " + where(name, rank, size) + ": " + call +
                             " failed: " + cudaGetErrorString(e));
}

std::string nccl_error_text(ncclResult_t code, ncclComm_t comm) {
  std::string text = ncclGetErrorString(code);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  return text;
}

}  // namespace

std::shared_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& bootstrap, const std::string& name) {
  NSA_CHECK(bootstrap.supports(DType::F64, Device::CPU), "NcclCommunicator::create(", name, "): the bootstrap ",
            bootstrap.backend(), " communicator does not take fp64 on the CPU");
  const int rank = bootstrap.rank(), size = bootstrap.size();
  int device = 0;
  check_cuda(cudaGetDevice(&device), "setup of", name, rank, size, "cudaGetDevice");

  // Rank 0 makes the id; its 128 bytes travel as fp64 byte values (exact) over the bootstrap.
  // The status goes with them, so that a failure on rank 0 stops every rank here.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  ncclResult_t id_code = ncclSuccess;
  if (rank == 0) id_code = ncclGetUniqueId(&id);
  constexpr std::int64_t kIdBytes = sizeof(id.internal);
  Tensor bytes = Tensor::zeros({kIdBytes + 1}, DType::F64);
  double* b = bytes.data<double>();
  if (rank == 0) {
    for (std::int64_t i = 0; i < kIdBytes; ++i) b[i] = double(static_cast<unsigned char>(id.internal[i]));
    b[kIdBytes] = double(int(id_code));
  }
  bootstrap.broadcast(bytes, 0);
  if (ncclResult_t(int(b[kIdBytes])) != ncclSuccess)
    throw std::runtime_error("NCCL ncclGetUniqueId for " + where(name, rank, size) + " failed on its rank 0: " +
                             ncclGetErrorString(ncclResult_t(int(b[kIdBytes]))));
  for (std::int64_t i = 0; i < kIdBytes; ++i) id.internal[i] = char(static_cast<unsigned char>(b[i]));

  ncclComm_t comm = nullptr;
  {
    // Blocks until every rank of the group has joined: a peer that failed before joining
    // ends this rank after the watchdog's timeout (when armed) instead of never.
    const Watchdog::Scope watch(name, "ncclCommInitRank", rank, size);
    if (const ncclResult_t code = ncclCommInitRank(&comm, size, id, rank); code != ncclSuccess)
      throw std::runtime_error("NCCL ncclCommInitRank on " + where(name, rank, size) + " (CUDA device " +
                               std::to_string(device) + ") failed: " + nccl_error_text(code, nullptr));
  }
  return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(comm, name, rank, size, device));
}

NcclCommunicator::NcclCommunicator(ncclComm* comm, std::string name, int rank, int size, int device)
    : comm_(comm), name_(std::move(name)), rank_(rank), size_(size), device_(device) {
  barrier_flag_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
  auto cuda = [&](cudaError_t e, const char* call) { check_cuda(e, "setup of", name_, rank_, size_, call); };
  // The highest priority: the block scheduler places a started collective's blocks before the
  // compute kernels' waiting ones, so it runs beside them instead of after them.
  int least_priority = 0, greatest_priority = 0;
  cuda(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority), "cudaDeviceGetStreamPriorityRange");
  cudaStream_t stream = nullptr;
  cuda(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest_priority), "cudaStreamCreateWithPriority");
  overlap_stream_ = stream;
  cudaEvent_t a = nullptr, b = nullptr;
  cuda(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  cuda(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  started_ = a;
  finished_ = b;
  // The watchdog's view of this communicator: NCCL's asynchronous error, and the abort.
  ncclComm_t c = comm_;
  const std::string group = where(name_, rank_, size_);
  monitor_ = Watchdog::instance().add_monitor(
      [c, group]() -> std::string {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(c, &async) != ncclSuccess) return "";
        if (async == ncclSuccess || async == ncclInProgress) return "";
        return "NCCL reported an asynchronous error on " + group + ": " + nccl_error_text(async, c);
      },
      [c] { ncclCommAbort(c); });
}

NcclCommunicator::~NcclCommunicator() {
  Watchdog::instance().remove_monitor(monitor_);
  if (overlap_stream_ != nullptr) cudaStreamSynchronize(overlap_stream_);
  if (comm_ != nullptr) ncclCommDestroy(comm_);
  if (started_ != nullptr) cudaEventDestroy(started_);
  if (finished_ != nullptr) cudaEventDestroy(finished_);
  if (overlap_stream_ != nullptr) cudaStreamDestroy(overlap_stream_);
}

void NcclCommunicator::watch_enqueued(const char* op, cudaStream_t stream) {
  if (!Watchdog::instance().armed()) return;
  watch_stream_work(Watchdog::describe(name_, op, rank_, size_), stream, device_);
}

void NcclCommunicator::check(int code, const char* what) const {
  if (ncclResult_t(code) == ncclSuccess) return;
  throw std::runtime_error(std::string("NCCL ") + what + " on " + where(name_, rank_, size_) +
                           " failed: " + nccl_error_text(ncclResult_t(code), comm_));
}

void NcclCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  const op_timer::BusyScope busy(name_, kStream);  // (in line: waited for by the compute stream)
  check(ncclAllReduce(t.raw(), t.raw(), std::size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), comm_, kStream),
        "ncclAllReduce");
  watch_enqueued("all_reduce", kStream);
}

void NcclCommunicator::do_all_gather(const Tensor& in, Tensor& out, bool /*in_place*/) {
  const op_timer::BusyScope busy(name_, kStream);
  // In place (in is out's block of this rank) is NCCL's own in-place case: the same call.
  check(ncclAllGather(in.raw(), out.raw(), std::size_t(in.numel()), nccl_type(in.dtype()), comm_, kStream),
        "ncclAllGather");
  watch_enqueued("all_gather", kStream);
}

void NcclCommunicator::do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  const op_timer::BusyScope busy(name_, kStream);
  check(ncclReduceScatter(in.raw(), out.raw(), std::size_t(out.numel()), nccl_type(in.dtype()), nccl_op(op), comm_,
                          kStream),
        "ncclReduceScatter");
  watch_enqueued("reduce_scatter", kStream);
}

void NcclCommunicator::do_broadcast(Tensor& t, int root) {
  const op_timer::BusyScope busy(name_, kStream);
  check(ncclBroadcast(t.raw(), t.raw(), std::size_t(t.numel()), nccl_type(t.dtype()), root, comm_, kStream),
        "ncclBroadcast");
  watch_enqueued("broadcast", kStream);
}

void NcclCommunicator::do_send(const Tensor& t, int peer) {
  const op_timer::BusyScope busy(name_, kStream);
  check(ncclSend(t.raw(), std::size_t(t.numel()), nccl_type(t.dtype()), peer, comm_, kStream), "ncclSend");
  watch_enqueued("send", kStream);
}

void NcclCommunicator::do_recv(Tensor& t, int peer) {
  const op_timer::BusyScope busy(name_, kStream);
  check(ncclRecv(t.raw(), std::size_t(t.numel()), nccl_type(t.dtype()), peer, comm_, kStream), "ncclRecv");
  watch_enqueued("recv", kStream);
}

void NcclCommunicator::do_send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) {
  const op_timer::BusyScope busy(name_, kStream);
  if (send_peer == rank_) {  // with itself (then recv_peer is too): a copy on the stream
    check_cuda(cudaMemcpyAsync(recv.raw(), send.raw(), send.nbytes(), cudaMemcpyDeviceToDevice, kStream),
               "send_recv to itself on", name_, rank_, size_, "cudaMemcpyAsync");
    return;
  }
  check(ncclGroupStart(), "ncclGroupStart");
  // Within the group NCCL progresses both halves together; an empty half is no message.
  ncclResult_t s = ncclSuccess, r = ncclSuccess;
  if (send.numel() > 0)
    s = ncclSend(send.raw(), std::size_t(send.numel()), nccl_type(send.dtype()), send_peer, comm_, kStream);
  if (recv.numel() > 0)
    r = ncclRecv(recv.raw(), std::size_t(recv.numel()), nccl_type(recv.dtype()), recv_peer, comm_, kStream);
  const ncclResult_t end = ncclGroupEnd();  // always closed, even after a failed half
  check(s, "ncclSend (in send_recv)");
  check(r, "ncclRecv (in send_recv)");
  check(end, "ncclGroupEnd (send_recv)");
  watch_enqueued("send_recv", kStream);
}

void NcclCommunicator::do_start_all_reduce(Tensor& t, ReduceOp op) {
  auto cuda = [&](cudaError_t e, const char* call) { check_cuda(e, "start_all_reduce on", name_, rank_, size_, call); };
  // After the kernels enqueued so far on the compute stream (the gradients' last writers).
  cuda(cudaEventRecord(started_, kStream), "cudaEventRecord");
  cuda(cudaStreamWaitEvent(overlap_stream_, started_, 0), "cudaStreamWaitEvent");
  const op_timer::BusyScope busy(name_, overlap_stream_);
  check(ncclAllReduce(t.raw(), t.raw(), std::size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), comm_,
                      overlap_stream_),
        "ncclAllReduce (started)");
  watch_enqueued("started all_reduce", overlap_stream_);
  pending_ = true;
}

void NcclCommunicator::do_wait_all() {
  if (!pending_) return;
  pending_ = false;
  check_cuda(cudaEventRecord(finished_, overlap_stream_), "wait_all on", name_, rank_, size_, "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(kStream, finished_, 0), "wait_all on", name_, rank_, size_, "cudaStreamWaitEvent");
}

void NcclCommunicator::do_barrier() {
  check(ncclAllReduce(barrier_flag_.raw(), barrier_flag_.raw(), 1, ncclFloat32, ncclSum, comm_, kStream),
        "ncclAllReduce (barrier)");
  check_cuda(cudaStreamSynchronize(kStream), "barrier on", name_, rank_, size_, "cudaStreamSynchronize");
  ncclResult_t async = ncclSuccess;
  check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
  check(async, "barrier (an earlier operation)");
}

}  // namespace nsatron::parallel
