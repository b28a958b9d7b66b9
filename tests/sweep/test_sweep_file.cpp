// The sweep file (launch/sweep/sweep_file.h): the grid, run names, budgets, and every bad
// input refused before any run starts, naming the line and the key.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/model/model.h"
#include "core/model/plan.h"
#include "launch/sweep/runner.h"
#include "launch/sweep/sweep_file.h"

namespace fs = std::filesystem;
using namespace nsatron;
using namespace nsatron::sweep;

namespace {

// A base config and a folder for the sweep file; the sweep text names the base by a path
// relative to the sweep file's folder (as a user's would).
class SweepFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "nsatron_sweepfile_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "configs" / "sweeps");
    std::ofstream(dir_ / "configs" / "base.toml")
        << "[model]\nd_model = 32\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nhead_dim = 8\nffn_hidden = 64\n"
           "[nsa]\ncmp_block = 8\ncmp_stride = 4\nsel_block = 8\nsel_count = 3\nwindow = 16\n"
           "[train]\nseq_len = 64\nmicro_batch = 4\nglobal_batch = 8\nsteps = 40\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path() const { return (dir_ / "configs" / "sweeps" / "study.toml").string(); }
  Sweep parse(const std::string& text) const { return parse_sweep(text, path()); }
  // The messages of the SweepError that parsing (and expanding) `text` throws.
  std::vector<std::string> problems(const std::string& text) const {
    try {
      expand(parse(text));
    } catch (const SweepError& e) {
      return e.messages;
    }
    ADD_FAILURE() << "no error for:\n" << text;
    return {};
  }
  fs::path dir_;
};

bool any_has(const std::vector<std::string>& msgs, const std::string& a, const std::string& b = "") {
  for (const auto& m : msgs)
    if (m.find(a) != std::string::npos && m.find(b) != std::string::npos) return true;
  return false;
}

std::string all(const std::vector<std::string>& msgs) {
  std::string s;
  for (const auto& m : msgs) s += m + "\n";
  return s;
}

}  // namespace

TEST_F(SweepFile, GridIsCrossedFirstAxisOutermostWithNamesThatSayTheValues) {
  const Sweep s = parse(
      "[sweep]\nbase = \"../base.toml\"\nout = \"" + (dir_ / "out").string() + "\"\n"
      "[set]\n\"train.eval_every\" = 5\n"
      "[axes]\n"
      "\"model.attention\" = [\"nsa\", \"dense\"]\n"
      "size = [{ name = \"s\", \"model.d_model\" = 32 }, { name = \"m\", \"model.d_model\" = 48, \"model.n_layers\" = 3 }]\n"
      "budget = [{ tokens = 5120 }, { tokens = 10240 }]\n");
  EXPECT_EQ(s.name, "study");
  EXPECT_EQ(fs::path(s.base), (dir_ / "configs" / "base.toml").lexically_normal());
  ASSERT_EQ(s.axes.size(), 3u);
  const auto runs = expand(s);
  ASSERT_EQ(runs.size(), 8u);
  EXPECT_EQ(runs[0].name, "attention-nsa_size-s_tok-5.12k");
  EXPECT_EQ(runs[1].name, "attention-nsa_size-s_tok-10.24k");
  EXPECT_EQ(runs[2].name, "attention-nsa_size-m_tok-5.12k");
  EXPECT_EQ(runs[4].name, "attention-dense_size-s_tok-5.12k");
  EXPECT_EQ(runs[7].name, "attention-dense_size-m_tok-10.24k");
  // The values reach the configs; [set] reaches every run; the run's files go under its folder.
  EXPECT_EQ(runs[3].config.model.attention, "nsa");
  EXPECT_EQ(runs[3].config.model.d_model, 48);
  EXPECT_EQ(runs[3].config.model.n_layers, 3);
  EXPECT_EQ(runs[4].config.model.attention, "dense");
  EXPECT_EQ(runs[4].config.model.n_layers, 2);
  for (const auto& r : runs) {
    EXPECT_EQ(r.config.train.eval_every, 5);
    EXPECT_EQ(r.config.checkpoint.dir, r.dir + "/checkpoints");
    EXPECT_EQ(r.config.log.metrics, r.dir + "/metrics.jsonl");
    EXPECT_EQ(r.config.checkpoint.resume, "auto");
    EXPECT_EQ(fs::path(r.dir), dir_ / "out" / r.name);
    EXPECT_EQ(r.ranks, 1);
  }
  // 5120 tokens of 8 x 64 per step: 10 steps.
  EXPECT_EQ(runs[0].config.train.steps, 10);
  EXPECT_EQ(runs[1].config.train.steps, 20);
  EXPECT_EQ(runs[1].tokens, 10240);
}

