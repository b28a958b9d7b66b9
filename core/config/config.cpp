// Config loading and strict validation. The key table below is the single place where a key
// is declared: its type, range, meaning, and the struct field it fills.
#include "core/config/config.h"

#include <toml++/toml.h>

#include "core/config/toml_text.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace nsatron {

ConfigError::ConfigError(std::vector<std::string> msgs)
    : UserError([&] {
        std::string all;
        for (const auto& m : msgs) all += (all.empty() ? "" : "\n") + m;
        return all;
      }()),
      messages(std::move(msgs)) {}

namespace {

enum class Kind { Int, Float, Bool, String, StringList, IntList };
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::Int: return "integer";
    case Kind::Float: return "float";
    case Kind::Bool: return "boolean";
    case Kind::String: return "string";
    case Kind::StringList: return "string or array of strings";
    case Kind::IntList: return "array of integers";
  }
  return "?";
}

// "an integer", "a float", "an array of integers".
std::string with_article(const std::string& noun) {
  return (std::string("aeiou").find(noun.front()) != std::string::npos ? "an " : "a ") + noun;
}

struct Key {
  std::string section, name;
  Kind kind = Kind::Int;
  std::string doc;
  std::function<void*(RunConfig&)> field;
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  std::vector<std::string> choices;

  std::string path() const { return section + "." + name; }
  Key at_least(double v) { lo = v; return *this; }
  Key above(double v) { lo = v; lo_open = true; return *this; }
  Key below(double v) { hi = v; hi_open = true; return *this; }
  Key one_of(std::vector<std::string> c) { choices = std::move(c); return *this; }
  bool has_range() const { return lo != -kInf || hi != kInf; }
  // For an array key the range applies to each entry.
  std::string range_text() const {
    if (!choices.empty()) {
      std::string s;
      for (const auto& c : choices) s += (s.empty() ? "" : ", ") + ("\"" + c + "\"");
      return s;
    }
    if (!has_range()) return "";
    auto num = [&](double v) {
      std::ostringstream os;
      os << v;
      return os.str();
    };
    std::string s;
    if (lo != -kInf) s += (lo_open ? "> " : ">= ") + num(lo);
    if (hi != kInf) s += (s.empty() ? "" : ", ") + std::string(hi_open ? "< " : "<= ") + num(hi);
    return s;
  }
};

template <class S, class F>
Key key(const char* section, const char* name, S RunConfig::*s, F S::*f, const char* doc) {
  Key k;
  k.section = section;
  k.name = name;
  k.doc = doc;
  if constexpr (std::is_same_v<F, std::int64_t>) k.kind = Kind::Int;
  else if constexpr (std::is_same_v<F, double>) k.kind = Kind::Float;
  else if constexpr (std::is_same_v<F, bool>) k.kind = Kind::Bool;
  else if constexpr (std::is_same_v<F, std::string>) k.kind = Kind::String;
  else if constexpr (std::is_same_v<F, std::vector<std::int64_t>>) k.kind = Kind::IntList;
  else if constexpr (std::is_same_v<F, std::vector<std::string>>) k.kind = Kind::StringList;
  else static_assert(sizeof(F) == 0, "no config Kind for this field type");
  k.field = [s, f](RunConfig& c) -> void* { return &((c.*s).*f); };
  return k;
}

const std::vector<std::string>& section_order() {
  static const std::vector<std::string> order = {"model",    "nsa",  "train",      "optim", "parallel",
                                                 "recompute", "data", "checkpoint", "log"};
  return order;
}

