// Running a sweep's runs here or on Slurm (runner.h).
#include "launch/sweep/runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>

#include "core/util/format.h"
#include "launch/sweep/run_state.h"

#ifndef NSATRON_SOURCE_DIR
#error "NSATRON_SOURCE_DIR must name the source tree (launch/CMakeLists.txt)"
#endif

namespace nsatron::sweep {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string self_executable() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("nsatron") : p.string();
}

void write_file(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f.flush()) throw EnvironmentError("cannot write '" + tmp.string() + "'");
  }
  fs::rename(tmp, p);
}

// The last non-empty lines of a log, joined by " | " (what a failed run said).
std::string log_tail(const fs::path& log, std::size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) all.push_back(line);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += (out.empty() ? "" : " | ") + all[i];
  return out;
}

// A sweep run holds OUT/.lock for its whole life (flock: released when the process ends).
class StudyLock {
 public:
  explicit StudyLock(const fs::path& out) {
    fs::create_directories(out);
    const fs::path p = out / ".lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw EnvironmentError("cannot open '" + p.string() + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      std::string holder;
      read_whole_file(p.string(), holder);
      ::close(fd_);
      throw UserError("another `sweep run` is working on " + out.string() +
                      (holder.empty() ? "" : " (" + holder.substr(0, holder.find('\n')) + ")") +
                      "; wait for it or stop it first");
    }
    const std::string me = "pid " + std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) == 0 && ::write(fd_, me.data(), me.size()) < 0) {}
  }
  ~StudyLock() { ::close(fd_); }
  StudyLock(const StudyLock&) = delete;
  StudyLock& operator=(const StudyLock&) = delete;

 private:
  int fd_ = -1;
};

std::atomic<pid_t> g_child{0};
std::atomic<int> g_stop{0};

void on_stop_signal(int sig) {
  g_stop = sig;
  const pid_t child = g_child;
  if (child > 0) ::kill(-child, SIGTERM);  // the child's process group: mpirun and its ranks too
}

}  // namespace

std::vector<std::string> train_command(const PlannedRun& run, const RunnerOptions& options) {
  const std::string nsatron = options.nsatron.empty() ? self_executable() : options.nsatron;
  const fs::path dir(run.dir);
  std::vector<std::string> argv;
  if (run.ranks > 1) {
    argv.push_back(options.mpirun);
    if (::geteuid() == 0) argv.push_back("--allow-run-as-root");  // Open MPI refuses root otherwise
    argv.insert(argv.end(), options.mpirun_args.begin(), options.mpirun_args.end());
    argv.insert(argv.end(), {"-np", std::to_string(run.ranks)});
  }
  argv.insert(argv.end(), {nsatron, "train", (dir / "config.toml").string(), "--done-file", (dir / "done.json").string()});
  return argv;
}

void write_run_configs(const Sweep& sweep, const std::vector<PlannedRun>& runs) {
  std::vector<std::string> changed;
  for (const auto& r : runs) {
    const fs::path p = fs::path(r.dir) / "config.toml";
    std::string existing;
    if (read_whole_file(p.string(), existing) && existing != to_toml(r.config)) changed.push_back(p.string());
  }
  if (!changed.empty()) {
    std::vector<std::string> msgs;
    for (const auto& p : changed)
      msgs.push_back(sweep.file + ": the sweep changed since this run started: " + p +
                     " differs from what the sweep now gives (restore the sweep, or remove that run's folder to "
                     "start it again)");
    throw SweepError(msgs);
  }
  for (const auto& r : runs) {
    fs::create_directories(r.dir);
    const fs::path p = fs::path(r.dir) / "config.toml";
    if (!fs::exists(p)) write_file(p, to_toml(r.config));
  }
}