TEST_F(SweepFile, BudgetsGiveStepsFromTokensParametersOrFlops) {
  const auto runs = expand(parse(
      "[sweep]\nbase = \"../base.toml\"\n[axes]\n"
      "budget = [{ tokens = 1000 }, { tokens_per_param = 2 }, { flops = 3e12 }]\n"));
  ASSERT_EQ(runs.size(), 3u);
  const ModelDims dims = ModelDims::from_config(runs[0].config);
  const double params = double(count_parameters(dims).total), fpt = dims.flops_per_token(64);
  EXPECT_EQ(runs[0].params, std::int64_t(params));
  EXPECT_DOUBLE_EQ(runs[0].flops_per_token, fpt);
  EXPECT_EQ(runs[0].config.train.steps, 2);  // 1000 / 512 rounds to 2
  EXPECT_EQ(runs[1].config.train.steps, std::llround(2 * params / 512));
  EXPECT_EQ(runs[2].config.train.steps, std::llround(3e12 / fpt / 512));
  EXPECT_DOUBLE_EQ(runs[2].flops, double(runs[2].tokens) * fpt);
  EXPECT_EQ(runs[0].name, "tok-1k");
  EXPECT_EQ(runs[1].name, "tpp-2");
  EXPECT_EQ(runs[2].name, "flops-3e12");
  // A budget too small for one step still trains one.
  EXPECT_EQ(expand(parse("[sweep]\nbase = \"../base.toml\"\nbudget = { tokens = 1 }\n"))[0].config.train.steps, 1);
  // No budget: the base config's steps.
  EXPECT_EQ(expand(parse("[sweep]\nbase = \"../base.toml\"\n"))[0].config.train.steps, 40);
}

TEST_F(SweepFile, RanksFollowTheLayoutAndAreChecked) {
  const auto runs = expand(parse("[sweep]\nbase = \"../base.toml\"\n[axes]\n\"parallel.tp\" = [1, 2]\n"));
  EXPECT_EQ(runs[0].ranks, 1);
  EXPECT_EQ(runs[1].ranks, 2);  // tp * pp by default
  const auto dp = expand(parse("[sweep]\nbase = \"../base.toml\"\nranks = 4\n[set]\n\"train.micro_batch\" = 2\n"
                               "[axes]\n\"parallel.tp\" = [1, 2]\n"));
  EXPECT_EQ(dp[0].config.dp(), 4);
  EXPECT_EQ(dp[1].config.dp(), 2);
  // 3 ranks with tp 2: the world does not divide; the line of the tp value is named.
  const auto msgs = problems("[sweep]\nbase = \"../base.toml\"\nranks = 3\n[axes]\n\"parallel.tp\" = [1, 2]\n");
  EXPECT_TRUE(any_has(msgs, "run tp-2: " + path() + ":5:", "not a multiple of tp * pp")) << all(msgs);
}

