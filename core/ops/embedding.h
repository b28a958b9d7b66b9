// Token embedding: a lookup of rows of a table by token id.
//   this header        - the math, the Tensor-level entry points
//   embedding.cpp      - the entry points
//   cpu/embedding.cpp  - the CPU implementation
//   cuda/embedding.cu  - (issue 7) the CUDA kernels, same contract, deterministic backward
//
// Math: table W [V, C], tokens t [N] (int32), out [N, C] (any leading shape with N rows):
//   out[n, :] = W[t_n, :]
// Backward (W is a parameter, so its gradient ACCUMULATES):
//   dW[v, :] += sum over n with t_n = v of dout[n, :]
// The sum for each row v runs over n in ascending order (the CPU splits the work by column
// blocks, never by tokens), so the bits do not depend on the thread count and nothing races.
// Saves nothing beyond the token ids.
//
// Vocab-parallel shards (tensor parallelism): the local table holds rows
// [vocab_start, vocab_start + V) of a vocabulary of vocab_size ids. Tokens outside the shard
// give zero rows in the forward and no gradient; summing the shards' outputs gives the full
// lookup. Without sharding, vocab_start = 0 and vocab_size = V.
//
// Token ids: an int32 array in the memory of the tensors' device (host memory for CPU
// tensors). Every id must lie in [0, vocab_size); one that does not is an error that names
// its position and value.
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor/tensor.h"

namespace nsatron {

struct EmbeddingOptions {
  std::int64_t vocab_start = 0;  // first global id held by this table
  std::int64_t vocab_size = 0;   // the whole vocabulary; 0: the table's rows (no sharding)
};

// table [V, C], out [.., C] with tokens.size() rows.
void embedding_forward(std::span<const std::int32_t> tokens, const Tensor& table, Tensor& out,
                       const EmbeddingOptions& opt = {});
// dtable [V, C] += scatter of dout [.., C].
void embedding_backward(std::span<const std::int32_t> tokens, const Tensor& dout, Tensor& dtable,
                        const EmbeddingOptions& opt = {});

namespace cpu {
// Throws std::invalid_argument for the first id outside [0, vocab_size).
void check_token_ids(const std::int32_t* tokens, std::int64_t N, std::int64_t vocab_size,
                     const char* what);
// Raw arrays: table V rows of C, out N rows of C. Ids are checked (see check_token_ids).
template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* table, std::int64_t N,
                       std::int64_t V, std::int64_t C, std::int64_t vocab_start,
                       std::int64_t vocab_size);
template <class T>
void embedding_backward(T* dtable, const std::int32_t* tokens, const T* dout, std::int64_t N,
                        std::int64_t V, std::int64_t C, std::int64_t vocab_start,
                        std::int64_t vocab_size);
}  // namespace cpu

}  // namespace nsatron
