// The communication watchdog (core/comm/watchdog.h) on its own: a watch open past the timeout
// or a monitor's error ends the process with exit code 4 and a message naming the rank, the
// operation and the timeout, after running the monitors' aborts; finished watches, closed
// scopes and a disarmed watchdog end nothing. (Death tests: each ending runs in a child.)
// The end-to-end behaviour, a peer of `mpirun nsatron train` stopped or killed mid-run, is
// tests/parallel/test_peer_failure.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "core/comm/watchdog.h"

namespace {

using nsatron::parallel::kExitCommunicationFailure;
using nsatron::parallel::Watchdog;

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

class WatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  void TearDown() override { Watchdog::instance().stop(); }
};

TEST_F(WatchdogTest, AWatchOpenPastTheTimeoutEndsTheRank) {
  EXPECT_EXIT(
      {
        Watchdog& dog = Watchdog::instance();
        dog.start("rank 3", 0.3, 0.02);
        dog.add_monitor([] { return std::string(); }, [] { std::fprintf(stderr, "monitor aborted\n"); });
        const Watchdog::Armed armed;
        const Watchdog::Scope scope("dp", "all_reduce", 1, 2);
        sleep_s(5);  // the watchdog ends the process long before
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kExitCommunicationFailure),
      "nsatron: rank 3: the dp group's all_reduce \\(rank 1 of 2\\) did not finish within 0.3 s "
      "\\(parallel.comm_timeout_s; a dead or hung peer\\?\\); aborting this rank's communicators and exiting "
      "with code 4(.|\n)*monitor aborted");
}

TEST_F(WatchdogTest, AMonitorsErrorEndsTheRank) {
  EXPECT_EXIT(
      {
        Watchdog& dog = Watchdog::instance();
        dog.start("rank 1", 100, 0.02);
        const Watchdog::Armed armed;
        dog.add_monitor([] { return std::string("NCCL reported an asynchronous error on the tp group"); }, {});
        sleep_s(5);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kExitCommunicationFailure),
      "nsatron: rank 1: NCCL reported an asynchronous error on the tp group; aborting");
}

TEST_F(WatchdogTest, AHangingAbortStillEndsTheRankWithinTenSeconds) {
  EXPECT_EXIT(
      {
        Watchdog& dog = Watchdog::instance();
        dog.start("rank 0", 0.1, 0.02);
        dog.add_monitor({}, [] { sleep_s(60); });
        const Watchdog::Armed armed;
        dog.open("the pp group's recv (rank 0 of 2)");
        sleep_s(30);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kExitCommunicationFailure), "the pp group's recv \\(rank 0 of 2\\) did not finish");
}

// A poll that never returns (a CUDA query stuck behind a driver lock) of a watch that is
// overdue: the guard names the watch 2 s after the timeout, long before timeout + grace.
TEST_F(WatchdogTest, AStuckPollOfAnOverdueWatchEndsTheRankNamingIt) {
  EXPECT_EXIT(
      {
        Watchdog& dog = Watchdog::instance();
        dog.start("rank 2", 0.3, 0.02, 100);
        const Watchdog::Armed armed;
        dog.open("the tp group's copy-engine sum (rank 0 of 2)", [] {
          sleep_s(60);
          return true;
        });
        sleep_s(30);  // the guard ends the process at about 2.3 s
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kExitCommunicationFailure),
      "nsatron: rank 2: the tp group's copy-engine sum \\(rank 0 of 2\\) did not finish within 0.3 s "
      "\\(parallel.comm_timeout_s; a dead or hung peer\\?\\) \\(the watchdog's poll did not return\\)");
}

// A check that never returns with no watch open (a monitor's NCCL query that hangs): the
// guard ends the rank after the timeout and the grace.
TEST_F(WatchdogTest, AStuckMonitorEndsTheRankThroughTheGuard) {
  EXPECT_EXIT(
      {
        Watchdog& dog = Watchdog::instance();
        dog.start("rank 2", 0.3, 0.02, 0.3);
        const Watchdog::Armed armed;
        dog.add_monitor(
            [] {
              sleep_s(60);
              return std::string();
            },
            {});
        sleep_s(30);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kExitCommunicationFailure),
      "nsatron: rank 2: the communication watchdog's own checks did not return for [0-9]+ s");
}

// Timings with room for a loaded machine: a 2 s timeout, watches of at most 0.5 s.
TEST_F(WatchdogTest, FinishedAndClosedWatchesAndADisarmedWatchdogEndNothing) {
  Watchdog& dog = Watchdog::instance();
  dog.start("rank 0", 2.0, 0.02);
  // Disarmed: nothing tracked, the release runs at once.
  bool released = false;
  EXPECT_EQ(dog.open("x", {}, [&] { released = true; }), 0u);
  EXPECT_TRUE(released);
  {
    const Watchdog::Scope scope("dp", "barrier", 0, 2);
    sleep_s(2.5);  // past the timeout, but disarmed
  }
  std::atomic<bool> done{false}, freed{false};  // outlive the watchdog's use of them
  {
    const Watchdog::Armed armed;
    EXPECT_TRUE(dog.armed());
    // A watch that finishes on its own (as a CUDA event completes) is closed by the thread,
    // and released.
    dog.open("the dp group's started all_reduce (rank 0 of 2)", [&] { return done.load(); }, [&] { freed = true; });
    EXPECT_EQ(dog.open_watches(), 1u);
    done = true;
    for (int i = 0; i < 500 && dog.open_watches() > 0; ++i) sleep_s(0.01);
    EXPECT_EQ(dog.open_watches(), 0u);
    EXPECT_TRUE(freed);
    // Scopes shorter than the timeout, one after another for longer than it.
    for (int i = 0; i < 6; ++i) {
      const Watchdog::Scope scope("tp", "all_reduce", 0, 2);
      sleep_s(0.5);
    }
    EXPECT_EQ(dog.open_watches(), 0u);
  }
  EXPECT_FALSE(dog.armed());  // Armed restores the previous state
  dog.stop();
  EXPECT_FALSE(dog.started());
  // Arming a watchdog that was never started arms nothing.
  dog.arm(true);
  EXPECT_FALSE(dog.armed());
}

}  // namespace
