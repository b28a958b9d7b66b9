// `nsatron sweep plan|run|report` end to end on a tiny study: runs finish with markers, a
// second `run` redoes nothing, a failed run is reported while the others go on, a killed
// `sweep run` started again finishes the study with the losses of an uninterrupted one, and
// the report lists every run.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "tests/train/train_fixture.h"

namespace {

class SweepRun : public TrainRun {
 protected:
  // A sweep over the fixture's tiny config: two widths x two budgets (4 runs), into out/.
  std::string write_sweep(const std::string& name, const std::string& extra = "") {
    const fs::path p = dir_ / (name + ".toml");
    std::ofstream(p) << "[sweep]\nbase = \"tiny.toml\"\nout = \"" << (dir_ / "out" / name).string() << "\"\n"
                     << "[set]\n\"train.eval_every\" = 10\n\"checkpoint.every\" = 5\n\"log.every\" = 100\n"
                     << "[axes]\n\"model.d_model\" = [32, 48]\nbudget = [{ tokens = 5120 }, { tokens = 20480 }]\n"
                     << extra;
    return p.string();
  }
  fs::path run_dir(const std::string& sweep, const std::string& run) const { return dir_ / "out" / sweep / run; }
  // The "loss" values of a run's metrics, in order (the last record of each step).
  std::vector<double> losses(const std::string& sweep, const std::string& run) const {
    return field_values(read_file_text((run_dir(sweep, run) / "metrics.jsonl").string()), "loss");
  }
};

const char* kRuns[] = {"d_model-32_tok-5.12k", "d_model-32_tok-20.48k", "d_model-48_tok-5.12k", "d_model-48_tok-20.48k"};

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_F(SweepRun, RunsEveryRunOnceAndPlanAndReportAgreeWithTheTrainer) {
  const std::string sweep = write_sweep("study");
  CommandResult plan = run_nsatron("sweep plan " + sweep + " --json");
  ASSERT_EQ(plan.code, 0) << plan.err;
  for (const char* r : kRuns) EXPECT_NE(plan.out.find(std::string("\"run\": \"") + r + "\""), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("\"state\": \"not started\""), std::string::npos);

  CommandResult run = run_nsatron("sweep run " + sweep);
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("4 of 4 runs done"), std::string::npos) << run.out;
  for (const char* r : kRuns) {
    EXPECT_TRUE(fs::exists(run_dir("study", r) / "done.json")) << r;
    EXPECT_TRUE(fs::exists(run_dir("study", r) / "config.toml")) << r;
  }
  // 5120 tokens at 8 x 64 per step: 10 steps; 20480: 40.
  EXPECT_EQ(losses("study", kRuns[0]).size(), 10u);
  EXPECT_EQ(losses("study", kRuns[1]).size(), 40u);
  // The plan's parameter count is the one the trainer reports.
  const std::string log0 = read_file_text((run_dir("study", kRuns[0]) / "run.log").string());
  const auto at = plan.out.find("\"params\": ");
  ASSERT_NE(at, std::string::npos);
  const std::string params = plan.out.substr(at + 10, plan.out.find(',', at) - at - 10);
  EXPECT_NE(log0.find("parameters (" + params + ")"), std::string::npos) << params << "\n" << log0;

  // Again: nothing is redone (each run's log holds one training).
  CommandResult again = run_nsatron("sweep run " + sweep);
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("4 done already"), std::string::npos) << again.out;
  for (const char* r : kRuns)
    EXPECT_EQ(count_of(read_file_text((run_dir("study", r) / "run.log").string()), "# resolved config"), 1) << r;
  plan = run_nsatron("sweep plan " + sweep);
  EXPECT_EQ(count_of(plan.out, " done\n"), 4) << plan.out;

  // The report's table: every run done, with its final losses.
  CommandResult report = run_nsatron("sweep report " + (dir_ / "out" / "study").string() + " --no-fit");
  ASSERT_EQ(report.code, 0) << report.out << report.err;
  const std::string csv = read_file_text((dir_ / "out" / "study" / "results.csv").string());
  EXPECT_EQ(csv.rfind("run,status,model.d_model,budget,attention,layout,device,params,", 0), 0u) << csv;
  EXPECT_EQ(count_of(csv, ",done,"), 4) << csv;
  EXPECT_NE(csv.find(std::string(kRuns[1]) + ",done,32,tok-20.48k,nsa,tp1.pp1.dp1,cpu,"), std::string::npos) << csv;

  // The wall time from that report (each run's own speed), and from a calibration here.
  plan = run_nsatron("sweep plan " + sweep + " --throughput " + (dir_ / "out" / "study" / "results.csv").string());
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find("wall time: from the same run in"), std::string::npos) << plan.out;
  EXPECT_EQ(plan.out.find("   - done"), std::string::npos) << plan.out;  // no run without a time
  plan = run_nsatron("sweep plan " + sweep + " --calibrate 2 --json");
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_EQ(count_of(plan.out, "\"speed_source\": \"calibrated here (2 steps)\""), 4) << plan.out;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "study" / ".calibrate"));  // the scratch runs are removed
  EXPECT_NE(run_nsatron("sweep plan " + sweep + " --calibrate 1").code, 0);

  // A done run whose metrics are gone is reported as corrupt and left out; the others stay.
  fs::remove(run_dir("study", kRuns[2]) / "metrics.jsonl");
  report = run_nsatron("sweep report " + (dir_ / "out" / "study").string() + " --no-fit");
  ASSERT_EQ(report.code, 0) << report.out << report.err;
  EXPECT_NE(report.out.find("(1 corrupt, 3 done)"), std::string::npos) << report.out;
  EXPECT_NE(report.out.find(std::string("not in the fits: ") + kRuns[2] + ": corrupt (done.json but no metrics.jsonl)"),
            std::string::npos)
      << report.out;
}

