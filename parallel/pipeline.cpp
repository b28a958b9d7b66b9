#include "parallel/pipeline.h"

#include <algorithm>

#include "core/util/error.h"

namespace nsatron::parallel {

std::vector<PipelineStep> schedule_1f1b(int stage, int stages, std::int64_t micro_batches) {
  NSA_CHECK(stages >= 1 && stage >= 0 && stage < stages, "schedule_1f1b: stage ", stage, " of ", stages);
  NSA_CHECK(micro_batches >= 0, "schedule_1f1b: ", micro_batches, " micro-batches");
  const bool first = stage == 0, last = stage == stages - 1;
  const std::int64_t A = micro_batches;
  const std::int64_t W = std::min<std::int64_t>(stages - stage - 1, A);  // warmup forwards
  const std::int64_t R = A - W;                                          // steady iterations
  std::vector<PipelineStep> steps;
  using Op = PipelineOp;
  // Warmup: forwards only.
  for (std::int64_t f = 0; f < W; ++f) {
    if (!first) steps.push_back({Op::RecvForward, f, -1});
    steps.push_back({Op::Forward, f, -1});
    if (!last) steps.push_back({Op::SendForward, f, -1});
  }
  // Steady: one forward, one backward. The input of the first steady forward is received
  // alone; each later one comes with the previous backward's input gradient.
  if (R > 0 && !first) steps.push_back({Op::RecvForward, W, -1});
  for (std::int64_t i = 0; i < R; ++i) {
    const std::int64_t f = W + i, b = i;
    steps.push_back({Op::Forward, f, -1});
    if (!last) steps.push_back({Op::SendForwardRecvBackward, f, b});
    steps.push_back({Op::Backward, -1, b});
    if (!first) {
      if (i + 1 < R)
        steps.push_back({Op::SendBackwardRecvForward, f + 1, b});
      else
        steps.push_back({Op::SendBackward, -1, b});
    }
  }
  // Cooldown: the backwards of the warmup's micro-batches.
  for (std::int64_t b = R; b < A; ++b) {
    if (!last) steps.push_back({Op::RecvBackward, -1, b});
    steps.push_back({Op::Backward, -1, b});
    if (!first) steps.push_back({Op::SendBackward, -1, b});
  }
  return steps;
}

namespace {

// A stage's output or input gradient about to be sent: the shape and dtype every stage expects.
void check_message(const Tensor& t, const Shape& shape, DType dtype, Device device, const char* what, std::int64_t mb,
                   int stage) {
  NSA_CHECK(t.defined(), "pipeline stage ", stage, ": the ", what, " of micro-batch ", mb, " is undefined");
  NSA_CHECK(t.shape() == shape && t.dtype() == dtype && t.device() == device, "pipeline stage ", stage, ": the ",
            what, " of micro-batch ", mb, " is ", t.describe(), ", expected ", dtype_name(dtype), shape_str(shape),
            device == Device::CPU ? " cpu" : " cuda");
}

}  // namespace

void run_1f1b(Communicator& pp, std::int64_t micro_batches, const PipelineStage& stage) {
  NSA_CHECK(stage.forward && stage.backward, "run_1f1b: the stage needs forward and backward");
  const int s = pp.rank(), P = pp.size();
  const bool first = s == 0, last = s == P - 1;
  const Shape& shape = stage.activation_shape;
  const DType dtype = stage.dtype;
  const std::size_t A = std::size_t(std::max<std::int64_t>(micro_batches, 0));
  // Per micro-batch, the tensors between their transfer and their use (released after it, so
  // only the micro-batches in flight hold any).
  std::vector<Tensor> input(A), output(A), d_output(A), d_input(A);
  auto fresh = [&] { return Tensor::empty(shape, dtype, stage.device); };
  for (const PipelineStep& step : schedule_1f1b(s, P, micro_batches)) {
    const std::size_t f = std::size_t(step.fwd_mb), b = std::size_t(step.bwd_mb);
    switch (step.op) {
      case PipelineOp::RecvForward:
        input[f] = fresh();
        pp.recv(input[f], s - 1);
        break;
      case PipelineOp::Forward:
        output[f] = stage.forward(step.fwd_mb, first ? nullptr : &input[f]);
        input[f] = Tensor();
        if (last)
          output[f] = Tensor();
        else
          check_message(output[f], shape, dtype, stage.device, "output", step.fwd_mb, s);
        break;
      case PipelineOp::SendForward:
        pp.send(output[f], s + 1);
        output[f] = Tensor();
        break;
      case PipelineOp::SendForwardRecvBackward:
        d_output[b] = fresh();
        pp.send_recv(output[f], s + 1, d_output[b], s + 1);
        output[f] = Tensor();
        break;
      case PipelineOp::Backward:
        d_input[b] = stage.backward(step.bwd_mb, last ? nullptr : &d_output[b]);
        d_output[b] = Tensor();
        if (first)
          d_input[b] = Tensor();
        else
          check_message(d_input[b], shape, dtype, stage.device, "input gradient", step.bwd_mb, s);
        break;
      case PipelineOp::SendBackward:
        pp.send(d_input[b], s - 1);
        d_input[b] = Tensor();
        break;
      case PipelineOp::RecvBackward:
        d_output[b] = fresh();
        pp.recv(d_output[b], s + 1);
        break;
      case PipelineOp::SendBackwardRecvForward:
        input[f] = fresh();
        pp.send_recv(d_input[b], s - 1, input[f], s - 1);
        d_input[b] = Tensor();
        break;
    }
  }
}

void run_pipeline_forward(Communicator& pp, std::int64_t micro_batches,
                          const std::function<Tensor(std::int64_t mb, const Tensor* input)>& forward,
                          const Shape& activation_shape, DType dtype, Device device) {
  NSA_CHECK(forward, "run_pipeline_forward: no forward");
  NSA_CHECK(micro_batches >= 0, "run_pipeline_forward: ", micro_batches, " micro-batches");
  const int s = pp.rank(), P = pp.size();
  for (std::int64_t mb = 0; mb < micro_batches; ++mb) {
    Tensor input;
    if (s > 0) {
      input = Tensor::empty(activation_shape, dtype, device);
      pp.recv(input, s - 1);
    }
    Tensor output = forward(mb, s > 0 ? &input : nullptr);
    if (s < P - 1) {
      check_message(output, activation_shape, dtype, device, "output", mb, s);
      pp.send(output, s + 1);
    }
  }
}

}  // namespace nsatron::parallel
