#include "core/ops/vocab_parallel_cross_entropy.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "core/ops/cross_entropy.h"

namespace nsatron::parallel {

void vocab_parallel_cross_entropy(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                  double dloss, const VocabParallelCE& opt, Tensor& loss) {
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
  if (!loss.defined() || loss.numel() != 1 || loss.dtype() != DType::F64 || loss.device() != dev)
    throw std::invalid_argument(op + ": loss must be one fp64 element on the device of the logits, got " +
                                (loss.defined() ? loss.describe() : std::string("undefined")));
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
  const double D = opt.denominator > 0 ? opt.denominator : double(count_targets(targets, opt.ignore_index));
  const double scale = D > 0 ? dloss / D : 0.0;

  // One fp64 buffer on the logits' device: every rank's row statistics [P x 3N] (this rank's
  // block written in place, then gathered), the global row maxima [N] and sums [2N], the row
  // losses [N].
  const std::int64_t P = tp.size();
  Tensor scratch = Tensor::empty({(3 * P + 4) * N}, DType::F64, dev);
  Tensor gathered = scratch.slice0(0, 3 * P * N);
  Tensor own = gathered.slice0(3 * tp.rank() * N, 3 * (tp.rank() + 1) * N);
  Tensor row_max = scratch.slice0(3 * P * N, (3 * P + 1) * N);
  Tensor sums = scratch.slice0((3 * P + 1) * N, (3 * P + 3) * N);
  Tensor row_loss = scratch.slice0((3 * P + 3) * N, (3 * P + 4) * N);
  cross_entropy_slice_stats(logits, targets, opt.vocab_start, opt.ignore_index, own, opt.vocab_size);
  tp.all_gather(own, gathered);
  cross_entropy_slice_combine(gathered, row_max, sums);
  cross_entropy_slice_grad(logits, targets, opt.vocab_start, opt.ignore_index, row_max, sums, scale, row_loss);
  cross_entropy_slice_loss(row_loss, D, loss);  // on the device: no host read
}

double vocab_parallel_cross_entropy(Communicator& tp, Tensor& logits, std::span<const std::int32_t> targets,
                                    double dloss, const VocabParallelCE& opt) {
  Tensor loss = Tensor::zeros({1}, DType::F64, logits.defined() ? logits.device() : Device::CPU);
  vocab_parallel_cross_entropy(tp, logits, targets, dloss, opt, loss);
  return loss.to_vector()[0];
}

}  // namespace nsatron::parallel
