#include "core/comm/watchdog.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace nsatron::parallel {

namespace {

// How far the guard lets the polling loop fall behind before it acts on an overdue watch.
constexpr double kGuardLagS = 2.0;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string seconds_text(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

std::string overdue_message(const std::string& what, double timeout_s) {
  return what + " did not finish within " + seconds_text(timeout_s) + " s (parallel.comm_timeout_s; a dead or hung peer?)";
}

}  // namespace

Watchdog& Watchdog::instance() {
  static Watchdog dog;
  return dog;
}

Watchdog::~Watchdog() { stop(); }

std::string Watchdog::describe(const std::string& group, const char* op, int rank, int size) {
  return "the " + group + " group's " + op + " (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
}

Watchdog::Scope::Scope(const std::string& group, const char* op, int rank, int size) {
  Watchdog& dog = instance();
  if (dog.armed()) id_ = dog.open(describe(group, op, rank, size));
}

void Watchdog::start(const std::string& who, double timeout_s, double poll_s, double guard_grace_s) {
  std::lock_guard<std::mutex> lock(mu_);
  who_ = who;
  timeout_s_ = timeout_s;
  poll_s_ = poll_s;
  grace_s_ = guard_grace_s;
  if (started_) return;
  started_ = true;
  stopping_ = false;
  beat_ = now_s();
  thread_ = std::thread([this] { loop(); });
  guard_ = std::thread([this] { guard(); });
}

void Watchdog::stop() {
  std::vector<std::function<void()>> releases;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) return;
    stopping_ = true;
    armed_ = false;
    for (auto& [id, w] : watches_)
      if (w.release) releases.push_back(std::move(w.release));
    watches_.clear();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (guard_.joinable()) guard_.join();
  std::lock_guard<std::mutex> lock(mu_);
  started_ = false;
  for (auto& r : releases) r();
}

void Watchdog::arm(bool on) {
  if (on && !started_) return;  // nothing to arm: no thread
  if (on) beat_ = now_s();      // the loop may have slept through a disarmed stretch
  armed_ = on;
}

Watchdog::Id Watchdog::open(std::string what, std::function<bool()> finished, std::function<void()> release) {
  if (!armed()) {
    if (release) release();
    return 0;
  }
  std::lock_guard<std::mutex> lock(mu_);
  const Id id = next_++;
  watches_[id] = Watch{std::move(what), now_s(), std::move(finished), std::move(release)};
  return id;
}

void Watchdog::close(Id id) {
  std::function<void()> release;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = watches_.find(id);
    if (it == watches_.end()) return;
    release = std::move(it->second.release);
    watches_.erase(it);
  }
  if (release) release();
}

std::size_t Watchdog::open_watches() {
  std::lock_guard<std::mutex> lock(mu_);
  return watches_.size();
}

Watchdog::Id Watchdog::add_monitor(std::function<std::string()> check, std::function<void()> abort) {
  std::lock_guard<std::mutex> lock(mu_);
  const Id id = next_++;
  monitors_[id] = Monitor{std::move(check), std::move(abort)};
  return id;
}

void Watchdog::remove_monitor(Id id) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failing_) {  // the rank is ending: keep the communicator alive for the abort
    lock.unlock();
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  monitors_.erase(id);
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::duration<double>(poll_s_));
    beat_ = now_s();
    if (stopping_) break;
    if (!armed()) continue;
    // What to poll, copied under the lock; the callbacks (CUDA, NCCL) run without it, so that
    // a call that blocks cannot hold up the communicators' opens and closes, and the guard
    // thread (below) still sees this loop's heartbeat stop.
    std::vector<std::function<std::string()>> checks;
    for (auto& [id, m] : monitors_)
      if (m.check) checks.push_back(m.check);
    std::vector<std::pair<Id, std::function<bool()>>> polls;
    for (auto& [id, w] : watches_)
      if (w.finished) polls.emplace_back(id, w.finished);
    lock.unlock();
    std::string why;
    for (auto& check : checks) {
      why = check();
      if (!why.empty()) break;
    }
    std::vector<Id> done;
    for (auto& [id, finished] : polls)
      if (finished()) done.push_back(id);
    lock.lock();
    std::vector<std::function<void()>> releases;
    for (Id id : done) {
      auto it = watches_.find(id);
      if (it == watches_.end()) continue;
      if (it->second.release) releases.push_back(std::move(it->second.release));
      watches_.erase(it);
    }
    const double t = now_s();
    for (auto it = watches_.begin(); why.empty() && it != watches_.end(); ++it)
      if (t - it->second.opened > timeout_s_)
        why = overdue_message(it->second.what, timeout_s_);
    lock.unlock();
    for (auto& release : releases) release();
    if (!why.empty()) fail(why);
    lock.lock();
  }
}

void Watchdog::guard() {
  // The loop's own hang (a CUDA or NCCL query that never returns): with a watch overdue, the
  // watch's message as soon as the loop has missed 2 s of polls (a watch whose stuck poll would
  // have said "done" within those 2 s past the timeout ends the rank too: it is past the
  // timeout); else no heartbeat for the timeout and the grace (30 s) more ends the rank.
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::duration<double>(poll_s_));
    if (stopping_ || !armed()) continue;
    const double t = now_s(), stalled = t - beat_.load();
    // A poll that blocks (a CUDA query behind a driver lock held by a launch that waits for
    // a stream a hung peer stopped) with a watch overdue: the watch's own message, as the
    // loop would have said it, as soon as the loop has missed a few polls.
    std::string overdue;
    if (stalled > kGuardLagS + poll_s_)
      for (const auto& [id, w] : watches_)
        if (t - w.opened > timeout_s_ + kGuardLagS) {
          overdue = overdue_message(w.what, timeout_s_) + " (the watchdog's poll did not return)";
          break;
        }
    if (!overdue.empty()) {
      lock.unlock();
      fail(overdue);
    }
    if (stalled > timeout_s_ + grace_s_) {
      lock.unlock();
      fail("the communication watchdog's own checks did not return for " + seconds_text(double(long(stalled))) +
           " s (a CUDA or NCCL call that hangs)");
    }
  }
}

void Watchdog::fail(const std::string& why) {
  std::vector<std::function<void()>> aborts;
  std::string who;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failing_) {  // the other thread is ending the rank
      std::this_thread::sleep_for(std::chrono::seconds(60));
      std::_Exit(kExitCommunicationFailure);
    }
    failing_ = true;  // from now on remove_monitor waits: the aborts use the communicators
    for (auto& [id, m] : monitors_)
      if (m.abort) aborts.push_back(m.abort);
    who = who_;
  }
  std::fprintf(stderr,
               "nsatron: %s%s; aborting this rank's communicators and exiting with code %d (the last "
               "committed checkpoint is unchanged)\n",
               who.empty() ? "" : (who + ": ").c_str(), why.c_str(), kExitCommunicationFailure);
  std::fflush(stderr);
  std::fflush(stdout);
  // An abort that hangs must not keep the rank alive: exit after 10 s regardless.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(kExitCommunicationFailure);
  }).detach();
  for (auto& a : aborts) a();
  std::_Exit(kExitCommunicationFailure);
}

}  // namespace nsatron::parallel
