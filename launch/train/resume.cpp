// Resume phase: which checkpoint to start from, loading it on every rank, and what the log
// says about it.
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/util/error.h"
#include "launch/train/phases.h"

namespace nsatron::train {

namespace ckpt = checkpoint;

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

// The checkpoint per checkpoint.resume ("" for none), chosen on rank 0 (which says why it
// passed over a checkpoint) and broadcast: every rank loads the same one.
std::string choose_checkpoint(Run& run) {
  const RunConfig& cfg = run.cfg;
  const std::filesystem::path dir(cfg.checkpoint.dir);
  const std::string choice = run.world.together([&] {
    if (!run.root) return std::string();
    std::optional<std::filesystem::path> from;
    if (cfg.checkpoint.resume == "auto") {
      ckpt::ResumeChoice choice = ckpt::find_resume(dir);
      for (const auto& w : choice.warnings) run.out << "warning: " << w << "\n";
      from = choice.checkpoint;
    } else if (cfg.checkpoint.resume == "never") {
      auto existing = std::filesystem::exists(dir) ? ckpt::list_checkpoints(dir) : std::vector<std::filesystem::path>{};
      if (!existing.empty() && !run.options.overwrite)
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
  return parallel::broadcast_string(run.world.comm(), choice, 0);
}

// The attention of the model in a checkpoint: its extra.attention, or for a checkpoint from
// before that attribute its stored config's model.attention, or "nsa" (the only one then).
std::string checkpoint_attention(const ckpt::TrainState& state) {
  if (auto it = state.extra.find(kAttentionAttribute); it != state.extra.end()) return it->second;
  const auto stored = config_entries(state.config_toml);
  if (auto it = stored.find("model.attention"); it != stored.end() && it->second.size() >= 2)
    return it->second.substr(1, it->second.size() - 2);  // the TOML string without its quotes
  return "nsa";
}

// A checkpoint of NSA layers cannot continue as dense attention or the other way round: the
// projections differ in meaning even where their shapes agree. Says so before any tensor loads.
void check_attention(const Run& run, const std::filesystem::path& from) {
  const std::string held = checkpoint_attention(ckpt::read_train_state(from));
  if (held == run.cfg.model.attention) return;
  throw UserError(from.string() + ": extra." + kAttentionAttribute + ": the checkpoint holds a model with \"" + held +
                  "\" attention, but " + run.cfg.source + " sets model.attention = \"" + run.cfg.model.attention +
                  "\"; resume it with model.attention = \"" + held +
                  "\", or start the other model in another checkpoint.dir");
}

// The weights and AdamW moments of this rank (a pipeline stage: its tensors; TP: blocks of
// them; ZeRO-1: its range of the moments) and the training state, from `from`.
ckpt::TrainState load_state(Run& run, const std::filesystem::path& from) {
  ParamStore& params = run.model->params();
  parallel::DataParallelOptimizer& opt = *run.optimizer;
  return run.world.together([&] {
    check_attention(run, from);
    const ckpt::LoadScope scope = run.pp() > 1 ? ckpt::LoadScope::part_of(NsaTransformer::parameter_names(run.dims))
                                               : ckpt::LoadScope::whole_model();
    if (!run.sharded_state) return ckpt::load_checkpoint(from, params, opt.m(), opt.v(), scope);
    // ZeRO-1: the full moments, then this rank's range of them.
    Tensor m_full = Tensor::zeros({params.total()}, DType::F32, run.device);
    Tensor v_full = Tensor::zeros({params.total()}, DType::F32, run.device);
    ckpt::TrainState st = ckpt::load_checkpoint(from, params, m_full, v_full, scope);
    opt.m().copy_from(m_full.slice0(opt.owned_begin(), opt.owned_end()));
    opt.v().copy_from(v_full.slice0(opt.owned_begin(), opt.owned_end()));
    return st;
  });
}

// Where the run resumed, the config keys that changed since the checkpoint, and whether any
// step is left.
void report_resume(Run& run, const std::filesystem::path& from, const ckpt::TrainState& state) {
  run.out << "resumed from " << from.string() << " (step " << run.start_step << ", " << state.consumed_tokens
          << " tokens)\n";
  const auto before = config_entries(state.config_toml), now = config_entries(to_toml(run.cfg));
  for (const auto& [key, value] : now) {
    auto it = before.find(key);
    if (it != before.end() && it->second != value)
      run.out << "config changed since the checkpoint: " << key << " = " << it->second << " -> " << value << "\n";
  }
  if (run.start_step >= run.cfg.train.steps)
    run.out << "the checkpoint is at step " << run.start_step << ", train.steps = " << run.cfg.train.steps
            << ": nothing left to do\n";
}

}  // namespace

void resume(Run& run) {
  const std::string from = choose_checkpoint(run);
  if (!from.empty()) {
    const ckpt::TrainState state = load_state(run, from);
    run.start_step = state.step;
    run.optimizer_step = state.optimizer_step;
    run.world.together([&] { run.data.sampler->restore(data::SamplerPosition::deserialize(state.sampler_position)); });
    report_resume(run, from, state);
  }
  run.saved_step = run.start_step;
  run.model->sync_compute_weights();  // the compute copy of the initial or the loaded weights
}

}  // namespace nsatron::train