const std::vector<Key>& keys() {
  using R = RunConfig;
  static const std::vector<Key> table = {
      key("model", "attention", &R::model, &ModelConfig::attention,
          "The attention of every layer: \"nsa\" (NSA_SPEC, configured by [nsa]) or \"dense\" (the "
          "baseline: causal grouped-query attention with RoPE, one K/V projection, no gates; [nsa] unused; "
          "docs/nsa.md, \"Dense attention\").")
          .one_of({"nsa", "dense"}),
      key("model", "vocab_size", &R::model, &ModelConfig::vocab_size,
          "Vocabulary size. The `bytes` tokenizer of `nsatron data prepare` has 256.").at_least(1),
      key("model", "d_model", &R::model, &ModelConfig::d_model, "Width of the residual stream.").at_least(1),
      key("model", "n_layers", &R::model, &ModelConfig::n_layers, "Number of transformer layers.").at_least(1),
      key("model", "n_heads", &R::model, &ModelConfig::n_heads, "Query heads per layer (H).").at_least(1),
      key("model", "n_kv_heads", &R::model, &ModelConfig::n_kv_heads,
          "Key/value heads (G, the NSA groups); must divide n_heads.").at_least(1),
      key("model", "head_dim", &R::model, &ModelConfig::head_dim,
          "Width of one head (D), even (RoPE). 0 derives d_model / n_heads.").at_least(0),
      key("model", "ffn_hidden", &R::model, &ModelConfig::ffn_hidden,
          "Hidden width of the SwiGLU MLP. 0 derives 8/3 d_model rounded up to a multiple of 64.")
          .at_least(0),
      key("model", "rope_theta", &R::model, &ModelConfig::rope_theta, "RoPE base theta.").above(0),
      key("model", "norm_eps", &R::model, &ModelConfig::norm_eps, "Epsilon of every RMSNorm.").above(0),
      key("model", "tie_embeddings", &R::model, &ModelConfig::tie_embeddings,
          "Use the token embedding as the LM head."),
      key("model", "init_std", &R::model, &ModelConfig::init_std,
          "Std of the normal initialisation; residual output projections use init_std / sqrt(2 n_layers).")
          .above(0),

      key("nsa", "cmp_block", &R::nsa, &NsaConfig::cmp_block, "l: tokens per compressed block.").at_least(1),
      key("nsa", "cmp_stride", &R::nsa, &NsaConfig::cmp_stride,
          "d: stride between compressed blocks; divides cmp_block and sel_block.").at_least(1),
      key("nsa", "sel_block", &R::nsa, &NsaConfig::sel_block,
          "l': tokens per selection block; at least cmp_block.").at_least(1),
      key("nsa", "sel_count", &R::nsa, &NsaConfig::sel_count,
          "n: blocks selected per query, the three forced ones (first, current, previous) included.")
          .at_least(3),
      key("nsa", "window", &R::nsa, &NsaConfig::window,
          "w: sliding-window width in tokens, the query's own token included.").at_least(1),

      key("train", "seq_len", &R::train, &TrainConfig::seq_len, "Tokens per training sequence.").at_least(1),
      key("train", "micro_batch", &R::train, &TrainConfig::micro_batch,
          "Sequences per forward/backward pass on one data-parallel rank.").at_least(1),
      key("train", "global_batch", &R::train, &TrainConfig::global_batch,
          "Sequences per optimizer step over all ranks; a multiple of micro_batch * dp "
          "(the quotient is the number of accumulated micro-batches).")
          .at_least(1),
      key("train", "steps", &R::train, &TrainConfig::steps, "Optimizer steps of the run.").at_least(1),
      key("train", "seed", &R::train, &TrainConfig::seed,
          "Seed of the initialisation and of the data sampler.").at_least(0),
      key("train", "device", &R::train, &TrainConfig::device, "Where the model trains.").one_of({"cpu", "cuda"}),
      key("train", "dtype", &R::train, &TrainConfig::dtype,
          "Compute precision; bf16 (with fp32 master weights) needs device \"cuda\".")
          .one_of({"fp32", "bf16"}),
      key("train", "eval_every", &R::train, &TrainConfig::eval_every,
          "Validation every this many steps; 0: never.").at_least(0),
      key("train", "eval_batches", &R::train, &TrainConfig::eval_batches,
          "Global batches of validation data per evaluation.").at_least(1),
      key("train", "max_bad_steps", &R::train, &TrainConfig::max_bad_steps,
          "A step whose loss or gradient norm is not finite is skipped (no update) and logged; "
          "this many in a row stop the run with an error.").at_least(1),
      key("train", "stop_at", &R::train, &TrainConfig::stop_at,
          "Stop after this many steps with a checkpoint, as a preempted job would, leaving the "
          "schedule of train.steps unchanged; the next run resumes. 0: run to train.steps.").at_least(0),

      key("optim", "lr", &R::optim, &OptimConfig::lr, "Peak learning rate (AdamW).").at_least(0),
      key("optim", "min_lr", &R::optim, &OptimConfig::min_lr,
          "Learning rate at the end of the decay; at most lr.").at_least(0),
      key("optim", "warmup_steps", &R::optim, &OptimConfig::warmup_steps,
          "Steps of linear warmup from 0 to lr.").at_least(0),
      key("optim", "decay", &R::optim, &OptimConfig::decay,
          "Shape of the decay from lr to min_lr after warmup.").one_of({"cosine", "linear", "constant"}),
      key("optim", "weight_decay", &R::optim, &OptimConfig::weight_decay,
          "Decoupled weight decay; not applied to norms or biases.").at_least(0),
      key("optim", "beta1", &R::optim, &OptimConfig::beta1, "AdamW beta1.").at_least(0).below(1),
      key("optim", "beta2", &R::optim, &OptimConfig::beta2, "AdamW beta2.").at_least(0).below(1),
      key("optim", "eps", &R::optim, &OptimConfig::eps, "AdamW epsilon.").above(0),
      key("optim", "grad_clip", &R::optim, &OptimConfig::grad_clip,
          "Clip the global gradient L2 norm to this; 0: no clipping.").at_least(0),

      key("parallel", "tp", &R::parallel, &ParallelConfig::tp,
          "Tensor-parallel ranks; divides n_kv_heads (NSA is sharded by KV group, at least one "
          "group per rank) and ffn_hidden (the MLP is sharded by hidden columns).")
          .at_least(1),
      key("parallel", "pp", &R::parallel, &ParallelConfig::pp,
          "Pipeline stages; divides n_layers unless pp_layers is given. Data-parallel ranks "
          "dp = world size / (tp * pp).")
          .at_least(1),
      key("parallel", "pp_layers", &R::parallel, &ParallelConfig::pp_layers,
          "Layers of each pipeline stage, first stage first (e.g. [3, 5] for pp = 2, n_layers = 8): "
          "pp entries summing to n_layers. With virtual_stages = V > 1: pp * V entries, one per model "
          "chunk in model order (chunk c runs on stage c % pp; e.g. [4, 3, 3, 2] gives stage 0 layers "
          "0-3 and 7-9 with pp = 2, V = 2). Empty: an even split.")
          .at_least(1),
      key("parallel", "virtual_stages", &R::parallel, &ParallelConfig::virtual_stages,
          "Model chunks per pipeline stage (V): with V > 1 the interleaved 1F1B schedule runs, the "
          "layers cut into pp * V equal chunks, chunk c on stage c % pp; the pipeline bubble shrinks "
          "from (pp - 1) / A to (pp - 1) / (V A) of a step (A: micro-batches per step and DP rank), "
          "for V times the messages. V > 1 needs pp >= 2, pp * V dividing n_layers (or pp_layers with "
          "pp * V entries), and A a multiple of pp (docs/parallel.md).")
          .at_least(1),
      key("parallel", "zero1", &R::parallel, &ParallelConfig::zero1,
          "Shard the AdamW moments over the data-parallel ranks (ZeRO stage 1): gradients are "
          "reduce-scattered, each rank updates its share of whole tensors, the weights are "
          "all-gathered. Same losses as without, to rounding; no effect with dp = 1."),
      key("parallel", "overlap_grad_reduce", &R::parallel, &ParallelConfig::overlap_grad_reduce,
          "Start each data-parallel gradient bucket's all-reduce during the backward of the step's "
          "last micro-batch, as soon as every gradient in it is final (buckets in backward order), "
          "instead of all after the backward: the same buckets and sums, so the same bits. On GPUs "
          "they run on a communication stream beside the backward's kernels (data parallelism "
          "alone: tp = pp = 1). Not with zero1 (docs/parallel.md); no effect with dp = 1."),
      key("parallel", "tp_overlap", &R::parallel, &ParallelConfig::tp_overlap,
          "Tensor parallelism (tp > 1): run each layer's norms, products and SwiGLU on the "
          "micro-batch in two halves of its sequences (its first micro_batch / 2, then the rest), "
          "the attention core over the whole micro-batch, so that the halves' TP all-reduces (the "
          "outputs of wo and w_out, the gradients of the norm outputs; all but the first half's wo "
          "sum) run while the other half, or the weight gradients, compute (on GPUs on the "
          "communicator's stream). Needs "
          "train.micro_batch >= 2; no effect with tp = 1. The same losses as without, to rounding "
          "(products over half the rows may take other kernels). At the 125M model on 2 H200s: "
          "even at micro_batch 16, 2% faster at 32 (docs/parallel.md)."),
      key("parallel", "tp_micro_batch_pairs", &R::parallel, &ParallelConfig::tp_micro_batch_pairs,
          "Tensor parallelism (tp > 1): run the step's micro-batches two at a time, their forwards "
          "layer by layer in turn (one micro-batch's attention, the other's, the first's MLP, the "
          "other's), so that each row-parallel output's TP all-reduce (wo's, w_out's) runs while "
          "the other micro-batch computes (on GPUs on the communicator's stream); then both heads "
          "and the backwards likewise in turn by phases of a layer, each input gradient's sum "
          "beside the other micro-batch's phase. The same operations and gradient order (a tied "
          "embedding's lookups summed apart under tp > 1, pairs or not), so the same bits as "
          "without; the activations of two micro-batches are held at once. An odd last "
          "micro-batch runs alone. Needs pp = 1 and tp_overlap = false; no effect with tp = 1 "
          "(docs/parallel.md)."),
      key("parallel", "tp_pair_core", &R::parallel, &ParallelConfig::tp_pair_core,
          "With tp_micro_batch_pairs on GPUs (model.attention = \"nsa\"): \"separate\" (the "
          "default) runs an NSA core call per micro-batch, the same bits as without pairs; "
          "\"joint\" runs the pair's two cores of a layer as one call over both micro-batches' "
          "sequences: a rank's core holds 1/tp of the KV groups and fills the GPU better with "
          "twice the sequences (the 125M model's tp2 share: 0.84-0.88x the time of two calls on an "
          "H200), but the two micro-batches then meet at every core, and the forward's wo sum "
          "and w_out sum of one of them hide behind less work. At the 125M model on 2 H200s, "
          "micro-batch 16: 812 against 821 ms a step. The same losses to rounding (the core's "
          "sums over sequences and its kernels' splits follow the call's size). Layers whose "
          "core's saved state is recomputed (recompute.policy) and CPU ranks run a call each; the "
          "run log says which ran (docs/parallel.md).")
          .one_of({"joint", "separate"}),
      key("parallel", "grad_bucket_kib", &R::parallel, &ParallelConfig::grad_bucket_kib,
          "Size in KiB of a data-parallel gradient bucket (one all-reduce of the flat gradient "
          "buffer, without zero1); 25600 = 25 MiB. Smaller buckets start sooner with "
          "overlap_grad_reduce, for more calls. The same value gives the same bits with overlap on "
          "or off; another value may change the sums' order with dp > 2 (MPI picks its algorithm "
          "by message size).")
          .at_least(1),
      key("parallel", "comm_timeout_s", &R::parallel, &ParallelConfig::comm_timeout_s,
          "Several ranks: a collective or transfer (MPI or NCCL, host call or GPU work) that has not "
          "finished after this many seconds, or an asynchronous NCCL error, ends the rank with exit "
          "code 4 and a message naming it and the group (a dead or hung peer), its communicators "
          "aborted; watched while the NCCL communicators are created and over the training loop. "
          "Keep it above the longest wait of one rank for another (a checkpoint write). 0: no "
          "watchdog.")
          .at_least(0),

      key("parallel", "pp_transport", &R::parallel, &ParallelConfig::pp_transport,
          "GPU pipeline messages (pp > 1): \"copy_engine\" moves them with the GPUs' copy engines "
          "into receive slots of the neighbour (CUDA IPC, one host; no SM and no host wait, "
          "2 pp V + 2 slots of one activation per neighbour), \"nccl\" with NCCL send and "
          "receive kernels on the compute stream, \"auto\" the copy engines where every rank "
          "reaches its neighbours' memory (the default), else NCCL. The same bits either way; on 2 "
          "H100s the copy engines give pp2 with 2 virtual stages 1.86x one GPU against NCCL's "
          "1.72x (their receives are waited for where they are read); the run log says which ran "
          "(docs/parallel.md).")
          .one_of({"auto", "nccl", "copy_engine"}),
      key("parallel", "tp_transport", &R::parallel, &ParallelConfig::tp_transport,
          "GPU tensor-parallel sums (tp > 1): \"copy_engine\" copies each rank's part into receive "
          "slots of every other rank of the tp group with the GPUs' copy engines (CUDA IPC, one "
          "host; 2 slots of one activation per peer) and adds them in rank order with one short "
          "kernel, \"nccl\" runs NCCL's all-reduce kernels, \"auto\" (the default) the copy engines "
          "with tp_micro_batch_pairs where every rank reaches the others' memory, else NCCL. The "
          "same bits either way at tp = 2 (and the same on every rank at any tp). NCCL's kernels "
          "hold SMs for the whole transfer, beside the other micro-batch's products; the copy "
          "engines hold none but take longer, which loses where a sum is waited for at once "
          "(without pairs); the run log says which ran (docs/parallel.md, docs/performance.md).")
          .one_of({"auto", "nccl", "copy_engine"}),

      key("recompute", "policy", &R::recompute, &RecomputeConfig::policy,
          "Activation recompute: \"none\" keeps what the backward needs; \"selective\" recomputes "
          "norms, the SwiGLU activation and NSA internals; \"full\" keeps only each layer's input "
          "and recomputes the layer in the backward.")
          .one_of({"none", "selective", "full"}),
      key("recompute", "layers", &R::recompute, &RecomputeConfig::layers,
          "With policy \"full\": how many layers (the first ones) recompute; -1: all.").at_least(-1),

      key("data", "train", &R::data, &DataConfig::train,
          "Training token shards: a file glob or an array of globs."),
      key("data", "val", &R::data, &DataConfig::val,
          "Validation token shards: a file glob or an array of globs; empty: no validation."),
      key("data", "format", &R::data, &DataConfig::format,
          "Shard format: llm.c (.bin with a 256-int header), Megatron (.bin + .idx), or detected.")
          .one_of({"auto", "llmc", "megatron"}),

      key("checkpoint", "dir", &R::checkpoint, &CheckpointConfig::dir,
          "Directory of the run's checkpoints (one step_NNNNNNNN/ per save)."),
      key("checkpoint", "every", &R::checkpoint, &CheckpointConfig::every,
          "Save every this many steps; 0: only at the end.").at_least(0),
      key("checkpoint", "keep", &R::checkpoint, &CheckpointConfig::keep,
          "Keep this many newest checkpoints; 0: keep all.").at_least(0),
      key("checkpoint", "resume", &R::checkpoint, &CheckpointConfig::resume,
          "\"auto\": continue from `latest` if present; \"never\": start fresh; or a checkpoint path."),

      key("log", "every", &R::log, &LogConfig::every, "Print a log line every this many steps.").at_least(1),
      key("log", "metrics", &R::log, &LogConfig::metrics,
          "Path of a JSONL file receiving one record per step; empty: none."),
      key("log", "profile_step", &R::log, &LogConfig::profile_step,
          "Time the op families of this step (1-based; 0: none) and print their split on rank 0 "
          "(the model's scopes: CUDA events on GPUs, a steady clock on CPUs; the time outside them "
          "is the rest of the step, e.g. the wait for the device or for other ranks). On GPU ranks "
          "also each group's communication (tp, dp, pp): its collectives' and transfers' busy time "
          "on the GPU, the compute stream's time in that group's scopes (its in-line collectives "
          "and its waits), and the fraction hidden, 1 - waited / busy. With several ranks, last, "
          "the ranks' compute times (the families less the communication groups'): the fastest "
          "and the slowest rank, how much longer the slowest computed, which every collective "
          "makes the others wait for (a slower GPU of the same kind, or a pipeline stage with more "
          "work), and the three families where the slowest spent most over the fastest. On GPUs with "
          "pp = 1, also when the host had queued the step's forwards and backwards and when the "
          "device was done with them (a lead near zero: the device waited for the host's launches; "
          "CUDA's launch queue caps it near a micro-batch's last thousand operations).")
          .at_least(0),
      key("log", "trace", &R::log, &LogConfig::trace,
          "With log.profile_step: the path of a Chrome trace-event JSON file (open it in Perfetto or "
          "chrome://tracing) receiving that step's timeline on every rank: a process per rank, its "
          "op scopes on the compute lane and, on GPUs, each communication group's collectives and "
          "transfers on a lane of their own; times from each rank's first scope (the ranks share no "
          "clock: a GPU's events count on their own device), written by rank 0. Empty: none."),
  };
  return table;
}

