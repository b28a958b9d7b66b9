// nsatron: the one executable. Subcommands are listed in kCommands; each has --help.
// Exit codes: 0 success, 1 failure, 2 bad input (config, arguments, files), documented in
// README.md and docs/cli.md.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/ckpt_command.h"
#include "core/config/config.h"
#include "core/device/device.h"
#include "core/util/error.h"
#include "data/data_command.h"
#include "launch/commands.h"
#include "nsa/parity.h"

namespace nsatron {
namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

int version_main(const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << "usage: nsatron version\n\nPrints the version and what this build contains.\n";
    return 0;
  }
  std::cout << "nsatron " << kVersion << "\n"
            << "cuda: " << (kBuiltWithCuda ? "built in" : "not built") << "; device: " << cuda_device_summary()
            << "\n";
  return 0;
}

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"train", "train a model from a TOML config", train_main},
      {"config", "check a config and print it resolved, or print the key reference", config_main},
      {"data", "prepare and inspect token shards", data::data_main},
      {"ckpt", "inspect and verify checkpoints", checkpoint::ckpt_main},
      {"sample", "generate text from a checkpoint", sample_main},
      {"sweep", "plan, run and report a scaling study (a grid of runs)", sweep_main},
      {"nsa-parity", "run the NSA core on inputs from an HDF5 file, for comparison", nsa::parity_main},
      {"version", "print the version and build", version_main},
  };
  return list;
}

void usage(std::ostream& os) {
  os << "usage: nsatron COMMAND [ARGS...]\n\ncommands:\n";
  for (const auto& c : commands()) {
    std::string n = c.name;
    os << "  " << n << std::string(n.size() < 12 ? 12 - n.size() : 1, ' ') << c.summary << "\n";
  }
  os << "\n`nsatron COMMAND --help` describes each. Exit codes: 0 success, 1 failure, 2 bad input.\n";
}

}  // namespace
}  // namespace nsatron

int main(int argc, char** argv) {
  using namespace nsatron;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    usage(args.empty() ? std::cerr : std::cout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") args[0] = "version";
  for (const auto& c : commands()) {
    if (args[0] != c.name) continue;
    try {
      return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
    } catch (const ConfigError& e) {
      for (const auto& m : e.messages) std::cerr << m << "\n";
      return 2;
    } catch (const UserError& e) {
      std::cerr << "nsatron " << c.name << ": " << e.what() << "\n";
      return 2;
    } catch (const EnvironmentError& e) {
      std::cerr << "nsatron " << c.name << ": " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "nsatron " << c.name << ": internal error: " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << "nsatron: unknown command '" << args[0] << "'\n\n";
  usage(std::cerr);
  return 2;
}
