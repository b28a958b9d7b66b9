#include "parallel/pipeline.h"

#include <algorithm>

#include "core/util/error.h"

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

// Executes this rank's steps. Per (chunk, micro-batch), the tensors between their transfer and
// their use (released after it, so only the micro-batches in flight hold any).
void execute(Communicator& pp, std::int64_t micro_batches, const PipelineStage& stage,
             const std::vector<PipelineStep>& steps) {
  const int s = pp.rank(), P = pp.size(), V = stage.chunks;
  const int next = next_stage(s, P), prev = prev_stage(s, P);
  const Shape& shape = stage.activation_shape;
  const DType dtype = stage.dtype;
  const std::size_t A = std::size_t(std::max<std::int64_t>(micro_batches, 0));
  auto first = [&](int chunk) { return s == 0 && chunk == 0; };
  auto last = [&](int chunk) { return s == P - 1 && chunk == V - 1; };
  std::vector<Tensor> input(A * std::size_t(V)), output(input.size()), d_output(input.size()), d_input(input.size());
  auto at = [&](int chunk, std::int64_t mb) { return std::size_t(chunk) * A + std::size_t(mb); };
  auto fresh = [&] { return Tensor::empty(shape, dtype, stage.device); };
  for (const PipelineStep& step : steps) {
    const std::size_t f = step.fwd_mb >= 0 ? at(step.fwd_chunk, step.fwd_mb) : 0;
    const std::size_t b = step.bwd_mb >= 0 ? at(step.bwd_chunk, step.bwd_mb) : 0;
    const std::size_t r = step.recv_mb >= 0 ? at(step.recv_chunk, step.recv_mb) : 0;
    switch (step.op) {
      case PipelineOp::RecvForward:
        input[f] = fresh();
        pp.recv(input[f], prev);
        break;
      case PipelineOp::Forward:
        output[f] = stage.forward(step.fwd_chunk, step.fwd_mb, first(step.fwd_chunk) ? nullptr : &input[f]);
        input[f] = Tensor();
        if (last(step.fwd_chunk))
          output[f] = Tensor();
        else
          check_message(output[f], shape, dtype, stage.device, "output", step.fwd_mb, s);
        break;
      case PipelineOp::SendForward:
        pp.send(output[f], next);
        output[f] = Tensor();
        break;
      case PipelineOp::SendForwardRecvBackward:
        d_output[b] = fresh();
        pp.send_recv(output[f], next, d_output[b], next);
        output[f] = Tensor();
        break;
      case PipelineOp::SendForwardRecvForward:
        input[r] = fresh();
        pp.send_recv(output[f], next, input[r], prev);
        output[f] = Tensor();
        break;
      case PipelineOp::Backward:
        d_input[b] = stage.backward(step.bwd_chunk, step.bwd_mb, last(step.bwd_chunk) ? nullptr : &d_output[b]);
        d_output[b] = Tensor();
        if (first(step.bwd_chunk))
          d_input[b] = Tensor();
        else
          check_message(d_input[b], shape, dtype, stage.device, "input gradient", step.bwd_mb, s);
        break;
      case PipelineOp::SendBackward:
        pp.send(d_input[b], prev);
        d_input[b] = Tensor();
        break;
      case PipelineOp::RecvBackward:
        d_output[b] = fresh();
        pp.recv(d_output[b], next);
        break;
      case PipelineOp::SendBackwardRecvForward:
        input[f] = fresh();
        pp.send_recv(d_input[b], prev, input[f], prev);
        d_input[b] = Tensor();
        break;
      case PipelineOp::SendBackwardRecvBackward:
        d_output[r] = fresh();
        pp.send_recv(d_input[b], prev, d_output[r], next);
        d_input[b] = Tensor();
        break;
    }
  }
}

}  // namespace

void run_1f1b(Communicator& pp, std::int64_t micro_batches, const PipelineStage& stage) {
  NSA_CHECK(stage.forward && stage.backward, "run_1f1b: the stage needs forward and backward");
  execute(pp, micro_batches, stage, schedule_pipeline(pp.rank(), pp.size(), micro_batches, stage.chunks));
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
