// The NSA language model: a decoder-only transformer whose attention is NSA (NSA_SPEC.md),
// every layer's forward and backward written by hand.
//
//   x0 = embedding[tokens]                                                   [N, C], N = B*T
//   per layer:
//     xn  = rmsnorm(x) * attn_norm
//     p   = xn @ wqkv^T                      fused projection, group-major rows (below); each
//                                            row padded to projection_pitch() elements
//     q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gate = split(p)   (on CUDA read in place:
//                                            below)
//     o   = nsa_core(q, ..., gate; cmp_wk, cmp_wv, cmp_pk, cmp_pv)          [N, H*D]
//     h   = x + o @ wo^T
//     hn  = rmsnorm(h) * mlp_norm
//     u   = hn @ [w_gate; w_up]^T            [N, 2F]: gate half then up half (the two
//                                            weights are adjacent in the flat buffer)
//     x'  = h + swiglu(u) @ w_out^T
//   xf = rmsnorm(x_L) * final_norm
//   loss = mean over tokens of cross_entropy(xf @ E^T, targets)      E: embedding or lm_head
//
// wqkv rows are laid out group by group, so a tensor-parallel rank's groups are one
// contiguous block of rows: for each KV group g, [q of its h heads (h*D rows), k_cmp (D),
// v_cmp (D), k_slc (D), v_slc (D), k_win (D), v_win (D), gate logits of its h heads (3h,
// head-major: head 0's (cmp, slc, win), then head 1's, ..., as the core's gate [.., H, 3])].
//
// The NSA core on CUDA reads its eight inputs from p in place and writes their gradients into
// dp (the core's row pitches, nsa/cuda/nsa_cuda.h): no split or join. For that the CUDA products
// run with wqkv's rows regrouped part by part (regroup_rows, core/ops/elementwise.h), so p's
// rows are [q of every head (H*D) | k_cmp of every group (G*D) | v_cmp | k_slc | v_slc | k_win |
// v_win | gate of every head (3H) | pad]: each input is one column range. The parameter (and
// its gradient, checkpoints, tensor-parallel shards) keeps the group-major rows above.
//
// The LM head runs on row chunks: logits for a chunk, the cross entropy and its gradient in
// place, then the chunk's backward, so the largest logits buffer is [chunk, V].
//
// Tensor parallelism (ModelShard::tp > 1; on CPU ranks over MPI, on GPUs over NCCL): each of the tp ranks holds G/tp KV groups
// with their H/tp query heads (the rows of wqkv of its groups, its groups' compression maps,
// the columns of wo of its heads), F/tp of the MLP's hidden units (rows of w_gate and w_up,
// columns of w_out) and a contiguous range of the vocabulary (rows of the embedding and the
// LM head); the norm gains are replicated. Per layer the forward all-reduces (sum) the
// outputs of wo and w_out, the backward the gradients of the two norm outputs (while the
// weight gradients are computed: tp_pass_on); the
// embedding's output and the gradient of the final norm's output are all-reduced too, and
// the loss is the vocab-parallel cross entropy (core/ops/vocab_parallel_cross_entropy.h).
// The NSA core itself needs no communication. With parallel.tp_overlap (set_tp_overlap) the
// ops around the core run in two row parts, the micro-batch's first B/2 sequences and the rest
// (RowPart), the core over the whole micro-batch (its kernels lose efficiency on fewer
// sequences: docs/performance.md, fourteenth session):
//   forward   norm+wqkv(0) | norm+wqkv(1) | core | wo | mlp(0) | mlp(1) | next layer...
//   backward  mlp dX(0) | mlp dX(1) | mlp dW | norm | wo dX | core | wqkv dX(0) | wo dW |
//             wqkv dX(1) | wqkv dW | norm
// and each part's all-reduce, started where the part's product ends (on GPUs on the
// communicator's stream), is waited for where the next part's product ends, or where its rows
// are next read: it runs beside the other part's work (the forward's second wo sum beside the
// first part's MLP, the w_out sums beside the other part's MLP and the next layer's first norm
// and projection, the backward's beside the other part's products or the weight gradients; the
// first wo sum has nothing beside it: wo is one product, as its input gradient). The weight
// gradients of the products and norms are computed over the whole micro-batch as without
// parts; products over half the rows may take other kernels, so the bits differ from the run
// without parts (to rounding: the tensor-parallel tests).
// With parallel.tp_micro_batch_pairs (forward_backward_pair_queued) the row-parallel sums hide
// behind a second micro-batch instead: two micro-batches' forwards and backwards layer by layer
// in turn, each one's sums beside the other's half or phase of the layer, the same bits as
// without.
// Pipeline parallelism: the model holds the layers [layer_begin, layer_end) only, the
// embedding on the first stage, the final norm and head on the last (with tied embeddings,
// the last stage holds a replica of the embedding; the trainer adds the two stages' gradients). With an interleaved pipeline (virtual stages) a
// rank holds several model chunks, each a contiguous range of layers (ModelShard::chunks, in
// increasing order, not necessarily adjacent): the embedding comes with a chunk that starts at
// layer 0, the final norm and head with one that ends at the last layer; stage_forward and
// stage_evaluate take the chunk to run. Parameter names are the global ones, and the flat
// buffers hold the rank's layers in increasing order whatever its chunks, so checkpoints do
// not depend on the layout.
//
// Dense attention (model.attention = "dense", ModelDims::attention): the baseline NSA is
// compared against. The same layer with the NSA core replaced by causal grouped-query
// attention with RoPE (nsa/dense.h): wqkv's rows per group are [q of its h heads (h*D), k (D),
// v (D)] (one K/V projection, no gates), there are no compression parameters, and o =
// attention(q, k, v). Everything else (names, norms, MLP, head, tensor parallelism by KV
// group, pipeline stages, recompute policies) is the same; its saved state is the per-row
// log-sum-exp (LayerActivations::attn_lse).
//
// Recompute policies (recompute.policy): "none" keeps every activation the backward reads;
// "selective" drops the norm outputs, the SwiGLU output and the NSA core's saved state and
// recomputes them in the backward; "full" keeps only the input of each of the first
// `recompute.layers` layers and reruns the layer's forward in its backward. All three give
// the same bits: the recomputation repeats the same operations on the same inputs.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/config/config.h"
#include "core/model/layer_activations.h"
#include "core/model/params.h"
#include "core/ops/embedding.h"
#include "nsa/nsa.h"

