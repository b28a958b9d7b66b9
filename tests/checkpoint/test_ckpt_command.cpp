// `nsatron ckpt inspect|verify`, run as a process (ckpt_tool: ckpt_main with main.cpp's error
// handling): output, exit codes, and the problems named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "ckpt_test_util.h"
#include "tests/cli/run_command.h"

using namespace ckpt_test;
namespace ck = nsatron::checkpoint;

namespace {

CommandResult ckpt(const std::string& args) { return run_command(std::string(CKPT_TOOL) + " " + args); }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

fs::path save_one(const fs::path& dir, std::int64_t step, Model& mo) {
  return ck::save_checkpoint(dir, mo.params, mo.m, mo.v, make_state(step), 0);
}

}  // namespace

TEST(CkptCommand, HelpAndUsage) {
  for (const std::string c : {"--help", "inspect --help", "verify --help"}) {
    const auto r = ckpt(c);
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_TRUE(has(r.out, "usage: nsatron ckpt")) << c << ": " << r.out;
  }
  EXPECT_EQ(ckpt("").code, 2);
  EXPECT_EQ(ckpt("frobnicate x").code, 2);
  const auto r = ckpt("verify /nonexistent/checkpoints");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "/nonexistent/checkpoints")) << r.err;
  EXPECT_EQ(ckpt("inspect").code, 2);
  TempDir tmp;
  EXPECT_EQ(ckpt("inspect " + tmp.path.string() + " --bogus").code, 2);
  const auto empty = ckpt("inspect " + tmp.path.string());
  EXPECT_EQ(empty.code, 2);
  EXPECT_TRUE(has(empty.err, "not a checkpoint")) << empty.err;
}

TEST(CkptCommand, InspectPrintsStateConfigAndTensorTable) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model mo = make_model(3);
  save_one(dir, 17, mo);
  for (const fs::path& p : {dir, dir / "step_00000017"}) {
    const auto r = ckpt("inspect " + p.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.out, "step         17\n")) << r.out;
    EXPECT_TRUE(has(r.out, "tokens       " + std::to_string(17 * 4096) + "\n")) << r.out;
    EXPECT_TRUE(has(r.out, "consumed_samples=34")) << r.out;
    EXPECT_TRUE(has(r.out, "# config\n[model]\nvocab_size = 256")) << r.out;
    EXPECT_TRUE(has(r.out, "extra.lr_schedule")) << r.out;
    // One row per tensor with its shape, dtype and L2 norm.
    for (const auto& p2 : mo.params.infos()) {
      double ss = 0;
      for (double x : mo.params.weight(p2).to_vector()) ss += x * x;
      char norm[64];
      std::snprintf(norm, sizeof norm, "%.6g", std::sqrt(ss));
      const std::string row_start = p2.name + " ";
      const auto at = r.out.find("\n" + row_start);
      ASSERT_NE(at, std::string::npos) << p2.name << "\n" << r.out;
      const std::string row = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
      EXPECT_TRUE(has(row, nsatron::shape_str(p2.shape))) << row;
      EXPECT_TRUE(has(row, " fp32 ")) << row;
      EXPECT_TRUE(has(row, norm)) << row << " vs " << norm;
      EXPECT_TRUE(has(r.out, "\noptim/m/" + row_start)) << r.out;
      EXPECT_TRUE(has(r.out, "\noptim/v/" + row_start)) << r.out;
    }
    EXPECT_TRUE(has(r.out, "18 tensors, " + std::to_string(mo.params.total()) + " parameters")) << r.out;
  }
  const auto quiet = ckpt("inspect " + dir.string() + " --no-config --no-tensors");
  EXPECT_EQ(quiet.code, 0);
  EXPECT_FALSE(has(quiet.out, "# config"));
  EXPECT_FALSE(has(quiet.out, "# tensors"));
}

TEST(CkptCommand, VerifyExitCodesNameTheProblem) {
  TempDir tmp;
  const fs::path dir = tmp.path / "run";
  Model mo = make_model(3);
  save_one(dir, 1, mo);
  const fs::path step2 = save_one(dir, 2, mo);
  auto r = ckpt("verify " + dir.string());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "ok: " + step2.string() + ": step 2, 1 file, 18 datasets")) << r.out;

  flip_data_byte(step2 / "rank_00000.h5", "optim/m/model/layers.1/mlp/w_in", 3);
  r = ckpt("verify " + dir.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.out, "error: " + (step2 / "rank_00000.h5").string() +
                             ": optim/m/model/layers.1/mlp/w_in: checksum mismatch")) << r.out;
  EXPECT_TRUE(has(r.out, "damaged: ")) << r.out;
  // inspect refuses the damaged tensor (exit 2, named); verify --all checks every step.
  r = ckpt("inspect " + dir.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "optim/m/model/layers.1/mlp/w_in: checksum mismatch")) << r.err;
  r = ckpt("verify --all " + dir.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.out, "ok: " + (dir / "step_00000001").string())) << r.out;
  EXPECT_TRUE(has(r.out, "latest -> step_00000002")) << r.out;
  EXPECT_EQ(ckpt("verify " + (dir / "step_00000001").string()).code, 0);

  write_text(dir / "latest", "step_00000009\n");
  r = ckpt("verify " + dir.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.out, "names step_00000009, which does not exist")) << r.out;

  fs::resize_file(dir / "step_00000001" / "rank_00000.h5", 4000);
  r = ckpt("verify " + (dir / "step_00000001").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.out, (dir / "step_00000001" / "rank_00000.h5").string() + ": cannot open as HDF5")) << r.out;
}
