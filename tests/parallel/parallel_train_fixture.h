// Runs of `nsatron train` with one process or under mpirun, compared step by step: the
// fixture of the data-, tensor- and pipeline-parallel end-to-end tests.
//
// Each rank runs one OpenMP thread (OMP_NUM_THREADS=1 on the command line, so that ranks do
// not crowd a small machine; the kernels give the same bits for any thread count).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <string>
#include <tuple>

#include "checkpoint/checkpoint.h"
#include "tests/train/train_fixture.h"

namespace ckpt = nsatron::checkpoint;

// Parameters of the tiny model of train_fixture.h (2 layers of 11, embedding, final norm).
inline constexpr int kTinyTensors = 24;


inline std::string mpirun(int np) {
  return std::string("env OMP_NUM_THREADS=1 ") + NSATRON_MPIEXEC +
         " --allow-run-as-root --oversubscribe --bind-to none -np " + std::to_string(np) + " " + NSATRON_BINARY;
}

// The run's config with a batch that splits over 1, 2 and 4 ranks, 5 steps, validation at 5.
inline const char* kSmall = " --set train.micro_batch=2 --set train.global_batch=8 --set train.steps=5"
                     " --set train.eval_every=5 --set log.every=1";

class ParallelTrain : public TrainRun {
 protected:
  // `nsatron train` with one process (np = 0) or under mpirun with np ranks; the run's
  // checkpoints go to dir_/name, its metrics to dir_/name.jsonl.
  CommandResult train(int np, const std::string& name, const std::string& extra = "") {
    const std::string args = " train " + config() + kSmall + " --set checkpoint.dir=" + (dir_ / name).string() +
                             " --set log.metrics=" + (dir_ / (name + ".jsonl")).string() + extra;
    return run_command((np == 0 ? std::string("OMP_NUM_THREADS=1 ") + NSATRON_BINARY : mpirun(np)) + args);
  }
  std::string metrics(const std::string& name) { return read_file_text((dir_ / (name + ".jsonl")).string()); }

  // Losses (and validation losses) of run b match run a to `rel` at every step.
  void expect_same_curve(const std::string& a, const std::string& b, double rel, std::size_t steps) {
    for (const char* field : {"loss", "val_loss", "grad_norm"}) {
      const auto la = field_values(metrics(a), field), lb = field_values(metrics(b), field);
      if (std::string(field) == "loss") {
        ASSERT_EQ(la.size(), steps) << a;
      }
      ASSERT_EQ(la.size(), lb.size()) << field << " " << a << " vs " << b;
      for (std::size_t i = 0; i < la.size(); ++i)
        EXPECT_LE(std::fabs(la[i] - lb[i]), rel * std::fabs(la[i])) << field << " " << i << ": " << la[i] << " vs " << lb[i];
    }
  }

  // Every tensor (weights and moments) of two checkpoints, to `tol` absolute (0: bit for bit).
  void expect_same_tensors(const std::string& a, const std::string& b, double tol, int tensors = kTinyTensors) {
    const auto fb = ckpt::checkpoint_files(ckpt::resolve_checkpoint(dir_ / b));
    int compared = 0;
    double worst = 0;
    ckpt::for_each_tensor(dir_ / a, [&](const std::string& name, const ckpt::FullTensor& t) {
      const ckpt::FullTensor u = ckpt::read_full_tensor(fb, name);
      ASSERT_EQ(t.shape, u.shape) << name;
      for (std::size_t i = 0; i < t.data.size(); ++i) {
        const double d = std::fabs(double(t.data[i]) - double(u.data[i]));
        worst = std::max(worst, d);
        if (tol == 0) ASSERT_EQ(t.data[i], u.data[i]) << name << "[" << i << "]";
        else ASSERT_LE(d, tol) << name << "[" << i << "]: " << t.data[i] << " vs " << u.data[i];
      }
      ++compared;
    });
    EXPECT_EQ(compared, 3 * tensors);  // the parameters and their two moments
    std::printf("%s vs %s: largest difference %.3g over %d tensors\n", a.c_str(), b.c_str(), worst, compared);
  }