const Key* find_key(const std::string& section, const std::string& name) {
  for (const auto& k : keys())
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// " (did you mean 'x'?)" for the closest candidate, or "" when none is close.
std::string suggestion(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

std::string format_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

std::string value_text(const Key& k, RunConfig& c) {
  void* f = k.field(c);
  switch (k.kind) {
    case Kind::Int: return std::to_string(*static_cast<std::int64_t*>(f));
    case Kind::Float: return format_float(*static_cast<double*>(f));
    case Kind::Bool: return *static_cast<bool*>(f) ? "true" : "false";
    case Kind::String: return quote(*static_cast<std::string*>(f));
    case Kind::StringList: {
      std::string s = "[";
      const auto& v = *static_cast<std::vector<std::string>*>(f);
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + quote(v[i]);
      return s + "]";
    }
    case Kind::IntList: {
      std::string s = "[";
      const auto& v = *static_cast<std::vector<std::int64_t>*>(f);
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    }
  }
  return "";
}

// Collects errors with their locations while a config is read.
struct Validator {
  std::string source;
  std::map<std::string, std::string> where;  // "section.key" or "section" -> "FILE:LINE:COL"
  std::vector<std::string> errors;

  std::string location_of(const std::string& path) const {
    if (auto it = where.find(path); it != where.end()) return it->second;
    auto dot = path.find('.');
    if (dot != std::string::npos)
      if (auto it = where.find(path.substr(0, dot)); it != where.end()) return it->second;
    return source + ":1:1";
  }
  void error_at(const std::string& loc, const std::string& path, const std::string& msg) {
    errors.push_back(loc + ": " + path + ": " + msg);
  }
  void error(const std::string& path, const std::string& msg) { error_at(location_of(path), path, msg); }

  // File errors in line/column order, then the --set ones in command-line order.
  std::vector<std::string> sorted_errors() const {
    auto line_col = [&](const std::string& e) -> std::pair<long, long> {
      if (e.rfind(source + ":", 0) != 0) return {1L << 40, 0};
      long line = 0, col = 0;
      std::sscanf(e.c_str() + source.size() + 1, "%ld:%ld", &line, &col);
      return {line, col};
    };
    std::vector<std::string> out = errors;
    std::stable_sort(out.begin(), out.end(),
                     [&](const std::string& a, const std::string& b) { return line_col(a) < line_col(b); });
    return out;
  }

  // Type-checks `n` against `k` and stores it in `c`; range checks follow in check_ranges.
  void assign(const Key& k, const toml::node& n, const std::string& loc, RunConfig& c) {
    void* f = k.field(c);
    auto wrong = [&] {
      error_at(loc, k.path(), "expected " + with_article(kind_name(k.kind)) + ", got " + toml_type_name(n) +
                                  " (" + toml_value_text(n) + ")");
    };
    switch (k.kind) {
      case Kind::Int:
        if (!n.is_integer()) return wrong();
        *static_cast<std::int64_t*>(f) = n.as_integer()->get();
        break;
      case Kind::Float:
        // An integer literal is accepted for a float key: the value is exact either way.
        if (n.is_floating_point())
          *static_cast<double*>(f) = n.as_floating_point()->get();
        else if (n.is_integer())
          *static_cast<double*>(f) = double(n.as_integer()->get());
        else
          return wrong();
        break;
      case Kind::Bool:
        if (!n.is_boolean()) return wrong();
        *static_cast<bool*>(f) = n.as_boolean()->get();
        break;
      case Kind::String:
        if (!n.is_string()) return wrong();
        *static_cast<std::string*>(f) = n.as_string()->get();
        break;
      case Kind::StringList: {
        auto& out = *static_cast<std::vector<std::string>*>(f);
        if (n.is_string()) {
          out = {n.as_string()->get()};
        } else if (n.is_array()) {
          std::vector<std::string> items;
          for (const auto& e : *n.as_array()) {
            if (!e.is_string()) return wrong();
            items.push_back(e.as_string()->get());
          }
          out = std::move(items);
        } else {
          return wrong();
        }
        break;
      }
      case Kind::IntList: {
        if (!n.is_array()) return wrong();
        std::vector<std::int64_t> items;
        for (const auto& e : *n.as_array()) {
          if (!e.is_integer()) return wrong();
          items.push_back(e.as_integer()->get());
        }
        *static_cast<std::vector<std::int64_t>*>(f) = std::move(items);
        break;
      }
    }
    where[k.path()] = loc;
  }

  void check_range(const Key& k, RunConfig& c) {
    void* f = k.field(c);
    auto in_range = [&](double v) {
      return !std::isnan(v) && (k.lo_open ? v > k.lo : v >= k.lo) && (k.hi_open ? v < k.hi : v <= k.hi);
    };
    if (k.kind == Kind::Int || k.kind == Kind::Float) {
      double v = k.kind == Kind::Int ? double(*static_cast<std::int64_t*>(f)) : *static_cast<double*>(f);
      if (!in_range(v)) error(k.path(), "value " + value_text(k, c) + " is out of range (must be " + k.range_text() + ")");
    } else if (k.kind == Kind::IntList) {
      const auto& items = *static_cast<std::vector<std::int64_t>*>(f);
      for (std::size_t i = 0; i < items.size(); ++i)
        if (!in_range(double(items[i])))
          error(k.path(), "the entry at index " + std::to_string(i) + " is " + std::to_string(items[i]) +
                              ", out of range (each entry must be " + k.range_text() + ")");
    } else if (k.kind == Kind::String && !k.choices.empty()) {
      const auto& s = *static_cast<std::string*>(f);
      if (std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end())
        error(k.path(), "\"" + s + "\" is not one of " + k.range_text() + suggestion(s, k.choices));
    }
  }
};

void read_table(const toml::table& root, Validator& v, RunConfig& c) {
  for (auto&& [sec_key, sec_node] : root) {
    std::string sec(sec_key.str());
    std::string sec_loc = toml_position(v.source, sec_key.source());
    const auto& order = section_order();
    if (std::find(order.begin(), order.end(), sec) == order.end()) {
      std::string where_else;
      for (const auto& k : keys())
        if (k.name == sec) where_else = " (did you mean '" + k.path() + "' inside [" + k.section + "]?)";
      v.error_at(sec_loc, sec,
                 sec_node.is_table() ? "unknown section" + (where_else.empty() ? suggestion(sec, order) : where_else)
                                     : "unknown top-level key" + (where_else.empty() ? suggestion(sec, order) : where_else));
      continue;
    }
    if (!sec_node.is_table()) {
      v.error_at(sec_loc, sec, "must be a table ([" + sec + "]), got " + toml_type_name(sec_node));
      continue;
    }
    v.where[sec] = sec_loc;
    for (auto&& [k, n] : *sec_node.as_table()) {
      std::string name(k.str());
      std::string loc = toml_position(v.source, k.source());
      const Key* key_def = find_key(sec, name);
      if (!key_def) {
        std::vector<std::string> same_section;
        std::string other;
        for (const auto& kd : keys()) {
          if (kd.section == sec) same_section.push_back(kd.name);
          else if (kd.name == name) other = " (did you mean '" + kd.path() + "' in [" + kd.section + "]?)";
        }
        std::string hint = suggestion(name, same_section);
        v.error_at(loc, sec + "." + name, "unknown key" + (hint.empty() ? other : hint));
        continue;
      }
      v.assign(*key_def, n, loc, c);
    }
  }
}

void apply_override(const LocatedOverride& o, Validator& v, RunConfig& c) {
  const std::string& text = o.text;
  const std::string& loc = o.origin;
  auto eq = text.find('=');
  auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    v.errors.push_back(loc + ": expected section.key=value");
    return;
  }
  std::string sec = text.substr(0, dot), name = text.substr(dot + 1, eq - dot - 1), value = text.substr(eq + 1);
  const Key* k = find_key(sec, name);
  if (!k) {
    std::vector<std::string> all;
    for (const auto& kd : keys()) all.push_back(kd.path());
    v.error_at(loc, sec + "." + name, "unknown key" + suggestion(sec + "." + name, all));
    return;
  }
  toml::table parsed;
  try {
    parsed = toml::parse(std::string_view("v = " + value), std::string_view("--set"));
  } catch (const toml::parse_error&) {
    if (k->kind == Kind::String || k->kind == Kind::StringList) {
      // A bare word for a string key: --set train.device=cuda
      parsed = toml::table{{"v", value}};
    } else {
      v.error_at(loc, k->path(), "'" + value + "' is not a valid TOML value (expected " + kind_name(k->kind) + ")");
      return;
    }
  }
  v.assign(*k, *parsed.get("v"), loc, c);
}

// Rules between keys (NSA_SPEC.md constraints, parallel layout, batch arithmetic).
void check_rules(Validator& v, RunConfig& c) {
  auto& m = c.model;
  auto& s = c.nsa;
  auto& t = c.train;
  auto& p = c.parallel;
  auto at = [&](std::initializer_list<const char*> paths) {
    for (const char* path : paths)
      if (v.where.count(path)) return std::string(path);
    return std::string(*paths.begin());
  };
  auto n = [](std::int64_t x) { return std::to_string(x); };

  if (m.n_heads % m.n_kv_heads != 0)
    v.error(at({"model.n_kv_heads", "model.n_heads"}),
            "n_heads = " + n(m.n_heads) + " is not divisible by n_kv_heads = " + n(m.n_kv_heads));
  if (m.head_dim == 0) {
    if (m.d_model % m.n_heads != 0)
      v.error(at({"model.head_dim", "model.d_model", "model.n_heads"}),
              "head_dim = 0 derives d_model / n_heads, but d_model = " + n(m.d_model) +
                  " is not divisible by n_heads = " + n(m.n_heads) + "; set model.head_dim");
    else
      m.head_dim = m.d_model / m.n_heads;
  }
  if (m.head_dim % 2 != 0)
    v.error(at({"model.head_dim", "model.d_model", "model.n_heads"}),
            "head_dim = " + n(m.head_dim) + " must be even (RoPE rotates pairs of channels)");
  if (m.ffn_hidden == 0) m.ffn_hidden = (8 * m.d_model / 3 + 63) / 64 * 64;

  if (s.cmp_block % s.cmp_stride != 0)
    v.error(at({"nsa.cmp_stride", "nsa.cmp_block"}),
            "cmp_stride = " + n(s.cmp_stride) + " must divide cmp_block = " + n(s.cmp_block));
  if (s.sel_block % s.cmp_stride != 0)
    v.error(at({"nsa.cmp_stride", "nsa.sel_block"}),
            "cmp_stride = " + n(s.cmp_stride) + " must divide sel_block = " + n(s.sel_block));
  if (s.cmp_block > s.sel_block)
    v.error(at({"nsa.cmp_block", "nsa.sel_block"}),
            "cmp_block = " + n(s.cmp_block) + " must not exceed sel_block = " + n(s.sel_block));

  if (p.grad_bucket_kib > (std::int64_t(1) << 40))  // its byte count must fit an int64
    v.error("parallel.grad_bucket_kib", "grad_bucket_kib = " + n(p.grad_bucket_kib) + " exceeds 2^40 KiB");
  if (p.overlap_grad_reduce && t.device == "cuda" && (p.tp > 1 || p.pp > 1))
    v.error(at({"parallel.overlap_grad_reduce", "train.device"}),
            "overlap_grad_reduce on GPUs is built for data parallelism alone (tp = pp = 1): with tp "
            "or pp the DP all-reduces would run beside the TP/PP communicators' kernels, which NCCL "
            "allows only when they all fit the GPU at once, and that has not been tested; set it to "
            "false, or run it on CPU ranks");
  if (p.tp_overlap && p.tp > 1 && t.micro_batch < 2)
    v.error(at({"parallel.tp_overlap", "train.micro_batch"}),
            "tp_overlap runs each micro-batch in two halves of its sequences and needs micro_batch >= 2 "
            "(it is " + n(t.micro_batch) + "); set it to false, or raise micro_batch");
  if (p.tp_micro_batch_pairs && p.tp > 1 && p.pp > 1)
    v.error(at({"parallel.tp_micro_batch_pairs", "parallel.pp"}),
            "tp_micro_batch_pairs runs the whole model's forward for two micro-batches in turn and is "
            "built for pp = 1 (it is " + n(p.pp) + "; the pipeline schedule keeps its own micro-batches "
            "in flight); set it to false, or pp = 1");
  if (p.tp_micro_batch_pairs && p.tp_overlap && p.tp > 1)
    v.error(at({"parallel.tp_micro_batch_pairs", "parallel.tp_overlap"}),
            "tp_micro_batch_pairs and tp_overlap are two ways to hide the TP all-reduces and cannot be "
            "combined; set one of them to false");
  if (p.overlap_grad_reduce && p.zero1)
    v.error(at({"parallel.overlap_grad_reduce", "parallel.zero1"}),
            "overlap_grad_reduce cannot be combined with zero1: ZeRO-1 reduces the gradients with one "
            "reduce-scatter over a staging buffer laid out by each rank's whole tensors, not in "
            "buckets (docs/parallel.md); set one of them to false");
  if (t.dtype == "bf16" && t.device != "cuda")
    v.error(at({"train.dtype", "train.device"}), "bf16 needs train.device = \"cuda\" (the CPU path is fp32)");
  if (!c.log.trace.empty() && c.log.profile_step == 0)
    v.error(at({"log.trace", "log.profile_step"}),
            "trace writes the timeline of the profiled step, but profile_step = 0; set profile_step to "
            "the step to trace, or trace = \"\"");
  if (c.optim.min_lr > c.optim.lr)
    v.error(at({"optim.min_lr", "optim.lr"}), "min_lr = " + format_float(c.optim.min_lr) +
                                                  " exceeds lr = " + format_float(c.optim.lr));

  if (p.tp > m.n_kv_heads)
    v.error(at({"parallel.tp", "model.n_kv_heads"}),
            "tp = " + n(p.tp) + " exceeds n_kv_heads = " + n(m.n_kv_heads) +
                ": NSA is sharded by KV group, so each tensor-parallel rank needs at least one KV group "
                "(tp > n_kv_heads is not supported)");
  else if (m.n_kv_heads % p.tp != 0)
    v.error(at({"parallel.tp", "model.n_kv_heads"}),
            "tp = " + n(p.tp) + " must divide n_kv_heads = " + n(m.n_kv_heads) +
                " (NSA is sharded by KV group; see docs/parallel.md)");
  if (m.ffn_hidden % p.tp != 0)
    v.error(at({"parallel.tp", "model.ffn_hidden"}),
            "tp = " + n(p.tp) + " must divide ffn_hidden = " + n(m.ffn_hidden) +
                " (the MLP is sharded by hidden columns; see docs/parallel.md)");
  const std::int64_t V = p.virtual_stages;
  if (V > 1 && p.pp < 2) {
    v.error(at({"parallel.virtual_stages", "parallel.pp"}),
            "virtual_stages = " + n(V) + " needs pp >= 2, but pp = " + n(p.pp) +
                " (the interleaved schedule spreads each rank's model chunks over the pipeline)");
  } else if (V > 1 && p.pp_layers.empty() && m.n_layers % (p.pp * V) != 0) {
    v.error(at({"parallel.virtual_stages", "model.n_layers", "parallel.pp"}),
            "pp * virtual_stages = " + n(p.pp) + " * " + n(V) + " = " + n(p.pp * V) + " must divide n_layers = " +
                n(m.n_layers) + " (the layers are cut into pp * virtual_stages equal chunks; or give each "
                "chunk's layers in parallel.pp_layers)");
  } else if (p.pp_layers.empty()) {
    if (V == 1 && m.n_layers % p.pp != 0)
      v.error(at({"parallel.pp", "model.n_layers"}),
              "pp = " + n(p.pp) + " must divide n_layers = " + n(m.n_layers) +
                  " (or give each stage's layers in parallel.pp_layers)");
  } else if (std::int64_t(p.pp_layers.size()) != p.pp * V) {
    if (V > 1)
      v.error(at({"parallel.pp_layers", "parallel.virtual_stages"}),
              "has " + n(std::int64_t(p.pp_layers.size())) + " entries but pp * virtual_stages = " + n(p.pp) +
                  " * " + n(V) + " = " + n(p.pp * V) + " (one entry per model chunk, in model order: chunk c "
                  "runs on stage c % pp)");
    else
      v.error("parallel.pp_layers", "has " + n(std::int64_t(p.pp_layers.size())) + " entries but pp = " + n(p.pp) +
                                        " (one entry per pipeline stage)");
  } else {
    std::int64_t sum = 0;
    bool overflow = false;
    for (auto l : p.pp_layers) overflow = overflow || __builtin_add_overflow(sum, l, &sum);
    if (overflow || sum != m.n_layers)
      v.error("parallel.pp_layers", "entries sum to " + (overflow ? std::string("more than 2^63") : n(sum)) +
                                        " but n_layers = " + n(m.n_layers) + " (each layer belongs to exactly one " +
                                        (V > 1 ? "chunk)" : "stage)"));
  }
  if (c.world_size == 0) {
    // The world is not known yet (parse_config_with_origins): its rules are checked later.
  } else if (c.world_size % (p.tp * p.pp) != 0) {
    v.error(at({"parallel.tp", "parallel.pp"}), "the world size " + n(c.world_size) +
                                                    " is not a multiple of tp * pp = " + n(p.tp * p.pp));
  } else if (t.global_batch % (t.micro_batch * c.dp()) != 0) {
    v.error(at({"train.global_batch", "train.micro_batch"}),
            "global_batch = " + n(t.global_batch) + " is not a multiple of micro_batch * dp = " +
                n(t.micro_batch) + " * " + n(c.dp()));
  } else if (V > 1 && p.pp >= 2 && c.grad_accum_steps() % p.pp != 0) {
    v.error(at({"train.global_batch", "train.micro_batch", "parallel.virtual_stages"}),
            "global_batch = " + n(t.global_batch) + " gives A = global_batch / (micro_batch * dp) = " +
                n(t.global_batch) + " / (" + n(t.micro_batch) + " * " + n(c.dp()) + ") = " + n(c.grad_accum_steps()) +
                " micro-batches per step, not a multiple of pp = " + n(p.pp) +
                ": with virtual_stages = " + n(V) + " the interleaved schedule runs the micro-batches through "
                "each stage's chunks in groups of pp");
  }
  if (c.recompute.layers > m.n_layers)
    v.error("recompute.layers", "layers = " + n(c.recompute.layers) + " exceeds n_layers = " + n(m.n_layers));
  if (c.recompute.layers == -1) c.recompute.layers = m.n_layers;
  if (c.checkpoint.dir.empty()) v.error("checkpoint.dir", "must not be empty");
  if (c.checkpoint.resume.empty()) v.error("checkpoint.resume", "must be \"auto\", \"never\" or a checkpoint path");
}

}  // namespace

