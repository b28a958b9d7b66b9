// Token embedding: a lookup of rows of a table by token id.
//   this header        - the math, the Tensor-level entry points
//   embedding.cpp      - the entry points
//   cpu/embedding.cpp  - the CPU implementation
//   cuda/embedding.cu  - the CUDA kernels, same contract, deterministic backward
//
// Math: table W [V, C], tokens t [N] (int32), out [N, C] (any leading shape with N rows):
//   out[n, :] = W[t_n, :]
// Backward (W is a parameter, so its gradient ACCUMULATES):
//   dW[v, :] += sum over n with t_n = v of dout[n, :]
// The order of each row's sum is fixed, the same on both devices, so the bits depend on neither
// the thread count nor the device: the positions of the shard's tokens sorted by (row,
// position) (a stable sort by row) are cut into pieces at every multiple of
// kEmbeddingGradPiece of their sorted index and at every change of row; each piece is summed in
// fp64 from zero in ascending position order, and row v's pieces are added in order to
// double(dW[v]), rounded once into dW[v]:
//   dW[v] = round(((double(dW[v]) + P_v0) + P_v1) + ...)
// (rounded once into an fp32 dW; a bf16 dW on CUDA through fp32).
// (The pieces let the GPU sum a frequent token's thousands of positions in parallel: a byte
// text's ' ' is ~6000 of 32768, which one block summed serially.)
// Saves nothing beyond the token ids.
//
// Vocab-parallel shards (tensor parallelism): the local table holds rows
// [vocab_start, vocab_start + V) of a vocabulary of vocab_size ids. Tokens outside the shard
// give zero rows in the forward and no gradient; summing the shards' outputs gives the full
// lookup. Without sharding, vocab_start = 0 and vocab_size = V.
//
// Token ids: an int32 array in the memory of the tensors' device (host memory for CPU
// tensors). Every id must lie in [0, vocab_size); one that does not is an error that names
// its position and value (on CUDA reported by cuda::check_id_errors(), see below).
// On CUDA, dtable may be fp32 while table/dout are bf16 (fp32 gradient accumulation).
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor/tensor.h"

namespace nsatron {

// The length of the backward's pieces (above), in sorted positions.
inline constexpr std::int64_t kEmbeddingGradPiece = 256;

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

namespace cuda {
// Device pointers (tokens too), default stream. table/out/dout of dtype `dt` (fp32 or bf16);
// dtable of `dtable_dt` (fp32 or dt). The backward sorts the positions by row (CUB's stable
// radix sort, in a scratch buffer of about 16 N bytes plus CUB's) and sums each row's
// positions in ascending order in fp64: same bits on every run, no atomics on floats.
// A bad id cannot throw here without a host synchronisation: the forward writes NaN in its
// row, the backward skips it, and both record it for check_id_errors().
void embedding_forward(DType dt, void* out, const std::int32_t* tokens, const void* table,
                       std::int64_t N, std::int64_t V, std::int64_t C, std::int64_t vocab_start,
                       std::int64_t vocab_size);
void embedding_backward(DType dt, DType dtable_dt, void* dtable, const std::int32_t* tokens,
                        const void* dout, std::int64_t N, std::int64_t V, std::int64_t C,
                        std::int64_t vocab_start, std::int64_t vocab_size);
// Throws std::invalid_argument naming the op, position and value of the first bad token id
// or target recorded on the current device since the last call (embedding and cross entropy
// share the record), and clears it. Synchronises with the device: call it where a step
// already reads a number back (the loss for the log), or in tests.
void check_id_errors();
}  // namespace cuda

}  // namespace nsatron
