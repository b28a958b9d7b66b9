#include "core/model/model.h"

#include "core/model/layer_activations.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "core/device/device.h"
#include "core/model/dense_core.h"
#include "core/model/nsa_core_cuda.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/linear.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/swiglu.h"
#include "core/ops/vocab_parallel_cross_entropy.h"
#include "core/util/error.h"
#include "core/util/op_timer.h"
#include "nsa/nsa.h"

// Time this statement's op under a family name when op_timer is on (benchmarks).
#define NSA_TIMED_CONCAT2(a, b) a##b
#define NSA_TIMED_CONCAT(a, b) NSA_TIMED_CONCAT2(a, b)
#define TIMED(family) ::nsatron::op_timer::Scope NSA_TIMED_CONCAT(timed_scope_, __LINE__)(family, device_)

namespace nsatron {

RecomputePolicy parse_recompute_policy(const std::string& s) {
  if (s == "none") return RecomputePolicy::None;
  if (s == "selective") return RecomputePolicy::Selective;
  if (s == "full") return RecomputePolicy::Full;
  throw UserError("recompute.policy: unknown policy '" + s + "'");
}

Attention parse_attention(const std::string& s) {
  if (s == "nsa") return Attention::Nsa;
  if (s == "dense") return Attention::Dense;
  throw UserError("model.attention: unknown attention '" + s + "' (\"nsa\" or \"dense\")");
}

const char* attention_name(Attention a) { return a == Attention::Dense ? "dense" : "nsa"; }

ModelDims ModelDims::from_config(const RunConfig& c) {
  ModelDims d{};
  d.attention = parse_attention(c.model.attention);
  d.V = c.model.vocab_size;
  d.C = c.model.d_model;
  d.L = c.model.n_layers;
  d.H = c.model.n_heads;
  d.G = c.model.n_kv_heads;
  d.D = c.model.head_dim;
  d.F = c.model.ffn_hidden;
  d.cmp_block = c.nsa.cmp_block;
  d.cmp_stride = c.nsa.cmp_stride;
  d.sel_block = c.nsa.sel_block;
  d.sel_count = c.nsa.sel_count;
  d.window = c.nsa.window;
  d.rope_theta = c.model.rope_theta;
  d.norm_eps = c.model.norm_eps;
  d.init_std = c.model.init_std;
  d.tie_embeddings = c.model.tie_embeddings;
  return d;
}


nsa::NsaDims ModelDims::core_dims(std::int64_t B, std::int64_t T) const {
  nsa::NsaDims d;
  d.B = B;
  d.T = T;
  d.H = H;
  d.G = G;
  d.D = D;
  d.cmp_block = cmp_block;
  d.cmp_stride = cmp_stride;
  d.sel_block = sel_block;
  d.sel_count = sel_count;
  d.window = window;
  d.rope_theta = rope_theta;
  return d;
}

namespace {

template <class F> void dispatch_real(DType t, F&& f) {
  if (t == DType::F32) return f(float{});
  if (t == DType::F64) return f(double{});
  throw std::invalid_argument("the CPU model computes in fp32 or fp64, not " + std::string(dtype_name(t)));
}

nsa::DenseDims dense_dims(const ModelDims& m, std::int64_t B, std::int64_t T) {
  return {B, T, m.H, m.G, m.D, m.rope_theta};
}

// The fused projection's rows per group, part by part: NSA [q (h*D), k_cmp, v_cmp, k_slc,
// v_slc, k_win, v_win (D each), gate (3h)]; dense [q (h*D), k (D), v (D)]. Each part's tensor
// is [N, G * width] (all groups of a token contiguous).
std::vector<std::int64_t> part_widths(const ModelDims& m) {
  const std::int64_t h = m.heads_per_group(), D = m.D;
  if (m.attention == Attention::Dense) return {h * D, D, D};
  const std::array<std::int64_t, 8> widths = m.core_dims(1, 1).input_widths();  // the core's (nsa/nsa.h)
  return {widths.begin(), widths.end()};
}

// Where the parts live in LayerActivations, in the same order.
std::vector<Tensor LayerActivations::*> part_members(Attention attention) {
  using A = LayerActivations;
  if (attention == Attention::Dense) return {&A::q, &A::k, &A::v};
  return {&A::q, &A::k_cmp, &A::v_cmp, &A::k_slc, &A::v_slc, &A::k_win, &A::v_win, &A::gate};
}

// Splitting the projection (p -> parts) and gathering the gradients back (parts -> p): p
// [N, projection_pitch()] holds per token row the G groups' columns, group g's part k at
// g * group width + o_k, then the pad; part k is [N, G * w_k], group g at g * w_k. A grouped,
// padded column split (core/ops/elementwise.h), one pass over the bytes on either device.
// On rows [r0, r1) of p and of the parts (a layer's row part, model.h).
void split_or_gather(const ModelDims& m, Tensor& p, std::span<Tensor* const> parts, std::int64_t r0, std::int64_t r1,
                     bool to_parts) {
  const PackedColumns layout{.groups = m.G, .pitch = m.projection_pitch(), .zero_pad = !to_parts};
  Tensor p_rows = p.slice0(r0, r1);
  std::vector<Tensor> views;  // the parts' rows
  for (Tensor* t : parts) views.push_back(t->slice0(r0, r1));
  std::vector<Tensor*> ptrs;
  for (Tensor& t : views) ptrs.push_back(&t);
  if (to_parts)
    split_columns(p_rows, ptrs, layout);
  else
    join_columns(std::vector<const Tensor*>(ptrs.begin(), ptrs.end()), p_rows, layout);
}

// The NSA core's inputs: the split projection kept in `a` and the layer's compression
// parameters (W: part name -> weight tensor).
template <class Real, class Weights>
nsa::NsaInputs<Real> core_inputs(const LayerActivations& a, const Weights& W) {
  return {a.q.data<Real>(),     a.k_cmp.data<Real>(),     a.v_cmp.data<Real>(),          a.k_slc.data<Real>(),
          a.v_slc.data<Real>(), a.k_win.data<Real>(),     a.v_win.data<Real>(),          a.gate.data<Real>(),
          W("attn/cmp_wk").template data<Real>(), W("attn/cmp_wv").template data<Real>(),
          W("attn/cmp_pk").template data<Real>(), W("attn/cmp_pv").template data<Real>()};
}

// The NSA core's saved state lives in std::vectors, outside the Tensor allocator's count: note
// its bytes in the CPU memory statistics for as long as it is held, so that
// last_activation_peak_bytes() includes it.
template <class Real>
std::shared_ptr<void> hold_saved(std::unique_ptr<nsa::NsaSaved<Real>> saved) {
  const std::size_t bytes = saved->bytes();
  note_alloc(Device::CPU, bytes);
  return std::shared_ptr<void>(saved.release(), [bytes](void* p) {
    delete static_cast<nsa::NsaSaved<Real>*>(p);
    note_free(Device::CPU, bytes);
  });
}

// last_activation_peak_bytes()'s window: the peak of `device`'s memory from its construction on,
// above what was live then (the CPU's peak is reset too on CUDA: the saved state noted there).
class ActivationPeakWindow {
 public:
  explicit ActivationPeakWindow(Device device) : device_(device), base_(memory_stats(device).current) {
    reset_peak_memory(device);
    if (device == Device::CUDA) reset_peak_memory(Device::CPU);
  }
  std::size_t bytes() const {
    const std::size_t peak = memory_stats(device_).peak;
    return peak > base_ ? peak - base_ : 0;
  }

