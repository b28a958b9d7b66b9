#include "core/model/plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/pipeline_schedule.h"
#include "core/model/params.h"
#include "nsa/nsa.h"

namespace nsatron {

ParameterCount count_parameters(const ModelDims& dims) {
  ParameterCount c;
  for (const ParamInfo& p : NsaTransformer::rank_parameters(dims)) {
    c.total += p.numel;
    if (p.name == "model/embedding" || p.name == "model/lm_head") c.embedding += p.numel;
  }
  return c;
}

namespace {

// Live bytes and their running peak, as memory_stats counts them.
class Ledger {
 public:
  void alloc(std::int64_t bytes) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  void free(std::int64_t bytes) { live_ -= bytes; }
  std::int64_t live() const { return live_; }
  std::int64_t peak() const { return peak_; }

 private:
  std::int64_t live_ = 0, peak_ = 0;
};

// The bytes of one micro-batch's tensors on this rank (N = B*T rows; local dims: H, G, F
// divided by tp, the vocabulary rows of this tp rank). The names are model.cpp's.
struct Sizes {
  std::int64_t x = 0;        // act [N, C]: x, a.xn, attn_out, a.h, a.hn, x_out, xf, dxf, d_last,
                             //   dhn, dh, dxn, dx_in, and the pipeline's messages
  std::int64_t row = 0;      // stat [N]: a.rstd1, a.rstd2, rstdf
  std::int64_t packed = 0;   // act [N, projection_pitch]: p, dp (rows padded to 64 elements)
  std::int64_t wpad = 0;     // CUDA, projection_pitch > used: padded_projection's act [pitch, C]
  std::int64_t dwpad = 0;    //   and projection_backward's fp32 [pitch, C] scratch for dW
  std::int64_t proj = 0;     // act [N, G*group_width]: the parts (a.q ... a.gate or a.q, a.k,
                             //   a.v) together; dpart_tensors together. In place: p itself
                             //   ([N, projection_pitch], kept as a.proj), no parts
  bool in_place = false;     // CUDA NSA: NsaTransformer::projection_in_place
  std::int64_t o = 0;        // act [N, H*D]: a.o, d_o, the recomputed o of complete_for_backward
  std::int64_t u = 0;        // act [N, 2F]: a.u, du
  std::int64_t f = 0;        // act [N, F]: a.act, dact
  std::int64_t saved = 0;    // the core's saved state: NSA's NsaSaved (CPU) / NsaSavedCuda, noted by
                             //   hold_saved / nsa_core_forward_cuda; dense: attn_lse [N, H] (fp32 on CUDA)
  std::int64_t saved_pair = 0;  // CUDA NSA: the saved state of a pair's joint core (2B sequences)
  bool dense = false;        // dense attention allocates its lse even when it keeps none
  int parts = 1;             // the layer's row parts around the core (NsaTransformer::row_parts)
  std::int64_t ids = 0;      // CUDA: st.ids, the device copy of the tokens (tp > 1: also the rebased ids
                             //   and the ownership mask); the CPU reads the host vectors (not counted)
  std::int64_t targets = 0;  // CUDA: tgt, the device copy of the targets
  std::int64_t loss = 0;     // head_loss's loss {1} (stat; fp64 with tp > 1), kept as st.loss to the step's end
  std::int64_t logits = 0;   // head_loss's first (largest) chunk of logits [min(N, chunk), V/tp]
  std::int64_t ce_scratch = 0;  // tp > 1: vocab_parallel_ce_start's fp64 [(3 tp + 4) rows] scratch
  std::int64_t next_logits = 0;      // tp > 1: the second chunk's logits and scratch, live beside
  std::int64_t next_ce_scratch = 0;  //   the first's while the first's statistics travel
};

Sizes sizes(const ModelDims& dims, const ActivationPlan& p, std::int64_t vocab_rows) {
  ModelDims m = dims;  // this rank's share, as NsaTransformer::local_dims()
  m.H /= p.tp;
  m.G /= p.tp;
  m.F /= p.tp;
  const std::int64_t N = p.micro_batch * p.seq_len;
  const bool cuda = p.device == Device::CUDA;
  const std::int64_t e = std::int64_t(dtype_size(p.dtype));       // act(): the compute dtype
  const std::int64_t s = cuda ? 4 : std::int64_t(dtype_size(p.dtype));  // stat(): fp32 on CUDA
  Sizes z;
  z.x = N * m.C * e;
  z.row = N * s;
  z.packed = N * m.projection_pitch() * e;
  z.in_place = cuda && m.attention == Attention::Nsa && p.projection_in_place;
  const bool regrouped = z.in_place && m.G > 1;  // as NsaTransformer::projection_regrouped
  if (cuda && (m.projection_padded() || regrouped)) {  // as NsaTransformer::projection_forward
    z.wpad = m.projection_pitch() * m.C * e;
    z.dwpad = m.projection_pitch() * m.C * 4;
    if (regrouped) z.dwpad += m.G * m.group_width() * m.C * 4;  // and dW regrouped back
  }
  z.proj = z.in_place ? z.packed : N * m.G * m.group_width() * e;
  z.o = N * m.H * m.D * e;
  z.u = N * 2 * m.F * e;
  z.f = N * m.F * e;
  z.dense = m.attention == Attention::Dense;
  if (z.dense) {
    z.saved = N * m.H * s;  // dense_core_forward's lse: fp32 on CUDA, the compute dtype on the CPU
  } else {
    const nsa::NsaDims c = m.core_dims(p.micro_batch, p.seq_len);
    if (cuda) {
      // NsaSavedCuda's block (nsa::cuda_saved_layout, which the CUDA code allocates by): for bf16
      // with the fp32 branch outputs the backward's do . o_c reads.
      z.saved = std::int64_t(nsa::cuda_saved_layout(c, p.dtype == DType::BF16 && p.nsa_saved_outputs).total);
      z.saved_pair = std::int64_t(
          nsa::cuda_saved_layout(m.core_dims(2 * p.micro_batch, p.seq_len), p.dtype == DType::BF16 && p.nsa_saved_outputs)
              .total);
    } else if (p.dtype == DType::F64) {
      z.saved = std::int64_t(nsa::NsaSaved<double>::bytes_for(c));
    } else {
      z.saved = std::int64_t(nsa::NsaSaved<float>::bytes_for(c));
    }
  }
  z.parts = NsaTransformer::row_parts(p.tp_overlap, p.tp, p.micro_batch);
  if (cuda) {
    z.ids = N * 4;      // device_ids(tokens)
    z.targets = N * 4;  // device_ids(targets)
  }
  const std::int64_t rows = std::min(N, p.head_chunk);
  z.loss = p.tp > 1 ? 8 : s;
  z.logits = rows * vocab_rows * e;
  z.ce_scratch = p.tp > 1 ? (3 * p.tp + 4) * rows * 8 : 0;
  const std::int64_t next_rows = p.tp > 1 ? std::min(N - rows, p.head_chunk) : 0;
  z.next_logits = next_rows * vocab_rows * e;
  z.next_ce_scratch = next_rows > 0 ? (3 * p.tp + 4) * next_rows * 8 : 0;
  return z;
}

enum class Keep { Input, Selective, All };  // NsaTransformer::Keep as keep_mode() chooses it

// One pipeline stage of the model (pp = 1: the whole model), replayed on a ledger: every
// alloc/free below is a Tensor (or noted state) of model.cpp, named after it.
class StageReplay {
 public:
  StageReplay(const Sizes& z, const ActivationPlan& p, bool first, bool last, std::int64_t begin, std::int64_t end,
              Ledger& ledger)
      : z_(z), p_(p), first_(first), last_(last), begin_(begin), end_(end), led_(ledger) {}

