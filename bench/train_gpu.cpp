// End-to-end training throughput of a config's model on one GPU: tokens/s, MFU, peak memory,
// per micro-batch size and recompute policy, on random tokens (the data pipeline is not
// measured: it is a few memcpy per step).
//
//   build/bench/train_gpu [CONFIG] [--micro 8,16,32] [--policies none,selective,full]
//                         [--seq N] [--steps N] [--profile] [--head-chunk ROWS] [--set section.key=value]...
//
// Each configuration: the model in the config's dtype on CUDA, 2 warm-up steps, then --steps
// timed optimizer steps of one micro-batch each (forward, backward, gradient norm, AdamW with
// the bf16 weight copy); the loss is read back every step, as the trainer does for its log.
// Peak memory is what the Tensor allocator and the NSA saved state held at most (cuBLAS
// workspaces not included). MFU = tokens/s * flops_per_token / 989e12 (H100/H200 dense bf16).
// --profile: after the timed steps, one more step with op_timer on, printing the time per op
// family (CUDA events around each of the model's calls; the events add a little time).
// --head-chunk: the LM head's row chunk (the trainer's is NsaTransformer::kDefaultHeadChunk).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/device/device.h"
#include "core/model/model.h"
#include "core/model/rng.h"
#include "core/ops/adamw.h"
#include "core/ops/grad_norm.h"
#include "core/util/op_timer.h"

using namespace nsatron;

namespace {
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  std::string path = "configs/nsa_125m.toml", micro = "8,16,32", policies = "none", seq;
  int steps = 5;
  bool profile = false;
  std::int64_t head_chunk = NsaTransformer::kDefaultHeadChunk;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else if (a == "--micro" && i + 1 < argc) micro = argv[++i];
    else if (a == "--policies" && i + 1 < argc) policies = argv[++i];
    else if (a == "--seq" && i + 1 < argc) seq = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--profile") profile = true;
    else if (a == "--head-chunk" && i + 1 < argc) head_chunk = std::atoll(argv[++i]);
    else path = a;
  }
  if (!cuda_available()) {
    std::printf("no CUDA device: %s\n", cuda_device_summary().c_str());
    return 0;
  }
  if (!seq.empty()) overrides.push_back("train.seq_len=" + seq);
  RunConfig cfg = load_config(path, overrides);
  const ModelDims dims = ModelDims::from_config(cfg);
  const std::int64_t T = cfg.train.seq_len;
  const DType dtype = cfg.train.dtype == "bf16" ? DType::BF16 : DType::F32;
  std::printf("device %s\nconfig %s, seq %lld, %s\n", cuda_device_summary().c_str(), path.c_str(), (long long)T,
              cfg.train.dtype.c_str());
  std::printf("%-10s %6s %12s %8s %10s %12s\n", "policy", "micro", "tokens/s", "MFU", "ms/step", "peak GiB");
  for (const auto& pol : split(policies)) {
    for (const auto& mb : split(micro)) {
      const std::int64_t B = std::stoll(mb);
      try {
        NsaTransformer model(dims, dtype, Device::CUDA);
        model.set_recompute(parse_recompute_policy(pol), dims.L);
        model.set_head_chunk(head_chunk);
        model.params().initialize(std::uint64_t(cfg.train.seed));
        model.sync_compute_weights();
        ParamStore& params = model.params();
        Tensor m1 = Tensor::zeros({params.total()}, DType::F32, Device::CUDA);
        Tensor m2 = Tensor::zeros({params.total()}, DType::F32, Device::CUDA);
        std::vector<ParamSegment> segs;
        for (const auto& p : params.infos()) segs.push_back({p.offset, p.numel, p.decay});
        std::vector<std::int32_t> tokens(std::size_t(B * T)), targets(std::size_t(B * T));
        SplitMix64 rng(1);
        for (auto& t : tokens) t = std::int32_t(rng.next() % std::uint64_t(dims.V));
        for (auto& t : targets) t = std::int32_t(rng.next() % std::uint64_t(dims.V));
        Tensor norm = Tensor::empty({1}, DType::F32, Device::CUDA);
        AdamWExtra extra;
        if (model.compute_weights().raw() != params.flat_weights().raw()) extra.compute_copy = &model.compute_weights();
        extra.clip_norm = &norm;
        extra.max_norm = 1.0;
        auto one_step = [&](int t) {
          params.zero_grads();
          double loss = model.forward_backward(tokens, targets, B, T);
          std::vector<Tensor> g{params.flat_grads()};
          {
            op_timer::Scope scope("gradient norm", Device::CUDA);
            global_norm(g, norm);
          }
          op_timer::Scope scope("adamw", Device::CUDA);
          adamw_step(params.flat_weights(), params.flat_grads(), m1, m2, segs, {1e-4, 0.9, 0.95, 1e-8, 0.1}, t, 1.0,
                     extra);
          return loss;
        };
        one_step(1);
        one_step(2);
        cuda_synchronize();
        reset_peak_memory(Device::CUDA);
        auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < steps; ++s) one_step(3 + s);
        cuda_synchronize();
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
        const double tok_s = double(B * T) / sec;
        const double mfu = tok_s * model.flops_per_token(T) / 989e12;
        std::printf("%-10s %6lld %12.0f %7.1f%% %10.1f %12.2f\n", pol.c_str(), (long long)B, tok_s, 100 * mfu, sec * 1e3,
                    double(memory_stats(Device::CUDA).peak) / (1 << 30));
        if (profile) {
          op_timer::reset();
          op_timer::enable(true);
          auto p0 = std::chrono::steady_clock::now();
          one_step(3 + steps);
          cuda_synchronize();
          const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0).count();
          op_timer::enable(false);
          std::printf("  time per op family in one step (%.1f ms):\n", step_ms);
          for (const std::string& line : op_timer::split_lines(op_timer::totals_ms(), step_ms))
            std::printf("    %s\n", line.c_str());
          op_timer::reset();
        }
      } catch (const std::exception& e) {
        std::printf("%-10s %6lld  failed: %s\n", pol.c_str(), (long long)B, e.what());
      }
      cuda_release_cached();
      std::fflush(stdout);
    }
  }
  return 0;
}
