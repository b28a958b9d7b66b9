// Checkpoints through the real trainer: exact resume, SIGTERM, SIGKILL during saves,
// corrupt latest, refusal to overwrite, shape mismatch, sampling.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "tests/train/train_fixture.h"

namespace ckpt = nsatron::checkpoint;

namespace {

// Every weight of two checkpoints, bit for bit.
void expect_same_weights(const fs::path& a, const fs::path& b) {
  auto fa = ckpt::checkpoint_files(ckpt::resolve_checkpoint(a));
  auto fb = ckpt::checkpoint_files(ckpt::resolve_checkpoint(b));
  int compared = 0;
  ckpt::for_each_tensor(a, [&](const std::string& name, const ckpt::FullTensor& t) {
    ckpt::FullTensor u = ckpt::read_full_tensor(fb, name);
    EXPECT_EQ(t.shape, u.shape) << name;
    EXPECT_TRUE(t.data == u.data) << name << " differs";
    ++compared;
  });
  EXPECT_GT(compared, 10);
}

// Starts `nsatron ARGS` in the background; returns its pid.
pid_t spawn_nsatron(const std::string& args, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    std::string cmd = std::string("exec ") + NSATRON_BINARY + " " + args + " >" + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

// A run stopped at step 12 and resumed has the losses, validation losses, gradient norms and
// final weights of the run that went through, bit for bit (`settings` on top of the tiny config).
void expect_exact_resume(const fs::path& dir_, const std::string& config, const std::string& settings) {
  const std::string common = " --set train.steps=24 --set train.eval_every=8" + settings;
  CommandResult full = run_nsatron("train " + config + common + " --set checkpoint.dir=" + (dir_ / "full").string() +
                                   " --set log.metrics=" + (dir_ / "full.jsonl").string());
  ASSERT_EQ(full.code, 0) << full.err;
  const std::string half = common + " --set checkpoint.dir=" + (dir_ / "half").string() + " --set log.metrics=" +
                           (dir_ / "half.jsonl").string();
  CommandResult first = run_nsatron("train " + config + half + " --set train.stop_at=12");
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("stopped at step 12"), std::string::npos) << first.out;
  CommandResult second = run_nsatron("train " + config + half);
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("step 12"), std::string::npos);

  const std::string a = read_file_text((dir_ / "full.jsonl").string()), b = read_file_text((dir_ / "half.jsonl").string());
  const auto la = field_values(a, "loss"), lb = field_values(b, "loss");
  ASSERT_EQ(la.size(), 24u);
  EXPECT_EQ(la, lb);  // exact equality at every step
  EXPECT_EQ(field_values(a, "val_loss"), field_values(b, "val_loss"));
  EXPECT_EQ(field_values(a, "grad_norm"), field_values(b, "grad_norm"));
  expect_same_weights(dir_ / "full", dir_ / "half");
}

TEST_F(TrainRun, StoppedAndResumedRunContinuesTheSameBits) { expect_exact_resume(dir_, config(), ""); }

TEST_F(TrainRun, StoppedAndResumedDenseRunContinuesTheSameBits) {
  expect_exact_resume(dir_, config(), " --set model.attention=dense");
}

TEST_F(TrainRun, SigtermFinishesTheStepSavesAndExits3ThenResumes) {
  const std::string common = " --set train.steps=3000 --set train.eval_every=0 --set log.every=1000";
  const std::string run = common + " --set checkpoint.dir=" + (dir_ / "sig").string();
  pid_t pid = spawn_nsatron("train " + config() + run, (dir_ / "sig.log").string());
  // Wait until training has started, then ask it to stop.
  for (int i = 0; i < 600 && read_file_text((dir_ / "sig.log").string()).find("step      1/") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  kill(pid, SIGTERM);  // a second signal, likely during the save, must change nothing
  EXPECT_EQ(wait_exit_code(pid), 3) << read_file_text((dir_ / "sig.log").string());
  std::string log = read_file_text((dir_ / "sig.log").string());
  EXPECT_NE(log.find("signal 15 received"), std::string::npos) << log;
  auto state = ckpt::read_train_state(ckpt::resolve_checkpoint(dir_ / "sig"));
  EXPECT_GT(state.step, 0);
  EXPECT_LT(state.step, 3000);
  EXPECT_TRUE(ckpt::verify_checkpoint(dir_ / "sig").empty());
  // The resumed run starts right after the saved step.
  CommandResult resumed = run_nsatron("train " + config() + run + " --set train.stop_at=" + std::to_string(state.step + 2));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos);
  char first_line[64];
  std::snprintf(first_line, sizeof first_line, "step %6lld/3000", (long long)(state.step + 1));
  EXPECT_NE(resumed.out.find(first_line), std::string::npos) << resumed.out;
}

