// Setup phases: the world and its groups, the data, the model and the optimizer.
#include <string>
#include <tuple>
#include <vector>

#include "core/comm/pipeline_schedule.h"
#include "core/comm/watchdog.h"
#include "core/device/device.h"
#include "core/util/error.h"
#include "core/util/format.h"
#include "launch/train/phases.h"
#include "parallel/copy_engine_communicator.h"
#include "parallel/gpu_binding.h"

namespace nsatron::train {

Run::Run(const RunConfig& cfg, std::ostream& out, World& world, const TrainOptions& options)
    : cfg(cfg),
      out(out),
      world(world),
      options(options),
      device(cfg.train.device == "cuda" ? Device::CUDA : Device::CPU),
      dtype(cfg.train.dtype == "bf16" ? DType::BF16 : DType::F32),
      root(world.rank() == 0),
      started(Clock::now()),
      dims(ModelDims::from_config(cfg)),
      bar(cfg.train.steps, world.rank() == 0) {}

namespace {

// A group's transfers on the copy engines (parallel.<key> = "copy_engine" or "auto"; `sums`:
// the tensor-parallel sums, else the pipeline's messages): a CopyEngineCommunicator with `slots`
// receive slots of one activation per linked peer over `host`, in place of `device` where every
// rank reaches its peers' memory; else `device` (NCCL) stays, or a UserError for "copy_engine".
// Collective over the group. Returns the run log's words (`nccl`: NCCL's).
std::string take_copy_engines(Run& run, parallel::Communicator& host, std::shared_ptr<parallel::Communicator>& device,
                              const char* key, const std::string& value, int slots, bool sums,
                              const std::string& nccl) {
#if NSATRON_WITH_NCCL
  const RunConfig& cfg = run.cfg;
  const auto slot = std::size_t(parallel::pipeline_message_bytes(cfg.train.micro_batch, cfg.train.seq_len, run.dims.C,
                                                                 std::int64_t(dtype_size(run.dtype))));
  using Role = parallel::CopyEngineCommunicator::Role;
  std::string why;
  auto ce = parallel::CopyEngineCommunicator::create(host, device, slot, slots, &why,
                                                     sums ? Role::TensorSums : Role::PipelineMessages);
  if (ce) {
    device = ce;
    return "copy engines into " + std::to_string(slots) + " receive slots of " + human_bytes(double(slot)) +
           (sums ? " per peer, added in rank order" : " per neighbour") + " (CUDA IPC; " + key + " = \"" + value +
           "\")";
  }
#else
  (void)host, (void)device, (void)slots, (void)sums;
  const std::string why = "this build has no NCCL";
#endif
  if (value == "copy_engine")
    throw UserError(run.cfg.source + ": parallel." + key + " = \"copy_engine\", but " + why);
  return nccl + " (" + key + " = \"auto\": no copy engines, " + why + ")";
}

// The GPU pipeline's transfers (parallel.pp_transport): the pp group's neighbours' messages
// on the copy engines where asked and possible. Collective over the pp group.
std::string choose_pipeline_transport(Run& run) {
  const ParallelConfig& p = run.cfg.parallel;
  const std::string nccl = "NCCL send/recv on the compute stream";
  if (p.pp_transport == "nccl") return nccl + " (pp_transport = \"nccl\")";
  return take_copy_engines(run, *run.groups.pp, run.tensor_groups.pp, "pp_transport", p.pp_transport,
                           parallel::copy_engine_slots(int(p.pp), int(p.virtual_stages)), false, nccl);
}

// The GPU tensor-parallel sums (parallel.tp_transport): on the copy engines where asked ("auto":
// with micro-batch pairs) and possible. Collective over the tp group.
std::string choose_tensor_transport(Run& run) {
  const ParallelConfig& p = run.cfg.parallel;
  const std::string nccl = "NCCL all-reduce";
  if (p.tp_transport == "nccl") return nccl + " (tp_transport = \"nccl\")";
  if (!parallel::tp_sums_on_copy_engines(p.tp_transport, p.tp_micro_batch_pairs))
    return nccl + " (tp_transport = \"auto\": without tp_micro_batch_pairs the forward's sums run in line, where "
                  "NCCL's are faster)";
  return take_copy_engines(run, *run.groups.tp, run.tensor_groups.tp, "tp_transport", p.tp_transport,
                           parallel::kCopyEngineSumSlots, true, nccl);
}

}  // namespace

void setup_world(Run& run) {
  const RunConfig& cfg = run.cfg;
  World& world = run.world;
  // Checks every rank makes alike, then the process groups (collective over the world).
  world.together([&] {
    if (run.device == Device::CUDA && !cuda_available())
      throw UserError(cfg.source + ": train.device: \"cuda\", but " + cuda_device_summary());
    if (cfg.data.train.empty()) throw UserError(cfg.source + ": data.train: required to train (a glob of token shards)");
  });
  run.groups = world.together([&] {
    return parallel::make_process_groups(world.size() > 1 ? parallel::Backend::Mpi : parallel::Backend::Single,
                                         int(cfg.parallel.tp), int(cfg.parallel.pp));
  });
  // Several GPU ranks: one GPU each (before any other CUDA call), and NCCL communicators for
  // the tensors (gradients, pipeline messages); the MPI groups keep carrying control values.
  // Several ranks: the communication watchdog (core/comm/watchdog.h), armed while the NCCL
  // communicators are created and over the training loop (run_training).
  if (world.size() > 1 && cfg.parallel.comm_timeout_s > 0)
    parallel::Watchdog::instance().start("rank " + std::to_string(world.rank()), cfg.parallel.comm_timeout_s);
  run.multi_gpu = run.device == Device::CUDA && world.size() > 1;
  if (!run.multi_gpu) {
    run.tensor_groups = run.groups;
    return;
  }
  run.gpu_index = world.together([&] { return parallel::bind_local_gpu(*run.groups.world); });
  run.tensor_groups = world.together([&] {
    const parallel::Watchdog::Armed watched;
    parallel::DeviceGroupSet which;
    which.world = false;  // the world carries only control values
    which.embedding = cfg.model.tie_embeddings && cfg.parallel.pp > 1;
    return parallel::make_device_groups(run.groups, which);
  });
  if (cfg.parallel.pp > 1) run.pp_transport = world.together([&] { return choose_pipeline_transport(run); });
  if (cfg.parallel.tp > 1) run.tp_transport = world.together([&] { return choose_tensor_transport(run); });
}

void open_data(Run& run) {
  run.world.together([&] { run.data = data::open_run_data(run.cfg, run.groups.layout.dp_rank); });
}

void build_model_and_optimizer(Run& run) {
  const RunConfig& cfg = run.cfg;
  run.world.together([&] {
    ModelShard shard;
    shard.tp = run.tp();
    shard.tp_rank = run.groups.layout.tp_rank;
    shard.tp_group = run.tensor_groups.tp;
    shard.chunks = cfg.stage_chunks(run.groups.layout.pp_rank);  // one range unless virtual stages
    run.model = std::make_unique<NsaTransformer>(run.dims, run.dtype, run.device, shard);
    run.model->set_recompute(parse_recompute_policy(cfg.recompute.policy), cfg.recompute.layers);
    run.model->set_tp_overlap(cfg.parallel.tp_overlap);
    run.model->set_pair_core_joint(cfg.parallel.tp_pair_core == "joint");
    run.model->defer_lookup_grads(
        NsaTransformer::trainer_defers_lookup_grads(run.dims.tie_embeddings, run.tp(), cfg.parallel.pp));
    ParamStore& params = run.model->params();
    params.initialize(std::uint64_t(cfg.train.seed));
    std::vector<ParamSegment> segments;
    for (const auto& p : params.infos()) segments.push_back({p.offset, p.numel, p.decay});
    run.optimizer = std::make_unique<parallel::DataParallelOptimizer>(
        run.tensor_groups.dp, params.flat_weights(), params.flat_grads(), segments, cfg.parallel.zero1,
        cfg.parallel.grad_bucket_kib * 1024);
    std::vector<bool> counted;
    for (const auto& p : params.infos()) counted.push_back(!p.replica);
    run.optimizer->set_norm_scope({run.groups.tp, run.groups.pp}, counted);
  });
  run.separate_compute_copy = run.model->compute_weights().raw() != run.model->params().flat_weights().raw();
  run.sharded_state = run.optimizer->zero1() && run.dp() > 1;
}

}  // namespace nsatron::train