  // parallel.overlap_grad_reduce off and on, with the same settings on np ranks and 1 KiB
  // buckets (hundreds, completed out of buffer order): the log says which path ran and, with
  // overlap, how many of rank 0's buckets the backward started (all of them, or with
  // `all_early` false some but not all: a tied embedding split over pipeline stages is
  // reduced after the backward); the losses, validation losses, gradient norms and every final
  // weight and moment are the same bits (the same bucket all-reduces, started earlier).
  void expect_overlap_same_bits(int np, const std::string& name, const std::string& settings,
                                int tensors = kTinyTensors, bool all_early = true) {
    SCOPED_TRACE(name);
    for (const bool on : {false, true}) {
      CommandResult r = train(np, name + (on ? "_on" : "_off"),
                              settings + " --set parallel.grad_bucket_kib=1 --set parallel.overlap_grad_reduce=" +
                                  (on ? "true" : "false"));
      ASSERT_EQ(r.code, 0) << r.out << r.err;
      EXPECT_NE(r.out.find(on ? "once its gradients are final (overlap_grad_reduce)" : "started after the backward"),
                std::string::npos)
          << r.out;
      if (!on) continue;
      std::smatch m;
      const std::regex re("step 1: ([0-9]+) of ([0-9]+) DP gradient bucket\\(s\\) started during the backward");
      ASSERT_TRUE(std::regex_search(r.out, m, re)) << r.out;
      const int early = std::stoi(m[1]), all = std::stoi(m[2]);
      EXPECT_GT(all, 10);
      if (all_early) EXPECT_EQ(early, all);
      else EXPECT_TRUE(early > 0 && early < all) << early << " of " << all;
    }
    expect_same_curve(name + "_off", name + "_on", 0.0, 5);
    expect_same_tensors(name + "_off", name + "_on", 0.0, tensors);
  }

  // Two runs of the same settings on np ranks, with `first` and with `second` appended, whose
  // logs say `first_says` and `second_says` ("": not checked): the losses, validation losses,
  // gradient norms and every final weight and moment are the same bits.
  void expect_same_bits(int np, const std::string& name, const std::string& settings, const std::string& first,
                        const std::string& first_says, const std::string& second, const std::string& second_says,
                        int tensors) {
    SCOPED_TRACE(name);
    for (const auto& [suffix, extra, says] : {std::tuple{"_1", first, first_says}, std::tuple{"_2", second, second_says}}) {
      CommandResult r = train(np, name + suffix, settings + extra);
      ASSERT_EQ(r.code, 0) << r.out << r.err;
      if (!says.empty()) {
        EXPECT_NE(r.out.find(says), std::string::npos) << r.out;
      }
    }
    expect_same_curve(name + "_1", name + "_2", 0.0, 5);
    expect_same_tensors(name + "_1", name + "_2", 0.0, tensors);
  }

  // One layout to another: run `name` with `first` (np ranks: first_np) to train.stop_at=5 of
  // a 10-step run (`ten` holds the run's settings, train.steps=10 among them), resume it with
  // `second` to step 10, and check that it follows run `ref` (the same 10 steps in one go): the
  // curve to `rel`, and, when tensors > 0, every final weight and moment to 1e-5.
  void stop_and_resume(const std::string& ref, const std::string& name, const std::string& ten, int first_np,
                       const std::string& first, int second_np, const std::string& second, double rel,
                       int tensors) {
    SCOPED_TRACE(name);
    CommandResult a = train(first_np, name, ten + " --set train.stop_at=5" + first);
    ASSERT_EQ(a.code, 0) << a.out << a.err;
    EXPECT_NE(a.out.find("stopped at step 5"), std::string::npos) << a.out;
    CommandResult b = train(second_np, name, ten + second);
    ASSERT_EQ(b.code, 0) << b.out << b.err;
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    EXPECT_NE(b.out.find("step      6/10"), std::string::npos) << b.out;
    expect_same_curve(ref, name, rel, 10);
    if (tensors > 0) expect_same_tensors(ref, name, 1e-5, tensors);
  }
};