RunConfig parse_config(std::string_view text, const std::string& source_name,
                       const std::vector<std::string>& overrides, std::int64_t world_size) {
  std::vector<LocatedOverride> located;
  for (const auto& o : overrides) located.push_back({o, "--set " + o});
  return parse_config_with_origins(text, source_name, located, world_size);
}

RunConfig parse_config_with_origins(std::string_view text, const std::string& source_name,
                                    const std::vector<LocatedOverride>& overrides, std::int64_t world_size) {
  RunConfig c;
  c.source = source_name;
  c.world_size = world_size;
  Validator v;
  v.source = source_name;
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(source_name));
  } catch (const toml::parse_error& e) {
    throw ConfigError({toml_position(source_name, e.source()) + ": TOML syntax error: " + std::string(e.description())});
  }
  read_table(root, v, c);
  for (const auto& o : overrides) apply_override(o, v, c);
  for (const auto& k : keys()) v.check_range(k, c);
  // Rules between keys mean something only once every key has a valid value.
  if (v.errors.empty()) check_rules(v, c);
  if (!v.errors.empty()) throw ConfigError(v.sorted_errors());
  return c;
}

std::pair<std::int64_t, std::int64_t> RunConfig::stage_layers(std::int64_t pp_rank) const {
  const std::int64_t pp = parallel.pp;
  if (pp_rank < 0 || pp_rank >= pp)
    throw std::out_of_range("stage_layers: pipeline stage " + std::to_string(pp_rank) + " of pp = " + std::to_string(pp));
  if (parallel.virtual_stages > 1)
    throw std::logic_error("stage_layers: with parallel.virtual_stages = " + std::to_string(parallel.virtual_stages) +
                           " a stage holds several layer ranges (stage_chunks)");
  if (parallel.pp_layers.empty()) {
    const std::int64_t per = model.n_layers / pp;
    return {pp_rank * per, (pp_rank + 1) * per};
  }
  if (std::int64_t(parallel.pp_layers.size()) != pp)
    throw std::out_of_range("stage_layers: parallel.pp_layers has " + std::to_string(parallel.pp_layers.size()) +
                            " entries but pp = " + std::to_string(pp));
  std::int64_t begin = 0;
  for (std::int64_t s = 0; s < pp_rank; ++s) begin += parallel.pp_layers[std::size_t(s)];
  return {begin, begin + parallel.pp_layers[std::size_t(pp_rank)]};
}

