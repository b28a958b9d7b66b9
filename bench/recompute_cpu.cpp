// Peak activation memory and step time of the three recompute policies, on the CPU model.
//
//   build/bench/recompute_cpu [CONFIG] [--set section.key=value]...
//
// Builds the model of CONFIG (default configs/demo_cpu.toml) in fp32 and runs forward +
// backward on one micro-batch of random tokens per policy ("full" recomputes every layer),
// after one warm-up. Prints activation peak (bytes held above parameters and gradients) and
// time per micro-batch, and checks that the loss and gradient bits agree across policies.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/model/model.h"
#include "core/model/rng.h"

using namespace nsatron;

int main(int argc, char** argv) {
  std::string path = "configs/demo_cpu.toml";
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--set") == 0 && i + 1 < argc) overrides.push_back(argv[++i]);
    else path = argv[i];
  }
  RunConfig cfg = load_config(path, overrides);
  const ModelDims dims = ModelDims::from_config(cfg);
  const std::int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len;
  std::vector<std::int32_t> tokens(std::size_t(B * T)), targets(std::size_t(B * T));
  SplitMix64 rng(7);
  for (auto& t : tokens) t = std::int32_t(rng.next() % std::uint64_t(dims.V));
  for (auto& t : targets) t = std::int32_t(rng.next() % std::uint64_t(dims.V));

  std::printf("config %s: B=%lld T=%lld, C=%lld L=%lld H=%lld G=%lld D=%lld\n", path.c_str(), (long long)B,
              (long long)T, (long long)dims.C, (long long)dims.L, (long long)dims.H, (long long)dims.G,
              (long long)dims.D);
  std::printf("%-10s %18s %14s\n", "policy", "activation peak", "ms/micro-batch");
  std::vector<double> reference_grads;
  double reference_loss = 0;
  for (auto [name, policy] : {std::pair{"none", RecomputePolicy::None}, std::pair{"selective", RecomputePolicy::Selective},
                              std::pair{"full", RecomputePolicy::Full}}) {
    NsaTransformer model(dims, DType::F32);
    model.params().initialize(std::uint64_t(cfg.train.seed));
    model.set_recompute(policy, dims.L);
    model.forward_backward(tokens, targets, B, T);  // warm-up
    model.params().zero_grads();
    const int reps = 3;
    auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int r = 0; r < reps; ++r) {
      model.params().zero_grads();
      loss = model.forward_backward(tokens, targets, B, T);
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    std::printf("%-10s %14.1f MiB %14.1f\n", name, double(model.last_activation_peak_bytes()) / (1 << 20), ms);
    std::vector<double> grads = model.params().flat_grads().to_vector();
    if (reference_grads.empty()) {
      reference_grads = grads;
      reference_loss = loss;
    } else if (grads != reference_grads || loss != reference_loss) {
      std::printf("MISMATCH: %s differs from none\n", name);
      return 1;
    }
  }
  std::printf("loss and gradients identical across policies\n");
  return 0;
}