namespace nsatron {

enum class RecomputePolicy { None, Selective, Full };
RecomputePolicy parse_recompute_policy(const std::string& s);

// The attention of every layer (model.attention).
enum class Attention { Nsa, Dense };
Attention parse_attention(const std::string& s);  // "nsa" | "dense"; UserError naming model.attention otherwise
const char* attention_name(Attention a);           // "nsa" | "dense"

struct ModelDims {
  std::int64_t V, C, L, H, G, D, F;
  std::int64_t cmp_block, cmp_stride, sel_block, sel_count, window;  // NSA only
  double rope_theta, norm_eps, init_std;
  bool tie_embeddings;
  Attention attention = Attention::Nsa;
  std::int64_t heads_per_group() const { return H / G; }
  // Rows of wqkv per group: NSA q, six K/V, gates; dense q, k, v.
  std::int64_t group_width() const {
    return attention == Attention::Dense ? (heads_per_group() + 2) * D : heads_per_group() * (D + 3) + 6 * D;
  }
  // Elements per row of the fused projection p = xn wqkv^T and of its gradient dp: the G groups'
  // G * group_width() columns, padded to a multiple of 64 so that every row starts 16-byte aligned
  // (cuBLASLt's fast kernels; e.g. 1572 -> 1600 at the 125M config). On the CPU the pad columns
  // are neither read nor written (linear's y_pitch / dy_pitch); on CUDA the projection's
  // products run over the whole pitch and the join writes dp's pad zero
  // (NsaTransformer::projection_forward / projection_backward).
  std::int64_t projection_pitch() const { return (G * group_width() + 63) / 64 * 64; }
  // Whether the pitch has pad columns (then the CUDA products run over padded rows).
  bool projection_padded() const { return projection_pitch() != G * group_width(); }
  // The NSA core's shape for B sequences of T tokens: these heads and the NSA fields.
  nsa::NsaDims core_dims(std::int64_t B, std::int64_t T) const;
  // Training FLOPs per token at sequence length T (forward + backward = 3x forward), for MFU
  // and study planning: 6 * (matrix parameters, the LM head included, embedding lookup
  // excluded) plus the attention core: 12 * H * D * K(T) per layer, K(T) the mean number of
  // keys a query attends (NSA: over its three branches, plus the compression maps; dense: the
  // causal (T+1)/2). See docs/performance.md.
  double flops_per_token(std::int64_t T) const;
  static ModelDims from_config(const RunConfig& c);
};

using LayerRange = std::pair<std::int64_t, std::int64_t>;  // layers [first, second)

// The part of the model this rank holds.
struct ModelShard {
  int tp = 1, tp_rank = 0;
  std::shared_ptr<parallel::Communicator> tp_group;  // required when tp > 1 (its size is tp)
  std::int64_t layer_begin = 0, layer_end = -1;     // this pipeline stage's layers; -1: to the last
  // Interleaved pipeline: the layers of each of this rank's model chunks, in increasing order
  // and disjoint (e.g. {[0, 1), [2, 3)} for rank 0 of pp = 2 with 2 virtual stages of 4
  // layers). Empty: one chunk, [layer_begin, layer_end).
  std::vector<LayerRange> chunks;
};

class NsaTransformer {
 public:
  // dtype is the compute dtype: fp32 (fp64 for tests) on the CPU, bf16 or fp32 on CUDA. The
  // master weights and the gradients are fp32 (fp64 with fp64); with bf16 compute, a bf16
  // copy of the weights feeds the forward and backward (sync_compute_weights() refreshes it
  // from the master weights; the trainer's AdamW writes it directly).
  NsaTransformer(const ModelDims& dims, DType dtype, Device device = Device::CPU, const ModelShard& shard = {});
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // The flat compute weights (the master weights themselves when the dtypes agree).
  Tensor& compute_weights() { return compute_; }
  void sync_compute_weights();
  const ModelDims& dims() const { return dims_; }    // the whole model
  const ModelDims& local_dims() const { return local_; }  // this rank's share: H, G, F divided by tp
  // This rank holds the embedding (a chunk starting at layer 0) / the final norm and head (a
  // chunk ending at the last layer).
  bool first_stage() const { return chunk_first(0); }
  bool last_stage() const { return chunk_last(chunks() - 1); }
  int chunks() const { return int(chunks_.size()); }
  const LayerRange& chunk_layers(int chunk) const { return chunks_.at(std::size_t(chunk)); }
  bool chunk_first(int chunk) const { return chunk_layers(chunk).first == 0; }
  bool chunk_last(int chunk) const { return chunk_layers(chunk).second == dims_.L; }
  // One chunk holding every layer, the embedding and the head (no pipeline stage).
  bool whole_model() const { return chunks() == 1 && first_stage() && last_stage(); }
  std::int64_t layer_begin() const { return chunks_.front().first; }  // of the first chunk
  std::int64_t layer_end() const { return chunks_.back().second; }    // of the last chunk
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  void set_recompute(RecomputePolicy policy, std::int64_t layers) {
    policy_ = policy;
    recompute_layers_ = layers;
  }
  // Row chunk of the LM head (rows of logits held at once); the trainer keeps the default.
  // Each chunk's dW reads and writes the whole fp32 head gradient, so the chunk sets that
  // product's intensity: at the 125M config on an H100 the head's dW ran at 38% of the bf16
  // peak with 1024 rows and 71% with 4096 (bench/ops_gpu --head-chunk), for [4096, V] logits
  // (412 MB in bf16 at V = 50304; the 125M step's peak grew 13.33 -> 13.43 GiB).
  static constexpr std::int64_t kDefaultHeadChunk = 4096;
  void set_head_chunk(std::int64_t rows) { head_chunk_ = rows; }
  // Tensor parallelism (parallel.tp_overlap): each layer runs the ops around the NSA core on a
  // micro-batch of B >= 2 sequences in two row parts (the first B/2 sequences, then the rest),
  // so that one part's TP all-reduce runs while the other part computes (above, "Tensor
  // parallelism"). No effect with tp = 1 or B = 1.
  void set_tp_overlap(bool on) { tp_overlap_ = on; }
  // The row parts a micro-batch of B sequences runs in: 2 with the overlap (above), else 1
  // (the memory plan asks the same with the run's settings).
  static int row_parts(bool tp_overlap, int tp, std::int64_t B) { return tp_overlap && tp > 1 && B >= 2 ? 2 : 1; }
  int row_parts(std::int64_t B) const { return row_parts(tp_overlap_, tp_, B); }