TEST_F(TrainRun, KilledDuringSavesLeavesTheLastCommittedCheckpointIntact) {
  // A model large enough that saving takes a while, saving after every step; SIGKILL at
  // random moments, then the committed checkpoint must load and verify each time.
  const std::string run = " --set model.d_model=256 --set model.head_dim=64 --set model.ffn_hidden=512"
                          " --set train.steps=100000 --set train.eval_every=0 --set log.every=1000"
                          " --set checkpoint.every=1 --set checkpoint.keep=2 --set checkpoint.dir=" +
                          (dir_ / "kill").string();
  std::uint64_t seed = std::chrono::steady_clock::now().time_since_epoch().count();
  std::printf("kill test seed %llu\n", (unsigned long long)seed);
  std::int64_t last_step = 0;
  for (int round = 0; round < 6; ++round) {
    pid_t pid = spawn_nsatron("train " + config() + run, (dir_ / "kill.log").string());
    for (int i = 0; i < 600 && read_file_text((dir_ / "kill.log").string()).find("checkpoint   step") == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + (seed >> 33) % 700));
    kill(pid, SIGKILL);
    wait_exit_code(pid);
    ckpt::ResumeChoice choice = ckpt::find_resume(dir_ / "kill");
    ASSERT_TRUE(choice.checkpoint.has_value()) << "round " << round;
    EXPECT_TRUE(choice.warnings.empty()) << choice.warnings.front();
    EXPECT_TRUE(ckpt::verify_checkpoint(*choice.checkpoint).empty()) << choice.checkpoint->string();
    std::int64_t step = ckpt::read_train_state(*choice.checkpoint).step;
    EXPECT_GE(step, last_step) << "round " << round;
    last_step = step;
  }
  EXPECT_GT(last_step, 0);
}