std::vector<std::pair<std::int64_t, std::int64_t>> RunConfig::stage_chunks(std::int64_t pp_rank) const {
  const std::int64_t V = parallel.virtual_stages, pp = parallel.pp;
  if (V <= 1) return {stage_layers(pp_rank)};
  if (pp_rank < 0 || pp_rank >= pp)
    throw std::out_of_range("stage_chunks: pipeline stage " + std::to_string(pp_rank) + " of pp = " + std::to_string(pp));
  // Chunk c of the model (pp * V of them, in model order) runs on stage c % pp: equal chunks,
  // or pp_layers[c] layers each.
  std::vector<std::int64_t> begin(std::size_t(pp * V) + 1, 0);
  for (std::int64_t c = 0; c < pp * V; ++c)
    begin[std::size_t(c) + 1] = begin[std::size_t(c)] + (parallel.pp_layers.empty()
                                                              ? model.n_layers / (pp * V)
                                                              : parallel.pp_layers.at(std::size_t(c)));
  std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
  for (std::int64_t v = 0; v < V; ++v) {
    const std::int64_t c = v * pp + pp_rank;
    chunks.push_back({begin[std::size_t(c)], begin[std::size_t(c) + 1]});
  }
  return chunks;
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, std::int64_t world_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError({path + ": cannot open the config file"});
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides, world_size);
}