 private:
  Device device_;
  std::size_t base_;
};

}  // namespace

NsaTransformer::Ids NsaTransformer::device_ids(std::span<const std::int32_t> host, bool keep_copy) const {
  Ids ids;
  ids.span = host;
  if (keep_copy && device_ == Device::CPU) {  // the caller's buffer may change before the backward
    ids.host_copy.assign(host.begin(), host.end());
    ids.span = ids.host_copy;
  }
  if (device_ == Device::CPU || host.empty()) return ids;
  auto on_device = [&](const void* data, std::size_t bytes) {
    auto copy = std::make_shared<Storage>(bytes, device_);
    copy_to_device_async(copy->data(), data, bytes);  // no wait for the device
    ids.device_copies.push_back(copy);
    return copy->data();
  };
  ids.span = {static_cast<const std::int32_t*>(on_device(host.data(), host.size_bytes())), host.size()};
  return ids;
}

NsaTransformer::NsaTransformer(const ModelDims& d, DType dtype, Device device, const ModelShard& shard)
    : dims_(d), local_(d), tp_(shard.tp), tp_rank_(shard.tp_rank), tp_group_(shard.tp_group), dtype_(dtype),
      device_(device) {
  if (device == Device::CPU && dtype == DType::BF16)
    throw UserError("the CPU model computes in fp32 (or fp64 for tests), not bf16");
  if (device == Device::CUDA && dtype == DType::F64) throw UserError("the CUDA model computes in bf16 or fp32");
  if (tp_ < 1 || tp_rank_ < 0 || tp_rank_ >= tp_) throw std::invalid_argument("ModelShard: tp_rank outside [0, tp)");
  if (tp_ > 1) {
    if (!tp_group_ || tp_group_->size() != tp_ || tp_group_->rank() != tp_rank_)
      throw std::invalid_argument("ModelShard: tensor parallelism needs its tp group (size tp, rank tp_rank)");
    if (d.G % tp_ != 0 || d.F % tp_ != 0 || d.V < tp_)
      throw UserError("tensor parallelism: tp = " + std::to_string(tp_) + " must divide n_kv_heads = " +
                      std::to_string(d.G) + " and ffn_hidden = " + std::to_string(d.F) +
                      " and not exceed vocab_size = " + std::to_string(d.V));
  }
  const ShardGeometry g = shard_geometry(
      d, tp_, tp_rank_,
      shard.chunks.empty() ? std::vector<LayerRange>{{shard.layer_begin, shard.layer_end}} : shard.chunks);
  local_ = g.local;
  chunks_ = g.chunks;
  std::int64_t previous_end = 0;
  for (const auto& [begin, end] : chunks_) {
    if (begin < previous_end || begin >= end || end > d.L)
      throw std::invalid_argument("ModelShard: layers [" + std::to_string(begin) + ", " + std::to_string(end) +
                                  ") outside the model's " + std::to_string(d.L) +
                                  " or not after the previous chunk's");
    previous_end = end;
  }
  vocab_begin_ = g.vocab_begin;
  vocab_end_ = g.vocab_end;

  declare_parameters(params_, d, g);
  params_.allocate(dtype == DType::F64 ? DType::F64 : DType::F32, device);
  compute_ = dtype == params_.flat_weights().dtype() ? params_.flat_weights()
                                                      : Tensor::empty({params_.total()}, dtype, device);
}

NsaTransformer::ShardGeometry NsaTransformer::shard_geometry(const ModelDims& d, int tp, int tp_rank,
                                                            std::vector<LayerRange> chunks) {
  if (chunks.empty()) throw std::invalid_argument("ModelShard: no layers");
  for (auto& range : chunks)
    if (range.second < 0) range.second = d.L;
  ShardGeometry g{d, tp_rank, std::move(chunks), d.V * tp_rank / tp, d.V * (tp_rank + 1) / tp};
  g.local.H = d.H / tp;
  g.local.G = d.G / tp;
  g.local.F = d.F / tp;
  return g;
}

// Every parameter this rank holds, in the order of the flat buffers (docs/parallel.md has
// the blocks of each under tensor parallelism).
void NsaTransformer::declare_parameters(ParamStore& store, const ModelDims& d, const ShardGeometry& g) {
  const bool first = g.first(), last = g.last();
  const double std = d.init_std, resid_std = d.init_std / std::sqrt(2.0 * double(d.L));
  const double cmp_std = 1.0 / std::sqrt(double(d.cmp_block * d.D));  // keeps the compressed K/V at the scale of k/v
  const std::int64_t Vl = g.vocab_end - g.vocab_begin, Gl = g.local.G, Hl = g.local.H, Fl = g.local.F, Pg = d.group_width();
  // This rank's block `local` of a tensor whose dimension `dim` (rows 0, columns 1) has
  // `extent` entries in all, starting at entry `start`.
  auto block = [](Shape local, int dim, std::int64_t extent, std::int64_t start) {
    ShardPlacement p;
    p.global_shape = local;
    p.global_shape[std::size_t(dim)] = extent;
    p.offset.assign(local.size(), 0);
    p.offset[std::size_t(dim)] = start;
    return p;
  };
  ShardPlacement replicated;
  replicated.replica = g.tp_rank > 0;
  if (first || (d.tie_embeddings && last)) {
    ShardPlacement vocab = block({Vl, d.C}, 0, d.V, g.vocab_begin);
    vocab.replica = !first;  // the last stage's copy of a tied embedding
    store.declare("model/embedding", {Vl, d.C}, true, std, false, vocab);
  }
  for (const auto& [layer_begin, layer_end] : g.chunks) {  // the rank's layers in increasing order
    for (std::int64_t l = layer_begin; l < layer_end; ++l) {
      store.declare(layer_name(l, "attn_norm"), {d.C}, false, 0, true, replicated);
      store.declare(layer_name(l, "attn/wqkv"), {Gl * Pg, d.C}, true, std,
                      false, block({Gl * Pg, d.C}, 0, d.G * Pg, g.tp_rank * Gl * Pg));
      if (d.attention == Attention::Nsa) {  // the compression maps (dense attention has none)
        for (const char* part : {"attn/cmp_wk", "attn/cmp_wv"})
          store.declare(layer_name(l, part), {Gl, d.cmp_block * d.D, d.D}, true, cmp_std, false,
                        block({Gl, d.cmp_block * d.D, d.D}, 0, d.G, g.tp_rank * Gl));
        for (const char* part : {"attn/cmp_pk", "attn/cmp_pv"})
          store.declare(layer_name(l, part), {Gl, d.cmp_block, d.D}, false, std, false,
                        block({Gl, d.cmp_block, d.D}, 0, d.G, g.tp_rank * Gl));
      }
      store.declare(layer_name(l, "attn/wo"), {d.C, Hl * d.D}, true, resid_std, false,
                      block({d.C, Hl * d.D}, 1, d.H * d.D, g.tp_rank * Hl * d.D));
      store.declare(layer_name(l, "mlp_norm"), {d.C}, false, 0, true, replicated);
      for (const char* part : {"mlp/w_gate", "mlp/w_up"})  // adjacent: together the [2F, C] input matrix
        store.declare(layer_name(l, part), {Fl, d.C}, true, std, false, block({Fl, d.C}, 0, d.F, g.tp_rank * Fl));
      store.declare(layer_name(l, "mlp/w_out"), {d.C, Fl}, true, resid_std, false,
                      block({d.C, Fl}, 1, d.F, g.tp_rank * Fl));
    }
  }
  if (last) {
    store.declare("model/final_norm", {d.C}, false, 0, true, replicated);
    if (!d.tie_embeddings)
      store.declare("model/lm_head", {Vl, d.C}, true, std, false, block({Vl, d.C}, 0, d.V, g.vocab_begin));
  }
}

std::vector<ParamInfo> NsaTransformer::rank_parameters(const ModelDims& d, int tp, int tp_rank, std::int64_t layer_begin,
                                                       std::int64_t layer_end) {
  return rank_parameters(d, tp, tp_rank, std::vector<LayerRange>{{layer_begin, layer_end}});
}

std::vector<ParamInfo> NsaTransformer::rank_parameters(const ModelDims& d, int tp, int tp_rank,
                                                       const std::vector<LayerRange>& chunks) {
  ParamStore store;  // declarations only: nothing is allocated
  declare_parameters(store, d, shard_geometry(d, tp, tp_rank, chunks));
  return store.infos();
}

std::vector<std::string> NsaTransformer::parameter_names(const ModelDims& d) {
  ParamStore store;  // declarations only: nothing is allocated
  declare_parameters(store, d, shard_geometry(d, 1, 0, {{0, d.L}}));
  std::vector<std::string> names;
  for (const auto& p : store.infos()) names.push_back(p.name);
  return names;
}

void NsaTransformer::sync_compute_weights() {
  if (compute_.raw() != params_.flat_weights().raw()) cast(params_.flat_weights(), compute_);
}

Tensor NsaTransformer::weight(const std::string& name) const {
  const ParamInfo& p = params_.info(name);
  return compute_.slice0(p.offset, p.offset + p.numel).view(p.shape);
}

// The fused projection over padded rows. cuBLASLt takes its fast kernels only for extents
// that are multiples of 8, which G * group_width() rarely is (1572 at the 125M config: the
// three products at 23-39% of the bf16 peak, 69-72% over 1576 or 1600 columns; bench/ops_gpu,
// docs/performance.md). So on CUDA the products run over all projection_pitch() columns of
// p and dp, with a copy of wqkv whose pad rows are zero (made per call: 2.4 MB at 125M), and
// dW's pad rows in a scratch that is dropped; p's pad columns come out zero and dp's are zero
// (split_or_gather's join writes them), so the used columns get the same sums as over the
// used extent alone. The CPU runs the products over the used columns.
// Where the NSA core reads p in place (projection_in_place), the copy's rows are also regrouped
// part by part (model.h), and dW's scratch regrouped back before its add.
Tensor NsaTransformer::projection_weight(const Tensor& w) const {
  if (!projection_products_padded()) return w;
  TIMED("matmul");
  return padded_projection(w);
}

void NsaTransformer::projection_forward(const Tensor& xn, const Tensor& wp, Tensor& p) const {
  TIMED("matmul");
  if (projection_products_padded()) return linear_forward(xn, wp, nullptr, p);
  linear_forward(xn, wp, nullptr, p, local_.projection_pitch());
}

void NsaTransformer::projection_backward_dx(const Tensor& dp, const Tensor& xn, const Tensor& wp, Tensor& dxn) const {
  TIMED("matmul");
  if (projection_products_padded()) return linear_backward(dp, xn, wp, {.dx = &dxn});
  linear_backward(dp, xn, wp, {.dx = &dxn, .dy_pitch = local_.projection_pitch()});
}

void NsaTransformer::projection_backward_dw(const Tensor& dp, const Tensor& xn, const Tensor& wp, Tensor& dw) const {
  TIMED("matmul");
  const std::int64_t pitch = local_.projection_pitch(), used = dw.dim(0);
  if (!projection_products_padded()) return linear_backward(dp, xn, wp, {.dw = &dw, .dy_pitch = pitch});
  Tensor dwp = Tensor::zeros({pitch, wp.dim(1)}, dw.dtype(), device_);
  linear_backward(dp, xn, wp, {.dw = &dwp});
  if (!projection_regrouped()) {
    add_(dw, dwp.slice0(0, used));  // dW += dp^T xn over the used rows: the product's own fp32 sum
    return;
  }
  Tensor dwg = Tensor::empty({used, wp.dim(1)}, dw.dtype(), device_);  // the parameter's row order
  regroup_rows(dwp, dwg, part_widths(local_), local_.G, false);
  add_(dw, dwg);
}

Tensor NsaTransformer::padded_projection(const Tensor& w) const {
  const std::int64_t pitch = local_.projection_pitch(), used = w.dim(0);
  Tensor wp = act({pitch, w.dim(1)});
  if (projection_regrouped())
    regroup_rows(w, wp, part_widths(local_), local_.G, true);
  else
    wp.slice0(0, used).copy_from(w);
  wp.slice0(used, pitch).zero_();
  return wp;
}

Tensor NsaTransformer::act(const Shape& shape) const { return Tensor::empty(shape, dtype_, device_); }
// Per-row statistics (rstd, loss): fp32 on CUDA, the compute dtype on the CPU.
Tensor NsaTransformer::stat(const Shape& shape) const {
  return Tensor::empty(shape, device_ == Device::CUDA ? DType::F32 : dtype_, device_);
}

std::string NsaTransformer::layer_name(std::int64_t l, const char* part) {
  return "model/layers." + std::to_string(l) + "/" + part;
}

const Tensor NsaTransformer::head_weight() const { return weight(dims_.tie_embeddings ? "model/embedding" : "model/lm_head"); }
Tensor NsaTransformer::head_grad() const {
  return params_.grad(dims_.tie_embeddings ? "model/embedding" : "model/lm_head");
}

void NsaTransformer::report_grads(const std::string& prefix) const {
  if (!grads_ready_) return;
  std::int64_t begin = -1, end = -1, numel = 0;
  for (const ParamInfo& p : params_.infos()) {
    if (p.name.compare(0, prefix.size(), prefix) != 0) continue;
    begin = begin < 0 ? p.offset : std::min(begin, p.offset);
    end = std::max(end, p.offset + p.numel);
    numel += p.numel;
  }
  if (begin < 0) throw std::logic_error("report_grads: no parameter named " + prefix + "*");
  if (end - begin != numel) throw std::logic_error("report_grads: the parameters " + prefix + "* are not contiguous");
  grads_ready_(begin, end);
}

Tensor NsaTransformer::mlp_in(const Tensor& flat, std::int64_t l) const {
  const ParamInfo& g = params_.info(layer_name(l, "mlp/w_gate"));
  return flat.slice0(g.offset, g.offset + 2 * g.numel).view({2 * g.shape[0], g.shape[1]});
}

void NsaTransformer::tp_sum(Tensor& t) const {
  if (tp_ == 1) return;
  TIMED("tp all-reduce");
  tp_group_->all_reduce(t);
}

void NsaTransformer::tp_finish_sums() const {
  if (tp_ == 1) return;
  TIMED("tp all-reduce");
  tp_group_->wait_all();
}

void NsaTransformer::tp_pass_on(Tensor& t) const {
  if (tp_ == 1) return;
  TIMED("tp all-reduce");
  tp_group_->wait_all();
  tp_group_->start_all_reduce(t);
}

std::vector<NsaTransformer::RowPart> NsaTransformer::parts_of(std::int64_t B, std::int64_t T) const {
  const int n = row_parts(B);
  std::vector<RowPart> parts;
  for (int k = 0; k < n; ++k) parts.push_back({k, n, B * k / n, B * (k + 1) / n, T});
  return parts;
}

// Vocab-parallel (tp > 1): this rank's rows of the table, zeros for the tokens another rank
// owns (summed over the ranks), and in the backward only the owned tokens' gradient rows: the
// ops' shard options, so a rank owning few of the ids (rank 1 on byte text) has little to add.
EmbeddingOptions NsaTransformer::embedding_shard() const { return {vocab_begin_, dims_.V}; }

Tensor NsaTransformer::embed(const Ids& tokens, std::int64_t N) const {
  Tensor x = act({N, dims_.C});
  {
    TIMED("embedding");
    embedding_forward(tokens.span, weight("model/embedding"), x, embedding_shard());
  }
  tp_sum(x);
  return x;
}

void NsaTransformer::embedding_grad(const Ids& tokens, Tensor& dx) {
  Tensor g = lookup_grads_.defined() ? lookup_grads_ : params_.grad("model/embedding");
  TIMED("embedding");
  embedding_backward(tokens.span, dx, g, embedding_shard());
}

void NsaTransformer::defer_lookup_grads(bool on) {
  if (!on) {
    lookup_grads_ = Tensor();
    return;
  }
  if (!dims_.tie_embeddings || !whole_model())
    throw std::logic_error("defer_lookup_grads: for a tied embedding on a rank that holds the whole model");
  const Tensor g = params_.grad("model/embedding");
  lookup_grads_ = Tensor::zeros(g.shape(), g.dtype(), g.device());
}

void NsaTransformer::add_lookup_grads() {
  if (!lookup_grads_.defined()) throw std::logic_error("add_lookup_grads: the lookups' gradient is not deferred");
  Tensor g = params_.grad("model/embedding");
  {
    TIMED("embedding");
    add_(g, lookup_grads_);
    lookup_grads_.zero_();
  }
  report_grads("model/embedding");
}

Tensor NsaTransformer::forward_layers(int chunk, const Ids& tokens, const Tensor* input, std::int64_t B,
                                      std::int64_t T) const {
  Stream s{chunk_first(chunk) ? embed(tokens, B * T) : *input, Tensor()};
  const auto [layer_begin, layer_end] = chunk_layers(chunk);
  for (std::int64_t l = layer_begin; l < layer_end; ++l) {
    Stream out;
    layer_forward(l, s, &out, nullptr, Keep::Nothing, B, T);
    s = std::move(out);
  }
  tp_finish_sums();  // the last layer's (row parts)
  sum_stream(s);
  return s.x;
}

NsaTransformer::Keep NsaTransformer::keep_mode(std::int64_t l) const {
  switch (policy_) {
    case RecomputePolicy::None: return Keep::All;
    case RecomputePolicy::Selective: return Keep::Selective;
    case RecomputePolicy::Full: return l < recompute_layers_ ? Keep::Input : Keep::All;
  }
  return Keep::All;
}

void NsaTransformer::core_forward(std::int64_t l, LayerActivations& a, Tensor& o, bool save, std::int64_t B,
                                  std::int64_t T) const {
  if (dims_.attention == Attention::Dense) {
    TIMED("dense attention forward");
    dense_core_forward(dense_dims(local_, B, T), a, o, save);
    return;
  }
  TIMED("nsa core forward");
  auto W = [&](const char* part_name) { return weight(layer_name(l, part_name)); };
  const nsa::NsaDims dims = local_.core_dims(B, T);
  if (device_ == Device::CUDA) {
    a.nsa_saved = nsa_core_forward_cuda(dims, a, W, o, save);
    return;
  }
  dispatch_real(dtype_, [&](auto tag) {
    using Real = decltype(tag);
    auto kept = save ? std::make_unique<nsa::NsaSaved<Real>>() : nullptr;
    nsa::nsa_forward<Real>(dims, core_inputs<Real>(a, W), o.data<Real>(), kept.get());
    if (kept) a.nsa_saved = hold_saved(std::move(kept));
  });
}

void NsaTransformer::core_backward(std::int64_t l, const LayerActivations& a, const Tensor& d_o,
                                   Tensor* const dparts[], Tensor* dproj, std::int64_t B, std::int64_t T) {
  if (dims_.attention == Attention::Dense) {
    TIMED("dense attention backward");
    dense_core_backward(dense_dims(local_, B, T), a, d_o, *dparts[0], *dparts[1], *dparts[2]);
    return;
  }
  TIMED("nsa core backward");
  auto W = [&](const char* part_name) { return weight(layer_name(l, part_name)); };
  auto G = [&](const char* part_name) { return params_.grad(layer_name(l, part_name)); };
  if (!a.nsa_saved) throw std::logic_error("core_backward: the forward saved no state for the backward");
  const nsa::NsaDims dims = local_.core_dims(B, T);
  if (device_ == Device::CUDA) {
    nsa_core_backward_cuda(dims, a, W, G, d_o, dparts, dproj);
    return;
  }
  dispatch_real(dtype_, [&](auto tag) {
    using Real = decltype(tag);
    nsa::NsaGrads<Real> gr{dparts[0]->data<Real>(), dparts[1]->data<Real>(), dparts[2]->data<Real>(),
                           dparts[3]->data<Real>(), dparts[4]->data<Real>(), dparts[5]->data<Real>(),
                           dparts[6]->data<Real>(), dparts[7]->data<Real>(), G("attn/cmp_wk").data<Real>(),
                           G("attn/cmp_wv").data<Real>(), G("attn/cmp_pk").data<Real>(), G("attn/cmp_pv").data<Real>()};
    nsa::nsa_backward<Real>(dims, core_inputs<Real>(a, W), *static_cast<const nsa::NsaSaved<Real>*>(a.nsa_saved.get()),
                            d_o.data<Real>(), gr);
  });
}

void NsaTransformer::norm_stream(Stream& s, const Tensor& w, Tensor& y, Tensor& rstd) const {
  TIMED("rmsnorm");
  if (!s.h.defined()) return rmsnorm_forward(s.x, w, y, rstd, local_.norm_eps);
  add_rmsnorm_forward(s.h, s.x, w, s.x, y, rstd, local_.norm_eps);
  s.h = Tensor();
}

void NsaTransformer::sum_stream(Stream& s) const {
  if (!s.h.defined()) return;
  TIMED("residual add");
  add(s.h, s.x, s.x);
  s.h = Tensor();
}

void NsaTransformer::layer_forward(std::int64_t l, Stream& in, Stream* out, LayerActivations* acts, Keep keep,
                                   std::int64_t B, std::int64_t T) const {
  LayerInFlight f;
  f.pass_on = row_parts(B) > 1;
  layer_attention_forward(l, in, f, keep, B, T);
  layer_mlp_forward(l, f, out, acts, keep, B, T);
}

void NsaTransformer::layer_attention_forward(std::int64_t l, Stream& in, LayerInFlight& f, Keep keep, std::int64_t B,
                                             std::int64_t T) const {
  attention_project(l, in, f, nullptr, B, T);
  core_forward(l, f.a, f.a.o, keep == Keep::All, B, T);
  attention_output(l, in, f, B * T);
}

void NsaTransformer::attention_project(std::int64_t l, Stream& in, LayerInFlight& f, const Tensor* joint_p,
                                       std::int64_t B, std::int64_t T) const {
  const ModelDims& m = local_;
  const std::int64_t N = B * T;
  auto W = [&](const char* part) { return weight(layer_name(l, part)); };
  f.parts = parts_of(B, T);
  const std::vector<RowPart>& parts = f.parts;
  LayerActivations& a = f.a;
  // Allocations in this order (the memory plan replays it: core/model/plan.cpp).
  a.rstd1 = stat({N});
  a.xn = act({N, m.C});
  Tensor p;
  Tensor wqkv;                 // projection_weight: made by the first part, dropped after the last's product
  std::vector<Tensor*> split;  // the core's inputs as tensors of their own (not in place)
  // Attention: the norm and projection per row part, the NSA core over the whole micro-batch
  // (its kernels lose efficiency on fewer sequences), the output product, its sum per part.
  for (const RowPart& r : parts) {
    if (r.index > 0) tp_finish_sums();  // the previous layer's last part's output, read here
    Stream s{r.of(in.x), r.of(in.h)};
    Tensor xn = r.of(a.xn), rstd = r.of(a.rstd1);
    norm_stream(s, W("attn_norm"), xn, rstd);  // the previous layer's residual add too
    if (r.index + 1 == r.count) in.h = Tensor();
    if (r.index == 0) {
      p = joint_p ? *joint_p : act({N, m.projection_pitch()});  // rows padded (model.h)
      if (projection_in_place()) a.proj = p;  // the core reads its columns
      wqkv = projection_weight(W("attn/wqkv"));
    }
    Tensor pr = r.of(p);
    projection_forward(xn, wqkv, pr);
    if (r.index + 1 == r.count) wqkv = Tensor();
    if (r.index == 0 && !projection_in_place()) {
      const std::vector<std::int64_t> widths = part_widths(m);
      const std::vector<Tensor LayerActivations::*> members = part_members(m.attention);
      for (std::size_t k = 0; k < widths.size(); ++k) {
        a.*members[k] = act({N, m.G * widths[k]});
        split.push_back(&(a.*members[k]));
      }
    }
    if (!split.empty()) {
      TIMED("split/gather projection");
      split_or_gather(m, p, split, r.r0(), r.r1(), true);
    }
  }
  if (!joint_p) a.o = act({N, m.H * m.D});  // (before p goes: the memory plan's order)
}

void NsaTransformer::attention_output(std::int64_t l, Stream& in, LayerInFlight& f, std::int64_t N) const {
  f.attn_out = act({N, local_.C});
  // (One product: with parts, only the second part's product would run beside the first's sum.)
  { TIMED("matmul"); linear_forward(f.a.o, weight(layer_name(l, "attn/wo")), nullptr, f.attn_out); }
  for (const RowPart& r : f.parts) f.sum(*this, r.of(f.attn_out));  // row-parallel wo: every rank's heads
  f.a.x = in.x;
}

void NsaTransformer::layer_mlp_forward(std::int64_t l, LayerInFlight& f, Stream* out, LayerActivations* acts,
                                       Keep keep, std::int64_t B, std::int64_t T) const {
  const ModelDims& m = local_;
  const std::int64_t N = B * T;
  auto W = [&](const char* part) { return weight(layer_name(l, part)); };
  const std::vector<RowPart>& parts = f.parts;
  LayerActivations& a = f.a;
  a.h = act({N, m.C});
  a.hn = act({N, m.C});
  a.rstd2 = stat({N});
  for (const RowPart& r : parts) {  // MLP
    Tensor h = r.of(a.h), hn = r.of(a.hn), rstd = r.of(a.rstd2);
    { TIMED("rmsnorm"); add_rmsnorm_forward(r.of(a.x), r.of(f.attn_out), W("mlp_norm"), h, hn, rstd, m.norm_eps); }
    if (r.index + 1 == r.count) f.attn_out = Tensor();
    if (r.index == 0) a.u = act({N, 2 * m.F});
    Tensor u = r.of(a.u);
    { TIMED("matmul"); linear_forward(hn, mlp_in(compute_, l), nullptr, u); }
    if (r.index == 0) a.act = act({N, m.F});
    Tensor activation = r.of(a.act);
    { TIMED("swiglu"); swiglu_forward(u, activation); }
    if (out) {  // (a recompute for the backward needs the activations, not the output)
      if (r.index == 0) out->x = act({N, m.C});
      Tensor x_rows = r.of(out->x);
      { TIMED("matmul"); linear_forward(activation, W("mlp/w_out"), nullptr, x_rows); }
      f.sum(*this, x_rows);  // row-parallel w_out
    } else if (parts.size() > 1) {
      tp_finish_sums();  // the last part's attention output, read next
    }
  }
  if (out) out->h = a.h;  // h + out->x: added by the next norm

  if (acts) {
    switch (keep) {
      case Keep::Nothing: break;
      case Keep::Input: acts->x = a.x; break;
      case Keep::Selective:
        a.xn = a.hn = a.act = Tensor();
        a.drop_core_saved();
        *acts = std::move(a);
        break;
      case Keep::All: *acts = std::move(a); break;
    }
  }
  a = LayerActivations();  // what is not kept goes now (the memory plan frees it here)
}

void NsaTransformer::complete_for_backward(std::int64_t l, LayerActivations& a, std::int64_t B, std::int64_t T) const {
  const ModelDims& m = local_;
  const std::int64_t N = B * T;
  if (!a.h.defined()) {  // full recompute: only the input was kept
    // Its forward's sums are blocking collectives; a sum the pairs' backwards started (the
    // other micro-batch's phase) is waited for first (no call between a start and wait_all).
    tp_finish_sums();
    Stream in{a.x, Tensor()};
    layer_forward(l, in, nullptr, &a, Keep::All, B, T);
    return;
  }
  auto W = [&](const char* part) { return weight(layer_name(l, part)); };
  if (!a.xn.defined()) {
    a.xn = act({N, m.C});
    { TIMED("rmsnorm"); rmsnorm_forward(a.x, W("attn_norm"), a.xn, a.rstd1, m.norm_eps); }
  }
  if (!a.hn.defined()) {
    a.hn = act({N, m.C});
    { TIMED("rmsnorm"); rmsnorm_forward(a.h, W("mlp_norm"), a.hn, a.rstd2, m.norm_eps); }
  }
  if (!a.act.defined()) {
    a.act = act({N, m.F});
    { TIMED("swiglu"); swiglu_forward(a.u, a.act); }
  }
  if (!a.core_saved()) {
    Tensor o = act({N, m.H * m.D});  // equals a.o bit for bit
    core_forward(l, a, o, true, B, T);
  }
}

void NsaTransformer::layer_backward(std::int64_t l, StageState& st, LayerGradInFlight& g) {
  LayerActivations& a = st.acts[std::size_t(l - chunk_layers(st.chunk).first)];
  layer_mlp_backward(l, a, g, st.B, st.T);
  tp_finish_sums();
  layer_attention_backward(l, a, g, st.B, st.T);
  tp_finish_sums();
  layer_backward_done(l, st, g);
}

void NsaTransformer::layer_mlp_backward(std::int64_t l, LayerActivations& a, LayerGradInFlight& g, std::int64_t B,
                                        std::int64_t T) {
  complete_for_backward(l, a, B, T);
  const ModelDims& m = local_;
  const std::int64_t N = B * T;
  auto W = [&](const char* part) { return weight(layer_name(l, part)); };
  auto G = [&](const char* part) { return params_.grad(layer_name(l, part)); };
  const std::vector<RowPart> parts = parts_of(B, T);
  const Tensor& dx_out = g.dx_out;
  // Each part's gradient of a column-parallel product's input (w_gate/w_up, wqkv) is summed over
  // the tensor-parallel ranks while the next part's is computed, the last while the weight
  // gradients (over every row, which need neither the sums nor the parts) are.

  // MLP: x' = h + w_out(swiglu(w_in(rmsnorm(h))))
  Tensor dact, du;
  for (const RowPart& r : parts) {
    if (r.index == 0) {
      dact = act({N, m.F});
      du = act({N, 2 * m.F});
    }
    Tensor du_rows = r.of(du);
    {
      Tensor dact_rows = r.of(dact);
      { TIMED("matmul"); linear_backward(r.of(dx_out), r.of(a.act), W("mlp/w_out"), {.dx = &dact_rows}); }
      TIMED("swiglu");
      swiglu_backward(dact_rows, r.of(a.u), du_rows);
    }
    if (r.index + 1 == r.count) dact = Tensor();
    if (r.index == 0) g.dhn = act({N, m.C});
    Tensor dhn_rows = r.of(g.dhn);
    { TIMED("matmul"); linear_backward(du_rows, r.of(a.hn), mlp_in(compute_, l), {.dx = &dhn_rows}); }
    tp_pass_on(dhn_rows);
  }
  {
    Tensor g_out = G("mlp/w_out"), g_in = mlp_in(params_.flat_grads(), l);
    TIMED("matmul");
    linear_backward(dx_out, a.act, W("mlp/w_out"), {.dw = &g_out});
    linear_backward(du, a.hn, mlp_in(compute_, l), {.dw = &g_in});
  }
}

void NsaTransformer::layer_attention_backward(std::int64_t l, LayerActivations& a, LayerGradInFlight& g,
                                              std::int64_t B, std::int64_t T) {
  // Attention: h = x + wo(nsa(split(wqkv(rmsnorm(x)))))
  Tensor d_o = attention_backward_output(l, a, g, nullptr);
  const Tensor dp = core_backward_to_projection(l, a, d_o, B, T);
  d_o = Tensor();
  attention_backward_project(l, a, g, dp, B, T);
}

Tensor NsaTransformer::core_backward_to_projection(std::int64_t l, const LayerActivations& a, const Tensor& d_o,
                                                   std::int64_t B, std::int64_t T) {
  const ModelDims& m = local_;
  const std::int64_t N = B * T;
  // dp's rows padded as p's; the pad columns zero (the join or zero_columns writes them:
  // projection_backward_dx reads them on CUDA).
  Tensor dp = act({N, m.projection_pitch()});
  if (a.proj.defined()) {  // the core writes its gradients into dp's columns
    core_backward(l, a, d_o, nullptr, &dp, B, T);
    TIMED("split/gather projection");
    zero_columns(dp, m.G * m.group_width(), m.projection_pitch());
    return dp;
  }
  std::vector<Tensor> dpart_tensors;  // the core's input gradients as tensors of their own
  for (std::int64_t width : part_widths(m)) dpart_tensors.push_back(act({N, m.G * width}));
  std::vector<Tensor*> dparts;
  for (Tensor& t : dpart_tensors) dparts.push_back(&t);
  core_backward(l, a, d_o, dparts.data(), nullptr, B, T);
  TIMED("split/gather projection");
  split_or_gather(m, dp, dparts, 0, N, false);
  return dp;
}

Tensor NsaTransformer::attention_backward_output(std::int64_t l, LayerActivations& a, LayerGradInFlight& g,
                                                 const Tensor* joint_d_o) {
  g.dh = act(g.dhn.shape());
  Tensor g_mlp_norm = params_.grad(layer_name(l, "mlp_norm"));
  {
    TIMED("rmsnorm");
    rmsnorm_backward(g.dhn, a.h, weight(layer_name(l, "mlp_norm")), a.rstd2, g.dh, g_mlp_norm, &g.dx_out);
  }
  g.dhn = Tensor();
  Tensor d_o = joint_d_o ? *joint_d_o : act({a.o.dim(0), a.o.dim(1)});
  { TIMED("matmul"); linear_backward(g.dh, a.o, weight(layer_name(l, "attn/wo")), {.dx = &d_o}); }
  return d_o;
}

void NsaTransformer::attention_backward_project(std::int64_t l, LayerActivations& a, LayerGradInFlight& g,
                                                const Tensor& dp, std::int64_t B, std::int64_t T) {
  const std::int64_t N = B * T;
  auto W = [&](const char* part) { return weight(layer_name(l, part)); };
  auto G = [&](const char* part) { return params_.grad(layer_name(l, part)); };
  a.drop_core_saved();
  g.dxn = act({N, local_.C});
  Tensor wqkv = projection_weight(W("attn/wqkv"));  // for every part's dX and dW
  // wo's weight gradient runs beside the first part's sum (with parts: only the small dX
  // product of the second part would be there), wqkv's beside the last.
  Tensor g_wo = G("attn/wo"), g_wqkv = G("attn/wqkv");
  for (const RowPart& r : parts_of(B, T)) {
    Tensor dxn_rows = r.of(g.dxn);
    projection_backward_dx(r.of(dp), r.of(a.xn), wqkv, dxn_rows);
    tp_pass_on(dxn_rows);
    if (r.index == 0) {
      TIMED("matmul");
      linear_backward(g.dh, a.o, W("attn/wo"), {.dw = &g_wo});
    }
  }
  projection_backward_dw(dp, a.xn, wqkv, g_wqkv);
}

Tensor NsaTransformer::head_loss(const Tensor& xf, const Ids& tgt, std::int64_t N, double grad_scale, Tensor* dxf) {
  const std::int64_t Vl = vocab_end_ - vocab_begin_;
  const Tensor E = head_weight();
  Tensor dE = dxf ? head_grad() : Tensor();
  // The loss stays on the device: fp64 summed over the vocab-parallel chunks, else the cross
  // entropy's own (stat dtype).
  Tensor loss = tp_ > 1 ? Tensor::empty({1}, DType::F64, device_) : stat({1});
  loss.zero_();
  CrossEntropyOptions ce;
  ce.denominator = double(N);
  ce.accumulate_loss = true;
  // Row chunks: the chunk's logits, its loss and (training) the gradient in place, then the
  // chunk's backward. Vocab-parallel, a chunk's statistics travel over the TP group while the
  // next chunk's product and statistics run, and the chunk is completed (gradient, loss,
  // backward) while the next one's travel: two chunks' logits are live at a time.
  parallel::VocabParallelCE opt;
  opt.vocab_start = vocab_begin_;
  opt.vocab_size = dims_.V;
  opt.denominator = double(N);
  struct Chunk {
    std::int64_t r0 = 0, r1 = 0;
    Tensor logits;
    parallel::VocabParallelCEChunk ce;
  };
  auto backward = [&](Chunk& c) {
    if (dxf) {
      Tensor dxc = dxf->slice0(c.r0, c.r1);
      TIMED("matmul");
      linear_backward(c.logits, xf.slice0(c.r0, c.r1), E, {&dxc, &dE, nullptr});
    }
    c = Chunk();
  };
  auto complete = [&](Chunk& c) {  // vocab-parallel: once its statistics have been exchanged
    {
      TIMED("cross entropy");
      parallel::vocab_parallel_ce_finish(c.ce, dxf ? grad_scale : 0.0, loss);
    }
    backward(c);
  };
  Chunk previous;
  for (std::int64_t r0 = 0; r0 < N; r0 += head_chunk_) {
    Chunk c{r0, std::min(N, r0 + head_chunk_), Tensor(), {}};
    const Tensor xc = xf.slice0(c.r0, c.r1);
    const auto targets = tgt.span.subspan(std::size_t(c.r0), std::size_t(c.r1 - c.r0));
    c.logits = act({c.r1 - c.r0, Vl});
    { TIMED("matmul"); linear_forward(xc, E, nullptr, c.logits); }
    if (tp_ > 1) {
      tp_finish_sums();  // the previous chunk's exchange, timed as the TP group's wait
      {
        TIMED("cross entropy");
        c.ce = parallel::vocab_parallel_ce_start(*tp_group_, c.logits, targets, opt);
      }
      if (previous.logits.defined()) complete(previous);
      previous = std::move(c);
      continue;
    }
    if (dxf) {
      TIMED("cross entropy");
      cross_entropy_fused(c.logits, targets, loss, grad_scale, ce);
    } else {
      TIMED("cross entropy");
      Tensor lse = stat({c.r1 - c.r0});
      cross_entropy_forward(c.logits, targets, loss, lse, ce);
    }
    backward(c);
  }
  if (previous.logits.defined()) {
    tp_finish_sums();
    complete(previous);
  }
  if (dxf) tp_sum(*dxf);  // vocab-parallel head: every rank's share of the gradient
  return loss;
}

NsaTransformer::Stream NsaTransformer::stage_begin(StageState& st, int chunk, std::span<const std::int32_t> tokens,
                                                   const Tensor* input, std::int64_t B, std::int64_t T,
                                                   double grad_scale) {
  const std::int64_t N = B * T;
  const auto [layer_begin, layer_end] = chunk_layers(chunk);
  st.chunk = chunk;
  st.B = B;
  st.T = T;
  st.grad_scale = grad_scale;
  Stream s;
  if (chunk_first(chunk)) {
    if (std::int64_t(tokens.size()) != N) throw std::invalid_argument("stage_forward: tokens must hold B*T ids");
    st.ids = device_ids(tokens, true);  // a pipeline refills the caller's batch before the backward
    s.x = embed(st.ids, N);
  } else {
    if (!input || input->shape() != Shape{N, dims_.C})
      throw std::invalid_argument("stage_forward: a later pipeline stage needs its input [B*T, C]");
    s.x = *input;
  }
  st.acts.resize(std::size_t(layer_end - layer_begin));
  return s;
}

void NsaTransformer::stage_end(StageState& st, Stream& s, std::span<const std::int32_t> targets) {
  const ModelDims& m = dims_;
  const std::int64_t N = st.B * st.T;
  if (!chunk_last(st.chunk)) {
    sum_stream(s);
    st.output = s.x;
    return;
  }
  if (std::int64_t(targets.size()) != N) throw std::invalid_argument("stage_forward: targets must hold B*T ids");
  const Ids tgt = device_ids(targets);
  Tensor rstdf = stat({N}), xf = act({N, m.C});
  norm_stream(s, weight("model/final_norm"), xf, rstdf);  // the last layer's residual add too
  const Tensor x = s.x;
  s.x = Tensor();
  Tensor dxf = act({N, m.C});
  st.loss = head_loss(xf, tgt, N, st.grad_scale, &dxf);
  if (!m.tie_embeddings) report_grads("model/lm_head");
  xf = Tensor();
  st.d_last = act({N, m.C});
  Tensor g_final = params_.grad("model/final_norm");
  { TIMED("rmsnorm"); rmsnorm_backward(dxf, x, weight("model/final_norm"), rstdf, st.d_last, g_final); }
  report_grads("model/final_norm");
}

StageState NsaTransformer::stage_forward(int chunk, std::span<const std::int32_t> tokens,
                                         std::span<const std::int32_t> targets, const Tensor* input, std::int64_t B,
                                         std::int64_t T, double grad_scale) {
  StageState st;
  Stream s = stage_begin(st, chunk, tokens, input, B, T, grad_scale);
  const auto [layer_begin, layer_end] = chunk_layers(chunk);
  for (std::int64_t l = layer_begin; l < layer_end; ++l) {
    Stream out;
    layer_forward(l, s, &out, &st.acts[std::size_t(l - layer_begin)], keep_mode(l), B, T);
    s = std::move(out);
  }
  tp_finish_sums();  // the last layer's (row parts)
  stage_end(st, s, targets);
  return st;
}

Tensor NsaTransformer::stage_backward(StageState& st, const Tensor* d_output) {
  const auto [layer_begin, layer_end] = chunk_layers(st.chunk);
  LayerGradInFlight g;  // g.dx_out: the gradient of the current layer's output
  if (chunk_last(st.chunk)) {
    g.dx_out = std::exchange(st.d_last, Tensor());
  } else {
    if (!d_output || d_output->shape() != Shape{st.B * st.T, dims_.C})
      throw std::invalid_argument("stage_backward: a stage before the last needs the gradient of its output");
    g.dx_out = *d_output;
  }
  st.output = Tensor();
  for (std::int64_t l = layer_end - 1; l >= layer_begin; --l) layer_backward(l, st, g);
  if (!chunk_first(st.chunk)) return g.dx_out;
  embedding_backward_step(st, g.dx_out);
  return Tensor();
}

void NsaTransformer::layer_backward_done(std::int64_t l, StageState& st, LayerGradInFlight& g) {
  LayerActivations& a = st.acts[std::size_t(l - chunk_layers(st.chunk).first)];
  Tensor dx_in = act(g.dxn.shape());
  Tensor g_attn_norm = params_.grad(layer_name(l, "attn_norm"));
  {
    TIMED("rmsnorm");
    rmsnorm_backward(g.dxn, a.x, weight(layer_name(l, "attn_norm")), a.rstd1, dx_in, g_attn_norm, &g.dh);
  }
  g.dh = g.dxn = Tensor();
  report_grads(layer_name(l, ""));
  a = LayerActivations();
  g = LayerGradInFlight();
  g.dx_out = std::move(dx_in);
}

void NsaTransformer::embedding_backward_step(StageState& st, Tensor dx) {
  embedding_grad(st.ids, dx);
  // A tied embedding split over pipeline stages gets its other part from the trainer, and
  // deferred lookups theirs from add_lookup_grads.
  if (!dims_.tie_embeddings || (last_stage() && !lookup_grads_.defined())) report_grads("model/embedding");
}

double NsaTransformer::forward_backward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                                        std::int64_t B, std::int64_t T, double grad_scale) {
  return forward_backward_queued(tokens, targets, B, T, grad_scale).to_vector()[0];
}