  // stage_forward of one micro-batch. A later stage's input (pipeline: RecvForward) is
  // already live and becomes its first layer's a.x. Not the last stage: returns with the
  // last layer's output live (st.output, the message to send).
  void forward() {
    begin();
    for (std::int64_t l = begin_; l < end_; ++l) layer_forward(keep(l), /*x_out=*/true);
    end();
  }

  // forward_backward_pair_queued (tensor parallelism's micro-batch pairs, pp = 1): two
  // micro-batches' replays on one ledger, their layers' halves in turn, then each one's head,
  // then their backwards' phases in turn.
  // With the cores joint (ActivationPlan::pair_core_joint), a layer's [2N, ...] projection and
  // core output are allocated once for both and freed with the second's activations (the
  // first's hold views); its saved state (for 2B sequences) goes after the joint backward, and
  // that backward's [2N, ...] d_o and dp within it.
  static void forward_backward_pair(StageReplay& first, StageReplay& second) {
    Ledger& led = first.led_;
    const Sizes& z = first.z_;
    first.begin();
    second.begin();
    StageReplay* const pair[2] = {&first, &second};
    for (std::int64_t l = first.begin_; l < first.end_; ++l) {
      if (first.joint(l)) {
        led.alloc(2 * z.proj);  // the joint projection
        for (StageReplay* r : pair) r->attention_project(/*own_p=*/false);
        led.alloc(2 * z.o);  // the joint output
        led.alloc(z.saved_pair);
        for (StageReplay* r : pair) r->led_.alloc(z.x);  // attn_out
      } else {
        for (StageReplay* r : pair) r->layer_attention_forward(r->keep(l));
      }
      first.layer_mlp_forward(first.keep(l), /*x_out=*/true);
      second.layer_mlp_forward(second.keep(l), /*x_out=*/true);
    }
    first.end();
    second.end();
    // The backwards layer by layer in turn, by layer_backward's phases.
    for (StageReplay* r : pair) r->dx_owned_ = r->last_;  // st.d_last
    for (std::int64_t l = first.end_ - 1; l >= first.begin_; --l) {
      const bool joint_after = l + 1 < first.end_ && first.joint(l + 1);
      for (int i = 0; i < 2; ++i) {
        if (l + 1 < first.end_) pair[i]->layer_backward_done(joint_after ? i + 1 : 0);
        pair[i]->complete_for_backward(pair[i]->keep(l));
        pair[i]->layer_mlp_backward();
      }
      if (!first.joint(l)) {
        for (StageReplay* r : pair) r->layer_attention_backward();
        continue;
      }
      led.alloc(2 * z.o);  // the joint d_o
      for (StageReplay* r : pair) r->attention_backward_output(/*own_d_o=*/false);
      led.alloc(2 * z.packed);  // the joint dp
      led.free(z.saved_pair);   // after the core's backward
      led.free(2 * z.o);        // d_o = Tensor()
      for (StageReplay* r : pair) r->attention_backward_project();
      led.free(2 * z.packed);  // dp
    }
    const bool joint_first = first.joint(first.begin_);
    for (int i = 0; i < 2; ++i) {
      pair[i]->layer_backward_done(joint_first ? i + 1 : 0);
      pair[i]->led_.free(pair[i]->z_.x);    // embedding_backward_step(dx) done: dx
      pair[i]->led_.free(pair[i]->z_.ids);  // st.ids
    }
  }