TEST_F(SweepRun, AFailedRunIsReportedAndTheOthersGoOn) {
  // One width whose data cannot be read: its runs fail at start-up, the others finish.
  const std::string sweep = write_sweep("failing");
  std::ofstream(sweep, std::ios::app) << "\"data.train\" = [\"" << (dir_ / "data/train_*.bin").string()
                                      << "\", \"" << (dir_ / "nowhere/*.bin").string() << "\"]\n";
  CommandResult run = run_nsatron("sweep run " + sweep);
  EXPECT_EQ(run.code, 1) << run.out << run.err;
  EXPECT_NE(run.out.find("4 of 8 runs done, 4 failed"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("FAILED (exit 2)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("nowhere"), std::string::npos) << run.out;  // the failed run's own message
  CommandResult report = run_nsatron("sweep report " + (dir_ / "out" / "failing").string() + " --no-fit");
  ASSERT_EQ(report.code, 0) << report.out << report.err;
  EXPECT_NE(report.out.find("4 done, 4 failed"), std::string::npos) << report.out;
  EXPECT_EQ(count_of(report.out, "not in the fits:"), 4) << report.out;
}

TEST_F(SweepRun, AKilledSweepStartedAgainFinishesWithoutRedoingDoneRuns) {
  // The reference: the study uninterrupted.
  ASSERT_EQ(run_nsatron("sweep run " + write_sweep("reference")).code, 0);
  const std::string sweep = write_sweep("killed");
  // Start `sweep run`, and kill -9 it once the second run is past its first checkpoint.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string out = (dir_ / "killed.out").string();
    ::execl("/bin/sh", "sh", "-c", (std::string("exec ") + NSATRON_BINARY + " sweep run " + sweep + " >" + out + " 2>&1").c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const fs::path second = run_dir("killed", kRuns[1]);
  bool seen = false;
  for (int i = 0; i < 1200 && !seen; ++i) {
    seen = fs::exists(second / "checkpoints" / "step_00000010");
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(seen) << read_file_text((dir_ / "killed.out").string());
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // The run in progress got SIGTERM (parent death) and stops with a checkpoint; wait for it.
  for (int i = 0; i < 600; ++i) {
    if (read_file_text((second / "run.log").string()).find("stopping after step") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(fs::exists(run_dir("killed", kRuns[0]) / "done.json"));
  EXPECT_FALSE(fs::exists(second / "done.json"));

  CommandResult again = run_nsatron("sweep run " + sweep);
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("1 done already"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find(std::string(kRuns[1]) + ": running (resuming)"), std::string::npos) << again.out;
  EXPECT_EQ(count_of(read_file_text((run_dir("killed", kRuns[0]) / "run.log").string()), "# resolved config"), 1);
  EXPECT_NE(read_file_text((second / "run.log").string()).find("resumed from"), std::string::npos);
  // Every run ends with the losses of the uninterrupted study, step for step.
  for (const char* r : kRuns) {
    EXPECT_TRUE(fs::exists(run_dir("killed", r) / "done.json")) << r;
    const auto ref = losses("reference", r);
    auto got = losses("killed", r);
    ASSERT_GE(got.size(), ref.size()) << r;
    // A resumed run appends: the records after the checkpoint it resumed from come twice;
    // the last record of each step is what counts (as for `sweep report`).
    const auto steps = field_values(read_file_text((run_dir("killed", r) / "metrics.jsonl").string()), "step");
    std::map<double, double> last;
    const std::string text = read_file_text((run_dir("killed", r) / "metrics.jsonl").string());
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      const auto s = field_values(line, "step"), l = field_values(line, "loss");
      if (!s.empty() && !l.empty()) last[s[0]] = l[0];
    }
    ASSERT_EQ(last.size(), ref.size()) << r;
    std::size_t i = 0;
    for (const auto& [step, loss] : last) EXPECT_EQ(loss, ref[i++]) << r << " step " << step;
    (void)steps;
  }
}

TEST_F(SweepRun, BadSweepStartsNothing) {
  const std::string sweep = write_sweep("bad", "\"model.n_layerz\" = [2]\n");
  CommandResult run = run_nsatron("sweep run " + sweep);
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("bad.toml:11:21: model.n_layerz: unknown key (did you mean 'model.n_layers'?)"), std::string::npos)
      << run.err;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "bad"));
  CommandResult report = run_nsatron("sweep report " + (dir_ / "nowhere").string());
  EXPECT_EQ(report.code, 2);
  EXPECT_NE(report.err.find("is not a sweep's folder"), std::string::npos) << report.err;
}

TEST_F(SweepRun, OneSweepRunAtATimePerStudy) {
  const std::string sweep = write_sweep("locked");
  // Another `sweep run` of the same study holds OUT/.lock (flock, as the runner takes it).
  fs::create_directories(dir_ / "out" / "locked");
  const int fd = ::open((dir_ / "out" / "locked" / ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  CommandResult run = run_nsatron("sweep run " + sweep);
  EXPECT_EQ(run.code, 2) << run.out << run.err;
  EXPECT_NE(run.err.find("another `sweep run` is working on"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(run_dir("locked", kRuns[0]) / "metrics.jsonl"));
  ::close(fd);  // released: now it runs
  run = run_nsatron("sweep run " + sweep);
  EXPECT_EQ(run.code, 0) << run.out << run.err;
}
