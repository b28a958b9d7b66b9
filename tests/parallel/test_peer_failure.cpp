// A peer that hangs or dies in the middle of `mpirun -np 2 nsatron train` (data parallelism,
// a checkpoint every few steps) ends every rank within a bounded time, with a message naming a
// rank, and leaves the last committed checkpoint intact:
//   - hung (SIGSTOP of rank 1): rank 0's communication watchdog (core/comm/watchdog.h,
//     parallel.comm_timeout_s = 30) finds its collective unfinished, prints the rank, the group
//     and the operation, aborts its communicators and exits with code 4; mpirun then ends the
//     stopped rank;
//   - dead (SIGKILL of rank 1): the launcher names the rank and ends rank 0;
//   - hung with two pipeline stages (on GPUs, messages over the copy engines), and with two
//     tensor-parallel ranks (on GPUs, the sums over the copy engines).
// Built twice from this file: test_peer_failure (CPU ranks over MPI, label mpi) and, with
// PEER_FAILURE_ON_GPU, test_peer_failure_gpu (one GPU per rank, NCCL; labels gpu and mpi,
// skipped with fewer than 2 GPUs).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "core/device/device.h"
#include "tests/parallel/parallel_train_fixture.h"

namespace {

#ifndef PEER_FAILURE_ON_GPU
#define PEER_FAILURE_ON_GPU 0
#endif

using Clock = std::chrono::steady_clock;

class PeerFailure : public ParallelTrain {
 protected:
  void SetUp() override {
    if (PEER_FAILURE_ON_GPU) {
      if (!NSATRON_TEST_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL";
      if (!nsatron::cuda_available() || nsatron::cuda_device_count() < 2)
        GTEST_SKIP() << "needs 2 CUDA devices; this machine has " << nsatron::cuda_device_count();
    }
    ParallelTrain::SetUp();
  }

  // Starts `mpirun -np 2 nsatron train` in the background (its own process group), a long run
  // with a checkpoint every 4 steps.
  void start(const std::string& name, const std::string& extra = "") {
    name_ = name;
    const std::string device = PEER_FAILURE_ON_GPU ? " --set train.device=cuda" : "";
    const std::string cmd = mpirun(2) + " train " + config() + " --set train.steps=1000000 --set log.every=1" +
                            " --set train.eval_every=0 --set checkpoint.every=4 --set checkpoint.keep=2" +
                            " --set parallel.comm_timeout_s=30" + device + extra +
                            " --set checkpoint.dir=" + (dir_ / name).string() +
                            " --set log.metrics=" + (dir_ / (name + ".jsonl")).string() + " >" +
                            (dir_ / (name + ".out")).string() + " 2>" + (dir_ / (name + ".err")).string();
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid_, pid_);
  }

  // Waits (up to 120 s) until the run has logged `steps` steps and committed a checkpoint.
  void wait_for_progress(std::size_t steps) {
    const auto until = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < until) {
      const bool committed = std::filesystem::exists(dir_ / name_ / "latest");
      if (field_values(metrics(name_), "loss").size() >= steps && committed) return;
      int status = 0;
      ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << "the run ended early:\n" << output();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "no progress within 120 s:\n" << output();
  }

  // The pid of world rank `rank` of this run (its command line names the run's directory).
  pid_t rank_pid(int rank) {
    const std::string mark = (dir_ / name_).string();
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string pid = entry.path().filename().string();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string cmdline = read_file_text("/proc/" + pid + "/cmdline");
      for (char& c : cmdline)
        if (c == '\0') c = ' ';
      if (cmdline.find(NSATRON_BINARY) != 0 || cmdline.find(mark + " ") == std::string::npos) continue;
      const std::string env = read_file_text("/proc/" + pid + "/environ");
      if (env.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos)
        return pid_t(std::stoi(pid));
    }
    return -1;
  }

