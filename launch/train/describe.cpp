// The log's header: the resolved config, then what runs (model, data, parallelism) and which
// implementation computes it.
#include <omp.h>

#include <cmath>
#include <iomanip>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/util/format.h"
#include "launch/commands.h"
#include "launch/train/phases.h"
#include "nsa/cuda/selection_loop.h"
#include "parallel/pipeline.h"

namespace nsatron::train {

namespace {

// tp_micro_batch_pairs: how the pair's NSA cores run (parallel.tp_pair_core).
std::string pair_core_text(const NsaTransformer& model) {
  std::int64_t joint = 0;
  for (std::int64_t l = model.layer_begin(); l < model.layer_end(); ++l) joint += model.pair_core_joint(l);
  if (joint == 0) return ", one attention core call per micro-batch";
  const std::int64_t layers = model.layer_end() - model.layer_begin();
  return ", the pair's two NSA cores in one call (tp_pair_core = \"joint\"" +
         (joint < layers ? "; " + std::to_string(joint) + " of " + std::to_string(layers) + " layers" : std::string()) +
         ")";
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Entropy (nats) of the token frequencies of a dataset: the loss of the best model that
// ignores context. Counted over at most the first 64M tokens.
double unigram_entropy(const data::TokenDataset& ds, std::int64_t vocab) {
  const std::int64_t n = std::min<std::int64_t>(ds.num_tokens(), 64 << 20);
  std::vector<double> counts(std::size_t(vocab), 0.0);
  std::vector<std::int32_t> buf(1 << 20);
  for (std::int64_t at = 0; at < n; at += std::int64_t(buf.size())) {
    const std::int64_t k = std::min<std::int64_t>(std::int64_t(buf.size()), n - at);
    ds.read(at, k, buf.data());
    for (std::int64_t i = 0; i < k; ++i) counts[std::size_t(buf[std::size_t(i)])] += 1;
  }
  double h = 0;
  for (double c : counts)
    if (c > 0) h -= c / double(n) * std::log(c / double(n));
  return h;
}

// Dense bf16 tensor-core peak of the GPU, for MFU: H100 and H200 (SXM) 989 TFLOP/s; 0 when
// the device is not one we know (MFU is then not reported).
double peak_bf16_flops(const std::string& device_name) {
  if (device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos) return 989e12;
  return 0.0;
}

// The "attention" line: which attention every layer computes, and its settings.
std::string attention_line(const ModelDims& dims) {
  if (dims.attention == Attention::Dense)
    return "attention    dense (model.attention): causal grouped-query attention with RoPE over every earlier "
           "token, one K/V projection, no gates ([nsa] unused)";
  return "attention    nsa (model.attention): cmp " + std::to_string(dims.cmp_block) + "/" +
         std::to_string(dims.cmp_stride) + ", sel " + std::to_string(dims.sel_block) + " x " +
         std::to_string(dims.sel_count) + ", window " + std::to_string(dims.window);
}

// model, attention, flops/token, batch, train data, val data, unigram.
void describe_model_and_data(Run& run, std::int64_t num_params) {
  const RunConfig& cfg = run.cfg;
  const ModelDims& dims = run.dims;
  const std::int64_t T = cfg.train.seq_len;
  run.out << "# run\n"
          << "model        " << human_count(double(num_params)) << " parameters (" << num_params << "), " << dims.L
          << " layers, d_model " << dims.C << ", heads " << dims.H << "/" << dims.G << " (query/KV), head_dim "
          << dims.D << ", ffn " << dims.F << "\n"
          << attention_line(dims) << "\n"
          << "flops/token  " << human_count(run.log.flops_per_token) << " (training, forward + backward, "
          << (dims.attention == Attention::Dense ? "dense" : "NSA") << " attention included)\n"
          << "batch        " << cfg.train.global_batch << " x " << T << " tokens per step = "
          << (run.dp() > 1 ? std::to_string(run.dp()) + " DP ranks x " : std::string()) << run.micro_batches()
          << " micro-batches of " << cfg.train.micro_batch << "\n"
          << "train data   " << trimmed(run.data.train_set->describe()) << "\n"
          << "val data     " << (run.data.val_set ? trimmed(run.data.val_set->describe()) : std::string("none"))
          << "\n"
          << "unigram      entropy of the training tokens " << std::fixed << std::setprecision(4)
          << unigram_entropy(*run.data.train_set, dims.V) << " nats (a context-free model's best loss)\n"
          << std::defaultfloat;
}

// The pipeline's part of the "parallel" line: the schedule, each stage's layers (a range per
// model chunk), the tied embedding, and the bubble: (pp - 1) / (V A) of the step's ideal time.
void describe_pipeline(Run& run) {
  const int pp = run.pp(), V = int(run.cfg.parallel.virtual_stages);
  const std::int64_t A = run.micro_batches();
  std::ostream& out = run.out;
  if (V > 1) out << "; PP: interleaved 1F1B, " << V << " virtual stages (model chunks) per stage, over " << A;
  else out << "; PP: 1F1B over " << A;
  out << " micro-batches, stage layers";
  for (int s = 0; s < pp; ++s) {
    const auto chunks = run.cfg.stage_chunks(s);
    out << (s ? ", " : " ");
    for (std::size_t v = 0; v < chunks.size(); ++v)
      out << (v ? " + " : "") << "[" << chunks[v].first << ", " << chunks[v].second << ")";
  }
  if (run.dims.tie_embeddings) out << ", tied embedding gradients summed between the first and last stages";
  const std::int64_t denominator = std::int64_t(V) * A;
  out << "; bubble (pp - 1) / " << (V > 1 ? "(V * A)" : "A") << " = " << pp - 1 << "/" << denominator << " = "
      << std::fixed << std::setprecision(1) << 100.0 * parallel::pipeline_bubble_fraction(pp, A, V) << std::defaultfloat
      << "% of the step's ideal time (the time with every stage busy throughout)";
}

// The "parallel" line: the layout, the launcher, and what each kind of parallelism does.
void describe_parallelism(Run& run) {
  const ModelDims& dims = run.dims;
  const int tp = run.tp(), pp = run.pp();
  const parallel::DataParallelOptimizer& opt = *run.optimizer;
  std::ostream& out = run.out;
  out << "parallel     " << run.groups.layout.describe() << ", world " << run.world.size();
  if (run.world.size() > 1) out << " (MPI, launched by " << run.world.launch().launcher << ")";
  else out << " (one process)";
  if (run.multi_gpu)
    out << "; one GPU per rank (rank 0 on GPU " << run.gpu_index << "), activations and gradients over NCCL";
  if (tp > 1)
    out << "; TP: per rank " << dims.G / tp << " KV group(s) with " << dims.H / tp << " query heads, "
        << dims.F / tp << " MLP units, about " << dims.V / tp << " vocabulary rows; vocab-parallel cross entropy"
        << (run.cfg.parallel.tp_overlap
                ? std::string("; each layer's ops around the core in two halves of the micro-batch, one half's "
                              "all-reduces beside the other's compute (tp_overlap)") +
                      (run.multi_gpu ? " on a communication stream" : "")
            : run.cfg.parallel.tp_micro_batch_pairs
                ? std::string("; micro-batches two at a time, their forwards and backwards layer by layer in "
                              "turn, one's all-reduces beside the other's compute (tp_micro_batch_pairs)") +
                      (run.multi_gpu ? " on a communication stream" : "") +
                      pair_core_text(*run.model)
                : std::string("; the forward's all-reduces in line, the backward's beside the weight gradients"));
  if (run.model->lookup_grads_deferred())
    out << "; the tied embedding's lookup gradients summed apart and added after the heads'";
  if (pp > 1) describe_pipeline(run);
  if (pp > 1 && run.multi_gpu) out << "; pipeline messages: " << run.pp_transport;
  if (run.cfg.parallel.tp > 1 && run.multi_gpu) out << "; tensor-parallel sums: " << run.tp_transport;
  if (run.dp() > 1 && !opt.zero1())
    out << "; DP gradients all-reduced (sum) in " << opt.buckets() << " bucket(s) of up to "
        << human_bytes(double(opt.bucket_bytes()))
        << (run.cfg.parallel.overlap_grad_reduce
                ? std::string(", each started in the last micro-batch's backward once its gradients are final "
                              "(overlap_grad_reduce)") +
                      (run.multi_gpu ? " on a communication stream" : "")
                : std::string(", started after the backward"));
  if (run.sharded_state)
    out << "; ZeRO-1: AdamW state sharded over DP (this rank " << opt.owned_end() - opt.owned_begin() << " of "
        << run.model->params().total() << " elements), gradients reduce-scattered, weights all-gathered";
  if (run.world.size() > 1) {
    if (run.cfg.parallel.comm_timeout_s > 0)
      out << "; communication watchdog: a collective unfinished after " << run.cfg.parallel.comm_timeout_s
          << " s ends the rank (comm_timeout_s)";
    else
      out << "; no communication watchdog (comm_timeout_s = 0)";
  }
  out << "\n";
}

// The implementation line of the attention core.
std::string attention_impl(const Run& run, const char* nsa, const char* dense) {
  return run.dims.attention == Attention::Dense ? std::string("attention    dense: ") + dense
                                                : std::string("nsa core     ") + nsa;
}

// The loop the CUDA selection row side runs at this model's shape (nsa/cuda/selection_loop.h).
std::string selection_loop(const Run& run) {
  return nsa::cuda::selection_loop_name(run.dims.core_dims(run.cfg.train.micro_batch, run.cfg.train.seq_len),
                                        cuda_l2_cache_bytes());
}

// The "# implementations" section's device, matmul, nsa core, other ops, recompute and
// checkpoints lines (printed by every rank's stream: only rank 0's is real).
void describe_implementations(Run& run) {
  const RunConfig& cfg = run.cfg;
  std::ostream& out = run.out;
  if (run.device == Device::CUDA)
    out << "device       cuda: " << cuda_device_summary() << "; " << cfg.train.dtype << " compute, fp32 master weights, "
        << "gradients and AdamW state\n"
        << "matmul       cuBLASLt (core/ops/cuda/matmul.cu), fp32 accumulation\n"
        << attention_impl(run,
                          ("CUDA kernels (nsa/cuda), inputs read in place from the fused projection; selection row side: " +
                           selection_loop(run))
                              .c_str(),
                          ("flash-style CUDA kernels (nsa/cuda/dense.h): " +
                           nsa::cuda::dense_kernel_name(cfg.train.seq_len, run.dims.D, cuda_l2_cache_bytes(),
                                                        cfg.train.dtype == "bf16"))
                              .c_str())
        << "\n"
        << "other ops    CUDA: rmsnorm, swiglu, embedding, chunked cross entropy, fused AdamW (core/ops/cuda)\n";
  else
    out << "device       cpu, fp32, " << omp_get_max_threads() << " OpenMP threads"
        << (run.world.size() > 1 ? " per rank" : "") << "\n"
        << "matmul       OpenBLAS sgemm (core/ops/cpu/matmul.cpp)\n"
        << attention_impl(run, "CPU reference forward/backward (nsa/cpu)",
                          "CPU reference forward/backward (nsa/dense.h, nsa/cpu)") << "\n"
        << "other ops    CPU: rmsnorm, swiglu, embedding, cross entropy (chunked head), AdamW (core/ops/cpu)\n";
  out << "recompute    " << cfg.recompute.policy
      << (cfg.recompute.policy == "full" ? " (first " + std::to_string(cfg.recompute.layers) + " layers)" : "")
      << "\n"
      << "checkpoints  " << cfg.checkpoint.dir << ", every "
      << (cfg.checkpoint.every > 0 ? std::to_string(cfg.checkpoint.every) + " steps and " : std::string()) << "at the end"
      << ", keep " << (cfg.checkpoint.keep > 0 ? std::to_string(cfg.checkpoint.keep) : std::string("all")) << "\n\n";
}

}  // namespace

void log_config(Run& run) {
  run.out << "nsatron " << kVersion << " train " << run.cfg.source << "\n\n# resolved config\n" << to_toml(run.cfg)
          << "\n";
}

void describe_run(Run& run) {
  const std::int64_t T = run.cfg.train.seq_len;
  run.log.flops_per_token = run.model->flops_per_token(T);
  // MFU: of the peak of every GPU of the job (tokens/s is the job's).
  run.log.peak_flops =
      run.device == Device::CUDA ? peak_bf16_flops(cuda_device_summary()) * double(run.world.size()) : 0.0;
  run.log.tokens_per_step = run.cfg.train.global_batch * T;
  // The whole model's parameter count: every shard counted once, over the ranks of DP group 0.
  std::int64_t own_params = 0;
  for (const auto& p : run.model->params().infos())
    if (!p.replica) own_params += p.numel;
  const std::int64_t num_params =
      std::int64_t(parallel::all_reduce_value(run.world.comm(), run.groups.layout.dp_rank == 0 ? double(own_params) : 0.0,
                                              parallel::ReduceOp::Sum));
  if (run.root) {
    describe_model_and_data(run, num_params);
    describe_parallelism(run);
    run.out << "# implementations\n";
  }
  describe_implementations(run);
}

}  // namespace nsatron::train
