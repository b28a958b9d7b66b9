// The communication watchdog: ends this rank, within a bounded time, when a collective or a
// transfer of a multi-rank run does not finish (a dead or hung peer) or when a backend reports
// an asynchronous error (NCCL's ncclCommGetAsyncError), instead of waiting forever.
//
// One process-wide object with one thread. While armed (arm() / Armed), it tracks
//   - watches: an operation in progress, opened by the communicators (Communicator's public
//     calls open a Scope for as long as they block the caller; the NCCL backend also opens a
//     watch per enqueued operation that finishes when the operation's CUDA event completes on
//     the device, since NCCL calls return before the work is done);
//   - monitors: per communicator, a check polled every period (an error text, or empty) and
//     an abort (ncclCommAbort) run before the rank exits.
// Every `poll` seconds the thread ends the rank when a watch has been open longer than the
// timeout or a monitor reports an error: it prints
//   "nsatron: rank 3: the dp group's all_reduce (rank 1 of 2) did not finish within 600 s
//    (a dead or hung peer?); aborting this rank's communicators and exiting with code 4"
// to stderr, runs every monitor's abort (bounded: if one hangs, the rank exits after 10 s
// anyway), and calls std::_Exit(kExitCommunicationFailure). The launcher (mpirun, srun
// --kill-on-bad-exit=1) then ends the other ranks; a rank blocked on this one hits its own
// timeout if nothing ends it first. No file is written on this path: the last checkpoint
// (committed by rename, docs/checkpoint.md) stays as it was.
//
// Disarmed (the default, and single-process runs, which never arm it), open() returns 0 and
// nothing is tracked: one atomic load per call. The driver arms it while the NCCL
// communicators are created and over the training loop (docs/parallel.md, "Failures"),
// not over phases where one rank may legitimately wait long for another (tokenising data).
// The watchdog never calls MPI (the world is MPI_THREAD_FUNNELED). Its polls (CUDA event
// queries, ncclCommGetAsyncError) run outside its lock; a second thread ends the rank the same
// way if the polling thread itself stops returning: at once, naming the watch, when a watch
// is overdue (by 2 s) while the polls have not returned for 2 s and a period (a CUDA event
// query can block behind a launch waiting for a stream a hung peer stopped: seen with the
// tensor-parallel sums on the copy engines), else after the timeout and 30 s more.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace nsatron::parallel {

// The exit code of a rank the watchdog ends (docs/parallel.md lists every exit code).
inline constexpr int kExitCommunicationFailure = 4;

class Watchdog {
 public:
  using Id = std::uint64_t;
  static Watchdog& instance();
  ~Watchdog();

  // Starts the threads (once per process; later calls change the settings): `who` prefixes
  // the messages ("rank 3"), `timeout_s` > 0 bounds every watch, `poll_s` is the period, and
  // the guard ends the rank when the polls themselves have not returned for 2 s + poll_s
  // while a watch is 2 s past timeout_s (naming the watch), or for timeout_s + guard_grace_s
  // in any case. Starting does not arm.
  void start(const std::string& who, double timeout_s, double poll_s = 0.1, double guard_grace_s = 30);
  // Stops the thread and forgets every watch (a run's end; tests).
  void stop();
  bool started() const { return started_; }
  double timeout_s() const { return timeout_s_; }

  // Armed: watches are tracked (only after start()).
  void arm(bool on);
  bool armed() const { return armed_.load(std::memory_order_relaxed); }
  class Armed {  // arms for its lifetime, then restores the previous state
   public:
    Armed() : was_(instance().armed()) { instance().arm(true); }
    ~Armed() { instance().arm(was_); }
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;

   private:
    bool was_;
  };

  // A watch on `what` ("the dp group's all_reduce (rank 1 of 2)"). `finished`, when given, is
  // polled by the thread (true: done, the watch closes itself and `release` runs); else the
  // caller closes it. Returns 0 (and tracks nothing, running `release` at once) when
  // disarmed.
  Id open(std::string what, std::function<bool()> finished = {}, std::function<void()> release = {});
  void close(Id id);
  // Watches open now (for the tests).
  std::size_t open_watches();

  // A monitor: `check` returns an error text or ""; `abort` runs before the rank exits.
  // Tracked armed or not (its check runs only while armed).
  Id add_monitor(std::function<std::string()> check, std::function<void()> abort);
  void remove_monitor(Id id);

  // A watch for as long as the scope lives (Communicator's blocking calls).
  class Scope {
   public:
    Scope(const std::string& group, const char* op, int rank, int size);
    ~Scope() {
      if (id_ != 0) instance().close(id_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Id id_ = 0;
  };
  // "the dp group's all_reduce (rank 1 of 2)"
  static std::string describe(const std::string& group, const char* op, int rank, int size);

 private:
  Watchdog() = default;
  void loop();
  void guard();
  [[noreturn]] void fail(const std::string& why);
  struct Watch {
    std::string what;
    double opened = 0;  // seconds on a steady clock
    std::function<bool()> finished;
    std::function<void()> release;
  };
  struct Monitor {
    std::function<std::string()> check;
    std::function<void()> abort;
  };
  std::mutex mu_;
  std::condition_variable wake_;
  std::map<Id, Watch> watches_;
  std::map<Id, Monitor> monitors_;
  Id next_ = 1;
  std::thread thread_, guard_;
  std::atomic<bool> started_{false};
  bool stopping_ = false, failing_ = false;
  std::atomic<bool> armed_{false};
  std::atomic<double> beat_{0};  // when loop() last woke (seconds, steady clock)
  std::string who_;
  double timeout_s_ = 0, poll_s_ = 0.1, grace_s_ = 30;
};

}  // namespace nsatron::parallel