  // stage_begin: a later stage's input is already live.
  void begin() {
    if (first_) {
      led_.alloc(z_.ids);  // st.ids (kept to the embedding's backward)
      led_.alloc(z_.x);    // x = embed(...): layer begin's a.x
    }
  }

  // stage_end: the last stage's head, or the output to send.
  void end() {
    if (!last_) {  // sum_stream: x (the last layer's output, its residual added) becomes st.output
      release_h();
      return;
    }
    led_.alloc(z_.targets);  // tgt
    led_.alloc(z_.row);      // rstdf
    led_.alloc(z_.x);        // xf
    release_h();             // norm_stream: the last layer's residual added
    led_.alloc(z_.x);        // dxf
    // head_loss: per row chunk the logits, their loss and gradient in place, the chunk's
    // backward; the first chunk is the largest. Vocab-parallel, the next chunk's logits and
    // scratch come before the first's gradient (its statistics travel meanwhile): the first
    // two chunks are the largest pair.
    led_.alloc(z_.loss);        // loss: returned as st.loss, read (and freed) at the step's end
    ++losses_;
    led_.alloc(z_.logits);      // logits
    led_.alloc(z_.ce_scratch);  // tp > 1: vocab_parallel_ce_start's scratch
    led_.alloc(z_.next_logits);
    led_.alloc(z_.next_ce_scratch);
    led_.free(z_.ce_scratch);   // vocab_parallel_ce_finish
    led_.free(z_.logits);       // the first chunk's backward done
    led_.free(z_.next_ce_scratch);
    led_.free(z_.next_logits);
    led_.free(z_.x);        // xf = Tensor()
    led_.alloc(z_.x);       // st.d_last
    led_.free(z_.row);      // return: rstdf,
    led_.free(z_.x);        //   dxf,
    led_.free(z_.targets);  //   tgt,
    led_.free(z_.x);        //   x (the last layer's output)
  }

