// `nsatron train CONFIG`: validates the config, then runs the training driver.
#include <iostream>

#include "core/config/config.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "launch/signals.h"
#include "launch/trainer.h"

namespace nsatron {

static const char* kTrainHelp =
    "usage: nsatron train CONFIG [--set section.key=value]... [--overwrite]\n"
    "\n"
    "Trains the model CONFIG describes (see docs/config.md). The config is validated before\n"
    "anything starts; errors go to stderr as FILE:LINE:COL: section.key: what is wrong.\n"
    "\n"
    "checkpoint.resume = \"auto\" continues from checkpoint.dir/latest when it exists (falling\n"
    "back to the newest good checkpoint if latest is corrupt); \"never\" starts fresh and refuses\n"
    "a checkpoint.dir that already holds checkpoints unless --overwrite is given; a path resumes\n"
    "from that checkpoint. SIGTERM or SIGUSR1 finish the current step, save a checkpoint and exit.\n"
    "\n"
    "exit codes: 0 done; 1 failed; 2 bad input (config, data, checkpoint);\n"
    "            3 stopped by SIGTERM/SIGUSR1 after saving a checkpoint (requeue to continue)\n";

int train_main(const std::vector<std::string>& argv) {
  Args args("train", argv, {"--set"}, {"--help", "-h", "--overwrite"});
  if (args.has("--help") || args.has("-h")) {
    std::cout << kTrainHelp;
    return 0;
  }
  if (args.positional().size() != 1) throw UserError("train takes exactly one CONFIG file (see --help)");
  RunConfig cfg = load_config(args.positional()[0], args.all("--set"), 1);
  TrainOptions options;
  options.overwrite = args.has("--overwrite");
  TrainSummary summary = run_training(cfg, std::cout, options);
  return summary.stopped_by_signal ? kExitStoppedBySignal : 0;
}

}  // namespace nsatron
