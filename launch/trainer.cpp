#include "launch/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <vector>

#include "core/device/device.h"
#include "core/util/format.h"
#include "core/model/model.h"
#include "core/ops/adamw.h"
#include "core/ops/grad_norm.h"
#include "core/optim/schedule.h"
#include "data/pipeline.h"
#include "launch/commands.h"
#include "launch/dist_checkpoint.h"
#include "launch/signals.h"
#include "launch/world.h"
#include "checkpoint/checkpoint.h"
#include "parallel/data_parallel.h"
#include "parallel/gpu_binding.h"
#include "parallel/pipeline.h"
#include "parallel/process_groups.h"

namespace nsatron {

namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

using Clock = std::chrono::steady_clock;

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

class ProgressBar {
 public:
  ProgressBar(std::int64_t total, bool on) : total_(total), enabled_(on && isatty(STDERR_FILENO)) {}
  void draw(std::int64_t done, double eta_s) {
    if (!enabled_) return;
    const int width = 30;
    int filled = int(double(width) * double(done) / double(std::max<std::int64_t>(1, total_)));
    std::fprintf(stderr, "\r[%s%s] %lld/%lld eta %s ", std::string(std::size_t(filled), '#').c_str(),
                 std::string(std::size_t(width - filled), '.').c_str(), (long long)done, (long long)total_,
                 human_duration(eta_s).c_str());
    std::fflush(stderr);
  }
  void clear() {
    if (enabled_) std::fprintf(stderr, "\r%60s\r", "");
  }

 private:
  std::int64_t total_;
  bool enabled_;
};

// The mean validation loss over the global eval batches: each DP rank evaluates its slice
// (with pipeline parallelism, stage by stage; the last stage has the losses), the sums and
// counts are added over DP.
// `g`: the control groups (values); `pp_messages`: the pipeline's communicator for activations.
double evaluate(NsaTransformer& model, data::RunData& data, const RunConfig& cfg, const parallel::ProcessGroups& g,
                parallel::Communicator& pp_messages) {
  if (!data.val) return -1;
  data::TokenBatch batch;
  double sum = 0;
  std::int64_t count = 0;
  const std::int64_t A = data.layout.micro_batches();
  auto forward = [&](std::int64_t b, std::int64_t m, const Tensor* input) {
    data.val->fill(b, data.layout, m, batch);
    double loss = 0;
    Tensor out = model.stage_evaluate(batch.inputs, batch.targets, input, batch.rows, batch.seq_len, &loss);
    sum += loss;
    ++count;
    return out;
  };
  for (std::int64_t b = 0; b < cfg.train.eval_batches; ++b) {
    if (g.pp->size() == 1) {
      for (std::int64_t m = 0; m < A; ++m) forward(b, m, nullptr);
    } else {
      parallel::run_pipeline_forward(pp_messages, A, [&](std::int64_t m, const Tensor* input) { return forward(b, m, input); },
                                     Shape{cfg.train.micro_batch * cfg.train.seq_len, cfg.model.d_model},
                                     model.dtype(), model.device());
    }
  }
  if (g.pp->size() > 1) sum = parallel::all_reduce_value(*g.pp, model.last_stage() ? sum : 0.0, parallel::ReduceOp::Sum);
  if (g.dp->size() > 1) {
    const std::vector<double> both = parallel::all_gather_values(*g.dp, {sum, double(count)});
    sum = 0;
    double total = 0;
    for (int r = 0; r < g.dp->size(); ++r) sum += both[std::size_t(2 * r)], total += both[std::size_t(2 * r + 1)];
    return sum / total;
  }
  return sum / double(count);
}

}  // namespace

namespace {

// "section.key" -> value text of a resolved config (the output of to_toml).
std::map<std::string, std::string> config_entries(const std::string& toml_text) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml_text);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.size() > 2 && line.front() == '[') section = line.substr(1, line.size() - 2);
    else if (auto eq = line.find(" = "); eq != std::string::npos) out[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

}  // namespace

