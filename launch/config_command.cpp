// `nsatron config check CONFIG` and `nsatron config docs`.
#include <iostream>

#include "core/config/config.h"
#include "launch/args.h"
#include "launch/commands.h"

namespace nsatron {

static const char* kConfigHelp =
    "usage: nsatron config check CONFIG [--set section.key=value]... [--world-size N]\n"
    "       nsatron config docs\n"
    "\n"
    "check  validates CONFIG strictly (unknown keys, types, ranges, rules between keys) and\n"
    "       prints the resolved config with every default and derived value filled in.\n"
    "       Errors go to stderr as FILE:LINE:COL: section.key: what is wrong; exit code 2.\n"
    "       --set overrides a key (repeatable); --world-size N validates for N ranks\n"
    "       (default 1), which decides dp = N / (tp * pp).\n"
    "docs   prints the reference of every key (the text of docs/config.md).\n";

int config_main(const std::vector<std::string>& argv) {
  if (argv.empty()) {
    std::cerr << kConfigHelp;
    return 2;
  }
  Args args("config", std::vector<std::string>(argv.begin() + 1, argv.end()), {"--set", "--world-size"},
            {"--help", "-h"});
  if (argv[0] == "--help" || argv[0] == "-h" || args.has("--help") || args.has("-h")) {
    std::cout << kConfigHelp;
    return 0;
  }
  if (argv[0] == "docs") {
    std::cout << config_reference_markdown();
    return 0;
  }
  if (argv[0] != "check") throw UserError("unknown config action '" + argv[0] + "' (expected check or docs)");
  if (args.positional().size() != 1) throw UserError("config check takes exactly one CONFIG file");
  long long world = args.get_int("--world-size", 1);
  if (world < 1) throw UserError("--world-size must be at least 1");
  RunConfig cfg = load_config(args.positional()[0], args.all("--set"), world);
  std::cout << "# " << cfg.source << ": valid for " << world << (world == 1 ? " rank" : " ranks")
            << " (tp=" << cfg.parallel.tp << " pp=" << cfg.parallel.pp << " dp=" << cfg.dp()
            << ", " << cfg.grad_accum_steps() << " micro-batches per step)\n"
            << to_toml(cfg);
  return 0;
}

}  // namespace nsatron
