// `nsatron sample`: generate text from a checkpoint on the CPU.
//
// The model's config comes from the checkpoint itself (the resolved config it stores), so
// only the checkpoint is needed. Each new token runs the model over the last seq_len tokens
// of the context (no key/value cache: simple, and fast enough for the small models one
// samples on a CPU), then draws from softmax(logits / temperature) restricted to the top-k.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/model/model.h"
#include "core/model/rng.h"
#include "data/tokenizer.h"
#include "launch/args.h"
#include "launch/commands.h"

namespace nsatron {

static const char* kSampleHelp =
    "usage: nsatron sample --checkpoint DIR --prompt TEXT --tokens N\n"
    "                      [--temperature T] [--top-k K] [--seed S]\n"
    "\n"
    "Generates N tokens after TEXT with the model of a checkpoint (DIR: a run's checkpoint\n"
    "directory, which means its latest checkpoint, or one step_* directory), on the CPU, with\n"
    "the bytes tokenizer. temperature (default 0.8) divides the logits; 0 picks the most likely\n"
    "token. top-k (default 40; 0: all) keeps the k most likely tokens. The same seed (default\n"
    "1) gives the same text.\n";

namespace {
double parse_double(const Args& a, const std::string& flag, double fallback) {
  auto v = a.get(flag);
  if (!v) return fallback;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end) throw UserError(flag + " expects a number, got '" + *v + "'");
  return x;
}
}  // namespace

int sample_main(const std::vector<std::string>& argv) {
  Args args("sample", argv, {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--seed"},
            {"--help", "-h"});
  if (args.has("--help") || args.has("-h")) {
    std::cout << kSampleHelp;
    return 0;
  }
  if (!args.get("--checkpoint")) throw UserError("--checkpoint DIR is required (see --help)");
  if (!args.positional().empty()) throw UserError("unexpected argument '" + args.positional()[0] + "'");
  const long long n_tokens = args.get_int("--tokens", 200);
  const double temperature = parse_double(args, "--temperature", 0.8);
  const long long top_k = args.get_int("--top-k", 40);
  const long long seed = args.get_int("--seed", 1);
  if (n_tokens < 0) throw UserError("--tokens must be at least 0");
  if (temperature < 0) throw UserError("--temperature must be at least 0");
  if (top_k < 0) throw UserError("--top-k must be at least 0");

  const auto path = checkpoint::resolve_checkpoint(*args.get("--checkpoint"));
  const checkpoint::TrainState state = checkpoint::read_train_state(path);
  // Sampling runs the whole model in this one process, whatever layout trained it.
  const RunConfig cfg = parse_config(state.config_toml, path.string() + " (stored config)",
                                     {"parallel.tp=1", "parallel.pp=1", "parallel.pp_layers=[]"});
  const data::Tokenizer tok = data::Tokenizer::get("bytes");
  if (cfg.model.vocab_size != tok.vocab_size())
    throw UserError("the checkpoint's model has vocab_size " + std::to_string(cfg.model.vocab_size) +
                    "; sample knows only the bytes tokenizer (256)");
  NsaTransformer model(ModelDims::from_config(cfg), DType::F32);
  checkpoint::load_weights(path, model.params());

  std::vector<std::int32_t> context = tok.encode(args.get("--prompt").value_or(""));
  if (context.empty()) context.push_back(std::int32_t('\n'));
  std::cerr << "sampling " << n_tokens << " tokens from " << path.string() << " (step " << state.step << ")\n";
  std::cout << args.get("--prompt").value_or("") << std::flush;
  SplitMix64 rng(static_cast<std::uint64_t>(seed));
  const std::int64_t V = cfg.model.vocab_size, window = cfg.train.seq_len;
  std::vector<int> order(static_cast<std::size_t>(V));
  for (long long i = 0; i < n_tokens; ++i) {
    const std::int64_t len = std::min<std::int64_t>(std::int64_t(context.size()), window);
    std::span<const std::int32_t> ctx(context.data() + context.size() - std::size_t(len), std::size_t(len));
    std::vector<double> logits = model.last_logits(ctx, 1, len).to_vector();
    std::int32_t next;
    if (temperature == 0) {
      next = std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
      const std::size_t k = top_k == 0 ? order.size() : std::min<std::size_t>(order.size(), std::size_t(top_k));
      std::partial_sort(order.begin(), order.begin() + long(k), order.end(), [&](int a, int b) {
        return logits[std::size_t(a)] > logits[std::size_t(b)] || (logits[std::size_t(a)] == logits[std::size_t(b)] && a < b);
      });
      std::vector<double> p(k);
      const double top = logits[std::size_t(order[0])];
      double sum = 0;
      for (std::size_t j = 0; j < k; ++j) sum += p[j] = std::exp((logits[std::size_t(order[j])] - top) / temperature);
      double u = rng.uniform() * sum;
      std::size_t j = 0;
      while (j + 1 < k && (u -= p[j]) > 0) ++j;
      next = order[j];
    }
    context.push_back(next);
    std::cout << tok.decode(std::span<const std::int32_t>(&next, 1)) << std::flush;
  }
  std::cout << "\n";
  return 0;
}

}  // namespace nsatron
