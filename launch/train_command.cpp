// `nsatron train CONFIG`: validates the config, then runs the training driver.
#include <iostream>

#include "core/config/config.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "launch/trainer.h"

namespace nsatron {

static const char* kTrainHelp =
    "usage: nsatron train CONFIG [--set section.key=value]...\n"
    "\n"
    "Trains the model CONFIG describes (see docs/config.md). The config is validated before\n"
    "anything starts; errors go to stderr as FILE:LINE:COL: section.key: what is wrong and the\n"
    "exit code is 2.\n";

int train_main(const std::vector<std::string>& argv) {
  Args args("train", argv, {"--set"}, {"--help", "-h"});
  if (args.has("--help") || args.has("-h")) {
    std::cout << kTrainHelp;
    return 0;
  }
  if (args.positional().size() != 1) throw UserError("train takes exactly one CONFIG file (see --help)");
  RunConfig cfg = load_config(args.positional()[0], args.all("--set"), 1);
  run_training(cfg, std::cout);
  return 0;
}

}  // namespace nsatron
