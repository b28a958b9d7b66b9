// A full disk at checkpoint time: the save is refused before anything is written, with a
// message that says how much room the checkpoint needs and how much the directory has; the
// run exits 1 (not bad input), the last committed checkpoint stays intact and verifies, and
// once there is room again the same command resumes from it and finishes.
//
// The disk is a small tmpfs mounted for the test (root, as on the project's machines and in
// CI); the test skips, saying why, where mounting is not allowed.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/train/train_fixture.h"

namespace {

class TrainDiskFull : public TrainRun {
 protected:
  void SetUp() override {
    TrainRun::SetUp();
    if (HasFatalFailure()) return;
    disk_ = dir_ / "disk";
    fs::create_directories(disk_);
    if (::mount("tmpfs", disk_.c_str(), "tmpfs", 0, "size=8m") != 0)
      GTEST_SKIP() << "cannot mount a tmpfs at " << disk_ << " (needs root with CAP_SYS_ADMIN)";
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount(disk_.c_str());
    TrainRun::TearDown();
  }
  // Fills the disk so that `keep` bytes stay free.
  void fill_leaving(std::uintmax_t keep) {
    const std::uintmax_t avail = fs::space(disk_).available;
    ASSERT_GT(avail, keep);
    std::ofstream f(disk_ / "filler", std::ios::binary);
    const std::vector<char> block(1 << 16, 'x');
    for (std::uintmax_t left = avail - keep; left > 0;) {
      const std::uintmax_t n = std::min<std::uintmax_t>(left, block.size());
      f.write(block.data(), std::streamsize(n));
      left -= n;
    }
  }
  std::string train(int steps) const {
    return "train " + config() + " --set train.steps=" + std::to_string(steps) +
           " --set checkpoint.every=10 --set checkpoint.dir=" + (disk_ / "ckpt").string();
  }
  fs::path disk_;
  bool mounted_ = false;
};

TEST_F(TrainDiskFull, SaveRefusedNamingTheRoomThenResumes) {
  const CommandResult first = run_nsatron(train(20));
  ASSERT_EQ(first.code, 0) << first.err;
  fill_leaving(256 << 10);  // 256 KiB: less than any checkpoint's estimate (>= 1 MiB)
  const CommandResult full = run_nsatron(train(40));
  EXPECT_EQ(full.code, 1) << full.err;
  EXPECT_NE(full.err.find("checkpoint step 30: needs "), std::string::npos) << full.err;
  EXPECT_NE(full.err.find(" MiB free in " + (disk_ / "ckpt").string()), std::string::npos) << full.err;
  EXPECT_EQ(full.err.find("HDF5"), std::string::npos) << "no raw HDF5 error text: " << full.err;
  EXPECT_EQ(read_file_text((disk_ / "ckpt/latest").string()), "step_00000020\n");
  const CommandResult verify = run_nsatron("ckpt verify " + (disk_ / "ckpt").string());
  EXPECT_EQ(verify.code, 0) << verify.out << verify.err;
  for (const auto& e : fs::directory_iterator(disk_ / "ckpt"))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "leftover " << e.path();
  fs::remove(disk_ / "filler");
  const CommandResult again = run_nsatron(train(40));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("step 20"), std::string::npos) << again.out;
  EXPECT_EQ(read_file_text((disk_ / "ckpt/latest").string()), "step_00000040\n");
}

}  // namespace
