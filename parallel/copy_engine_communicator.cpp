#include "parallel/copy_engine_communicator.h"

#include <cuda.h>  // the driver's types and flags only: its functions come from the runtime
#include <cuda_runtime.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>

#include "core/comm/watchdog.h"
#include "core/ops/elementwise.h"
#include "core/util/error.h"
#include "core/util/op_timer.h"
#include "parallel/cuda_watch.h"
#include "parallel/pipeline.h"

namespace nsatron::parallel {

namespace {

const cudaStream_t kStream = nullptr;  // the compute stream (legacy default; nccl_communicator.cpp)

// cuStreamWaitValue32 and cuStreamWriteValue32 (their CUDA 12 forms), found through the runtime
// so that the driver library is not linked (its stub breaks start-up without a driver).
using StreamValueOp = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
struct StreamValueOps {
  StreamValueOp wait = nullptr, write = nullptr;
  std::string error;  // why they are missing
};
const StreamValueOps& stream_value_ops() {
  static const StreamValueOps ops = [] {
    StreamValueOps o;
    auto find = [&](const char* symbol) -> StreamValueOp {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      if (cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess || fn == nullptr) {
        cudaGetLastError();
        if (o.error.empty()) o.error = std::string("the CUDA driver has no ") + symbol;
        return nullptr;
      }
      return reinterpret_cast<StreamValueOp>(fn);
    };
    o.wait = find("cuStreamWaitValue32");
    o.write = find("cuStreamWriteValue32");
    return o;
  }();
  return ops;
}

std::string where(const Communicator& c) {
  return "the " + c.name() + " group (rank " + std::to_string(c.rank()) + " of " + std::to_string(c.size()) + ")";
}

// Throws for a failed CUDA runtime or driver call: "copy-engine <what> on the pp group (rank
// r of n)<dir><peer>: <call> failed: <reason>" (no peer where peer < 0), the text built only then.
struct CallCheck {
  const Communicator& group;
  const char* what;       // "send", "receive", ...
  const char* dir = "";   // " to rank ", " from rank ", ...
  int peer = -1;
  [[noreturn]] void fail(const char* call, const std::string& reason) const {
    throw std::runtime_error(std::string("copy-engine ") + what + " on " + where(group) +
                             (peer >= 0 ? std::string(dir) + std::to_string(peer) : std::string()) + ": " + call +
                             " failed" + reason);
  }
  void operator()(cudaError_t e, const char* call) const {
    if (e != cudaSuccess) fail(call, std::string(": ") + cudaGetErrorString(e));
  }
  void operator()(CUresult e, const char* call) const {
    if (e != CUDA_SUCCESS) fail(call, " (CUresult " + std::to_string(int(e)) + ")");
  }
};

// This host's name as kHostBytes byte values (zero-padded), to tell ranks of one host apart
// from others before any IPC handle is opened (a handle means nothing on another host).
constexpr std::size_t kHostBytes = 64;
std::vector<double> host_name_bytes() {
  char name[kHostBytes + 1] = {};
  if (gethostname(name, kHostBytes) != 0) name[0] = '\0';
  std::vector<double> v(kHostBytes, 0.0);
  for (std::size_t i = 0; i < kHostBytes && name[i] != '\0'; ++i) v[i] = double(static_cast<unsigned char>(name[i]));
  return v;
}

// Offsets within a link's allocation: the slots, then full[S] and empty[S] (uint32 each).
struct LinkLayout {
  std::size_t slot_bytes = 0, full = 0, empty = 0, total = 0;
  LinkLayout(std::size_t slot, int slots) {
    slot_bytes = std::size_t(copy_engine_slot_pitch(std::int64_t(slot)));
    full = slot_bytes * std::size_t(slots);
    empty = full + std::size_t(slots) * 4;
    total = std::size_t(copy_engine_link_bytes(std::int64_t(slot), slots));
  }
};

}  // namespace

struct CopyEngineCommunicator::Link {
  int peer = 0;
  LinkLayout layout;
  char* mine = nullptr;    // this rank's allocation: p writes its messages and flags here
  char* theirs = nullptr;  // p's allocation, opened through CUDA IPC
  cudaStream_t copies = nullptr;  // this rank's sends to p, in order (non-blocking stream)
  cudaEvent_t copied = nullptr;   // sums: after this rank's latest copy to p (its tensor read)
  std::uint64_t sent = 0, received = 0;  // messages started to / from p
  Link(int p, const LinkLayout& l) : peer(p), layout(l) {}
  CUdeviceptr flag(char* base, std::size_t table, int s) const {
    return reinterpret_cast<CUdeviceptr>(base + table + std::size_t(s) * 4);
  }
};

struct CopyEngineCommunicator::Pending {
  Request request = kDone;
  bool send = false;
  Link* link = nullptr;
  Tensor tensor;             // receive: where the message goes
  std::uint64_t index = 0;   // receive: the message's number on its link
  cudaEvent_t done = nullptr;  // send: after its copy
};

struct CopyEngineCommunicator::StartedSum {
  struct Slot {
    Link* link;
    int slot;
    std::uint32_t use;  // the slot's use by this message (its full flag reads use + 1)
  };
  Tensor tensor;                    // the caller's, kept allocated until wait_all
  std::vector<const void*> inputs;  // by rank: the tensor (this rank), the peers' slots
  std::vector<Slot> received;       // the peers' messages
};

std::shared_ptr<CopyEngineCommunicator> CopyEngineCommunicator::create(Communicator& host,
                                                                       std::shared_ptr<Communicator> inner,
                                                                       std::size_t slot_bytes, int slots,
                                                                       std::string* why, Role role) {
  NSA_CHECK(inner && inner->size() == host.size() && inner->rank() == host.rank(),
            "CopyEngineCommunicator::create: the device group differs from the host group");
  NSA_CHECK(slots >= 1 && slot_bytes > 0, "CopyEngineCommunicator::create: ", slots, " slots of ", slot_bytes,
            " bytes");
  // (do_wait tells its own requests from the inner communicator's by their numbers: the inner
  // one must complete its transfers at the call, as NCCL's do.)
  NSA_CHECK(!inner->posts_ahead(), "CopyEngineCommunicator::create: the inner ", inner->backend(),
            " communicator posts its transfers ahead");
  const int rank = host.rank(), size = host.size();
  int device = 0;
  const CallCheck cuda{host, "transfers"};
  cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::shared_ptr<CopyEngineCommunicator> c(
      new CopyEngineCommunicator(std::move(inner), slot_bytes, slots, device, role));
  const LinkLayout layout(slot_bytes, slots);
  std::vector<int> peers = {prev_stage(rank, size), next_stage(rank, size)};
  if (role == Role::TensorSums) {
    peers.clear();
    for (int p = 0; p < size; ++p) peers.push_back(p);
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  peers.erase(std::remove(peers.begin(), peers.end(), rank), peers.end());

  // This rank's allocation per neighbour, flags zeroed before any peer can write them (the
  // gathers below come after the memset has finished), and their IPC handles, gathered by all.
  std::string failure;
  const StreamValueOps& ops = stream_value_ops();
  if (!ops.error.empty()) failure = ops.error;
  if (role == Role::TensorSums && size > cuda::kMaxSumInputs)
    failure = "the copy-engine sums add at most " + std::to_string(cuda::kMaxSumInputs) + " ranks' parts, not " +
              std::to_string(size);
  const std::vector<double> hosts = all_gather_values(host, host_name_bytes());
  for (int p : peers)
    if (failure.empty() && !std::equal(hosts.begin() + std::ptrdiff_t(std::size_t(p) * kHostBytes),
                                       hosts.begin() + std::ptrdiff_t(std::size_t(p + 1) * kHostBytes),
                                       hosts.begin() + std::ptrdiff_t(std::size_t(rank) * kHostBytes)))
      failure = "rank " + std::to_string(rank) + " and its peer rank " + std::to_string(p) + " run on different hosts";
  std::vector<double> mine(std::size_t(size) * sizeof(cudaIpcMemHandle_t), 0.0);
  // A CUDA failure here (the slots are large: out of memory) goes into the verdict like the
  // others, so that no rank leaves the group's gathers below alone.
  auto soft = [&](cudaError_t e, const char* call) {
    if (e == cudaSuccess) return true;
    cudaGetLastError();
    if (failure.empty()) failure = std::string(call) + ": " + cudaGetErrorString(e);
    return false;
  };
  for (int p : peers) {
    c->links_.push_back(std::make_unique<Link>(p, layout));
    Link* link = c->links_.back().get();
    if (!failure.empty()) continue;
    cudaIpcMemHandle_t handle;
    if (soft(cudaMalloc(&link->mine, layout.total), "cudaMalloc (receive slots)") &&
        soft(cudaMemset(link->mine + layout.full, 0, layout.total - layout.full), "cudaMemset (flags)") &&
        soft(cudaStreamCreateWithFlags(&link->copies, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") &&
        (role != Role::TensorSums ||
         soft(cudaEventCreateWithFlags(&link->copied, cudaEventDisableTiming), "cudaEventCreateWithFlags")) &&
        soft(cudaIpcGetMemHandle(&handle, link->mine), "cudaIpcGetMemHandle")) {
      const auto* b = reinterpret_cast<const unsigned char*>(&handle);
      for (std::size_t i = 0; i < sizeof(handle); ++i) mine[std::size_t(p) * sizeof(handle) + i] = double(b[i]);
    }
  }
  if (role == Role::TensorSums && failure.empty()) {  // the sums' stream, its event, its grid
    int sms = 0;
    if (soft(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute") &&
        soft(cudaStreamCreateWithFlags(&c->sums_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") &&
        soft(cudaEventCreateWithFlags(&c->summed_, cudaEventDisableTiming), "cudaEventCreateWithFlags"))
      c->sum_blocks_ = kSumBlocksPerSm * std::max(sms, 1);
  }
  soft(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // all[r][p]: the handle rank r made for its neighbour p.
  const std::vector<double> all = all_gather_values(host, mine);
  for (auto& link : c->links_) {
    if (!failure.empty()) break;
    cudaIpcMemHandle_t handle;
    auto* b = reinterpret_cast<unsigned char*>(&handle);
    const std::size_t at = (std::size_t(link->peer) * std::size_t(size) + std::size_t(rank)) * sizeof(handle);
    for (std::size_t i = 0; i < sizeof(handle); ++i) b[i] = static_cast<unsigned char>(all[at + i]);
    void* theirs = nullptr;
    if (const cudaError_t e = cudaIpcOpenMemHandle(&theirs, handle, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      cudaGetLastError();
      failure = "rank " + std::to_string(rank) + " cannot open the memory of rank " + std::to_string(link->peer) +
                " (cudaIpcOpenMemHandle: " + cudaGetErrorString(e) +
                "; copy-engine transfers need both ranks on one host, their GPUs visible to each other)";
    } else {
      link->theirs = static_cast<char*>(theirs);
    }
  }
  // Every rank's verdict, so that all of them use the copy engines or none does.
  const std::vector<double> ok = all_gather_values(host, {failure.empty() ? 1.0 : 0.0});
  for (int r = 0; r < size; ++r)
    if (ok[std::size_t(r)] == 0.0) {
      if (why != nullptr)
        *why = r == rank ? failure : "rank " + std::to_string(r) + " cannot reach its peers' memory";
      for (auto& link : c->links_)
        if (link->theirs != nullptr) {
          cudaIpcCloseMemHandle(link->theirs);
          link->theirs = nullptr;
        }
      host.barrier();  // no rank frees its slots while a peer may still hold them open
      return nullptr;
    }
  c->established_ = true;
  return c;
}

CopyEngineCommunicator::CopyEngineCommunicator(std::shared_ptr<Communicator> inner, std::size_t slot_bytes, int slots,
                                               int device, Role role)
    : inner_(std::move(inner)), slot_bytes_(slot_bytes), slots_(slots), device_(device), role_(role) {
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
    throw std::runtime_error("copy-engine transfers on " + where(*inner_) + ": cudaEventCreateWithFlags failed");
  ready_ = e;
}

CopyEngineCommunicator::~CopyEngineCommunicator() {
  // Unwinding after an error on this rank alone (the job is about to abort): no barrier its
  // peers would never join; the slots are left to the process's end (a peer may still write
  // them).
  // The same with sums started and not waited for (a caught error between a start and its
  // wait_all): their stream may wait for a peer's message forever.
  if (std::uncaught_exceptions() > 0 || !summing_.empty()) return;
  for (auto& link : links_)
    if (link->copies != nullptr) cudaStreamSynchronize(link->copies);
  if (sums_ != nullptr) cudaStreamSynchronize(sums_);
  for (auto& p : pending_)
    if (p->done != nullptr) cudaEventDestroy(p->done);
  // A peer may still write our slots and flags until it is done: the group synchronises on the
  // inner communicator before the memory goes.
  if (established_ && !links_.empty()) {
    try {
      inner_->barrier();
    } catch (...) {
    }
  }
  for (auto& link : links_) {
    if (link->theirs != nullptr) cudaIpcCloseMemHandle(link->theirs);
    if (link->copies != nullptr) cudaStreamDestroy(link->copies);
    if (link->copied != nullptr) cudaEventDestroy(link->copied);
    if (link->mine != nullptr) cudaFree(link->mine);
  }
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (summed_ != nullptr) cudaEventDestroy(summed_);
  if (sums_ != nullptr) cudaStreamDestroy(sums_);
}

CopyEngineCommunicator::Link* CopyEngineCommunicator::link_to(int peer) {
  if (role_ == Role::TensorSums) return nullptr;  // its links carry the sums only
  for (auto& link : links_)
    if (link->peer == peer) return link.get();
  return nullptr;
}

void CopyEngineCommunicator::check_fits(const Tensor& t, const char* op) const {
  NSA_CHECK(t.nbytes() <= slot_bytes_, name(), ".", op, ": a message of ", t.nbytes(),
            " bytes, but the copy-engine slots hold ", slot_bytes_);
}

// Collectives (but the sums of Role::TensorSums), and transfers to ranks that are not
// neighbours: the inner communicator.
void CopyEngineCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  if (!sums_here(t, op)) return inner_->all_reduce(t, op);
  start_sum(t, 0);  // waited for at once: the add's whole grid
  do_wait_all();
}
void CopyEngineCommunicator::do_all_gather(const Tensor& in, Tensor& out, bool) { inner_->all_gather(in, out); }
void CopyEngineCommunicator::do_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) {
  inner_->reduce_scatter(in, out, op);
}
void CopyEngineCommunicator::do_broadcast(Tensor& t, int root) { inner_->broadcast(t, root); }
void CopyEngineCommunicator::do_barrier() { inner_->barrier(); }
void CopyEngineCommunicator::do_start_all_reduce(Tensor& t, ReduceOp op) {
  if (!sums_here(t, op)) return inner_->start_all_reduce(t, op);
  start_sum(t, sum_blocks_);
}
void CopyEngineCommunicator::do_wait_all() {
  inner_->wait_all();
  if (summing_.empty()) return;
  // The sums' stream runs them in order: its last add's event covers every one started.
  const CallCheck check{*this, "sum"};
  check(cudaStreamWaitEvent(kStream, summed_, 0), "cudaStreamWaitEvent");
  summing_.clear();  // (the tensors' later uses are ordered after the adds on the compute stream)
}

bool CopyEngineCommunicator::sums_here(const Tensor& t, ReduceOp op) const {
  return role_ == Role::TensorSums && op == ReduceOp::Sum && t.device() == Device::CUDA &&
         (t.dtype() == DType::F32 || t.dtype() == DType::BF16) && t.nbytes() <= slot_bytes_;
}

// Every other rank's slot gets this rank's tensor (each link's copy stream, after the compute
// stream's work so far); then on sums_ the add (add_sum), after this rank's copies (it
// overwrites the tensor they read). (The adds in line on the compute stream at wait_all were
// slower: 868 against 853 ms a step, docs/performance.md.)
void CopyEngineCommunicator::start_sum(Tensor& t, int max_blocks) {
  const CallCheck check{*this, "sum"};
  check(cudaEventRecord(ready_, kStream), "cudaEventRecord");
  check(cudaStreamWaitEvent(sums_, ready_, 0), "cudaStreamWaitEvent");
  StartedSum sum;
  sum.tensor = t;
  sum.inputs.assign(std::size_t(size()), t.raw());
  for (auto& owned : links_) {
    Link* link = owned.get();
    copy_to_peer(link, t, "sum");
    check(cudaEventRecord(link->copied, link->copies), "cudaEventRecord");
    check(cudaStreamWaitEvent(sums_, link->copied, 0), "cudaStreamWaitEvent");

    const std::uint64_t r = link->received++;
    const int rs = int(r % std::uint64_t(slots_));
    sum.inputs[std::size_t(link->peer)] = link->mine + std::size_t(rs) * link->layout.slot_bytes;
    sum.received.push_back({link, rs, static_cast<std::uint32_t>(r / std::uint64_t(slots_))});
  }
  add_sum(sum, max_blocks);
  check(cudaEventRecord(summed_, sums_), "cudaEventRecord");
  summing_.push_back(std::move(sum));
}

// On sums_: the wait for every peer's message, the add in rank order (in at most max_blocks
// blocks, 0: as many as the size asks), the slots handed back to their senders.
void CopyEngineCommunicator::add_sum(StartedSum& sum, int max_blocks) {
  const StreamValueOps& ops = stream_value_ops();
  const CallCheck check{*this, "sum"};
  CUstream on = reinterpret_cast<CUstream>(sums_);
  for (const StartedSum::Slot& r : sum.received)
    check(ops.wait(on, r.link->flag(r.link->mine, r.link->layout.full, r.slot), r.use + 1, CU_STREAM_WAIT_VALUE_GEQ),
          "cuStreamWaitValue32 (full)");
  {
    const op_timer::BusyScope busy(name(), sums_);
    cuda::sum_in_order(sum.tensor.dtype(), sum.tensor.raw(), sum.inputs, sum.tensor.numel(), sums_, max_blocks);
  }
  for (const StartedSum::Slot& r : sum.received)
    check(ops.write(on, r.link->flag(r.link->theirs, r.link->layout.empty, r.slot), r.use + 1,
                    CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue32 (empty)");
  if (Watchdog::instance().armed())
    watch_stream_work(Watchdog::describe(name(), "copy-engine sum", rank(), size()), sums_, device_);
}

void CopyEngineCommunicator::do_send(const Tensor& t, int peer) { do_wait(do_start_send(t, peer)); }
void CopyEngineCommunicator::do_recv(Tensor& t, int peer) { do_wait(do_start_recv(t, peer)); }
void CopyEngineCommunicator::do_send_recv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) {
  if (send_peer == rank()) {  // with itself: a copy on the compute stream
    if (const cudaError_t e = cudaMemcpyAsync(recv.raw(), send.raw(), send.nbytes(), cudaMemcpyDeviceToDevice, kStream);
        e != cudaSuccess)
      throw std::runtime_error(name() + ".send_recv to itself: cudaMemcpyAsync failed: " + cudaGetErrorString(e));
    return;
  }
  Link* to = link_to(send_peer);
  Link* from = link_to(recv_peer);
  if (to == nullptr && from == nullptr) {
    inner_->send_recv(send, send_peer, recv, recv_peer);
    return;
  }
  // The copy-engine halves started before anything waits: neither rank of an exchange waits
  // for the other before its own message is on its way.
  const Request s = send.numel() > 0 && to ? do_start_send(send, send_peer) : kDone;
  const Request r = recv.numel() > 0 && from ? do_start_recv(recv, recv_peer) : kDone;
  if (send.numel() > 0 && !to) inner_->send(send, send_peer);
  if (recv.numel() > 0 && !from) inner_->recv(recv, recv_peer);
  if (r != kDone) do_wait(r);
  if (s != kDone) do_wait(s);
}

CopyEngineCommunicator::Request CopyEngineCommunicator::do_start_send(const Tensor& t, int peer) {
  Link* link = link_to(peer);
  if (link == nullptr) return inner_->start_send(t, peer);  // (a request of inner_: see do_wait)
  check_fits(t, "start_send");
  const CallCheck check{*this, "send", " to rank ", peer};
  check(cudaEventRecord(ready_, kStream), "cudaEventRecord");  // after the kernels that wrote t
  copy_to_peer(link, t, "send");
  auto p = std::make_unique<Pending>();
  p->request = next_request_++;
  p->send = true;
  p->link = link;
  check(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaEventRecord(p->done, link->copies), "cudaEventRecord");
  if (Watchdog::instance().armed())
    watch_stream_work(Watchdog::describe(name(), "copy-engine send", rank(), size()), link->copies, device_);
  pending_.push_back(std::move(p));
  return pending_.back()->request;
}

// On the link's copy stream, after ready_ (the caller records it on the compute stream): once
// the peer has consumed the slot's previous message, t's bytes into the peer's slot, then the
// flag that tells it they are there.
void CopyEngineCommunicator::copy_to_peer(Link* link, const Tensor& t, const char* what) {
  const CallCheck check{*this, what, " to rank ", link->peer};
  const StreamValueOps& ops = stream_value_ops();
  const std::uint64_t k = link->sent++;
  const int s = int(k % std::uint64_t(slots_));
  const auto use = static_cast<cuuint32_t>(k / std::uint64_t(slots_));
  CUstream copies = reinterpret_cast<CUstream>(link->copies);
  check(cudaStreamWaitEvent(link->copies, ready_, 0), "cudaStreamWaitEvent");
  check(ops.wait(copies, link->flag(link->mine, link->layout.empty, s), use, CU_STREAM_WAIT_VALUE_GEQ),
        "cuStreamWaitValue32 (a free slot)");
  const op_timer::BusyScope busy(name(), link->copies);  // (the wait for a free slot not counted)
  check(cudaMemcpyAsync(link->theirs + std::size_t(s) * link->layout.slot_bytes, t.raw(), t.nbytes(),
                        cudaMemcpyDefault, link->copies),
        "cudaMemcpyAsync (to the peer's slot)");
  check(ops.write(copies, link->flag(link->theirs, link->layout.full, s), use + 1, CU_STREAM_WRITE_VALUE_DEFAULT),
        "cuStreamWriteValue32 (full)");
}

CopyEngineCommunicator::Request CopyEngineCommunicator::do_start_recv(Tensor& t, int peer) {
  Link* link = link_to(peer);
  if (link == nullptr) return inner_->start_recv(t, peer);
  check_fits(t, "start_recv");
  // Nothing to do on the GPU yet: the message is waited for and copied out at wait().
  auto p = std::make_unique<Pending>();
  p->request = next_request_++;
  p->link = link;
  p->tensor = t;  // the same storage as the caller's
  p->index = link->received++;
  pending_.push_back(std::move(p));
  return pending_.back()->request;
}

void CopyEngineCommunicator::do_wait(Request request) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p->request == request; });
  if (it == pending_.end()) {  // not ours: a transfer of the inner communicator (not a neighbour)
    inner_->wait(request);
    return;
  }
  std::unique_ptr<Pending> p = std::move(*it);
  pending_.erase(it);
  Link* link = p->link;
  if (p->send) {  // the compute stream goes on once the copy has read the tensor
    const CallCheck check{*this, "send", " to rank ", link->peer};
    check(cudaStreamWaitEvent(kStream, p->done, 0), "cudaStreamWaitEvent");
    check(cudaEventDestroy(p->done), "cudaEventDestroy");
    return;
  }
  const CallCheck check{*this, "receive", " from rank ", link->peer};
  const StreamValueOps& ops = stream_value_ops();
  const int s = int(p->index % std::uint64_t(slots_));
  const auto use = static_cast<cuuint32_t>(p->index / std::uint64_t(slots_));
  CUstream compute = reinterpret_cast<CUstream>(kStream);
  // The message in slot s, out into the tensor, then the slot back to the sender.
  check(ops.wait(compute, link->flag(link->mine, link->layout.full, s), use + 1, CU_STREAM_WAIT_VALUE_GEQ),
        "cuStreamWaitValue32 (full)");
  const op_timer::BusyScope busy(name(), kStream);  // (in line, after the wait for the message)
  check(cudaMemcpyAsync(p->tensor.raw(), link->mine + std::size_t(s) * link->layout.slot_bytes, p->tensor.nbytes(),
                        cudaMemcpyDeviceToDevice, kStream),
        "cudaMemcpyAsync (from the slot)");
  check(ops.write(compute, link->flag(link->theirs, link->layout.empty, s), use + 1, CU_STREAM_WRITE_VALUE_DEFAULT),
        "cuStreamWriteValue32 (empty)");
  if (Watchdog::instance().armed())
    watch_stream_work(Watchdog::describe(name(), "copy-engine receive", rank(), size()), kStream, device_);
}

}  // namespace nsatron::parallel
