#include "core/ops/embedding.h"

#include "core/ops/op_util.h"

namespace nsatron {

using namespace ops_detail;

namespace {
// Returns C; checks table/out shapes and the shard range.
std::int64_t check_embedding(const std::string& op, std::span<const std::int32_t> tokens,
                             const Tensor& table, const Tensor& rows, const char* rows_name,
                             const EmbeddingOptions& opt, std::int64_t& vocab_size,
                             bool table_is_grad = false) {
  if (table.device() == Device::CUDA && table_is_grad) {  // dtable fp32 or the rows' dtype
    all_on_cuda(op, {&rows});
    cuda_compute_dtype(op, rows);
    grad_dtype(op, rows, table, "dtable");
  } else {
    same_dtype_device(op, {&table, &rows});
  }
  require(table.ndim() == 2, op, "the table must be [V, C], got " + table.describe());
  const std::int64_t V = table.dim(0), C = table.dim(1);
  require(rows.ndim() >= 1 && rows.dim(-1) == C && rows_of(rows) == std::int64_t(tokens.size()),
          op,
          std::string(rows_name) + " must be [.., " + std::to_string(C) + "] with " +
              std::to_string(tokens.size()) + " rows (one per token), got " + rows.describe());
  vocab_size = opt.vocab_size ? opt.vocab_size : V;
  require(opt.vocab_start >= 0 && opt.vocab_start + V <= vocab_size, op,
          "the table's rows [" + std::to_string(opt.vocab_start) + ", " +
              std::to_string(opt.vocab_start + V) + ") must lie in the vocabulary [0, " +
              std::to_string(vocab_size) + ")");
  return C;
}
}  // namespace

void embedding_forward(std::span<const std::int32_t> tokens, const Tensor& table, Tensor& out,
                       const EmbeddingOptions& opt) {
  const std::string op = "embedding_forward";
  std::int64_t vocab = 0;
  const std::int64_t C = check_embedding(op, tokens, table, out, "out", opt, vocab);
  if (table.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda_compute_dtype(op, table);
    cuda::embedding_forward(table.dtype(), out.raw(), tokens.data(), table.raw(),
                            std::int64_t(tokens.size()), table.dim(0), C, opt.vocab_start, vocab);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, table, [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_forward<T>(out.data<T>(), tokens.data(), table.data<T>(),
                              std::int64_t(tokens.size()), table.dim(0), C, opt.vocab_start, vocab);
  });
}

void embedding_backward(std::span<const std::int32_t> tokens, const Tensor& dout, Tensor& dtable,
                        const EmbeddingOptions& opt) {
  const std::string op = "embedding_backward";
  std::int64_t vocab = 0;
  const std::int64_t C = check_embedding(op, tokens, dtable, dout, "dout", opt, vocab, true);
  if (dtable.device() == Device::CUDA) {
#ifdef NSATRON_WITH_CUDA
    cuda::embedding_backward(dout.dtype(), dtable.dtype(), dtable.raw(), tokens.data(),
                             dout.raw(), std::int64_t(tokens.size()), dtable.dim(0), C,
                             opt.vocab_start, vocab);
    return;
#else
    no_cuda(op);
#endif
  }
  dispatch_cpu(op, dtable, [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_backward<T>(dtable.data<T>(), tokens.data(), dout.data<T>(),
                               std::int64_t(tokens.size()), dtable.dim(0), C, opt.vocab_start,
                               vocab);
  });
}

}  // namespace nsatron
