// Data-parallel training end to end: `mpirun -np N nsatron train` against the one-process run
// (losses at every step to 1e-5 relative, final parameters), mpirun with one rank bit for
// bit, checkpoints across layouts (dp2 -> 1, 1 -> dp2, ZeRO-1 -> 1), start-up errors (world
// size, srun without PMIx), a signal to one rank, and a rank that dies.
//
// Each rank runs one OpenMP thread (OMP_NUM_THREADS=1 on the command line, so that ranks do
// not crowd a small machine; the kernels give the same bits for any thread count).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "tests/parallel/parallel_train_fixture.h"

namespace {

using DpTrain = ParallelTrain;

// The parent pid and state of a process, from /proc/PID/stat ("" when it is gone).
std::pair<pid_t, char> parent_and_state(pid_t pid) {
  const std::string stat = read_file_text("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return {0, 0};
  std::istringstream rest(stat.substr(close + 1));
  char state = 0;
  pid_t ppid = 0;
  rest >> state >> ppid;
  return {ppid, state};
}

// The ranks mpirun started (its children), with their rank from OMPI_COMM_WORLD_RANK.
std::vector<std::pair<int, pid_t>> ranks_of(pid_t mpirun_pid) {
  std::vector<std::pair<int, pid_t>> out;
  const std::string key = "OMPI_COMM_WORLD_RANK=";
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (parent_and_state(pid).first != mpirun_pid) continue;
    const std::string env = read_file_text("/proc/" + name + "/environ");
    for (std::size_t at = 0; at < env.size();) {
      const std::size_t end = env.find('\0', at);
      if (env.compare(at, key.size(), key) == 0) out.push_back({std::stoi(env.substr(at + key.size())), pid});
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

pid_t spawn(const std::string& cmd, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    const std::string full = "exec " + cmd + " >" + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int wait_code(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Waits until `log` contains `text` (up to 60 s).
bool wait_for(const std::string& log, const std::string& text) {
  for (int i = 0; i < 1200; ++i) {
    if (read_file_text(log).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

TEST_F(DpTrain, Dp2AndDp4MatchOneRank) {
  ASSERT_EQ(train(0, "one").code, 0);
  for (int np : {2, 4}) {
    const std::string name = "dp" + std::to_string(np);
    CommandResult r = train(np, name);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("tp=1 pp=1 dp=" + std::to_string(np)), std::string::npos) << r.out;
    EXPECT_EQ(r.err, "");  // the other ranks are quiet
    expect_same_curve("one", name, 1e-5, 5);
    expect_same_tensors("one", name, 1e-5);
  }
}

TEST_F(DpTrain, Zero1MatchesOneRankAndWritesOneFilePerDpRank) {
  ASSERT_EQ(train(0, "one").code, 0);
  for (int np : {2, 4}) {
    const std::string name = "zero1_dp" + std::to_string(np);
    CommandResult r = train(np, name, " --set parallel.zero1=true");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("ZeRO-1"), std::string::npos) << r.out;
    EXPECT_EQ(ckpt::checkpoint_files(ckpt::resolve_checkpoint(dir_ / name)).size(), std::size_t(np));
    EXPECT_TRUE(ckpt::verify_checkpoint(dir_ / name).empty());
    expect_same_curve("one", name, 1e-5, 5);
    expect_same_tensors("one", name, 1e-5);
  }
}

// parallel.overlap_grad_reduce: dp2 with gradient accumulation (A = 2: only the last
// micro-batch's backward starts buckets), dp2 and dp4 with one micro-batch per step.
TEST_F(DpTrain, OverlappedReductionGivesTheSameBits) {
  expect_overlap_same_bits(2, "dp2_a2", "");
  expect_overlap_same_bits(2, "dp2_a1", " --set train.global_batch=4");
  expect_overlap_same_bits(4, "dp4_a1", "");
}

TEST_F(DpTrain, MpirunWithOneRankIsTheSingleProcessBitForBit) {
  ASSERT_EQ(train(0, "one").code, 0);
  CommandResult r = train(1, "np1");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_curve("one", "np1", 0.0, 5);
  expect_same_tensors("one", "np1", 0.0);
}

TEST_F(DpTrain, CheckpointsMoveBetweenLayouts) {
  const std::string ten = " --set train.steps=10";
  ASSERT_EQ(train(0, "ref", ten).code, 0);
  // dp2 -> 1 rank, 1 rank -> dp2, ZeRO-1 dp2 <-> 1 rank: stop at 5, resume to 10.
  const std::string zero1 = " --set parallel.zero1=true";
  stop_and_resume("ref", "dp2_to_1", ten, 2, "", 0, "", 1e-5, kTinyTensors);
  stop_and_resume("ref", "one_to_dp2", ten, 0, "", 2, "", 1e-5, kTinyTensors);
  stop_and_resume("ref", "zero1_to_1", ten, 2, zero1, 0, "", 1e-5, kTinyTensors);
  stop_and_resume("ref", "one_to_zero1", ten, 0, "", 2, zero1, 1e-5, kTinyTensors);
}

TEST_F(DpTrain, WorldSizeMustFitTheConfig) {
  // tp = 2 on one rank: the world size is not a multiple of tp * pp.
  CommandResult r = run_nsatron("train " + config() + " --set parallel.tp=2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("parallel.tp"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("world size 1"), std::string::npos) << r.err;
  // Three ranks cannot split a global batch of 8: every rank finds it; it is printed once.
  CommandResult three = run_command(mpirun(3) + " train " + config() + kSmall + " --set checkpoint.dir=" + (dir_ / "three").string());
  EXPECT_EQ(three.code, 2) << three.out << three.err;
  const std::string msg = "is not a multiple of micro_batch * dp = 2 * 3";
  const auto first = three.err.find(msg);
  ASSERT_NE(first, std::string::npos) << three.err;
  EXPECT_EQ(three.err.find(msg, first + 1), std::string::npos) << "printed more than once:\n" << three.err;
  EXPECT_FALSE(fs::exists(dir_ / "three"));
  // More tensor-parallel ranks than KV groups: refused by config validation, naming the key.
  CommandResult tp4 = run_command(mpirun(4) + " train " + config() + kSmall + " --set parallel.tp=4");
  EXPECT_EQ(tp4.code, 2) << tp4.out << tp4.err;
  EXPECT_NE(tp4.err.find("parallel.tp"), std::string::npos) << tp4.err;
  EXPECT_NE(tp4.err.find("n_kv_heads = 2"), std::string::npos) << tp4.err;
}

TEST_F(DpTrain, SrunWithoutPmixIsRefused) {
  // What an `srun -n 2` without PMIx gives each task: Slurm's variables, no PMI.
  CommandResult r = run_command("env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK -u PMI_RANK -u PMI_SIZE "
                                "SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=2 SLURM_PROCID=0 " +
                                std::string(NSATRON_BINARY) + " train " + config());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("Slurm started 2 tasks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("MPI sees a world of 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("srun --mpi=pmix"), std::string::npos) << r.err;
  // The other task exits the same way, silently.
  CommandResult other = run_command("env SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=2 SLURM_PROCID=1 " +
                                    std::string(NSATRON_BINARY) + " train " + config());
  EXPECT_EQ(other.code, 2);
  EXPECT_EQ(other.err, "");
}

TEST_F(DpTrain, SigtermToOneRankStopsEveryRankAtTheSameStep) {
  const std::string log = (dir_ / "sig.log").string();
  const std::string run = " train " + config() + " --set train.micro_batch=2 --set train.steps=100000"
                          " --set train.eval_every=0 --set log.every=100000 --set checkpoint.dir=" + (dir_ / "sig").string();
  pid_t pid = spawn(mpirun(2) + run, log);
  ASSERT_TRUE(wait_for(log, "step      1/")) << read_file_text(log);
  const auto ranks = ranks_of(pid);
  ASSERT_EQ(ranks.size(), 2u) << "mpirun's children";
  ASSERT_EQ(ranks[1].first, 1);
  kill(ranks[1].second, SIGTERM);  // rank 1 only
  EXPECT_EQ(wait_code(pid), 3) << read_file_text(log);
  const std::string text = read_file_text(log);
  EXPECT_NE(text.find("signal 15 received by another rank: stopping after step"), std::string::npos) << text;
  EXPECT_TRUE(ckpt::verify_checkpoint(dir_ / "sig").empty());
  const auto state = ckpt::read_train_state(ckpt::resolve_checkpoint(dir_ / "sig"));
  EXPECT_GT(state.step, 0);
  // Both ranks stopped after that step: the sampler position is the step's.
  EXPECT_EQ(state.consumed_tokens, state.step * 8 * 64);
  CommandResult resumed = run_command(mpirun(2) + run + " --set train.stop_at=" + std::to_string(state.step + 2));
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
}

// Data parallelism (the ranks meet in all-reduces) and a pipeline (rank 0 waits in a
// point-to-point receive from the lost rank).
TEST_F(DpTrain, ALostRankEndsTheJobAndKeepsTheLastCheckpoint) {
  for (const std::string layout : {"", " --set parallel.pp=2"}) {
    const std::string name = layout.empty() ? "lost_dp2" : "lost_pp2";
    SCOPED_TRACE(name);
    const std::string log = (dir_ / (name + ".log")).string();
    const std::string run = " train " + config() + " --set train.micro_batch=2 --set train.steps=100000"
                            " --set train.eval_every=0 --set log.every=100000 --set checkpoint.every=1"
                            " --set checkpoint.keep=2 --set checkpoint.dir=" + (dir_ / name).string() + layout;
    pid_t pid = spawn(mpirun(2) + run, log);
    // Should an assertion end this test early, the job must not outlive it.
    bool reaped = false;
    std::shared_ptr<void> reap(nullptr, [pid, &reaped](void*) {
      if (reaped) return;
      kill(pid, SIGTERM);  // mpirun takes its ranks down
      waitpid(pid, nullptr, 0);
    });
    ASSERT_TRUE(wait_for(log, "checkpoint   step 3 ")) << read_file_text(log);
    const auto ranks = ranks_of(pid);
    ASSERT_EQ(ranks.size(), 2u);
    const auto t0 = std::chrono::steady_clock::now();
    kill(ranks[1].second, SIGKILL);
    const int code = wait_code(pid);
    reaped = true;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string text = read_file_text(log);
    EXPECT_NE(code, 0) << text;
    EXPECT_LT(seconds, 60.0) << "the job did not end in time";
    EXPECT_NE(text.find("rank 1"), std::string::npos) << "the lost rank is not named:\n" << text;
    // mpirun may return while it is still taking rank 0 down: rank 0 must be gone (or a zombie)
    // within a bounded time after that.
    char state = parent_and_state(ranks[0].second).second;
    for (int i = 0; i < 100 && !(state == 0 || state == 'Z'); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      state = parent_and_state(ranks[0].second).second;
    }
    EXPECT_TRUE(state == 0 || state == 'Z') << "rank 0 still runs 10 s after mpirun ended (state " << state << ")";
    ckpt::ResumeChoice choice = ckpt::find_resume(dir_ / name);
    ASSERT_TRUE(choice.checkpoint.has_value());
    EXPECT_TRUE(choice.warnings.empty()) << choice.warnings.front();
    EXPECT_TRUE(ckpt::verify_checkpoint(*choice.checkpoint).empty());
    EXPECT_GE(ckpt::read_train_state(*choice.checkpoint).step, 3);
  }
}