  // Two micro-batches in flight (parallel.tp_micro_batch_pairs): the forward of micro-batches
  // k and k + 1 layer by layer in turn, k's attention half, k + 1's, k's MLP half, k + 1's, so
  // that each row-parallel output's TP all-reduce (wo's, w_out's) runs while the other
  // micro-batch computes (on GPUs on the communicator's stream); then k's head, k + 1's, and
  // the backwards layer by layer in turn likewise (layer_backward's phases: k's MLP phase, k +
  // 1's, k's attention phase, k + 1's, ...), each phase's input-gradient sums beside the other
  // micro-batch's next phase. Each micro-batch's operations are those of
  // forward_backward_queued, and every gradient accumulates in the same order (k's part before
  // k + 1's) except a tied embedding's, whose heads would now come before k's lookups: it needs
  // defer_lookup_grads (below), and then the same bits as two calls of forward_backward_queued
  // with the lookups deferred. The activations of both are held at once. The whole model only
  // (pp = 1) and without row parts (tp_overlap); with tp = 1 no sums to hide, the same work.
  // before_backward(i), if set, runs before each part of micro-batch i's head and backward (0:
  // the first, 1: the second; the trainer arms the gradient hook there for the step's last
  // micro-batch, so that a range is reported once its last part is added; a joint core's
  // backward, both micro-batches' share, runs under the second's turn and reports nothing).
  // Returns the two mean losses, on the device as forward_backward_queued's.
  struct MicroBatchIds {
    std::span<const std::int32_t> tokens, targets;
  };
  // parallel.tp_pair_core = "joint": in forward_backward_pair_queued each layer's two NSA cores
  // run as one call over the pair's 2B sequences (a rank's core on 1/tp of the KV groups fills
  // the GPU better with twice the sequences), the projections written into the rows of one
  // [2N, pitch] buffer and the core's output, saved state and gradients likewise; the ops
  // around it per micro-batch as before. CUDA, NSA, layers that keep the core's saved state
  // (pair_core_joint(l)); elsewhere, or off, a call per micro-batch. The same losses to
  // rounding (the core's sums over sequences and its kernels' splits follow the call's size).
  void set_pair_core_joint(bool on) { pair_core_joint_ = on; }
  bool pair_core_joint(std::int64_t l) const {
    return pair_core_joint_ && device_ == Device::CUDA && projection_in_place() && keep_mode(l) == Keep::All;
  }
  std::array<Tensor, 2> forward_backward_pair_queued(const std::array<MicroBatchIds, 2>& micro_batches,
                                                     std::int64_t B, std::int64_t T, double grad_scale = 1.0,
                                                     const std::function<void(int)>& before_backward = {});

