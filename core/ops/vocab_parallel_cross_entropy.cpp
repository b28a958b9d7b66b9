#include "core/ops/vocab_parallel_cross_entropy.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "core/ops/cross_entropy.h"

namespace nsatron::parallel {

namespace {
void check_loss(const Tensor& logits, const Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1 || loss.dtype() != DType::F64 || loss.device() != logits.device())
    throw std::invalid_argument("vocab_parallel_cross_entropy: loss must be one fp64 element on the device of the "
                                "logits, got " + (loss.defined() ? loss.describe() : std::string("undefined")));
}
}  // namespace

VocabParallelCEChunk vocab_parallel_ce_start(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                             const VocabParallelCE& opt) {
  const std::string op = "vocab_parallel_cross_entropy";
  if (!logits.defined() || logits.ndim() != 2 || std::int64_t(targets.size()) != logits.dim(0))
    throw std::invalid_argument(op + ": logits must be an [N, V_r] tensor with N targets, got " +
                                (logits.defined() ? logits.describe() : std::string("undefined")) + " and " +
                                std::to_string(targets.size()) + " targets");
  const Device dev = logits.device();
  if (dev == Device::CUDA ? !(logits.dtype() == DType::F32 || logits.dtype() == DType::BF16)
                          : !(logits.dtype() == DType::F32 || logits.dtype() == DType::F64))
    throw std::invalid_argument(op + ": logits fp32 or fp64 on the CPU, fp32 or bf16 on CUDA, got " +
                                logits.describe());
  if (!(opt.denominator >= 0))
    throw std::invalid_argument(op + ": the denominator must be >= 0 (0: count the targets)");
  if (dev == Device::CUDA && !(opt.denominator > 0))
    throw std::invalid_argument(op + ": on CUDA the denominator must be given (> 0): counting the targets "
                                     "would read device memory from the host");
  if (!tp.supports(DType::F64, dev))
    throw std::invalid_argument(op + ": the " + tp.backend() + " communicator '" + tp.name() +
                                "' does not take fp64 tensors on the device of " + logits.describe());
  const std::int64_t N = logits.dim(0), Vr = logits.dim(1);
  if (opt.vocab_start < 0 || opt.vocab_size < 0 || (opt.vocab_size > 0 && opt.vocab_start + Vr > opt.vocab_size))
    throw std::invalid_argument(op + ": the columns [" + std::to_string(opt.vocab_start) + ", " +
                                std::to_string(opt.vocab_start + Vr) + ") do not fit a vocabulary of " +
                                (opt.vocab_size > 0 ? std::to_string(opt.vocab_size) : std::string("unknown size")));
  if (dev == Device::CPU) {  // the slice ops would check them too, but after the first all-reduce
    if (opt.vocab_size > 0) {
      cpu::check_targets(targets.data(), N, opt.vocab_size, opt.ignore_index, op.c_str());
    } else {
      for (std::int64_t n = 0; n < N; ++n)
        if (targets[std::size_t(n)] != opt.ignore_index && targets[std::size_t(n)] < 0)
          throw std::invalid_argument(op + ": target " + std::to_string(targets[std::size_t(n)]) + " at position " +
                                      std::to_string(n) + " is neither ignore_index (" +
                                      std::to_string(opt.ignore_index) + ") nor a vocabulary id (>= 0)");
    }
  }
  VocabParallelCEChunk c;
  c.logits = logits;
  c.targets = targets;
  c.opt = opt;
  c.denominator = opt.denominator > 0 ? opt.denominator : double(count_targets(targets, opt.ignore_index));

  // One fp64 scratch on the logits' device: the ranks' statistics [P x 3N] (this rank's block
  // written, the others zero, then summed over tp), the global row maxima [N] and sums [2N],
  // the row losses [N].
  const std::int64_t P = tp.size();
  Tensor scratch = Tensor::empty({(3 * P + 4) * N}, DType::F64, dev);
  c.gathered = scratch.slice0(0, 3 * P * N);
  c.row_max = scratch.slice0(3 * P * N, (3 * P + 1) * N);
  c.sums = scratch.slice0((3 * P + 1) * N, (3 * P + 3) * N);
  c.row_loss = scratch.slice0((3 * P + 3) * N, (3 * P + 4) * N);
  const std::int64_t own = 3 * N * tp.rank();
  if (own > 0) c.gathered.slice0(0, own).zero_();
  if (own + 3 * N < 3 * P * N) c.gathered.slice0(own + 3 * N, 3 * P * N).zero_();
  Tensor mine = c.gathered.slice0(own, own + 3 * N);
  cross_entropy_slice_stats(logits, targets, opt.vocab_start, opt.ignore_index, mine, opt.vocab_size);
  tp.wait_all();  // the exchange started before this one: its chunk's finish may follow
  tp.start_all_reduce(c.gathered, ReduceOp::Sum);
  return c;
}

void vocab_parallel_ce_finish(VocabParallelCEChunk& c, double dloss, Tensor& loss) {
  check_loss(c.logits, loss);
  const double scale = c.denominator > 0 ? dloss / c.denominator : 0.0;
  cross_entropy_slice_combine(c.gathered, c.row_max, c.sums);
  cross_entropy_slice_grad(c.logits, c.targets, c.opt.vocab_start, c.opt.ignore_index, c.row_max, c.sums, scale,
                           c.row_loss);
  cross_entropy_slice_loss(c.row_loss, c.denominator, loss);  // on the device: no host read
  c = VocabParallelCEChunk();  // the scratch goes now
}

void vocab_parallel_cross_entropy(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                  double dloss, const VocabParallelCE& opt, Tensor& loss) {
  check_loss(logits, loss);
  VocabParallelCEChunk c = vocab_parallel_ce_start(tp, logits, targets, opt);
  tp.wait_all();
  vocab_parallel_ce_finish(c, dloss, loss);
}

double vocab_parallel_cross_entropy(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                    double dloss, const VocabParallelCE& opt) {
  Tensor loss = Tensor::zeros({1}, DType::F64, logits.defined() ? logits.device() : Device::CPU);
  vocab_parallel_cross_entropy(tp, logits, targets, dloss, opt, loss);
  return loss.to_vector()[0];
}

}  // namespace nsatron::parallel