Tensor NsaTransformer::forward_backward_queued(std::span<const std::int32_t> tokens,
                                               std::span<const std::int32_t> targets, std::int64_t B, std::int64_t T,
                                               double grad_scale) {
  if (!whole_model())
    throw std::logic_error("forward_backward runs the whole model; a pipeline stage uses stage_forward/backward");
  const ActivationPeakWindow peak(device_);
  StageState st = stage_forward(tokens, targets, nullptr, B, T, grad_scale);
  stage_backward(st, nullptr);
  last_activation_peak_ = peak.bytes();
  return st.loss;
}

std::array<Tensor, 2> NsaTransformer::forward_backward_pair_queued(const std::array<MicroBatchIds, 2>& micro_batches,
                                                                  std::int64_t B, std::int64_t T, double grad_scale,
                                                                  const std::function<void(int)>& before_backward) {
  if (!whole_model())
    throw std::logic_error("forward_backward_pair_queued runs the whole model; a pipeline stage uses stage_forward/backward");
  if (row_parts(B) > 1)
    throw std::logic_error("forward_backward_pair_queued: not with row parts (tp_overlap)");
  if (dims_.tie_embeddings && !lookup_grads_.defined())
    throw std::logic_error("forward_backward_pair_queued: a tied embedding needs defer_lookup_grads (the lookups' "
                           "gradient added after the heads', as without pairs)");
  const ActivationPeakWindow peak(device_);
  std::array<StageState, 2> st;
  std::array<Stream, 2> s;
  for (int i = 0; i < 2; ++i) s[i] = stage_begin(st[i], 0, micro_batches[i].tokens, nullptr, B, T, grad_scale);
  // With the cores joint (set_pair_core_joint), each layer's [2N, pitch] projection, from the
  // layer's forward to its backward (the micro-batches' activations hold views of its rows and
  // of the core's output, and both the core's saved state).
  std::vector<Tensor> joint_proj(static_cast<std::size_t>(dims_.L));
  const std::int64_t N = B * T;
  const auto rows_of = [N](const Tensor& t, int i) { return t.slice0(i * N, (i + 1) * N); };
  // Layer by layer, the two micro-batches' halves in turn: each half's sum (tp_pass_on) waits
  // for the one started before it, the other micro-batch's, which the half between had to hide.
  // With the cores joint: both projections, the core, both outputs; the second micro-batch's
  // norm first waits for its last sum (beside the first's norm and projection).
  for (std::int64_t l = 0; l < dims_.L; ++l) {
    std::array<LayerInFlight, 2> f;
    for (int i = 0; i < 2; ++i) f[i].pass_on = true;
    if (pair_core_joint(l)) {
      Tensor& p = joint_proj[std::size_t(l)];
      p = act({2 * N, local_.projection_pitch()});
      for (int i = 0; i < 2; ++i) {
        if (i == 1) tp_finish_sums();
        const Tensor rows = rows_of(p, i);
        attention_project(l, s[i], f[i], &rows, B, T);
      }
      Tensor o = act({2 * N, local_.H * local_.D});
      LayerActivations both;
      both.proj = p;
      core_forward(l, both, o, true, 2 * B, T);
      for (int i = 0; i < 2; ++i) {
        f[i].a.o = rows_of(o, i);
        f[i].a.nsa_saved = both.nsa_saved;
        attention_output(l, s[i], f[i], N);
      }
    } else {
      for (int i = 0; i < 2; ++i) layer_attention_forward(l, s[i], f[i], keep_mode(l), B, T);
    }
    for (int i = 0; i < 2; ++i) {
      Stream out;
      layer_mlp_forward(l, f[i], &out, &st[i].acts[std::size_t(l)], keep_mode(l), B, T);
      s[i] = std::move(out);
    }
  }
  tp_finish_sums();  // the second micro-batch's last w_out sum
  const auto turn = [&](int i) {  // micro-batch i's work follows
    if (before_backward) before_backward(i);
  };
  for (int i = 0; i < 2; ++i) {  // the heads, k's then k + 1's
    turn(i);
    stage_end(st[i], s[i], micro_batches[i].targets);
  }
  // The backwards layer by layer in turn, each phase's sums (tp_pass_on) waited for by the
  // other micro-batch's next phase, whose work they ran beside.
  std::array<LayerGradInFlight, 2> g;
  for (int i = 0; i < 2; ++i) g[i].dx_out = std::exchange(st[i].d_last, Tensor());
  for (std::int64_t l = dims_.L - 1; l >= 0; --l) {
    for (int i = 0; i < 2; ++i) {
      turn(i);
      if (l + 1 < dims_.L) layer_backward_done(l + 1, st[i], g[i]);
      layer_mlp_backward(l, st[i].acts[std::size_t(l)], g[i], B, T);
    }
    if (!pair_core_joint(l)) {
      for (int i = 0; i < 2; ++i) {
        turn(i);
        layer_attention_backward(l, st[i].acts[std::size_t(l)], g[i], B, T);
      }
      continue;
    }
    // The cores joint: both MLP norms' backwards and wo's input gradients (the second's first
    // waits for its MLP phase's sums, beside its MLP weight gradients and the first's work),
    // the core's backward once, then each micro-batch's projection gradients and sums.
    Tensor d_o = act({2 * N, local_.H * local_.D});
    for (int i = 0; i < 2; ++i) {
      turn(i);
      if (i == 1) tp_finish_sums();
      const Tensor rows = rows_of(d_o, i);
      attention_backward_output(l, st[i].acts[std::size_t(l)], g[i], &rows);
    }
    Tensor dp;
    {
      LayerActivations both;
      both.proj = std::exchange(joint_proj[std::size_t(l)], Tensor());
      both.nsa_saved = st[0].acts[std::size_t(l)].nsa_saved;
      for (int i = 0; i < 2; ++i) st[i].acts[std::size_t(l)].drop_core_saved();  // freed after the backward
      dp = core_backward_to_projection(l, both, d_o, 2 * B, T);
    }
    d_o = Tensor();
    for (int i = 0; i < 2; ++i) {
      turn(i);
      attention_backward_project(l, st[i].acts[std::size_t(l)], g[i], rows_of(dp, i), B, T);
    }
  }
  for (int i = 0; i < 2; ++i) {
    turn(i);
    if (i == 1) tp_finish_sums();  // (k's were waited for by k + 1's last phase)
    layer_backward_done(0, st[i], g[i]);
    embedding_backward_step(st[i], g[i].dx_out);
    g[i] = LayerGradInFlight();
    st[i].ids = DeviceIds();
  }
  last_activation_peak_ = peak.bytes();
  return {st[0].loss, st[1].loss};
}