std::string to_toml(const RunConfig& config) {
  RunConfig c = config;
  std::string out;
  for (const auto& sec : section_order()) {
    if (!out.empty()) out += '\n';
    out += "[" + sec + "]\n";
    for (const auto& k : keys())
      if (k.section == sec) out += k.name + " = " + value_text(k, c) + "\n";
  }
  return out;
}

std::string config_reference_markdown() {
  RunConfig defaults;
  std::string md =
      "# Configuration reference\n\n"
      "<!-- Generated by `nsatron config docs > docs/config.md` from the key table in\n"
      "     core/config/config.cpp; a test fails when this file is stale. -->\n\n"
      "One TOML file describes a run. Every key is optional and has the default below;\n"
      "`nsatron config check FILE` prints the resolved config with every default and derived\n"
      "value filled in. Validation is strict and happens before anything starts:\n\n"
      "- an unknown section or key is an error, with a \"did you mean\" suggestion;\n"
      "- a value of the wrong type is an error, with no silent conversion (`lr = \"3e-4\"` and\n"
      "  `n_layers = 12.5` are refused). The one exception: an integer literal is accepted for a\n"
      "  float key (`rope_theta = 10000`), since the value is exact either way;\n"
      "- a value out of range, or not one of the listed choices, is an error;\n"
      "- the rules between keys below are checked after that.\n\n"
      "An array-of-integers key takes a TOML array (`pp_layers = [3, 5]`, on the command line\n"
      "`--set parallel.pp_layers=[3,5]`); its range applies to each entry.\n\n"
      "Each problem is reported on stderr as `FILE:LINE:COL: section.key: what is wrong` (all of\n"
      "them, not only the first) and the program exits with code 2. A rule broken by values\n"
      "left at their defaults points at the section header, or at `FILE:1:1`.\n\n"
      "Command-line overrides `--set section.key=value` (repeatable) are parsed as TOML values\n"
      "and validated the same way; their errors name the override instead of a line\n"
      "(`--set model.n_layers=12.5: model.n_layers: expected an integer, got a float (12.5)`).\n"
      "A bare word is accepted for a string key: `--set train.device=cuda`.\n\n"
      "## Rules between keys\n\n"
      "- `model.n_heads` is a multiple of `model.n_kv_heads`.\n"
      "- `model.head_dim` is even; when 0, `model.d_model` is a multiple of `model.n_heads`.\n"
      "- NSA (see NSA_SPEC): `nsa.cmp_stride` divides `nsa.cmp_block` and `nsa.sel_block`;\n"
      "  `nsa.cmp_block <= nsa.sel_block`; `nsa.sel_count >= 3`; `nsa.window >= 1`. With\n"
      "  `model.attention = \"dense\"` the `[nsa]` keys are not used (but still checked).\n"
      "- `parallel.tp` divides `model.n_kv_heads` (NSA is sharded by KV group: `tp > n_kv_heads`\n"
      "  is not supported) and `model.ffn_hidden` (the MLP is sharded by hidden columns).\n"
      "- `parallel.pp_layers` empty: `parallel.pp` divides `model.n_layers` (an even split).\n"
      "  Given: it has `parallel.pp` entries, each >= 1, summing to `model.n_layers`.\n"
      "- `parallel.virtual_stages > 1` (the interleaved pipeline schedule) needs `parallel.pp >= 2`,\n"
      "  `pp * virtual_stages` dividing `model.n_layers` (equal chunks) or `parallel.pp_layers` with\n"
      "  `pp * virtual_stages` entries (one per chunk),\n"
      "  and `A = train.global_batch / (train.micro_batch * dp)` a multiple of `pp`.\n"
      "- The world size (number of ranks) is a multiple of `tp * pp`; `dp = world / (tp * pp)`,\n"
      "  and `train.global_batch` is a multiple of `train.micro_batch * dp`.\n"
      "  `nsatron config check` assumes one rank unless given `--world-size N`.\n"
      "- `optim.min_lr <= optim.lr`.\n"
      "- `train.dtype = \"bf16\"` needs `train.device = \"cuda\"`.\n"
      "- `parallel.grad_bucket_kib <= 2^40`.\n"
      "- `parallel.overlap_grad_reduce = true` needs `parallel.zero1 = false`, and with\n"
      "  `train.device = \"cuda\"` also `parallel.tp = 1` and `parallel.pp = 1`.\n"
      "- `parallel.tp_overlap = true` with `parallel.tp > 1` needs `train.micro_batch >= 2`.\n"
      "- `parallel.tp_micro_batch_pairs = true` with `parallel.tp > 1` needs `parallel.pp = 1`\n"
      "  and `parallel.tp_overlap = false`.\n"
      "- `recompute.layers <= model.n_layers`.\n"
      "- `log.trace` non-empty needs `log.profile_step >= 1`.\n";
  for (const auto& sec : section_order()) {
    md += "\n## [" + sec + "]\n\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
    for (const auto& k : keys()) {
      if (k.section != sec) continue;
      std::string def = value_text(k, defaults);
      const std::string allowed = k.kind == Kind::IntList && k.has_range() ? "each " + k.range_text() : k.range_text();
      md += "| `" + k.name + "` | " + kind_name(k.kind) + " | `" + def + "` | " + allowed + " | " + k.doc + " |\n";
    }
  }
  return md;
}

}  // namespace nsatron