  // Waits for mpirun to end; returns its exit status and the seconds it took (kills the
  // whole group and fails after 90 s).
  std::pair<int, double> wait_for_end() {
    const auto t0 = Clock::now();
    while (true) {
      int status = 0;
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (done == pid_) {
        pid_ = -1;
        return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), s};
      }
      if (s > 90) {
        kill(-pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        pid_ = -1;
        ADD_FAILURE() << "still running 90 s after the failure:\n" << output();
        return {-1, s};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // The process is gone (or a zombie, ended but not yet reaped).
  static bool ended(pid_t pid) {
    if (kill(pid, 0) != 0) return true;
    const std::string stat = read_file_text("/proc/" + std::to_string(pid) + "/stat");
    const std::size_t paren = stat.rfind(')');
    return paren == std::string::npos || (paren + 2 < stat.size() && stat[paren + 2] == 'Z');
  }

  std::string output() {
    return read_file_text((dir_ / (name_ + ".out")).string()) + read_file_text((dir_ / (name_ + ".err")).string());
  }

  void TearDown() override {
    if (pid_ > 0) {  // a failed assertion left the run going
      kill(-pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    ParallelTrain::TearDown();
  }

  // The failure of rank 1 by `signal`, then the checks common to both cases.
  std::string fail_rank_1(const std::string& name, int signal, const std::string& extra = "") {
    start(name, extra);
    wait_for_progress(6);
    if (HasFatalFailure()) return "";
    const pid_t victim = rank_pid(1);
    EXPECT_GT(victim, 0) << "rank 1 of the run not found";
    if (victim <= 0) return "";
    EXPECT_EQ(kill(victim, signal), 0);
    const auto [code, seconds] = wait_for_end();
    const std::string out = output();
    EXPECT_NE(code, 0) << out;
    EXPECT_LT(seconds, 60) << out;
    std::printf("%s: mpirun ended %.1f s after the signal, exit code %d\n", name.c_str(), seconds, code);
    // The launcher's kill of the other rank may land just after mpirun returns: allow 10 s.
    bool gone = false;
    for (int i = 0; i < 100 && !(gone = ended(victim)); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(gone) << "rank 1 (pid " << victim << ") outlived the job by 10 s";
    if (!gone) kill(victim, SIGKILL);
    // The last committed checkpoint is whole, and the newest that verifies is the one
    // `latest` names (nothing of a half-written one was committed).
    EXPECT_TRUE(ckpt::verify_checkpoint(dir_ / name).empty()) << out;
    const ckpt::ResumeChoice choice = ckpt::find_resume(dir_ / name);
    EXPECT_TRUE(choice.warnings.empty()) << choice.warnings.front();
    EXPECT_TRUE(choice.checkpoint && *choice.checkpoint == ckpt::resolve_checkpoint(dir_ / name));
    return out;
  }

  std::string name_;
  pid_t pid_ = -1;
};

TEST_F(PeerFailure, HungPeerEndsEveryRankThroughTheWatchdog) {
  const std::string out = fail_rank_1("hung", SIGSTOP);
  EXPECT_NE(out.find("nsatron: rank 0: the "), std::string::npos) << out;
  EXPECT_NE(out.find("did not finish within 30 s (parallel.comm_timeout_s; a dead or hung peer?); aborting this "
                     "rank's communicators and exiting with code 4"),
            std::string::npos)
      << out;
}

// Two pipeline stages: on GPUs the messages go through the copy engines (a receive waits on a
// flag in GPU memory that a hung peer never writes: the watchdog's watch on it ends the rank).
TEST_F(PeerFailure, HungPipelinePeerEndsEveryRank) {
  const std::string out = fail_rank_1(
      "hung_pp", SIGSTOP,
      std::string(" --set parallel.pp=2") + (PEER_FAILURE_ON_GPU ? " --set parallel.pp_transport=copy_engine" : ""));
  EXPECT_NE(out.find("nsatron: rank 0: the "), std::string::npos) << out;
  EXPECT_NE(out.find("did not finish within 30 s"), std::string::npos) << out;
}

// Two tensor-parallel ranks with micro-batch pairs: on GPUs the sums go through the copy engines
// (an add waits on a flag a hung peer never writes: the watchdog's watch on the sums' stream
// ends the rank), on CPU ranks through MPI's started all-reduces.
TEST_F(PeerFailure, HungTensorParallelPeerEndsEveryRank) {
  const std::string out = fail_rank_1(
      "hung_tp", SIGSTOP,
      std::string(" --set parallel.tp=2 --set parallel.tp_micro_batch_pairs=true") +
          (PEER_FAILURE_ON_GPU ? " --set parallel.tp_transport=copy_engine" : ""));
  EXPECT_NE(out.find("nsatron: rank 0: the "), std::string::npos) << out;
  EXPECT_NE(out.find("did not finish within 30 s"), std::string::npos) << out;
}

TEST_F(PeerFailure, DeadPeerEndsEveryRank) {
  const std::string out = fail_rank_1("dead", SIGKILL);
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
}

}  // namespace
