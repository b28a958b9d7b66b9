// `nsatron sweep plan|run|report`: scaling studies (launch/sweep/, docs/sweeps.md).
#include <iostream>

#include "launch/args.h"
#include "launch/commands.h"
#include "launch/sweep/plan.h"
#include "launch/sweep/report.h"
#include "launch/sweep/runner.h"
#include "launch/sweep/sweep_file.h"

namespace nsatron {

namespace {

const char* kSweepHelp =
    "usage: nsatron sweep plan SWEEP [--json] [--calibrate N] [--throughput results.csv] [--gpu-memory GIB]\n"
    "       nsatron sweep run SWEEP [--slurm [--no-submit] [--sbatch-arg ARG]...] [--mpirun-arg ARG]...\n"
    "       nsatron sweep report DIR [--no-fit]\n"
    "\n"
    "A sweep file (TOML) names a base run config and axes of values, crossed as a grid, and a\n"
    "token budget per run (docs/sweeps.md; examples in configs/sweeps/). Every run is validated\n"
    "before anything starts; problems are printed as FILE:LINE:COL: key: what is wrong (exit 2).\n"
    "\n"
    "plan     a row per run: parameters (total, without embeddings), tokens, steps, training FLOPs,\n"
    "         the memory per GPU (CPU: per rank) its layout and recompute policy need, whether it\n"
    "         fits (--gpu-memory GIB, default 80; CPU: this machine's memory), the estimated wall\n"
    "         time and the run's state. The wall time needs a throughput: --calibrate N trains\n"
    "         each run N steps here (at least 2), --throughput takes the results.csv of an\n"
    "         earlier report (the same run's speed, else the FLOP/s of runs on the same device\n"
    "         and layout). --json: the same as JSON, for scripts.\n"
    "run      trains every run not done yet, into [sweep].out (default runs/<name>)/<run>/, one\n"
    "         after another here (mpirun -np R when a run needs R ranks), or with --slurm as a job\n"
    "         array per rank count through launch/slurm/train.sbatch (checkpoint on SIGUSR1,\n"
    "         requeue). Run it again to continue: done runs are skipped, interrupted ones resume\n"
    "         from their checkpoints, failed ones are retried. Ctrl-C or SIGTERM stop the run in\n"
    "         progress with a checkpoint. --no-submit writes the Slurm scripts only.\n"
    "report   DIR/results.csv (every run: axes, parameters, tokens, FLOPs, final losses, tokens/s,\n"
    "         MFU, wall time), the loss-against-compute fits (fit.json), PNG plots (DIR/plots/) and\n"
    "         DIR/summary.md; runs not done are listed and left out of the fits.\n"
    "\n"
    "exit codes: 0 done; 1 a run failed (run) or the fit failed (report); 2 bad input;\n"
    "            3 stopped by a signal (run: the same command continues)\n";

}  // namespace

int sweep_main(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    (argv.empty() ? std::cerr : std::cout) << kSweepHelp;
    return argv.empty() ? 2 : 0;
  }
  const std::string verb = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  Args args("sweep " + verb, rest,
            {"--calibrate", "--throughput", "--gpu-memory", "--sbatch-arg", "--mpirun-arg", "--nsatron"},
            {"--help", "-h", "--json", "--slurm", "--no-submit", "--no-fit"});
  if (args.has("--help") || args.has("-h")) {
    std::cout << kSweepHelp;
    return 0;
  }
  if (args.positional().size() != 1)
    throw UserError("sweep " + verb + " takes exactly one " + (verb == "report" ? "DIR" : "SWEEP file") + " (see --help)");
  const std::string target = args.positional()[0];
  sweep::RunnerOptions runner;
  runner.nsatron = args.get("--nsatron").value_or("");
  runner.mpirun_args = args.all("--mpirun-arg");
  runner.sbatch_args = args.all("--sbatch-arg");
  runner.submit = !args.has("--no-submit");
  if (verb == "report") return sweep::report(target, std::cout, !args.has("--no-fit"));
  if (verb != "plan" && verb != "run")
    throw UserError("unknown sweep command '" + verb + "' (plan, run or report; see --help)");

  const sweep::Sweep s = sweep::read_sweep(target);
  const std::vector<sweep::PlannedRun> runs = sweep::expand(s);
  if (verb == "plan") {
    sweep::PlanOptions options;
    options.calibrate_steps = args.get_int("--calibrate", 0);
    if (args.has("--calibrate") && options.calibrate_steps < 2)
      throw UserError("--calibrate: at least 2 steps (the first carries start-up and is left out of the speed)");
    options.throughput_csv = args.get("--throughput").value_or("");
    if (const auto g = args.get("--gpu-memory")) {
      char* end = nullptr;
      const double v = std::strtod(g->c_str(), &end);
      if (end == g->c_str() || *end != '\0' || !(v > 0)) throw UserError("--gpu-memory: expected GiB above 0, got '" + *g + "'");
      options.gpu_memory_bytes = v * double(1ull << 30);
    }
    const auto rows = sweep::make_plan(s, runs, options, runner);
    if (args.has("--json")) sweep::print_plan_json(std::cout, s, rows);
    else sweep::print_plan_table(std::cout, s, rows);
    return 0;
  }
  sweep::write_runs_csv(s, runs);
  return args.has("--slurm") ? sweep::run_on_slurm(s, runs, runner, std::cout) : sweep::run_here(s, runs, runner, std::cout);
}

}  // namespace nsatron