int train_and_wait(const std::vector<std::string>& argv, const std::string& log_path, bool* stopped) {
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw EnvironmentError("cannot open '" + log_path + "': " + std::strerror(errno));
  struct sigaction sa {}, old_int {}, old_term {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw EnvironmentError(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);                      // its own group: a terminal's Ctrl-C reaches us, we pass SIGTERM on
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);   // `sweep run` killed: the run checkpoints and stops
    if (::getppid() != parent) ::_exit(3);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "nsatron sweep: cannot start %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  g_child = pid;
  if (g_stop) ::kill(-pid, SIGTERM);  // a signal that came before the child existed
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  g_child = 0;
  ::close(log_fd);
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  if (stopped) *stopped = g_stop != 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run_here(const Sweep& sweep, const std::vector<PlannedRun>& runs, const RunnerOptions& options, std::ostream& out) {
  StudyLock lock(sweep.out);
  write_run_configs(sweep, runs);
  g_stop = 0;
  const std::size_t total = runs.size();
  std::size_t done = 0, failed = 0;
  double remaining_flops = 0;
  for (const auto& r : runs)
    if (run_state(r.dir) == RunState::Done) ++done;
    else remaining_flops += r.flops;
  out << "sweep " << sweep.name << ": " << total << " runs in " << sweep.out << ", " << done << " done already\n"
      << std::flush;
  const auto started = Clock::now();
  double flops_here = 0;  // of the runs finished by this invocation (for the ETA)
  std::size_t position = 0;
  for (const auto& r : runs) {
    ++position;
    const RunState before = run_state(r.dir);
    if (before == RunState::Done) continue;
    const fs::path dir(r.dir);
    std::string note;
    if (before == RunState::Failed) {
      note = " (retrying; last time " + failed_reason(r.dir) + ")";
      fs::remove(dir / "failed.json");
    } else if (before == RunState::Interrupted) {
      note = " (resuming)";
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
    const std::string eta =
        flops_here > 0 ? ", eta " + human_duration(elapsed / flops_here * remaining_flops) : std::string();
    out << "[" << position << "/" << total << "] " << r.name << ": running" << note << " | done " << done
        << ", failed " << failed << ", left " << total - done - failed << eta << "\n"
        << std::flush;
    const auto run_start = Clock::now();
    bool stopped = false;
    const int rc = train_and_wait(train_command(r, options), (dir / "run.log").string(), &stopped);
    const double seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
    if (stopped) {
      out << "[" << position << "/" << total << "] " << r.name << ": stopped by a signal after "
          << human_duration(seconds) << " (exit " << rc << "); run the same command to continue\n"
          << std::flush;
      return 3;
    }
    remaining_flops -= r.flops;
    if (rc == 0 && run_state(r.dir) == RunState::Done) {
      ++done;
      flops_here += r.flops;
      const RunMetrics m = read_metrics((dir / "metrics.jsonl").string());
      char loss[64] = "";
      if (m.final_val_loss >= 0) std::snprintf(loss, sizeof loss, ", val loss %.4f", m.final_val_loss);
      out << "[" << position << "/" << total << "] " << r.name << ": done in " << human_duration(seconds) << loss
          << "\n"
          << std::flush;
    } else {
      ++failed;
      const std::string why = rc == 0 ? "exited 0 without finishing its steps" : log_tail(dir / "run.log", 3);
      write_failed_marker(r.dir, rc, why);
      out << "[" << position << "/" << total << "] " << r.name << ": FAILED (exit " << rc << "): " << why
          << "\n    log: " << (dir / "run.log").string() << "\n"
          << std::flush;
    }
  }
  out << "sweep " << sweep.name << ": " << done << " of " << total << " runs done"
      << (failed ? ", " + std::to_string(failed) + " failed (their logs are named above; the same command retries them)"
                 : std::string())
      << "\n";
  return failed ? 1 : 0;
}

namespace {

// The array script of the runs at `array` (indices into runs.txt) that need `ranks` ranks.
std::string array_script(const Sweep& sweep, std::int64_t ranks, const std::string& array, const fs::path& slurm_dir,
                         const std::string& nsatron, const std::string& train_sbatch) {
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# Written by `nsatron sweep run --slurm " << sweep.file << "`: one array task per run of the study\n"
    << "# (the line of runs.txt at the task's index), trained by launch/slurm/train.sbatch, which\n"
    << "# checkpoints on SIGUSR1 and requeues the task; a requeued task resumes its run.\n"
    << "#SBATCH --job-name=" << sweep.name << "\n"
    << "#SBATCH --array=" << array << "\n"
    << "#SBATCH --ntasks=" << ranks << "\n"
    << "#SBATCH --signal=USR1@90\n"
    << "#SBATCH --requeue\n"
    << "#SBATCH --open-mode=append\n"
    << "#SBATCH --chdir=" << fs::current_path().string() << "\n"
    << "#SBATCH --output=" << (slurm_dir / "%x-%A_%a.out").string() << "\n"
    << "set -u\n"
    << "run_dir=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" '" << (slurm_dir / "runs.txt").string() << "')\n"
    << "[ -n \"$run_dir\" ] || { echo \"no run at index $SLURM_ARRAY_TASK_ID\" >&2; exit 2; }\n"
    << "exec >>\"$run_dir/run.log\" 2>&1\n"
    << "if [ -f \"$run_dir/done.json\" ]; then echo \"== $run_dir is done\"; exit 0; fi\n"
    << "export NSATRON='" << nsatron << "'\n"
    << "bash '" << train_sbatch << "' \"$run_dir/config.toml\" --done-file \"$run_dir/done.json\"\n"
    << "rc=$?\n"
    << "if [ \"$rc\" -ne 0 ]; then\n"
    << "  printf '{\"exit_code\": %d, \"why\": \"slurm job %s: see run.log\"}\\n' \"$rc\" \"$SLURM_JOB_ID\" "
       ">\"$run_dir/failed.json\"\n"
    << "fi\n"
    << "exit \"$rc\"\n";
  return s.str();
}

// Runs argv (each argument quoted for the shell) and returns its exit status and output.
std::pair<int, std::string> run_capture(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const auto& a : argv) {
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += (cmd.empty() ? "" : " ") + q + "'";
  }
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw EnvironmentError("cannot run " + argv.front());
  std::string reply;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) reply += buf;
  const int status = ::pclose(p);
  while (!reply.empty() && (reply.back() == '\n' || reply.back() == ' ')) reply.pop_back();
  return {status, reply};
}

}  // namespace

