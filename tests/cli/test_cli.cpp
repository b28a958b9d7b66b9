// The nsatron executable as a user meets it: subcommands, --help, exit codes, config errors.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/cli/run_command.h"

namespace {
std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST(Cli, EverySubcommandHasHelp) {
  for (const char* cmd : {"train", "config", "data", "nsa-parity", "version"}) {
    CommandResult r = run_nsatron(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd << ": " << r.err;
    EXPECT_NE(r.out.find("usage: nsatron"), std::string::npos) << cmd << " printed: " << r.out;
  }
}

TEST(Cli, NoArgumentsOrUnknownCommandIsExit2) {
  EXPECT_EQ(run_nsatron("").code, 2);
  CommandResult r = run_nsatron("trian configs/demo_cpu.toml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown command 'trian'"), std::string::npos);
}

TEST(Cli, Version) {
  CommandResult r = run_nsatron("version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("nsatron 0."), std::string::npos);
}

TEST(Cli, ConfigCheckAcceptsShippedConfigsAndPrintsResolved) {
  for (const char* name : {"demo_cpu.toml", "nsa_125m.toml"}) {
    CommandResult r = run_nsatron(std::string("config check ") + NSATRON_SOURCE_DIR + "/configs/" + name);
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    for (const char* section : {"[model]", "[nsa]", "[train]", "[optim]", "[parallel]", "[recompute]", "[data]",
                                "[checkpoint]", "[log]"})
      EXPECT_NE(r.out.find(section), std::string::npos) << section;
  }
}

TEST(Cli, ConfigCheckRefusesEachKindOfBadConfigWithExit2) {
  struct Case {
    const char* text;
    const char* expect;  // after "FILE:"
  };
  const Case cases[] = {
      {"[model]\nn_layer = 4\n", ":2:1: model.n_layer: unknown key (did you mean 'n_layers'?)"},
      {"[optim]\nlr = \"3e-4\"\n", ":2:1: optim.lr: expected a float, got a string"},
      {"[model]\nn_layers = 12.5\n", ":2:1: model.n_layers: expected an integer, got a float (12.5)"},
      {"[nsa]\nsel_count = 1\n", ":2:1: nsa.sel_count: value 1 is out of range (must be >= 3)"},
      {"[nsa]\ncmp_stride = 7\n", ":2:1: nsa.cmp_stride: cmp_stride = 7 must divide cmp_block = 32"},
      {"[model]\nn_kv_heads = 5\n", ":2:1: model.n_kv_heads: n_heads = 12 is not divisible by n_kv_heads = 5"},
      {"[train]\nmicro_batch = 3\nglobal_batch = 4\n", ":3:1: train.global_batch: global_batch = 4 is not a multiple"},
  };
  int i = 0;
  for (const auto& c : cases) {
    std::string path = write_temp("bad" + std::to_string(i++) + ".toml", c.text);
    CommandResult r = run_nsatron("config check " + path);
    EXPECT_EQ(r.code, 2) << c.text;
    EXPECT_NE(r.err.find(path + c.expect), std::string::npos) << "stderr: " << r.err;
    EXPECT_TRUE(r.out.empty());
  }
}

TEST(Cli, OverridesAndWorldSize) {
  std::string demo = std::string(NSATRON_SOURCE_DIR) + "/configs/demo_cpu.toml";
  CommandResult ok = run_nsatron("config check " + demo + " --set model.n_layers=2");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("n_layers = 2\n"), std::string::npos);
  CommandResult bad = run_nsatron("config check " + demo + " --set model.n_layers=2.5");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--set model.n_layers=2.5: model.n_layers: expected an integer"), std::string::npos) << bad.err;
  CommandResult dp = run_nsatron("config check " + demo + " --world-size 3");  // 16 % (8 * 3) != 0
  EXPECT_EQ(dp.code, 2);
  EXPECT_NE(dp.err.find("train.global_batch"), std::string::npos) << dp.err;
}

TEST(Cli, MissingConfigFile) {
  CommandResult r = run_nsatron("config check /nonexistent/x.toml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent/x.toml: cannot open"), std::string::npos);
}

TEST(Cli, TrainValidatesConfigFirst) {
  std::string path = write_temp("train_bad.toml", "[model]\nn_layers = 0\n");
  CommandResult r = run_nsatron("train " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find(path + ":2:1: model.n_layers: value 0 is out of range"), std::string::npos) << r.err;
}