  // Forward and backward of one micro-batch of B sequences of T tokens (row-major [B, T]).
  // Gradients ACCUMULATE into params().flat_grads(), scaled by `grad_scale` (1 / number of
  // micro-batches for gradient accumulation). Returns the micro-batch's mean loss.
  double forward_backward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                          std::int64_t B, std::int64_t T, double grad_scale = 1.0);
  // The same without reading the loss: it is returned as one element on the model's device
  // (on CUDA everything is queued; nothing in the micro-batch waits for the device), to be read
  // once per step for the log.
  Tensor forward_backward_queued(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                                 std::int64_t B, std::int64_t T, double grad_scale = 1.0);
  // The same, one pipeline stage (model chunk `chunk` of this rank) at a time. stage_forward:
  // the model's first chunk reads `tokens`, the others `input` (the previous chunk's output,
  // [B*T, C]); a chunk that is not the model's last returns with state.output set (to send
  // on); the last computes the loss (state.loss, on the device), the head's gradients and the gradient of its
  // last layer's output right away. stage_backward (of state.chunk): `d_output` is the
  // gradient of state.output (received from the next chunk; ignored on the last); returns the
  // gradient of `input` (not on the first chunk, which finishes with the embedding's
  // gradient). Gradients accumulate as in forward_backward. The overloads without a chunk run
  // chunk 0.
  StageState stage_forward(int chunk, std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                           const Tensor* input, std::int64_t B, std::int64_t T, double grad_scale = 1.0);
  StageState stage_forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                           const Tensor* input, std::int64_t B, std::int64_t T, double grad_scale = 1.0) {
    return stage_forward(0, tokens, targets, input, B, T, grad_scale);
  }
  Tensor stage_backward(StageState& state, const Tensor* d_output);
  // Forward only: the output of a chunk that is not the model's last; on the last, *loss = the
  // mean loss.
  Tensor stage_evaluate(int chunk, std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                        const Tensor* input, std::int64_t B, std::int64_t T, double* loss);
  Tensor stage_evaluate(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                        const Tensor* input, std::int64_t B, std::int64_t T, double* loss) {
    return stage_evaluate(0, tokens, targets, input, B, T, loss);
  }

  // Mean loss without gradients or saved activations.
  double evaluate(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                  std::int64_t B, std::int64_t T);
  // Logits of the last position of each sequence, [B, V] (for sampling).
  Tensor last_logits(std::span<const std::int32_t> tokens, std::int64_t B, std::int64_t T);

  // Gradient hook: while set, every backward (forward_backward, and stage_forward on the model's
  // last chunk, which runs the head's backward, and stage_backward) calls it with ranges
  // [begin, end) of params().flat_grads() whose gradient this micro-batch has finished writing,
  // in the order they finish: the LM head (untied), the final norm, each layer from the last
  // down (all its parameters at once, after its backward), then the embedding. Each range once
  // per micro-batch. Not reported: a tied embedding split over pipeline stages (its two parts
  // are added by the caller afterwards, see above), so its gradient is not final here. The
  // trainer sets it for the step's last micro-batch to start the data-parallel reduction early
  // (parallel.overlap_grad_reduce); an empty function: no calls.
  using GradsReadyHook = std::function<void(std::int64_t begin, std::int64_t end)>;
  void set_grads_ready_hook(GradsReadyHook hook) { grads_ready_ = std::move(hook); }

  // A tied embedding's gradient has two parts: the LM head's (added by each micro-batch's head,
  // first in its backward) and the lookups' (last). With defer_lookup_grads(true) (a rank
  // holding the whole model, tied embeddings) the lookups' part accumulates in a buffer of its
  // own (fp32, the embedding gradient's shape, allocated here, zero) until add_lookup_grads()
  // adds it into the embedding's gradient, zeroes it and reports the embedding's range to the
  // hook: the gradient becomes (the heads' sum) + (the lookups' sum), whatever order the
  // micro-batches' backwards interleave in. forward_backward_pair_queued needs it (its heads run
  // before either lookup), and the trainer sets it wherever the pairs can run (tensor
  // parallelism, pp = 1), so that a step's bits do not depend on them. false drops the buffer.
  void defer_lookup_grads(bool on);
  bool lookup_grads_deferred() const { return lookup_grads_.defined(); }
  // Where the trainer defers them (and the memory plan counts the buffer): tied embeddings,
  // tensor parallelism, no pipeline.
  static bool trainer_defers_lookup_grads(bool tied, int tp, int pp) { return tied && tp > 1 && pp == 1; }
  void add_lookup_grads();

  // Peak bytes of activations (everything allocated above the parameters, gradients and
  // optimizer state) during the last forward_backward.
  std::size_t last_activation_peak_bytes() const { return last_activation_peak_; }

  // Training FLOPs per token at sequence length T: ModelDims::flops_per_token of the whole model.
  double flops_per_token(std::int64_t T) const { return dims_.flops_per_token(T); }
  std::int64_t num_params() const { return params_.total(); }
  // The names of the whole model's parameters (any layout holds blocks of these).
  static std::vector<std::string> parameter_names(const ModelDims& dims);
  // The parameters one rank holds, in the order and at the offsets of its flat buffers, as
  // the constructor with ModelShard{tp, tp_rank, -, layer_begin, layer_end} (or with these
  // chunks) declares them, without allocating anything (memory planning: core/model/plan.h).
  // The shard's shape is not validated here; the constructor does that.
  static std::vector<ParamInfo> rank_parameters(const ModelDims& dims, int tp = 1, int tp_rank = 0,
                                                std::int64_t layer_begin = 0, std::int64_t layer_end = -1);
  static std::vector<ParamInfo> rank_parameters(const ModelDims& dims, int tp, int tp_rank,
                                                const std::vector<LayerRange>& chunks);

 private:
  static std::string layer_name(std::int64_t l, const char* part);
  // What a rank holds: its dims (H, G, F divided by tp), layers and vocabulary rows.
  struct ShardGeometry {
    ModelDims local;
    int tp_rank;
    std::vector<LayerRange> chunks;  // in increasing order
    std::int64_t vocab_begin, vocab_end;
    bool first() const { return chunks.front().first == 0; }
    bool last() const { return chunks.back().second == local.L; }
  };
  // tp ranks hold H, G, F / tp and vocabulary rows [V*r/tp, V*(r+1)/tp); a range's end -1: to the last.
  static ShardGeometry shard_geometry(const ModelDims& d, int tp, int tp_rank, std::vector<LayerRange> chunks);
  static void declare_parameters(ParamStore& store, const ModelDims& d, const ShardGeometry& g);
  using Ids = DeviceIds;
  Ids device_ids(std::span<const std::int32_t> host, bool keep_copy = false) const;
  EmbeddingOptions embedding_shard() const;  // this rank's vocabulary rows for the embedding ops
  Tensor mlp_in(const Tensor& flat, std::int64_t l) const;  // [w_gate; w_up] of layer l in a flat buffer
  void tp_sum(Tensor& t) const;
  // tp_sum in halves, so that work which needs neither t nor its sum runs between them (the
  // backward's weight gradients, the next row part: Communicator::start_all_reduce, on GPUs the
  // collective's own stream): tp_pass_on waits for the sum started before (if any) and starts
  // t's; tp_finish_sums completes the last. No other TP collective between them.
  void tp_pass_on(Tensor& t) const;
  void tp_finish_sums() const;
  // Sequences [b0, b1) of a micro-batch (row_parts()): rows [b0 T, b1 T) of every per-token tensor.
  struct RowPart {
    int index = 0, count = 1;
    std::int64_t b0 = 0, b1 = 0, T = 0;
    std::int64_t r0() const { return b0 * T; }
    std::int64_t r1() const { return b1 * T; }
    Tensor of(const Tensor& t) const { return t.defined() ? t.slice0(r0(), r1()) : Tensor(); }
  };
  std::vector<RowPart> parts_of(std::int64_t B, std::int64_t T) const;
  // Final-norm output -> mean loss (one element on the device, not read); with dxf, also the
  // head's gradients and dxf.
  Tensor head_loss(const Tensor& xf, const Ids& targets, std::int64_t N, double grad_scale, Tensor* dxf);
  void embedding_grad(const Ids& tokens, Tensor& dx);
  enum class Keep { Nothing, Input, Selective, All };
  Tensor weight(const std::string& name) const;  // compute-dtype view
  // p = xn wqkv^T into rows of projection_pitch(), and its backward (dxn assigned, dw
  // accumulated; dp's pad columns zero): on CUDA over the whole pitch (model.cpp says why), p's
  // columns part-major where projection_in_place(). wp: projection_weight(wqkv) (a copy on
  // CUDA, made once per layer's forward and once per backward, for all its row parts).
  void projection_forward(const Tensor& xn, const Tensor& wp, Tensor& p) const;
  void projection_backward_dx(const Tensor& dp, const Tensor& xn, const Tensor& wp, Tensor& dxn) const;
  void projection_backward_dw(const Tensor& dp, const Tensor& xn, const Tensor& wp, Tensor& dw) const;
  // The products run over the whole pitch with a padded (and regrouped) copy of wqkv (CUDA,
  // where the pitch has pad columns or the columns are regrouped).
  bool projection_products_padded() const {
    return device_ == Device::CUDA && (local_.projection_padded() || projection_regrouped());
  }
  // The weight the projection's products take: that copy, else w itself.
  Tensor projection_weight(const Tensor& w) const;
  // [projection_pitch(), C]: w's rows (regrouped part-major where projection_in_place()), then zero rows.
  Tensor padded_projection(const Tensor& w) const;
  // The NSA core reads its inputs from p in place (CUDA): LayerActivations::proj, no split.
  bool projection_in_place() const { return device_ == Device::CUDA && dims_.attention == Attention::Nsa; }
  // p's columns differ from the parameter's row order (in place and more than one group).
  bool projection_regrouped() const { return projection_in_place() && local_.G > 1; }
  Tensor act(const Shape& shape) const;
  Tensor stat(const Shape& shape) const;
  // The core over the micro-batch's B sequences (the saved state into a.nsa_saved or, dense,
  // a.attn_lse).
  void core_forward(std::int64_t l, LayerActivations& a, Tensor& o, bool save, std::int64_t B, std::int64_t T) const;
  // dparts: the gradients of the core's inputs, in the order of the projection's parts; where
  // the core read a.proj in place, dproj instead (its columns, as a.proj's).
  void core_backward(std::int64_t l, const LayerActivations& a, const Tensor& d_o, Tensor* const dparts[],
                     Tensor* dproj, std::int64_t B, std::int64_t T);
  Keep keep_mode(std::int64_t l) const;
  // The residual stream between layers as a layer leaves it: its MLP output x and, not yet
  // added to it, its attention residual h (undefined: x is the whole stream, e.g. the
  // embedding or a pipeline stage's input). The next norm adds them (add_rmsnorm, the sum
  // written over x) and lets h go: the residual add costs no pass of its own.
  struct Stream {
    Tensor x, h;
  };
  // y = rmsnorm(x), or with h: x = h + x (in place), y = rmsnorm(x), h released.
  void norm_stream(Stream& s, const Tensor& w, Tensor& y, Tensor& rstd) const;
  // x = h + x where no norm follows (a stage's output, evaluation), h released.
  void sum_stream(Stream& s) const;
  // in: the layer's input (summed into in.x by its norm); out: its output, nullptr when only
  // the activations are wanted (full recompute). With two row parts the sum of out->x's second
  // part may still be running: the next layer_forward, or tp_finish_sums(), completes it.
  void layer_forward(std::int64_t l, Stream& in, Stream* out, LayerActivations* acts, Keep keep, std::int64_t B,
                     std::int64_t T) const;
  // layer_forward in its two halves, so that two micro-batches can take turns
  // (forward_backward_pair_queued): the attention half ends with the sums of wo's output
  // started (pass_on: tp_pass_on, the sum running while the next work is enqueued) or done;
  // the MLP half reads them and ends with w_out's output's sums started or done. What the
  // first half hands the second:
  struct LayerInFlight {
    LayerActivations a;
    Tensor attn_out;
    std::vector<RowPart> parts;
    bool pass_on = false;  // every row-parallel output's sum by tp_pass_on (row parts, pairs)
    // A row-parallel output (wo's, w_out's, or a row part of it) summed over the TP ranks.
    void sum(const NsaTransformer& model, Tensor t) const {
      if (pass_on)
        model.tp_pass_on(t);
      else
        model.tp_sum(t);
    }
  };
  void layer_attention_forward(std::int64_t l, Stream& in, LayerInFlight& f, Keep keep, std::int64_t B,
                               std::int64_t T) const;
  // layer_attention_forward in three: the norm and the projection (p: rows of a pair's joint
  // projection, or nullptr: p and a.o allocated here), the core (core_forward), and the output
  // product with its sums (the attention residual's input kept as a.x).
  void attention_project(std::int64_t l, Stream& in, LayerInFlight& f, const Tensor* p, std::int64_t B,
                         std::int64_t T) const;
  void attention_output(std::int64_t l, Stream& in, LayerInFlight& f, std::int64_t N) const;
  void layer_mlp_forward(std::int64_t l, LayerInFlight& f, Stream* out, LayerActivations* acts, Keep keep,
                         std::int64_t B, std::int64_t T) const;
  // stage_forward's parts for the whole model's chunk 0 or a pipeline chunk: the start (ids,
  // embedding or input: st set up, the first layer's input returned), and the end after the
  // layers (the last chunk's final norm, loss, head gradients and st.d_last, else st.output).
  Stream stage_begin(StageState& st, int chunk, std::span<const std::int32_t> tokens, const Tensor* input,
                     std::int64_t B, std::int64_t T, double grad_scale);
  void stage_end(StageState& st, Stream& s, std::span<const std::int32_t> targets);
  void complete_for_backward(std::int64_t l, LayerActivations& a, std::int64_t B, std::int64_t T) const;
  // A layer's backward in three phases, so that two micro-batches can take turns
  // (forward_backward_pair_queued): the MLP phase (complete_for_backward first) ends with the
  // sums of the MLP norm output's gradient (dhn) started and the MLP's weight gradients
  // queued beside them; the attention phase reads those sums and ends likewise with the
  // attention norm output's (dxn) started and wo's and wqkv's weight gradients beside them;
  // the end (layer_backward_done) reads them, hands on the layer input's gradient and reports
  // the layer's gradients. Before each of the last two phases the sums must be done
  // (tp_finish_sums, or the other micro-batch's next tp_pass_on). What the phases hand on:
  struct LayerGradInFlight {
    Tensor dx_out;  // the gradient of the layer's output (the caller's), held to the end
    Tensor dhn, dh, dxn;
  };
  void layer_mlp_backward(std::int64_t l, LayerActivations& a, LayerGradInFlight& g, std::int64_t B, std::int64_t T);
  void layer_attention_backward(std::int64_t l, LayerActivations& a, LayerGradInFlight& g, std::int64_t B,
                                std::int64_t T);
  // layer_attention_backward in three: the MLP norm's backward and wo's input gradient into d_o
  // (rows of a pair's joint gradient, or a tensor of its own), the core's backward, and the
  // projection's input gradient with its sums and the weight gradients of wo and wqkv (dp: the
  // core's input gradient, the micro-batch's rows).
  Tensor attention_backward_output(std::int64_t l, LayerActivations& a, LayerGradInFlight& g, const Tensor* d_o);
  // The core's backward into the gradient of the projection (allocated here): in place in its
  // columns (a.proj defined), else through the parts' gradients and their join.
  Tensor core_backward_to_projection(std::int64_t l, const LayerActivations& a, const Tensor& d_o, std::int64_t B,
                                     std::int64_t T);
  void attention_backward_project(std::int64_t l, LayerActivations& a, LayerGradInFlight& g, const Tensor& dp,
                                  std::int64_t B, std::int64_t T);
  // The end of layer l's backward for a micro-batch (st): the attention norm's backward gives
  // the layer input's gradient, the layer's gradients are reported, its activations dropped,
  // and g handed on to layer l - 1 with that gradient as its dx_out.
  void layer_backward_done(std::int64_t l, StageState& st, LayerGradInFlight& g);
  // Layer l's backward for one micro-batch: the three phases, each phase's sums waited for
  // before the next (stage_backward's loop), then layer_backward_done.
  void layer_backward(std::int64_t l, StageState& st, LayerGradInFlight& g);
  // The model's first chunk's last step of a backward: the embedding's gradient from dx (the
  // first layer's input's), reported unless a tied embedding's parts are added later.
  void embedding_backward_step(StageState& st, Tensor dx);
  Tensor embed(const Ids& tokens, std::int64_t N) const;
  // A chunk's embedding (the model's first chunk) and layers, keeping nothing for a backward:
  // the last layer's output.
  Tensor forward_layers(int chunk, const Ids& tokens, const Tensor* input, std::int64_t B, std::int64_t T) const;
  const Tensor head_weight() const;
  Tensor head_grad() const;
  // The hook (if set) for the parameters whose names start with `prefix` (one contiguous
  // range of the flat buffers: a whole layer, or one parameter).
  void report_grads(const std::string& prefix) const;

  ModelDims dims_, local_;
  int tp_ = 1, tp_rank_ = 0;
  std::shared_ptr<parallel::Communicator> tp_group_;
  std::vector<LayerRange> chunks_;  // this rank's model chunks (one without an interleaved pipeline)
  std::int64_t vocab_begin_ = 0, vocab_end_ = 0;  // this rank's rows of the embedding and head
  DType dtype_;
  Device device_;
  ParamStore params_;
  Tensor compute_;
  RecomputePolicy policy_ = RecomputePolicy::None;
  std::int64_t recompute_layers_ = 0;
  std::int64_t head_chunk_ = kDefaultHeadChunk;
  bool tp_overlap_ = false;
  bool pair_core_joint_ = false;
  std::size_t last_activation_peak_ = 0;
  GradsReadyHook grads_ready_;
  Tensor lookup_grads_;  // defer_lookup_grads: the lookups' part of a tied embedding's gradient
};

}  // namespace nsatron
