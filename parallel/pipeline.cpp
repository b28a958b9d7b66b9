#include "parallel/pipeline.h"

#include <algorithm>
#include <exception>
#include <map>

#include "core/util/error.h"
#include "core/util/op_timer.h"

namespace nsatron::parallel {

namespace {

// A stage's output or input gradient about to be sent: the shape and dtype every stage expects.
void check_message(const Tensor& t, const Shape& shape, DType dtype, Device device, const char* what, std::int64_t mb,
                   int stage) {
  NSA_CHECK(t.defined(), "pipeline stage ", stage, ": the ", what, " of micro-batch ", mb, " is undefined");
  NSA_CHECK(t.shape() == shape && t.dtype() == dtype && t.device() == device, "pipeline stage ", stage, ": the ",
            what, " of micro-batch ", mb, " is ", t.describe(), ", expected ", dtype_name(dtype), shape_str(shape),
            device == Device::CPU ? " cpu" : " cuda");
}

// On an exception (the job then aborts) a transfer started ahead may still write into its
// buffer or read it: the buffers are kept for the rest of the process rather than handed back
// to the allocator while MPI holds them.
struct KeepBuffersOnThrow {
  std::vector<std::vector<Tensor>*> buffers;
  bool armed = false;
  int exceptions = std::uncaught_exceptions();
  ~KeepBuffersOnThrow() {
    if (!armed || std::uncaught_exceptions() == exceptions) return;
    static std::vector<Tensor> kept;
    for (std::vector<Tensor>* v : buffers)
      for (Tensor& t : *v)
        if (t.defined()) kept.push_back(std::move(t));
  }
};

// Executes this rank's steps, as the events of pipeline_events (receives posted before the
// computation ahead of them and waited for by the computation that reads them, sends
// completed at the next sending step). Per (chunk,
// micro-batch), the tensors between their transfer and their use (released after it, so only
// the micro-batches in flight hold any). Returns the receives posted ahead of a computation
// (0 when the backend does not post ahead: then each transfer is the blocking call it always
// was, at its step, and only the buffers' lifetimes follow the events).
std::int64_t execute(Communicator& pp, std::int64_t micro_batches, const PipelineStage& stage,
                     const std::vector<PipelineStep>& steps) {
  const int s = pp.rank(), P = pp.size(), V = stage.chunks;
  const int next = next_stage(s, P), prev = prev_stage(s, P);
  const Shape& shape = stage.activation_shape;
  const DType dtype = stage.dtype;
  const std::size_t A = std::size_t(std::max<std::int64_t>(micro_batches, 0));
  const bool ahead = pp.posts_ahead();
  auto first = [&](int chunk) { return s == 0 && chunk == 0; };
  auto last = [&](int chunk) { return s == P - 1 && chunk == V - 1; };
  std::vector<Tensor> input(A * std::size_t(V)), output(input.size()), d_output(input.size()), d_input(input.size());
  auto at = [&](int chunk, std::int64_t mb) { return std::size_t(chunk) * A + std::size_t(mb); };
  auto fresh = [&] { return Tensor::empty(shape, dtype, stage.device); };
  struct End {
    Tensor* t = nullptr;
    int peer = 0;
  };
  // The buffer a transfer step receives into, and the one it sends (t == nullptr: none).
  auto recv_end = [&](const PipelineStep& step) -> End {
    const std::size_t f = step.fwd_mb >= 0 ? at(step.fwd_chunk, step.fwd_mb) : 0;
    const std::size_t b = step.bwd_mb >= 0 ? at(step.bwd_chunk, step.bwd_mb) : 0;
    const std::size_t r = step.recv_mb >= 0 ? at(step.recv_chunk, step.recv_mb) : 0;
    switch (step.op) {
      case PipelineOp::RecvForward:
      case PipelineOp::SendBackwardRecvForward: return {&input[f], prev};
      case PipelineOp::SendForwardRecvForward: return {&input[r], prev};
      case PipelineOp::RecvBackward:
      case PipelineOp::SendForwardRecvBackward: return {&d_output[b], next};
      case PipelineOp::SendBackwardRecvBackward: return {&d_output[r], next};
      default: return {};
    }
  };
  auto send_end = [&](const PipelineStep& step) -> End {
    if (!has_send(step.op)) return {};
    const bool forward = step.op == PipelineOp::SendForward || step.op == PipelineOp::SendForwardRecvBackward ||
                         step.op == PipelineOp::SendForwardRecvForward;
    if (forward) return {&output[at(step.fwd_chunk, step.fwd_mb)], next};
    return {&d_input[at(step.bwd_chunk, step.bwd_mb)], prev};
  };
  // Posted ahead: the started receives, by buffer, each waited for by the computation that
  // reads it (not at its transfer step: a rank then waits for a neighbour's message only when it
  // needs it, not at every exchange of the lockstep schedule).
  std::map<const Tensor*, Communicator::Request> receives;
  // The time the compute stream spends in transfers and waits for them (log.profile_step's
  // "pp transfer": the communication not hidden, core/util/op_timer.h).
  constexpr const char* kTransfer = "pp transfer";
  auto wait_received = [&](const Tensor* t) {
    if (auto it = receives.find(t); it != receives.end()) {
      const op_timer::Scope timed(kTransfer, stage.device);
      pp.wait(it->second);
      receives.erase(it);
    }
  };
  std::vector<Communicator::Request> sends;  // started, not yet completed
  std::vector<Tensor> sent;                  // their buffers, held until then
  std::int64_t posted_ahead = 0;
  KeepBuffersOnThrow keep{{&input, &output, &d_output, &d_input, &sent}, ahead};
  for (const PipelineEvent& event : pipeline_events(steps, ahead)) {
    if (event.kind == PipelineEvent::Kind::WaitSends) {
      const op_timer::Scope timed(kTransfer, stage.device);
      for (Communicator::Request request : sends) pp.wait(request);
      sends.clear();
      sent.clear();
      continue;
    }
    const PipelineStep& step = steps[event.step];
    if (event.kind == PipelineEvent::Kind::PostRecv) {
      const End in = recv_end(step);
      *in.t = fresh();
      receives[in.t] = pp.start_recv(*in.t, in.peer);
      ++posted_ahead;
      continue;
    }
    if (!is_computation(step.op)) {
      const op_timer::Scope timed(kTransfer, stage.device);
      const End in = recv_end(step), out = send_end(step);
      if (in.t && !event.recv_posted) *in.t = fresh();
      if (ahead) {
        if (in.t && !event.recv_posted) receives[in.t] = pp.start_recv(*in.t, in.peer);
        if (out.t) sends.push_back(pp.start_send(*out.t, out.peer));
      } else if (in.t && out.t) {
        pp.send_recv(*out.t, out.peer, *in.t, in.peer);
      } else if (out.t) {
        pp.send(*out.t, out.peer);
      } else {
        pp.recv(*in.t, in.peer);
      }
      if (out.t) {
        if (!ahead) sends.push_back(Communicator::kDone);  // done: the WaitSends right after releases it
        sent.push_back(std::move(*out.t));
        *out.t = Tensor();
      }
      continue;
    }
    // A computation: it takes `in` (the previous chunk's output, or the next chunk's gradient
    // of this one's; none on the model's first chunk's forward and last chunk's backward),
    // releases it, and returns the message for the neighbour (dropped where none goes).
    const bool fwd = step.op == PipelineOp::Forward;
    const int chunk = fwd ? step.fwd_chunk : step.bwd_chunk;
    const std::int64_t mb = fwd ? step.fwd_mb : step.bwd_mb;
    const std::size_t i = at(chunk, mb);
    Tensor& in = fwd ? input[i] : d_output[i];
    Tensor& out = fwd ? output[i] : d_input[i];
    const Tensor* taken = (fwd ? first(chunk) : last(chunk)) ? nullptr : &in;
    if (taken) wait_received(taken);
    out = fwd ? stage.forward(chunk, mb, taken) : stage.backward(chunk, mb, taken);
    in = Tensor();
    if (fwd ? last(chunk) : first(chunk))
      out = Tensor();
    else
      check_message(out, shape, dtype, stage.device, fwd ? "output" : "input gradient", mb, s);
  }
  // (Every received buffer is read by a computation; none is left.)
  const op_timer::Scope timed(kTransfer, stage.device);
  for (const auto& [t, request] : receives) pp.wait(request);
  return posted_ahead;
}

}  // namespace

std::int64_t run_1f1b(Communicator& pp, std::int64_t micro_batches, const PipelineStage& stage) {
  NSA_CHECK(stage.forward && stage.backward, "run_1f1b: the stage needs forward and backward");
  return execute(pp, micro_batches, stage, schedule_pipeline(pp.rank(), pp.size(), micro_batches, stage.chunks));
}

void run_pipeline_forward(Communicator& pp, std::int64_t micro_batches,
                          const std::function<Tensor(int chunk, std::int64_t mb, const Tensor* input)>& forward,
                          const Shape& activation_shape, DType dtype, Device device, int chunks) {
  NSA_CHECK(forward, "run_pipeline_forward: no forward");
  PipelineStage stage;
  stage.forward = forward;
  stage.chunks = chunks;
  stage.activation_shape = activation_shape;
  stage.dtype = dtype;
  stage.device = device;
  execute(pp, micro_batches, stage, schedule_forward(pp.rank(), pp.size(), micro_batches, chunks));
}

}  // namespace nsatron::parallel