TEST_F(TrainRun, CorruptLatestFallsBackToTheNewestGoodCheckpoint) {
  const std::string run = " --set train.steps=10 --set checkpoint.every=5 --set train.eval_every=0";
  ASSERT_EQ(run_nsatron("train " + config() + run).code, 0);
  fs::path bad = dir_ / "ckpt/step_00000010/rank_00000.h5";
  ASSERT_TRUE(fs::exists(bad));
  {  // flip bytes in the middle of the file, where the tensor data lies
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = fs::file_size(bad);
    for (std::uintmax_t at : {size / 2, size / 3, 2 * size / 3}) {
      f.seekg(std::streamoff(at));
      char c = 0;
      f.read(&c, 1);
      c = char(c ^ 0x5a);
      f.seekp(std::streamoff(at));
      f.write(&c, 1);
    }
  }
  CommandResult verify = run_nsatron("ckpt verify " + (dir_ / "ckpt").string());
  EXPECT_NE(verify.code, 0);
  EXPECT_NE((verify.out + verify.err).find("rank_00000.h5"), std::string::npos) << verify.out << verify.err;
  CommandResult r = run_nsatron("train " + config() + run + " --set train.steps=12");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("warning:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step_00000010"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from " + (dir_ / "ckpt/step_00000005").string()), std::string::npos) << r.out;
}

TEST_F(TrainRun, NeverRefusesAnExistingRunUnlessOverwrite) {
  const std::string run = " --set train.steps=3 --set train.eval_every=0";
  ASSERT_EQ(run_nsatron("train " + config() + run).code, 0);
  CommandResult refused = run_nsatron("train " + config() + run + " --set checkpoint.resume=never");
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.err.find("checkpoint.resume"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--overwrite"), std::string::npos) << refused.err;
  CommandResult forced = run_nsatron("train " + config() + run + " --set checkpoint.resume=never --overwrite");
  EXPECT_EQ(forced.code, 0) << forced.err;
  EXPECT_EQ(forced.out.find("resumed from"), std::string::npos);
}

TEST_F(TrainRun, ModelShapeChangeIsNamed) {
  ASSERT_EQ(run_nsatron("train " + config() + " --set train.steps=2 --set train.eval_every=0").code, 0);
  CommandResult r = run_nsatron("train " + config() + " --set train.steps=4 --set model.ffn_hidden=96");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("model/layers.0/mlp/w_gate"), std::string::npos) << r.err;
}

// A checkpoint says which attention its model has (root attribute extra.attention): resuming
// it with the other is refused before any tensor loads, naming the checkpoint and the key,
// and the checkpoint stays as it was; the matching attention resumes it, and sampling builds
// the checkpoint's own model.
TEST_F(TrainRun, AttentionChangeIsRefusedNamingTheCheckpoint) {
  const std::string two = " --set train.steps=2 --set train.eval_every=0";
  for (const auto& [held, other] : {std::pair<std::string, std::string>{"nsa", "dense"}, {"dense", "nsa"}}) {
    SCOPED_TRACE(held + " checkpoint");
    const std::string dir = " --set checkpoint.dir=" + (dir_ / held).string();
    ASSERT_EQ(run_nsatron("train " + config() + two + dir + " --set model.attention=" + held).code, 0);
    EXPECT_EQ(ckpt::read_train_state(ckpt::resolve_checkpoint(dir_ / held)).extra.at("attention"), held);
    CommandResult r = run_nsatron("train " + config() + " --set train.steps=4" + dir + " --set model.attention=" + other);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    const std::string step = (dir_ / held / "step_00000002").string();
    EXPECT_NE(r.err.find(step + ": extra.attention: the checkpoint holds a model with \"" + held + "\" attention"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("model.attention = \"" + other + "\""), std::string::npos) << r.err;
    EXPECT_EQ(ckpt::list_checkpoints(dir_ / held).size(), 1u);
    EXPECT_TRUE(ckpt::verify_checkpoint(dir_ / held).empty());
    CommandResult same = run_nsatron("train " + config() + " --set train.steps=4" + dir + " --set model.attention=" + held);
    EXPECT_EQ(same.code, 0) << same.err;
    EXPECT_NE(same.out.find("resumed from " + step), std::string::npos) << same.out;
    CommandResult sample = run_nsatron("sample --checkpoint " + (dir_ / held).string() + " --prompt 'the ' --tokens 8");
    EXPECT_EQ(sample.code, 0) << sample.err;
    EXPECT_EQ(sample.out.rfind("the ", 0), 0u) << sample.out;
  }
}

TEST_F(TrainRun, SampleFromCheckpoint) {
  ASSERT_EQ(run_nsatron("train " + config() + " --set train.steps=30 --set train.eval_every=0").code, 0);
  const std::string args = "sample --checkpoint " + (dir_ / "ckpt").string() + " --prompt 'the ' --tokens 24 --seed 5";
  CommandResult a = run_nsatron(args), b = run_nsatron(args);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out.rfind("the ", 0), 0u) << a.out;
  EXPECT_EQ(a.out.size(), 4u + 24u + 1u) << a.out;  // prompt, 24 bytes, newline
  EXPECT_EQ(a.out, b.out);                          // same seed, same text
  CommandResult greedy = run_nsatron("sample --checkpoint " + (dir_ / "ckpt").string() + " --prompt 'the ' --tokens 8 --temperature 0");
  EXPECT_EQ(greedy.code, 0) << greedy.err;
  CommandResult missing = run_nsatron("sample --checkpoint " + (dir_ / "nothing").string() + " --tokens 3");
  EXPECT_EQ(missing.code, 2);
  // Careless arguments: each refused with exit 2 and a message naming the argument.
  const std::string ck = "sample --checkpoint " + (dir_ / "ckpt").string() + " --prompt 'the '";
  const std::pair<std::string, std::string> bad[] = {
      {" --tokens -3", "--tokens"},       {" --tokens abc", "--tokens"},  {" --tokens 4 --temperature -1", "--temperature"},
      {" --tokens 4 --top-k -2", "--top-k"}, {" --tokens 4 --seed x", "--seed"}, {" --tokens 4 --bogus 1", "--bogus"},
      {" --tokens", "--tokens"}};
  for (const auto& [arg, name] : bad) {
    const CommandResult r = run_nsatron(ck + arg);
    EXPECT_EQ(r.code, 2) << arg << ": " << r.err;
    EXPECT_NE(r.err.find(name), std::string::npos) << arg << ": " << r.err;
  }
}