  // stage_backward of the oldest micro-batch. Not the last stage: the gradient of the
  // output (d_output) is live and stays so (the pipeline frees it after this). Not the first
  // stage: returns with the input's gradient live (d_input, the message to send).
  void backward() {
    dx_owned_ = last_;  // the last stage starts from st.d_last, owned by this function
    for (std::int64_t l = end_ - 1; l >= begin_; --l) {
      complete_for_backward(keep(l));
      layer_mlp_backward();
      layer_attention_backward();
      layer_backward_done();
    }
    if (!first_) return;  // dx is returned (d_input)
    led_.free(z_.x);    // embedding_grad(dx) done: dx
    led_.free(z_.ids);  // st.ids
  }

  // The step has read the losses (launch/train/step.cpp, read_losses): they go.
  void end_of_step() {
    for (; losses_ > 0; --losses_) led_.free(z_.loss);
  }

  // What a layer keeps from its forward for its backward (LayerActivations), a.x excluded
  // (it is the previous layer's output, counted there as x_out).
  std::int64_t kept(Keep k) const {
    switch (k) {
      case Keep::Input: return 0;
      // a.rstd1, the parts, a.o, a.h, a.rstd2, a.u
      case Keep::Selective: return 2 * z_.row + z_.proj + z_.o + z_.x + z_.u;
      // and a.xn, a.hn, a.act and the core's saved state
      case Keep::All: return 2 * z_.row + 3 * z_.x + z_.proj + z_.o + z_.saved + z_.u + z_.f;
    }
    return 0;
  }

 private:
  Keep keep(std::int64_t l) const {
    switch (p_.policy) {
      case RecomputePolicy::None: return Keep::All;
      case RecomputePolicy::Selective: return Keep::Selective;
      case RecomputePolicy::Full: return l < p_.recompute_layers ? Keep::Input : Keep::All;
    }
    return Keep::All;
  }

  // core_forward(save): NSA notes its saved state only when it keeps it; dense attention
  // allocates its lse either way and drops it when not saving.
  void core_forward(bool save) {
    if (z_.dense || save) led_.alloc(z_.saved);
    if (z_.dense && !save) led_.free(z_.saved);
  }

  // The previous layer's attention residual (Stream::h), when only the stream held it (its
  // layer kept no a.h), goes once the next norm has added it.
  void release_h() {
    if (h_held_) led_.free(z_.x);
    h_held_ = false;
  }

  // layer_forward(l, in, out, acts, keep): the layer's input is live already. With two row
  // parts (model.cpp) a tensor is allocated by the first part that writes it and freed after
  // the last that reads it; the core runs once, over both.
  void layer_forward(Keep k, bool x_out) {
    layer_attention_forward(k);
    layer_mlp_forward(k, x_out);
  }

  // The pair's cores run as one call on layer l (NsaTransformer::pair_core_joint).
  bool joint(std::int64_t l) const {
    return p_.micro_batch_pairs && p_.pair_core_joint && z_.in_place && keep(l) == Keep::All;
  }

  // layer_attention_forward (attention_project, the core, attention_output), then
  // layer_mlp_forward (model.cpp's halves).
  void layer_attention_forward(Keep k) {
    attention_project(/*own_p=*/true);
    if (!z_.in_place) led_.free(z_.packed);  // p = Tensor()
    const bool save = k == Keep::All;
    core_forward(save);
    led_.alloc(z_.x);     // attn_out
  }

  // attention_project: with own_p, p allocated here (else rows of a pair's joint projection),
  // and a.o at its end.
  void attention_project(bool own_p) {
    const bool two = z_.parts == 2;
    led_.alloc(z_.row);   // a.rstd1
    led_.alloc(z_.x);     // a.xn
    if (!two) release_h();  // the (last) part's norm: the previous layer's residual added
    if (own_p) led_.alloc(z_.in_place ? z_.proj : z_.packed);  // p (in place: kept as a.proj)
    led_.alloc(z_.wpad);  // projection_weight: the padded weight,
    if (!two) led_.free(z_.wpad);  //   dropped after the (last part's) product
    if (!z_.in_place) led_.alloc(z_.proj);  // the parts a.q ... (split_or_gather's targets)
    if (two) {  // part 1's norm and product
      release_h();
      led_.free(z_.wpad);
    }
    if (own_p) led_.alloc(z_.o);  // a.o
  }