int run_on_slurm(const Sweep& sweep, const std::vector<PlannedRun>& runs, const RunnerOptions& options,
                 std::ostream& out) {
  write_run_configs(sweep, runs);
  const fs::path slurm_dir = fs::absolute(sweep.out) / "slurm";
  fs::create_directories(slurm_dir);
  std::string list;
  for (const auto& r : runs) list += fs::absolute(r.dir).string() + "\n";
  write_file(slurm_dir / "runs.txt", list);
  const std::string nsatron = options.nsatron.empty() ? self_executable() : options.nsatron;
  const std::string train_sbatch = std::string(NSATRON_SOURCE_DIR) + "/launch/slurm/train.sbatch";
  if (!fs::exists(train_sbatch)) throw EnvironmentError("cannot find " + train_sbatch + " (the source tree moved?)");

  std::map<std::int64_t, std::string> todo;  // ranks -> the indices of the runs not done ("0,2,5")
  std::map<std::int64_t, std::size_t> counts;
  for (std::size_t i = 0; i < runs.size(); ++i)
    if (run_state(runs[i].dir) != RunState::Done) {
      std::string& array = todo[runs[i].ranks];
      array += (array.empty() ? "" : ",") + std::to_string(i);
      ++counts[runs[i].ranks];
    }
  if (todo.empty()) {
    out << "sweep " << sweep.name << ": all " << runs.size() << " runs are done; nothing to submit\n";
    return 0;
  }
  int rc = 0;
  for (const auto& [ranks, array] : todo) {
    const std::string base = "array_" + std::to_string(ranks) + "ranks";
    const fs::path script = slurm_dir / (base + ".sbatch");
    write_file(script, array_script(sweep, ranks, array, slurm_dir, nsatron, train_sbatch));
    fs::permissions(script, fs::perms::owner_exec, fs::perm_options::add);
    std::vector<std::string> argv = {"sbatch", "--parsable"};
    argv.insert(argv.end(), options.sbatch_args.begin(), options.sbatch_args.end());
    argv.push_back(script.string());
    const std::string what = std::to_string(counts[ranks]) + " run(s) of " + std::to_string(ranks) + " rank(s)";
    if (!options.submit) {
      std::string shown;
      for (const auto& a : argv) shown += (shown.empty() ? "" : " ") + a;
      out << "wrote " << script.string() << " (" << what << "); submit with: " << shown << "\n";
      continue;
    }
    const auto [status, reply] = run_capture(argv);
    if (status != 0) {
      out << "sbatch failed for " << script.string() << ": " << reply << "\n";
      rc = 1;
      continue;
    }
    const std::string job = reply.substr(0, reply.find(';'));
    write_file(slurm_dir / (base + ".job"), job + "\n");
    out << "submitted job array " << job << ": " << what << ", tasks " << array << " (" << script.string() << ")\n";
  }
  if (rc == 0 && options.submit)
    out << "follow it with squeue, and `nsatron sweep plan " << sweep.file << "` (the state column); each run logs to "
        << "OUT/<run>/run.log\n";
  return rc;
}

}  // namespace nsatron::sweep