TEST_F(SweepFile, BadInputIsRefusedNamingLineAndKey) {
  const std::string head = "[sweep]\nbase = \"../base.toml\"\n";
  // An unknown config key in an axis: its line, the key, a suggestion.
  auto m = problems(head + "[axes]\n\"model.d_modle\" = [32, 64]\n");
  EXPECT_TRUE(any_has(m, path() + ":4:", "model.d_modle: unknown key (did you mean 'model.d_model'?)")) << all(m);
  // A value of the wrong type, in [set] and in a grouped axis.
  m = problems(head + "[set]\n\"model.n_layers\" = \"four\"\n");
  EXPECT_TRUE(any_has(m, path() + ":4:", "model.n_layers: expected an integer, got a string")) << all(m);
  m = problems(head + "[axes]\nsize = [{ name = \"a\", \"model.d_model\" = 3.5 }]\n");
  EXPECT_TRUE(any_has(m, path() + ":4:", "model.d_model: expected an integer, got a float")) << all(m);
  // An empty axis.
  m = problems(head + "[axes]\n\"model.d_model\" = []\n");
  EXPECT_TRUE(any_has(m, path() + ":4:", "axes.\"model.d_model\": an axis needs at least one value")) << all(m);
  // A budget of zero, negative, of two kinds, of an unknown kind.
  m = problems(head + "budget = { tokens = 0 }\n");
  EXPECT_TRUE(any_has(m, path() + ":3:", "sweep.budget.tokens: must be above zero")) << all(m);
  m = problems(head + "[axes]\nbudget = [{ flops = -1e15 }]\n");
  EXPECT_TRUE(any_has(m, path() + ":4:", "axes.budget.flops: must be above zero")) << all(m);
  m = problems(head + "budget = { tokens = 10, flops = 1e9 }\n");
  EXPECT_TRUE(any_has(m, path() + ":3:", "exactly one of tokens, tokens_per_param, flops")) << all(m);
  m = problems(head + "budget = { steps = 10 }\n");
  EXPECT_TRUE(any_has(m, path() + ":3:", "sweep.budget.steps: unknown budget key")) << all(m);
  // Unknown keys and sections of the sweep file itself; a missing base.
  m = problems(head + "colour = 3\n[misc]\nx = 1\n");
  EXPECT_TRUE(any_has(m, path() + ":3:1", "sweep.colour: unknown key")) << all(m);
  EXPECT_TRUE(any_has(m, path() + ":4:", "misc: unknown section")) << all(m);
  m = problems("[sweep]\nname = \"x\"\n");
  EXPECT_TRUE(any_has(m, "sweep.base: missing")) << all(m);
  // A key axis whose key has no section; a grouped axis of plain values; labels that collide.
  m = problems(head + "[axes]\nsize = [1, 2]\n");
  EXPECT_TRUE(any_has(m, path() + ":4:", "a grouped axis")) << all(m);
  m = problems(head + "[axes]\nsize = [{ name = \"a\", \"model.d_model\" = 32 }, { name = \"a\", \"model.d_model\" = 64 }]\n");
  EXPECT_TRUE(any_has(m, path() + ":4:", "two values have the label 'a'")) << all(m);
  m = problems(head + "[set]\nd_model = 3\n");
  EXPECT_TRUE(any_has(m, path() + ":4:", "not a config key of the form \"section.key\"")) << all(m);
  // A TOML syntax error.
  m = problems(head + "[axes\n");
  EXPECT_TRUE(any_has(m, path() + ":3:", "TOML syntax error")) << all(m);
  // Every problem at once, in line order.
  m = problems("[sweep]\nbase = \"../base.toml\"\nbudget = { tokens = 0 }\nfoo = 1\n[axes]\n\"model.d_model\" = []\n");
  ASSERT_EQ(m.size(), 3u) << all(m);
  EXPECT_NE(m[0].find(":3:"), std::string::npos);
  EXPECT_NE(m[1].find(":4:"), std::string::npos);
  EXPECT_NE(m[2].find(":6:"), std::string::npos);
}

TEST_F(SweepFile, AChangedSweepIsRefusedForRunsAlreadyStarted) {
  const std::string text = "[sweep]\nbase = \"../base.toml\"\nout = \"" + (dir_ / "out").string() +
                           "\"\n[axes]\n\"model.d_model\" = [32, 48]\n";
  write_run_configs(parse(text), expand(parse(text)));
  ASSERT_TRUE(fs::exists(dir_ / "out" / "d_model-32" / "config.toml"));
  // The same sweep again: fine. Another learning rate for every run: refused, naming the files.
  EXPECT_NO_THROW(write_run_configs(parse(text), expand(parse(text))));
  const std::string changed = text + "[set]\n\"optim.lr\" = 0.5\n";
  try {
    write_run_configs(parse(changed), expand(parse(changed)));
    FAIL() << "a changed sweep was accepted";
  } catch (const SweepError& e) {
    ASSERT_EQ(e.messages.size(), 2u);
    EXPECT_NE(e.messages[0].find("d_model-32/config.toml differs"), std::string::npos) << e.messages[0];
  }
}