  void layer_mlp_forward(Keep k, bool x_out) {
    const bool two = z_.parts == 2;
    const bool save = k == Keep::All;
    led_.alloc(z_.x);     // a.h
    led_.alloc(z_.x);     // a.hn
    led_.alloc(z_.row);   // a.rstd2
    if (!two) led_.free(z_.x);  // attn_out = Tensor() (after the last part's norm)
    led_.alloc(z_.u);     // a.u
    led_.alloc(z_.f);     // a.act
    if (x_out) led_.alloc(z_.x);  // out->x: the next layer's a.x (once its norm has added out->h)
    if (two) led_.free(z_.x);     // attn_out = Tensor() (part 1's norm)
    // What is not kept goes at the half's end (a = LayerActivations()); a.h stays while out->h holds it.
    const std::int64_t made = 2 * z_.row + 3 * z_.x + z_.proj + z_.o + (save ? z_.saved : 0) + z_.u + z_.f;
    h_held_ = x_out && k == Keep::Input;  // Selective and All keep a.h anyway
    led_.free(made - kept(k) - (h_held_ ? z_.x : 0));
  }

  // complete_for_backward: what the policy dropped, recomputed.
  void complete_for_backward(Keep k) {
    switch (k) {
      case Keep::All: return;
      case Keep::Input: layer_forward(Keep::All, /*x_out=*/false); return;  // full recompute
      case Keep::Selective:
        led_.alloc(z_.x);  // a.xn
        led_.alloc(z_.x);  // a.hn
        led_.alloc(z_.f);  // a.act
        led_.alloc(z_.o);  // o (equals a.o)
        core_forward(true);
        led_.free(z_.o);   // o, at the return
        return;
    }
  }

  // layer_backward's phases after complete_for_backward; dx_out is live. With two row parts
  // (model.cpp) the first part allocates dhn before the second drops dact.
  void layer_mlp_backward() {
    const bool two = z_.parts == 2;
    led_.alloc(z_.f);      // dact
    led_.alloc(z_.u);      // du
    if (!two) led_.free(z_.f);  // dact = Tensor() (the last part's)
    led_.alloc(z_.x);      // g.dhn
    if (two) led_.free(z_.f);   // dact = Tensor() (part 1's)
    led_.free(z_.u);       // du, at the return
  }

  // layer_attention_backward (attention_backward_output, core_backward_to_projection,
  // attention_backward_project).
  void layer_attention_backward() {
    attention_backward_output(/*own_d_o=*/true);
    led_.alloc(z_.packed);  // dp
    if (!z_.in_place) {
      led_.alloc(z_.proj);   // dpart_tensors (core_backward's outputs)
      led_.free(z_.proj);    // dpart_tensors, at the end of their scope
    }
    led_.free(z_.o);       // d_o = Tensor()
    led_.free(z_.saved);   // a.drop_core_saved()
    attention_backward_project();
    led_.free(z_.packed);  // dp, at the return
  }

  // With own_d_o, d_o allocated here (else rows of a pair's joint d_o).
  void attention_backward_output(bool own_d_o) {
    led_.alloc(z_.x);               // g.dh
    led_.free(z_.x);                // g.dhn = Tensor()
    if (own_d_o) led_.alloc(z_.o);  // d_o
  }

  void attention_backward_project() {
    led_.alloc(z_.x);      // g.dxn
    led_.alloc(z_.wpad);   // projection_weight: the padded weight (dX to dW)
    led_.alloc(z_.dwpad);  //   and dW's scratch,
    led_.free(z_.wpad + z_.dwpad);  // at its return
  }

