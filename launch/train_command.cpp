// `nsatron train CONFIG`: validates the config, then runs the training driver.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>

#include "core/config/config.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "launch/signals.h"
#include "launch/trainer.h"
#include "launch/world.h"

namespace nsatron {

static const char* kTrainHelp =
    "usage: nsatron train CONFIG [--set section.key=value]... [--overwrite] [--done-file PATH]\n"
    "\n"
    "Trains the model CONFIG describes (see docs/config.md). The config is validated before\n"
    "anything starts; errors go to stderr as FILE:LINE:COL: section.key: what is wrong.\n"
    "\n"
    "checkpoint.resume = \"auto\" continues from checkpoint.dir/latest when it exists (falling\n"
    "back to the newest good checkpoint if latest is corrupt); \"never\" starts fresh and refuses\n"
    "a checkpoint.dir that already holds checkpoints unless --overwrite is given; a path resumes\n"
    "from that checkpoint. SIGTERM or SIGUSR1 finish the current step, save a checkpoint and exit.\n"
    "\n"
    "--done-file PATH: once every step of train.steps is done (not when stopped early), rank 0\n"
    "writes PATH: a JSON record of the steps, the final losses and the time (nsatron sweep\n"
    "marks a finished run so).\n"
    "\n"
    "exit codes: 0 done; 1 failed; 2 bad input (config, data, checkpoint);\n"
    "            3 stopped by SIGTERM/SIGUSR1 after saving a checkpoint (requeue to continue)\n"
    "\n"
    "Several ranks (docs/parallel.md): mpirun -np N nsatron train CONFIG, or under Slurm\n"
    "srun --mpi=pmix -n N nsatron train CONFIG. N must be a multiple of parallel.tp * parallel.pp;\n"
    "dp = N / (tp * pp). Rank 0 prints the log; other ranks print only their errors, naming\n"
    "their rank. A signal to any rank stops every rank after the same step, with a checkpoint.\n";

namespace {

// The --done-file record, written whole or not at all (a temporary file renamed over it).
void write_done_file(const std::string& path, const RunConfig& cfg, const TrainSummary& s) {
  const std::filesystem::path p(path), tmp = p.string() + ".tmp";
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << std::setprecision(9) << "{\"steps\": " << cfg.train.steps << ", \"final_train_loss\": " << s.last_loss
      << ", \"final_val_loss\": ";
    if (s.last_val_loss >= 0) f << s.last_val_loss;
    else f << "null";
    f << ", \"skipped_steps\": " << s.skipped_steps << ", \"wall_s\": " << s.wall_s << ", \"config\": \""
      << cfg.source << "\"}\n";
    if (!f.flush()) throw EnvironmentError("cannot write the done file '" + tmp.string() + "'");
  }
  std::filesystem::rename(tmp, p);
}

}  // namespace

int train_main(const std::vector<std::string>& argv) {
  Args args("train", argv, {"--set", "--done-file"}, {"--help", "-h", "--overwrite"});
  if (args.has("--help") || args.has("-h")) {
    std::cout << kTrainHelp;
    return 0;
  }
  if (args.positional().size() != 1) throw UserError("train takes exactly one CONFIG file (see --help)");
  const LaunchInfo launch = detect_launch();
  std::unique_ptr<World> world;
  try {
    world = std::make_unique<World>();
  } catch (const UserError&) {
    if (launch.slurm_procid > 0) return 2;  // the task with SLURM_PROCID 0 says why
    throw;
  }
  std::ostream silent(nullptr);  // ranks other than 0 log nothing
  std::ostream& out = world->rank() == 0 ? std::cout : silent;
  try {
    RunConfig cfg = world->together([&] { return load_config(args.positional()[0], args.all("--set"), world->size()); });
    TrainOptions options;
    options.overwrite = args.has("--overwrite");
    TrainSummary summary = run_training(cfg, out, *world, options);
    if (const auto done = args.get("--done-file"); done && summary.finished && world->rank() == 0)
      write_done_file(*done, cfg, summary);
    std::cout.flush();
    return summary.stopped_by_signal ? kExitStoppedBySignal : 0;
  } catch (const JobError& e) {  // every rank stops here together: exit normally (MPI_Finalize)
    std::cout.flush();
    if (e.print) std::cerr << e.what() << "\n";
    return e.code;
  } catch (const std::exception& e) {
    if (world->size() == 1) throw;  // main() prints it and picks the exit code
    // One rank failed on its own, mid-run: say which, and take the job down rather than let
    // the other ranks wait for this one.
    const bool user = dynamic_cast<const UserError*>(&e) != nullptr;
    std::cout.flush();
    std::cerr << "nsatron train: " << world->rank_prefix() << (user ? "" : "internal error: ") << e.what()
              << "\n(aborting the job)" << std::endl;
    world->abort(user ? 2 : 1);
  }
}

}  // namespace nsatron