Tensor NsaTransformer::stage_evaluate(int chunk, std::span<const std::int32_t> tokens,
                                      std::span<const std::int32_t> targets, const Tensor* input, std::int64_t B,
                                      std::int64_t T, double* loss) {
  const ModelDims& m = dims_;
  const std::int64_t N = B * T;
  const bool first = chunk_first(chunk), last = chunk_last(chunk);
  if (!first && (!input || input->shape() != Shape{N, m.C}))
    throw std::invalid_argument("stage_evaluate: a later pipeline stage needs its input [B*T, C]");
  if ((first && std::int64_t(tokens.size()) != N) || (last && std::int64_t(targets.size()) != N))
    throw std::invalid_argument("stage_evaluate: tokens/targets must hold B*T ids");
  Tensor x = forward_layers(chunk, first ? device_ids(tokens) : Ids{}, input, B, T);
  if (!last) return x;
  const Ids tgt = device_ids(targets);
  Tensor rstdf = stat({N}), xf = act({N, m.C});
  { TIMED("rmsnorm"); rmsnorm_forward(x, weight("model/final_norm"), xf, rstdf, m.norm_eps); }
  *loss = head_loss(xf, tgt, N, 0.0, nullptr).to_vector()[0];
  return Tensor();
}

double NsaTransformer::evaluate(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                                std::int64_t B, std::int64_t T) {
  if (!whole_model()) throw std::logic_error("evaluate runs the whole model; a stage uses stage_evaluate");
  double loss = 0;
  stage_evaluate(tokens, targets, nullptr, B, T, &loss);
  return loss;
}

