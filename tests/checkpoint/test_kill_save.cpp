// Kill during save: a child process saves checkpoints back to back and is SIGKILLed at
// random moments; after every kill the checkpoint `latest` names must verify and load with
// exactly the content of its step, and resume must need no fallback.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "ckpt_test_util.h"

using namespace ckpt_test;
namespace ck = nsatron::checkpoint;

namespace {

// Large enough that a save (write + fsync) takes a while: 3 x 4M floats = 48 MiB per save.
std::vector<Spec> big_model() {
  return {{"model/embedding", {1024, 1024}}, {"model/layers.0/attn/wqkv", {2048, 1024}},
          {"model/layers.0/attn_norm", {1024}}, {"model/final_norm", {1024}}, {"model/lm_head", {1024, 1024}}};
}

// The content a checkpoint of `step` must hold.
void fill_for_step(Model& mo, std::int64_t step) {
  float* w = mo.params.flat_weights().data<float>();
  float* m = mo.m.data<float>();
  float* v = mo.v.data<float>();
  for (std::int64_t i = 0; i < mo.params.total(); ++i) {
    w[i] = float(step) + float(i % 1021) * 0.5f;
    m[i] = -w[i];
    v[i] = float(step * 3 + i % 7);
  }
}

Model empty_big() {
  Model mo;
  for (const auto& s : big_model()) mo.params.declare(s.name, s.shape, true, 0.0);
  mo.params.allocate(nsatron::DType::F32);
  mo.m = nsatron::Tensor::zeros({mo.params.total()}, nsatron::DType::F32);
  mo.v = nsatron::Tensor::zeros({mo.params.total()}, nsatron::DType::F32);
  return mo;
}

[[noreturn]] void saver(const fs::path& dir, std::int64_t first_step) {
  try {
    Model mo = empty_big();
    for (std::int64_t step = first_step;; ++step) {
      fill_for_step(mo, step);
      ck::save_checkpoint(dir, mo.params, mo.m, mo.v, make_state(step), /*keep=*/2);
    }
  } catch (...) {
  }
  _exit(3);
}

}  // namespace

TEST(KillDuringSave, TheLastCommittedCheckpointSurvives) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  std::srand(12345);
  int killed_mid_save = 0;  // kills that left a staging directory behind
  std::int64_t last_step = -1;
  const int rounds = 14;
  for (int round = 0; round < rounds; ++round) {
    const std::int64_t first = std::int64_t(round) * 1000 + 1;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) saver(dir, first);
    if (round == 0) {  // let the first round commit at least once
      for (int i = 0; i < 600 && !fs::exists(dir / "latest"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ASSERT_TRUE(fs::exists(dir / "latest"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + std::rand() % 700));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saver stopped by itself: status " << status;

    bool staging_left = false;
    for (const auto& e : fs::directory_iterator(dir))
      staging_left = staging_left || e.path().filename().string().find(".tmp-") != std::string::npos;
    killed_mid_save += staging_left;

    const auto rc = ck::find_resume(dir);
    ASSERT_TRUE(rc.checkpoint) << "round " << round;
    EXPECT_TRUE(rc.warnings.empty()) << "round " << round << ": " << joined(rc.warnings);
    EXPECT_EQ(*rc.checkpoint, ck::resolve_checkpoint(dir));
    const auto problems = ck::verify_checkpoint(dir);
    EXPECT_TRUE(problems.empty()) << "round " << round << ": " << joined(problems);
    Model got = empty_big();
    const ck::TrainState st = ck::load_checkpoint(dir, got.params, got.m, got.v);
    EXPECT_EQ(st, make_state(st.step));
    EXPECT_GE(st.step, last_step) << "latest went backwards";
    last_step = st.step;
    Model want = empty_big();
    fill_for_step(want, st.step);
    EXPECT_TRUE(same_bits(want.params.flat_weights(), got.params.flat_weights())) << "step " << st.step;
    EXPECT_TRUE(same_bits(want.m, got.m)) << "step " << st.step;
    EXPECT_TRUE(same_bits(want.v, got.v)) << "step " << st.step;
    // keep = 2: at most two committed checkpoints (a kill can come between the commit and the
    // clean-up of the previous ones: then three).
    EXPECT_LE(ck::list_checkpoints(dir).size(), 3u);
  }
  std::cout << "kills that interrupted a save: " << killed_mid_save << " of " << rounds << "; last step " << last_step
            << "\n";
  EXPECT_GE(killed_mid_save, rounds / 3) << "the kills missed the saves; the test proves little";
}