TrainSummary run_training(const RunConfig& cfg, std::ostream& out, World& world, const TrainOptions& options) {
  namespace ckpt = checkpoint;
  const Device device = cfg.train.device == "cuda" ? Device::CUDA : Device::CPU;
  const DType dtype = cfg.train.dtype == "bf16" ? DType::BF16 : DType::F32;
  const bool root = world.rank() == 0;
  const auto t_start = Clock::now();

  // Checks every rank makes alike, then the process groups (collective over the world).
  world.together([&] {
    if (device == Device::CUDA && !cuda_available())
      throw UserError(cfg.source + ": train.device: \"cuda\", but " + cuda_device_summary());
    if (cfg.data.train.empty()) throw UserError(cfg.source + ": data.train: required to train (a glob of token shards)");
  });
  const parallel::ProcessGroups groups = world.together([&] {
    return parallel::make_process_groups(world.size() > 1 ? parallel::Backend::Mpi : parallel::Backend::Single,
                                         int(cfg.parallel.tp), int(cfg.parallel.pp));
  });
  // Several GPU ranks: one GPU each (before any other CUDA call), and NCCL communicators for
  // the tensors (gradients, pipeline messages); the MPI groups keep carrying control values.
  const bool multi_gpu = device == Device::CUDA && world.size() > 1;
  int gpu_index = 0;
  if (multi_gpu) gpu_index = world.together([&] { return parallel::bind_local_gpu(*groups.world); });
  const parallel::ProcessGroups tensor_groups =
      multi_gpu ? world.together([&] {
        parallel::DeviceGroupSet which;
        which.world = false;  // the world carries only control values
        which.embedding = cfg.model.tie_embeddings && cfg.parallel.pp > 1;
        return parallel::make_device_groups(groups, which);
      })
                : groups;
  const int dp = groups.layout.dp, dp_rank = groups.layout.dp_rank;
  const int tp = groups.layout.tp, pp = groups.layout.pp;
  out << "nsatron " << kVersion << " train " << cfg.source << "\n\n# resolved config\n" << to_toml(cfg) << "\n";

  // Data first: a bad shard should stop the run before any work. Each DP rank opens its slice.
  data::RunData data;
  std::unique_ptr<NsaTransformer> model_ptr;
  std::unique_ptr<parallel::DataParallelOptimizer> dpo_ptr;
  const ModelDims dims = ModelDims::from_config(cfg);
  world.together([&] {
    data = data::open_run_data(cfg, dp_rank);
    ModelShard shard;
    shard.tp = tp;
    shard.tp_rank = groups.layout.tp_rank;
    shard.tp_group = tensor_groups.tp;
    std::tie(shard.layer_begin, shard.layer_end) = cfg.stage_layers(groups.layout.pp_rank);
    model_ptr = std::make_unique<NsaTransformer>(dims, dtype, device, shard);
    model_ptr->set_recompute(parse_recompute_policy(cfg.recompute.policy), cfg.recompute.layers);
    model_ptr->params().initialize(std::uint64_t(cfg.train.seed));
    std::vector<ParamSegment> segments;
    for (const auto& p : model_ptr->params().infos()) segments.push_back({p.offset, p.numel, p.decay});
    dpo_ptr = std::make_unique<parallel::DataParallelOptimizer>(tensor_groups.dp, model_ptr->params().flat_weights(),
                                                                model_ptr->params().flat_grads(), segments,
                                                                cfg.parallel.zero1);
    std::vector<bool> counted;
    for (const auto& p : model_ptr->params().infos()) counted.push_back(!p.replica);
    dpo_ptr->set_norm_scope({groups.tp, groups.pp}, counted);
  });
  NsaTransformer& model = *model_ptr;
  parallel::DataParallelOptimizer& dpo = *dpo_ptr;
  ParamStore& params = model.params();
  const bool separate_compute_copy = model.compute_weights().raw() != params.flat_weights().raw();
  const bool sharded_state = dpo.zero1() && dp > 1;

  // Where to start: a checkpoint per checkpoint.resume, or the initialisation above. Rank 0
  // chooses (and says why it passed over a checkpoint), every rank loads the same one.
  const std::filesystem::path ckpt_dir(cfg.checkpoint.dir);
  const std::string resume_choice = world.together([&] {
    if (!root) return std::string();
    std::optional<std::filesystem::path> from;
    if (cfg.checkpoint.resume == "auto") {
      ckpt::ResumeChoice choice = ckpt::find_resume(ckpt_dir);
      for (const auto& w : choice.warnings) out << "warning: " << w << "\n";
      from = choice.checkpoint;
    } else if (cfg.checkpoint.resume == "never") {
      auto existing = std::filesystem::exists(ckpt_dir) ? ckpt::list_checkpoints(ckpt_dir) : std::vector<std::filesystem::path>{};
      if (!existing.empty() && !options.overwrite)
        throw UserError(cfg.source + ": checkpoint.resume: \"never\", but checkpoint.dir '" + cfg.checkpoint.dir +
                        "' already holds " + std::to_string(existing.size()) + " checkpoint(s) (newest " +
                        existing.back().filename().string() +
                        "); continue it with resume = \"auto\", choose another checkpoint.dir, or pass --overwrite to "
                        "start afresh and replace them");
    } else {
      from = ckpt::resolve_checkpoint(cfg.checkpoint.resume);
    }
    return from ? from->string() : std::string();
  });
  const std::string resume_path = parallel::broadcast_string(world.comm(), resume_choice, 0);
  std::optional<std::filesystem::path> resume_from;
  if (!resume_path.empty()) resume_from = resume_path;
  std::int64_t start_step = 0, optimizer_step = 0;
  if (resume_from) {
    const ckpt::TrainState state = world.together([&] {
      // A pipeline stage holds some of the checkpoint's tensors (and TP ranks blocks of them).
      const ckpt::LoadScope scope = pp > 1 ? ckpt::LoadScope::part_of(NsaTransformer::parameter_names(dims))
                                           : ckpt::LoadScope::whole_model();
      if (!sharded_state) return ckpt::load_checkpoint(*resume_from, params, dpo.m(), dpo.v(), scope);
      // ZeRO-1: the full moments, then this rank's range of them.
      Tensor m_full = Tensor::zeros({params.total()}, DType::F32, device);
      Tensor v_full = Tensor::zeros({params.total()}, DType::F32, device);
      ckpt::TrainState st = ckpt::load_checkpoint(*resume_from, params, m_full, v_full, scope);
      dpo.m().copy_from(m_full.slice0(dpo.owned_begin(), dpo.owned_end()));
      dpo.v().copy_from(v_full.slice0(dpo.owned_begin(), dpo.owned_end()));
      return st;
    });
    start_step = state.step;
    optimizer_step = state.optimizer_step;
    world.together([&] { data.sampler->restore(data::SamplerPosition::deserialize(state.sampler_position)); });
    out << "resumed from " << resume_from->string() << " (step " << start_step << ", "
        << state.consumed_tokens << " tokens)\n";
    const auto before = config_entries(state.config_toml), now = config_entries(to_toml(cfg));
    for (const auto& [key, value] : now) {
      auto it = before.find(key);
      if (it != before.end() && it->second != value)
        out << "config changed since the checkpoint: " << key << " = " << it->second << " -> " << value << "\n";
    }
    if (start_step >= cfg.train.steps)
      out << "the checkpoint is at step " << start_step << ", train.steps = " << cfg.train.steps
          << ": nothing left to do\n";
  }

  model.sync_compute_weights();  // the compute copy of the initial or the loaded weights
  const std::int64_t T = cfg.train.seq_len;
  const double flops = model.flops_per_token(T);
  // MFU: of the peak of every GPU of the job (tokens/s is the job's).
  const double peak_flops =
      device == Device::CUDA ? peak_bf16_flops(cuda_device_summary()) * double(world.size()) : 0.0;
  const std::int64_t tokens_per_step = cfg.train.global_batch * T;
  const std::int64_t A = data.layout.micro_batches();
  // The whole model's parameter count: every shard counted once, over the ranks of DP group 0.
  std::int64_t own_params = 0;
  for (const auto& p : params.infos())
    if (!p.replica) own_params += p.numel;
  const std::int64_t num_params = std::int64_t(
      parallel::all_reduce_value(world.comm(), dp_rank == 0 ? double(own_params) : 0.0, parallel::ReduceOp::Sum));
  if (root) {
    out << "# run\n"
        << "model        " << human_count(double(num_params)) << " parameters (" << num_params
        << "), " << dims.L << " layers, d_model " << dims.C << ", heads " << dims.H << "/" << dims.G
        << " (query/KV), head_dim " << dims.D << ", ffn " << dims.F << "\n"
        << "nsa          cmp " << dims.cmp_block << "/" << dims.cmp_stride << ", sel " << dims.sel_block << " x "
        << dims.sel_count << ", window " << dims.window << "\n"
        << "flops/token  " << human_count(flops) << " (training, forward + backward, NSA attention included)\n"
        << "batch        " << cfg.train.global_batch << " x " << T << " tokens per step = "
        << (dp > 1 ? std::to_string(dp) + " DP ranks x " : std::string()) << A << " micro-batches of "
        << cfg.train.micro_batch << "\n"
        << "train data   " << trimmed(data.train_set->describe()) << "\n"
        << "val data     " << (data.val_set ? trimmed(data.val_set->describe()) : std::string("none")) << "\n"
        << "unigram      entropy of the training tokens " << std::fixed << std::setprecision(4)
        << unigram_entropy(*data.train_set, dims.V) << " nats (a context-free model's best loss)\n"
        << std::defaultfloat;
    out << "parallel     " << groups.layout.describe() << ", world " << world.size();
    if (world.size() > 1) out << " (MPI, launched by " << world.launch().launcher << ")";
    else out << " (one process)";
    if (multi_gpu)
      out << "; one GPU per rank (rank 0 on GPU " << gpu_index << "), activations and gradients over NCCL";
    if (tp > 1)
      out << "; TP: per rank " << dims.G / tp << " KV group(s) with " << dims.H / tp << " query heads, "
          << dims.F / tp << " MLP units, about " << dims.V / tp << " vocabulary rows; vocab-parallel cross entropy";
    if (pp > 1) {
      out << "; PP: 1F1B over " << A << " micro-batches, stage layers";
      for (int s = 0; s < pp; ++s) {
        const auto [b, e] = cfg.stage_layers(s);
        out << (s ? ", " : " ") << "[" << b << ", " << e << ")";
      }
      if (dims.tie_embeddings) out << ", tied embedding gradients summed between the first and last stages";
    }
    if (dp > 1 && !dpo.zero1())
      out << "; DP gradients all-reduced (sum) in " << dpo.buckets() << " bucket(s) of up to "
          << human_bytes(double(parallel::kDefaultBucketBytes));
    if (sharded_state)
      out << "; ZeRO-1: AdamW state sharded over DP (this rank " << dpo.owned_end() - dpo.owned_begin() << " of "
          << params.total() << " elements), gradients reduce-scattered, weights all-gathered";
    out << "\n# implementations\n";
  }
  if (device == Device::CUDA)
    out << "device       cuda: " << cuda_device_summary() << "; " << cfg.train.dtype << " compute, fp32 master weights, "
        << "gradients and AdamW state\n"
        << "matmul       cuBLASLt (core/ops/cuda/matmul.cu), fp32 accumulation\n"
        << "nsa core     CUDA kernels (nsa/cuda)\n"
        << "other ops    CUDA: rmsnorm, swiglu, embedding, chunked cross entropy, fused AdamW (core/ops/cuda)\n";
  else
    out << "device       cpu, fp32, " << omp_get_max_threads() << " OpenMP threads" << (world.size() > 1 ? " per rank" : "")
        << "\n"
        << "matmul       OpenBLAS sgemm (core/ops/cpu/matmul.cpp)\n"
        << "nsa core     CPU reference forward/backward (nsa/cpu)\n"
        << "other ops    CPU: rmsnorm, swiglu, embedding, cross entropy (chunked head), AdamW (core/ops/cpu)\n";
  out
      << "recompute    " << cfg.recompute.policy
      << (cfg.recompute.policy == "full" ? " (first " + std::to_string(cfg.recompute.layers) + " layers)" : "")
      << "\n"
      << "checkpoints  " << cfg.checkpoint.dir << ", every "
      << (cfg.checkpoint.every > 0 ? std::to_string(cfg.checkpoint.every) + " steps and " : std::string()) << "at the end"
      << ", keep " << (cfg.checkpoint.keep > 0 ? std::to_string(cfg.checkpoint.keep) : std::string("all")) << "\n\n";

  std::ofstream metrics;
  world.together([&] {
    if (!root || cfg.log.metrics.empty()) return;
    std::filesystem::path mp(cfg.log.metrics);
    if (mp.has_parent_path()) std::filesystem::create_directories(mp.parent_path());
    metrics.open(cfg.log.metrics, start_step > 0 ? std::ios::app : std::ios::trunc);
    if (!metrics) throw UserError(cfg.source + ": log.metrics: cannot write '" + cfg.log.metrics + "'");
  });

  install_stop_handlers();
  TrainSummary summary;
  std::int64_t saved_step = start_step;
  auto save = [&](std::int64_t step_done) {
    const auto t0 = Clock::now();
    ckpt::TrainState state;
    state.step = step_done;
    state.consumed_tokens = data.sampler->consumed_samples() * T;
    state.optimizer_step = optimizer_step;
    state.sampler_position = data.sampler->position().serialize();
    state.config_toml = to_toml(cfg);
    std::filesystem::path where;
    if (world.size() == 1) {
      where = ckpt::save_checkpoint(ckpt_dir, params, dpo.m(), dpo.v(), state, int(cfg.checkpoint.keep));
    } else {
      // Each rank of DP group 0 writes the blocks it holds (one writer for pure DP: rank 0);
      // ZeRO-1: each DP rank writes the blocks whose moments it owns. Replicas are written by
      // their counting rank only. (Weights and moments are fp32; on a GPU, copied to the host.)
      auto host = [](const Tensor& t) { return t.is_cpu() ? t : t.to(Device::CPU); };
      Tensor hw, hm, hv;  // the shards point into these until the file is written
      std::vector<ckpt::ShardSpec> shards;
      if (sharded_state || dp_rank == 0) {
        hw = host(params.flat_weights()), hm = host(dpo.m()), hv = host(dpo.v());
        shards = ckpt::param_shards(params, static_cast<const float*>(hw.raw()), static_cast<const float*>(hm.raw()),
                                    static_cast<const float*>(hv.raw()), dpo.owned_begin(), dpo.owned_begin(),
                                    dpo.owned_end());
      }
      where = save_checkpoint_from_ranks(world, ckpt_dir, state, shards, !shards.empty(),
                                         groups.layout.describe() + (sharded_state ? " zero1" : ""),
                                         int(cfg.checkpoint.keep));
    }
    saved_step = step_done;
    out << "checkpoint   step " << step_done << " saved to " << where.string() << " ("
        << std::fixed << std::setprecision(2) << std::chrono::duration<double>(Clock::now() - t0).count() << " s)\n"
        << std::defaultfloat << std::flush;
  };

  ProgressBar bar(cfg.train.steps, root);
  data::TokenBatch batch;
  std::int64_t bad_in_row = 0;
  double window_time = 0, window_loss = 0;
  std::int64_t window_steps = 0;
  if (data.val && start_step == 0) {  // the starting point, so the log shows the validation loss falling
    const double val = evaluate(model, data, cfg, groups, *tensor_groups.pp);
    summary.first_val_loss = val;
    char line[128];
    std::snprintf(line, sizeof line, "eval   %6d | val loss %.4f\n", 0, val);
    out << line << std::flush;
    if (metrics) metrics << std::setprecision(9) << "{\"step\": 0, \"val_loss\": " << val << "}\n" << std::flush;
  }
  // Every rank scales its micro-batches by 1 / (A * dp): the sum over DP is the mean over the
  // global batch (dp = 1: 1 / A, as a single process).
  const double micro_scale = 1.0 / double(A * dp);
  const auto loop_start = Clock::now();
  for (std::int64_t step = start_step; step < cfg.train.steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = learning_rate(cfg.optim, cfg.train.steps, step);
    params.zero_grads();
    double loss = 0;
    std::size_t act_peak = 0;
    if (pp == 1) {
      for (std::int64_t m = 0; m < A; ++m) {
        data.sampler->next(data.layout, m, batch);
        loss += model.forward_backward(batch.inputs, batch.targets, batch.rows, batch.seq_len, micro_scale) /
                double(A * dp);
        act_peak = std::max(act_peak, model.last_activation_peak_bytes());
      }
    } else {
      // 1F1B over the stages (parallel/pipeline.h): the micro-batches in flight on this stage
      // wait in order for their backward.
      std::deque<StageState> in_flight;
      parallel::PipelineStage stage;
      stage.activation_shape = {cfg.train.micro_batch * T, dims.C};
      stage.dtype = dtype;
      stage.device = device;
      stage.forward = [&](std::int64_t m, const Tensor* input) {
        data.sampler->next(data.layout, m, batch);
        in_flight.push_back(
            model.stage_forward(batch.inputs, batch.targets, input, batch.rows, batch.seq_len, micro_scale));
        in_flight.back().micro_batch = m;
        loss += in_flight.back().loss / double(A * dp);
        return std::move(in_flight.back().output);  // the stage keeps no copy of what it sends
      };
      stage.backward = [&](std::int64_t m, const Tensor* d_output) {
        if (in_flight.empty() || in_flight.front().micro_batch != m)
          throw std::logic_error("pipeline: backward of micro-batch " + std::to_string(m) + " out of order");
        StageState st = std::move(in_flight.front());
        in_flight.pop_front();
        return model.stage_backward(st, d_output);
      };
      const std::size_t base = memory_stats(device).current;
      reset_peak_memory(device);
      parallel::run_1f1b(*tensor_groups.pp, A, stage);
      act_peak = memory_stats(device).peak - base;  // every micro-batch in flight at once
      // The loss is the last stage's; a tied embedding's gradient is the sum of the first
      // stage's (lookup) and the last stage's (head) parts.
      loss = parallel::all_reduce_value(*groups.pp, model.last_stage() ? loss : 0.0, parallel::ReduceOp::Sum);
      if (dims.tie_embeddings && (model.first_stage() || model.last_stage())) {
        Tensor g = params.grad("model/embedding");
        tensor_groups.embedding->all_reduce(g);
      }
    }
    data.sampler->advance(data.layout);
    dpo.reduce_gradients();
    if (dp > 1) loss = parallel::all_reduce_value(*groups.dp, loss, parallel::ReduceOp::Sum);
    const double gnorm = dpo.grad_norm();
    const bool bad = !std::isfinite(loss) || !std::isfinite(gnorm);
    if (bad) {
      ++summary.skipped_steps;
      ++bad_in_row;
      bar.clear();
      out << "step " << step + 1 << ": skipped (loss " << loss << ", grad norm " << gnorm
          << " not finite); " << bad_in_row << " in a row, " << summary.skipped_steps << " in all\n";
      if (bad_in_row >= cfg.train.max_bad_steps)  // loss and norm are the same on every rank: all stop here
        throw JobError(1,
                       "nsatron train: " + std::to_string(bad_in_row) +
                           " steps in a row had a non-finite loss or gradient norm (train.max_bad_steps = " +
                           std::to_string(cfg.train.max_bad_steps) + "); stopping at step " +
                           std::to_string(step + 1) + "; the last checkpoint is kept",
                       root);
    } else {
      bad_in_row = 0;
      const double clip = cfg.optim.grad_clip > 0 ? clip_coefficient(gnorm, cfg.optim.grad_clip) : 1.0;
      AdamWHyper hp{lr, cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay};
      AdamWExtra extra;
      // AdamW writes the bf16 compute copy as it goes; with ZeRO-1 over several ranks the
      // weights arrive by all-gather, so the copy is refreshed afterwards.
      if (separate_compute_copy && !sharded_state) extra.compute_copy = &model.compute_weights();
      dpo.step(hp, ++optimizer_step, clip, extra);
      if (separate_compute_copy && sharded_state) model.sync_compute_weights();
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    summary.steps_done = step + 1;
    summary.last_loss = loss;
    window_time += dt;
    window_loss += loss;
    ++window_steps;
    const double tok_s = double(tokens_per_step) / dt;
    const std::size_t peak = memory_stats(device).peak;
    const double mfu = peak_flops > 0 ? tok_s * flops / peak_flops : 0.0;
    if (metrics) {
      metrics << std::setprecision(9) << "{\"step\": " << step + 1 << ", \"loss\": " << (std::isfinite(loss) ? loss : -1)
              << ", \"lr\": " << lr << ", \"grad_norm\": " << (std::isfinite(gnorm) ? gnorm : -1)
              << ", \"tokens_per_s\": " << tok_s << ", \"ms_per_step\": " << dt * 1e3
              << ", \"peak_mem_bytes\": " << peak << ", \"activation_peak_bytes\": " << act_peak
              << ", \"mfu\": " << mfu
              << ", \"tokens\": " << (step + 1) * tokens_per_step << ", \"skipped\": " << (bad ? "true" : "false")
              << "}\n" << std::flush;
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - loop_start).count();
    const double eta = elapsed / double(step + 1 - start_step) * double(cfg.train.steps - step - 1);
    const bool last = step + 1 == cfg.train.steps;
    if ((step + 1) % cfg.log.every == 0 || last || step == start_step) {
      bar.clear();
      char line[512];
      const double window_tok_s = double(tokens_per_step) * double(window_steps) / window_time;
      char mfu_text[32] = "";
      if (peak_flops > 0) std::snprintf(mfu_text, sizeof mfu_text, " | mfu %.1f%%", 100.0 * window_tok_s * flops / peak_flops);
      std::snprintf(line, sizeof line,
                    "step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %s tok/s | %.0f ms/step | mem %s%s | eta %s\n",
                    (long long)(step + 1), (long long)cfg.train.steps, window_loss / double(window_steps), lr, gnorm,
                    human_count(window_tok_s).c_str(), window_time / double(window_steps) * 1e3,
                    human_bytes(double(peak)).c_str(), mfu_text, human_duration(eta).c_str());
      out << line << std::flush;
      window_time = window_loss = 0;
      window_steps = 0;
    }
    if (data.val && ((cfg.train.eval_every > 0 && (step + 1) % cfg.train.eval_every == 0) || last)) {
      const double val = evaluate(model, data, cfg, groups, *tensor_groups.pp);
      if (summary.first_val_loss < 0) summary.first_val_loss = val;
      summary.last_val_loss = val;
      bar.clear();
      char line[128];
      std::snprintf(line, sizeof line, "eval   %6lld | val loss %.4f\n", (long long)(step + 1), val);
      out << line << std::flush;
      if (metrics) metrics << std::setprecision(9) << "{\"step\": " << step + 1 << ", \"val_loss\": " << val << "}\n" << std::flush;
    }
    if (cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0) {
      bar.clear();
      save(step + 1);
    }
    // A signal on any rank stops every rank after this step (the highest signal number wins).
    const int stop = world.size() > 1 ? int(parallel::all_reduce_value(world.comm(), stop_signal(), parallel::ReduceOp::Max))
                                      : stop_signal();
    if (stop != 0 && !last) {
      bar.clear();
      out << "signal " << stop << " received" << (stop_signal() == 0 ? " by another rank" : "")
          << ": stopping after step " << step + 1 << "\n";
      if (saved_step != step + 1) save(step + 1);
      summary.stopped_by_signal = true;
      return summary;
    }
    if (cfg.train.stop_at > 0 && step + 1 == cfg.train.stop_at && !last) {
      bar.clear();
      if (saved_step != step + 1) save(step + 1);
      out << "stopped at step " << step + 1 << " (train.stop_at); run again to resume\n";
      return summary;
    }
    bar.draw(step + 1, eta);
  }
  bar.clear();
  if (summary.steps_done > 0 && saved_step != summary.steps_done) save(summary.steps_done);
  const double total = std::chrono::duration<double>(Clock::now() - t_start).count();
  out << "\ndone: " << summary.steps_done << " steps in " << human_duration(total) << ", final train loss "
      << std::fixed << std::setprecision(4) << summary.last_loss;
  if (summary.last_val_loss >= 0) out << ", val loss " << summary.first_val_loss << " -> " << summary.last_val_loss;
  out << ", " << summary.skipped_steps << " skipped steps\n" << std::defaultfloat;
  return summary;
}

}  // namespace nsatron