  // The attention norm's backward, then the layer's activations and the gradient of its output
  // dropped (NsaTransformer::layer_backward_done). A layer whose pair's cores ran joint: the
  // first (pair_role 1) holds views of the joint projection and output, which go with the
  // second's (2).
  void layer_backward_done(int pair_role = 0) {
    const std::int64_t joint_parts = z_.proj + z_.o;
    led_.alloc(z_.x);      // dx_in (returned)
    led_.free(z_.x);       // g.dh,
    led_.free(z_.x);       //   g.dxn
    // st.acts[l] = {}: its a.x too (the saved state is gone)
    led_.free(kept(Keep::All) - z_.saved + z_.x + (pair_role == 1 ? -joint_parts : pair_role == 2 ? joint_parts : 0));
    if (dx_owned_) led_.free(z_.x);                // dx_out: the previous gradient
    dx_owned_ = true;
  }

  const Sizes& z_;
  const ActivationPlan& p_;
  bool first_, last_;
  std::int64_t begin_, end_;
  Ledger& led_;
  std::int64_t losses_ = 0;  // st.loss of the micro-batches this chunk ended, held to the step's end
  bool h_held_ = false;      // the last layer's a.h, held only by its output stream
  bool dx_owned_ = false;    // backward: the gradient of the current layer's output is this replay's
};

}  // namespace

std::int64_t estimate_activation_bytes(const ModelDims& dims, const ActivationPlan& p) {
  if (p.tp < 1 || p.tp_rank < 0 || p.tp_rank >= p.tp || p.pp < 1 || p.pp_stage < 0 || p.pp_stage >= p.pp)
    throw std::invalid_argument("estimate_activation_bytes: tp_rank or pp_stage outside [0, tp) or [0, pp)");
  if (dims.G % p.tp != 0 || dims.F % p.tp != 0)
    throw std::invalid_argument("estimate_activation_bytes: tp must divide n_kv_heads and ffn_hidden");
  std::vector<LayerRange> chunks = p.chunk_layers;
  if (chunks.empty()) chunks.push_back({p.layer_begin, p.layer_end < 0 ? dims.L : p.layer_end});
  std::int64_t previous_end = 0;
  for (const auto& [begin, end] : chunks) {
    if (begin < previous_end || begin >= end || end > dims.L)
      throw std::invalid_argument("estimate_activation_bytes: layers [" + std::to_string(begin) + ", " +
                                  std::to_string(end) + ") outside the model's " + std::to_string(dims.L) +
                                  " or not after the previous chunk's");
    previous_end = end;
  }
  const int V = int(chunks.size());
  if (V > 1 && (p.pp < 2 || p.micro_batches % p.pp != 0))
    throw std::invalid_argument("estimate_activation_bytes: " + std::to_string(V) + " model chunks need pp >= 2 and " +
                                "micro-batches a multiple of pp");
  const std::int64_t vocab_rows = dims.V * (p.tp_rank + 1) / p.tp - dims.V * p.tp_rank / p.tp;
  const Sizes z = sizes(dims, p, vocab_rows);
  Ledger led;
  std::vector<StageReplay> stage;  // one per model chunk
  for (const auto& [begin, end] : chunks) stage.emplace_back(z, p, begin == 0, end == dims.L, begin, end, led);

  // pp = 1: forward_backward per micro-batch (each starts from the earlier ones' losses, held
  // until the step reads them, so the last is the step's peak); with tensor parallelism's
  // micro-batch pairs, the step's last pair and an odd last micro-batch alone after it. pp > 1:
  // run_1f1b (parallel/pipeline.cpp) executing the schedule's steps, its messages included: an
  // input received becomes its chunk's first layer's a.x; an output lives until its send
  // completes; a received output gradient until its backward returns; an input gradient until
  // its send completes.
  const bool pairs = p.pp == 1 && p.tp > 1 && p.micro_batch_pairs && p.micro_batches >= 2;
  const std::int64_t odd = p.micro_batches % 2;
  const std::int64_t A = p.pp == 1 ? std::min<std::int64_t>(p.micro_batches, 1) : p.micro_batches;
  const std::int64_t earlier_losses =
      p.pp > 1 ? 0 : (pairs ? p.micro_batches - 2 - odd : std::max<std::int64_t>(p.micro_batches - 1, 0));
  for (std::int64_t i = 0; i < earlier_losses; ++i) led.alloc(z.loss);
  if (pairs) {
    StageReplay second(z, p, true, true, chunks[0].first, chunks[0].second, led);
    StageReplay::forward_backward_pair(stage[0], second);
    if (odd) {
      StageReplay alone(z, p, true, true, chunks[0].first, chunks[0].second, led);
      alone.forward();
      alone.backward();
      alone.end_of_step();
    }
    second.end_of_step();
  } else {
    // The events of run_1f1b (parallel::pipeline_events): a receive's buffer from its post
    // (posted ahead: before the computation ahead of it; else at its step), a sent message until
    // the sends are completed (posted ahead: the next sending step, or the end; else at once).
    using Op = parallel::PipelineOp;
    using Kind = parallel::PipelineEvent::Kind;
    const std::vector<parallel::PipelineStep> steps = parallel::schedule_pipeline(p.pp_stage, p.pp, A, V);
    std::int64_t sending = 0;  // messages sent and not yet completed
    for (const parallel::PipelineEvent& ev : parallel::pipeline_events(steps, p.pipeline_posts_ahead)) {
      if (ev.kind == Kind::WaitSends) {
        for (; sending > 0; --sending) led.free(z.x);
        continue;
      }
      const parallel::PipelineStep& st = steps[ev.step];
      if (ev.kind == Kind::PostRecv) {
        led.alloc(z.x);  // input[f] or d_output[b]
      } else if (st.op == Op::Forward) {
        stage[std::size_t(st.fwd_chunk)].forward();  // not the last chunk: output[f] live
      } else if (st.op == Op::Backward) {
        stage[std::size_t(st.bwd_chunk)].backward();  // not the first chunk: d_input[b] live
        if (!(st.bwd_chunk == V - 1 && p.pp_stage == p.pp - 1)) led.free(z.x);  // d_output[b] = Tensor()
      } else {
        if (parallel::has_recv(st.op) && !ev.recv_posted) led.alloc(z.x);
        if (parallel::has_send(st.op)) ++sending;  // output[f] or d_input[b], held until completed
      }
    }
  }
  for (StageReplay& s : stage) s.end_of_step();
  for (std::int64_t i = 0; i < earlier_losses; ++i) led.free(z.loss);
  if (led.live() != 0) throw std::logic_error("estimate_activation_bytes: the replay does not free what it allocates");
  return led.peak();
}

namespace {

// ZeRO-1's split of the flat buffer (parallel::partition_segments): dp contiguous ranges of
// whole tensors, each boundary the tensor boundary nearest to r * n / dp (ties: the earlier),
// never before the previous one. Returns the range starts and the end.
std::vector<std::int64_t> zero1_ranges(const std::vector<ParamInfo>& params, std::int64_t dp) {
  std::int64_t n = 0;
  std::vector<std::int64_t> bounds{0};
  for (const ParamInfo& p : params) bounds.push_back(n += p.numel);
  std::vector<std::int64_t> begin(std::size_t(dp) + 1, n);
  begin[0] = 0;
  for (std::int64_t r = 1; r < dp; ++r) {
    std::int64_t best = n;
    long double best_dist = -1;
    for (std::int64_t b : bounds) {
      if (b < begin[std::size_t(r) - 1]) continue;
      const long double dist = std::fabs((long double)b * (long double)dp - (long double)n * (long double)r);
      if (best_dist < 0 || dist < best_dist) best = b, best_dist = dist;
    }
    begin[std::size_t(r)] = best;
  }
  return begin;
}

}  // namespace

MemoryEstimate estimate_memory(const RunConfig& cfg) { return estimate_memory(cfg, true); }

MemoryEstimate estimate_memory(const RunConfig& cfg, bool nsa_saved_outputs, std::int64_t head_chunk,
                               bool projection_in_place, bool lookup_grads_apart) {
  const ModelDims dims = ModelDims::from_config(cfg);
  const std::int64_t tp = cfg.parallel.tp, pp = cfg.parallel.pp, dp = cfg.dp();
  if (tp < 1 || pp < 1 || dp < 1) throw std::invalid_argument("estimate_memory: the config is not validated for its world size");
  ActivationPlan plan;
  plan.micro_batch = cfg.train.micro_batch;
  plan.seq_len = cfg.train.seq_len;
  plan.micro_batches = cfg.grad_accum_steps();
  plan.policy = parse_recompute_policy(cfg.recompute.policy);
  plan.recompute_layers = cfg.recompute.layers < 0 ? dims.L : cfg.recompute.layers;
  plan.device = cfg.train.device == "cuda" ? Device::CUDA : Device::CPU;
  plan.dtype = cfg.train.dtype == "bf16" ? DType::BF16 : DType::F32;  // as the trainer (launch/train/setup.cpp)
  plan.nsa_saved_outputs = nsa_saved_outputs;
  plan.head_chunk = head_chunk;
  plan.projection_in_place = projection_in_place;
  plan.tp_overlap = cfg.parallel.tp_overlap;
  plan.micro_batch_pairs = cfg.parallel.tp_micro_batch_pairs;
  plan.pair_core_joint = cfg.parallel.tp_pair_core == "joint";
  // MPI between CPU ranks posts ahead, and so do the copy engines between GPUs; NCCL does not.
  const bool copy_engines = plan.device == Device::CUDA && pp > 1 && cfg.parallel.pp_transport != "nccl";
  plan.pipeline_posts_ahead = plan.device == Device::CPU || copy_engines;
  plan.tp = int(tp);
  plan.pp = int(pp);
  const std::int64_t compute_bytes = plan.dtype == DType::F32 ? 0 : std::int64_t(dtype_size(plan.dtype));

  MemoryEstimate best;
  bool any = false;
  for (std::int64_t s = 0; s < pp; ++s) {
    const std::vector<LayerRange> chunks = cfg.stage_chunks(s);
    for (std::int64_t r = 0; r < tp; ++r) {
      const std::vector<ParamInfo> params = NsaTransformer::rank_parameters(dims, int(tp), int(r), chunks);
      std::int64_t n = 0;
      for (const ParamInfo& p : params) n += p.numel;
      MemoryEstimate e;
      e.pp_stage = int(s);
      e.tp_rank = int(r);
      // NsaTransformer: params_.allocate (fp32 weights and gradients), compute_ (a copy in the
      // compute dtype when it is not fp32).
      e.weights = 4 * n + compute_bytes * n;
      e.gradients = 4 * n;
      if (lookup_grads_apart && NsaTransformer::trainer_defers_lookup_grads(dims.tie_embeddings, int(tp), int(pp)))
        for (const ParamInfo& p : params)  // the lookups' part of the embedding's gradient, apart
          if (p.name == "model/embedding") e.gradients += 4 * p.numel;
      // DataParallelOptimizer: m_, v_ over the owned range; ZeRO-1 over several ranks also
      // padded_ [dp * block] and mine_ [block], block the longest range.
      if (cfg.parallel.zero1 && dp > 1) {
        const std::vector<std::int64_t> ranges = zero1_ranges(params, dp);
        std::int64_t block = 0;
        for (std::int64_t d = 0; d < dp; ++d) block = std::max(block, ranges[std::size_t(d) + 1] - ranges[std::size_t(d)]);
        e.optimizer = 2 * 4 * block + 4 * block * dp + 4 * block;
      } else {
        e.optimizer = 2 * 4 * n;
      }
      plan.tp_rank = int(r);
      plan.pp_stage = int(s);
      plan.chunk_layers = chunks;
      e.activations = estimate_activation_bytes(dims, plan);
      // One activation: a pipeline message, a tensor-parallel sum.
      const std::int64_t message = parallel::pipeline_message_bytes(cfg.train.micro_batch, cfg.train.seq_len, dims.C,
                                                                    std::int64_t(dtype_size(plan.dtype)));
      if (copy_engines) {  // the receive slots per pipeline neighbour (launch/train/setup.cpp; "auto"
        // counted as if the copy engines are taken, its usual outcome on one host)
        const std::int64_t neighbours = pp == 2 ? 1 : 2;
        e.activations += neighbours * parallel::copy_engine_link_bytes(
                                          message, parallel::copy_engine_slots(int(pp), int(cfg.parallel.virtual_stages)));
      }
      if (plan.device == Device::CUDA && tp > 1 &&
          parallel::tp_sums_on_copy_engines(cfg.parallel.tp_transport, cfg.parallel.tp_micro_batch_pairs)) {
        // the sums' receive slots per peer (launch/train/setup.cpp)
        e.activations += (tp - 1) * parallel::copy_engine_link_bytes(message, parallel::kCopyEngineSumSlots);
      }
      if (!any || e.total() > best.total()) best = e;
      any = true;
    }
  }
  return best;
}

}  // namespace nsatron