Tensor NsaTransformer::last_logits(std::span<const std::int32_t> tokens, std::int64_t B, std::int64_t T) {
  const ModelDims& m = dims_;
  if (tp_ > 1 || !whole_model())
    throw std::logic_error("last_logits needs the whole model on one rank");
  const Ids ids = device_ids(tokens);
  Tensor x = forward_layers(0, ids, nullptr, B, T);
  Tensor last = act({B, m.C});
  for (std::int64_t b = 0; b < B; ++b) last.slice0(b, b + 1).copy_from(x.slice0(b * T + T - 1, b * T + T));
  Tensor rstd = stat({B}), xf = act({B, m.C});
  { TIMED("rmsnorm"); rmsnorm_forward(last, weight("model/final_norm"), xf, rstd, m.norm_eps); }
  Tensor logits = act({B, m.V});
  { TIMED("matmul"); linear_forward(xf, head_weight(), nullptr, logits); }
  return logits;
}

double ModelDims::flops_per_token(std::int64_t T) const {
  const ModelDims& m = *this;
  // Matrix products: 2 flops per multiply-add, forward; the LM head included.
  const double per_layer_matrix = double(m.G * m.group_width() * m.C + m.C * m.H * m.D + 3 * m.F * m.C);
  double forward = 2.0 * (double(m.L) * per_layer_matrix + double(m.V * m.C));
  if (m.attention == Attention::Dense) {
    // Per query and head, 4*D flops per key attended (scores and values), over its causal
    // keys s <= t: (T+1)/2 on average.
    forward += double(m.L) * 4.0 * double(m.H * m.D) * double(T + 1) / 2.0;
    return 3.0 * forward;
  }
  // Compression maps: per block and group, two [l*D] x [l*D, D] products.
  const std::int64_t blocks = T >= m.cmp_block ? (T - m.cmp_block) / m.cmp_stride + 1 : 0;
  forward += double(m.L) * double(blocks) * double(m.G) * 2.0 * 2.0 * double(m.cmp_block * m.D * m.D) / double(T);
  // Attention: per query and head, 4*D flops per key attended (scores and values), over
  // the visible compressed blocks, the tokens of the selected blocks, and the window.
  double keys = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t cmp = t >= m.cmp_block - 1 ? std::min(blocks, (t - m.cmp_block + 1) / m.cmp_stride + 1) : 0;
    const std::int64_t bt = t / m.sel_block;
    const std::int64_t sel = std::min<std::int64_t>(m.sel_count, bt + 1) * m.sel_block - (m.sel_block - 1 - t % m.sel_block);
    const std::int64_t win = std::min<std::int64_t>(m.window, t + 1);
    keys += double(cmp + std::min<std::int64_t>(sel, t + 1) + win);
  }
  forward += double(m.L) * 4.0 * double(m.H * m.D) * keys / double(T);
  return 3.0 * forward;
}

}  // namespace nsatron
